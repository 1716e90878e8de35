"""Shared by the stitching tests that run several `slicex up` aggregates on this host: their substrate files
(one switch, one host, an external link per neighbour), the three path shapes (direct, translated, Q-in-Q),
the request, homes that trust each other's roots, `slicex up` as a child process, and (lab_aggregates) the
aggregates of one shape each on a lab host of its own, which the lab stitching test and bench/stitched_path.py
share."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from slicex import procs
from slicex.devpki import add_user, init_ca
from slicex.home import Home

CAPACITY_KBPS = 10_000


def urn(name: str, rest: str = "authority+am") -> str:
    return f"urn:publicid:IDN+{name}.test+{rest}"


def port(name: str, peer: str) -> str:
    return urn(name, f"interface+sw1:to-{peer}")


def substrate(name: str, peers: dict[str, dict]) -> dict:
    """One aggregate: a switch, one host, an external link per peer with the given attributes."""
    ranges = ["100-299", "3000-3010"]
    return {"authority": f"{name}.test",
            "switches": [{"name": "sw1", "vlan_range": ranges,
                          "ports": [{"name": "h1"}] + [{"name": f"to-{p}"} for p in peers]}],
            "hosts": [{"name": "pc", "count": 1, "cores": 8, "memory_mb": 16384,
                       "interfaces": [{"name": "eth0", "switch_port": "sw1:h1"}]}],
            "external_links": [{"name": f"to-{p}", "switch": "sw1", "port": f"to-{p}", "remote_aggregate": urn(p),
                                "remote_port": port(p, name), **attrs} for p, attrs in peers.items()]}


MODES = {  # aggregate -> peer -> external link attributes
    "direct": {"sa": {"sb": {"vlan_range": "100-110"}}, "sb": {"sa": {"vlan_range": "100-110"}}},
    # no tag is in both sa-sb's and sb-sc's ranges: sb's port to sc translates
    "translated": {"sa": {"sb": {"vlan_range": "100-110"}},
                   "sb": {"sa": {"vlan_range": "100-110"}, "sc": {"vlan_range": "200-210", "vlan_translation": True}},
                   "sc": {"sb": {"vlan_range": "200-210"}}},
    # the transit carries only 3000-3010, the edges only 100-110 and translate nothing: Q-in-Q at the edges
    "qinq": {"sa": {"sb": {"vlan_range": "100-110", "qinq": True, "s_vlan_range": "3000-3009"}},
             "sb": {"sa": {"vlan_range": "3005-3010"}, "sc": {"vlan_range": "3000-3010"}},
             "sc": {"sb": {"vlan_range": "100-110", "qinq": True, "s_vlan_range": "3000-3009"}}},
}


def request(a: str, b: str, link: str = "st0", capacity_kbps: int = CAPACITY_KBPS, hosts: tuple[int, int] = (1, 2),
            node_names: tuple[str, str] = ("a", "b")) -> str:
    """Two nodes, one at `a` and one at `b`, on one stitched link (10.77.0.x)."""
    na, nb = node_names
    return f"""<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">
  <node client_id="{na}" component_manager_id="{urn(a)}" exclusive="false">
    <sliver_type name="default-vm"/><interface client_id="{na}:if0"><ip address="10.77.0.{hosts[0]}"
      netmask="255.255.255.0"/></interface></node>
  <node client_id="{nb}" component_manager_id="{urn(b)}" exclusive="false">
    <sliver_type name="default-vm"/><interface client_id="{nb}:if0"><ip address="10.77.0.{hosts[1]}"
      netmask="255.255.255.0"/></interface></node>
  <link client_id="{link}"><component_manager name="{urn(a)}"/><component_manager name="{urn(b)}"/>
    <interface_ref client_id="{na}:if0"/><interface_ref client_id="{nb}:if0"/>
    <property source_id="{na}:if0" dest_id="{nb}:if0" capacity="{capacity_kbps}"/>
    <property source_id="{nb}:if0" dest_id="{na}:if0" capacity="{capacity_kbps}"/></link></rspec>"""


def make_homes(root: Path, racks: dict[str, dict[str, dict]], **config: Any) -> dict[str, Home]:
    """A home per aggregate (own CA and authority `<name>.test`, its substrate file, `config` added to its
    slicex.yaml), user alice at the first, every home trusting every other's root."""
    homes: dict[str, Home] = {}
    for name, peers in racks.items():
        (root / f"{name}.yaml").write_text(yaml.safe_dump(substrate(name, peers)))
        home = Home(root / name)
        home.root.mkdir(parents=True)
        cfg = {"authority": f"{name}.test", "sa_port": 0, "am_port": 0, "am_v2_port": None, "tick_seconds": 0.05,
               "dashboard_port": None, "substrate": str(root / f"{name}.yaml")}
        cfg.update({k: (v(name) if callable(v) else v) for k, v in config.items()})
        home.config_file.write_text(yaml.safe_dump(cfg))
        init_ca(home, f"{name}.test")
        homes[name] = home
    add_user(homes[next(iter(racks))], f"{next(iter(racks))}.test", "alice")
    for name, home in homes.items():
        for other, peer in homes.items():
            if other != name:
                (home.trusted_roots / f"{other}.pem").write_bytes(peer.ca_cert.read_bytes())
    return homes


class Up:
    """`slicex up` as a child process in the foreground, as an operator runs it; `stop` is SIGTERM. `inside`: an
    argv prefix that runs it elsewhere (a lab host: lab.edge.inside)."""

    def __init__(self, home: Home, inside: tuple[str, ...] = ()):
        self.home = home
        self.inside = inside
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> dict[str, Any]:
        """Start it and return what it records in its pid file (am_url, sa_url, ...)."""
        log = open(self.home.root / "up.log", "ab")
        self.proc = subprocess.Popen([*self.inside, sys.executable, "-m", "cli", "--home", str(self.home.root), "up"],
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log()
            rec = procs.read(self.home.pid_file)
            if rec is not None and rec.pid == self.proc.pid:
                return rec.info
            time.sleep(0.05)
        raise AssertionError("slicex up did not start: " + self.log())

    def log(self) -> str:
        path = self.home.root / "up.log"
        return path.read_text()[-3000:] if path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def slice_credential(sa: Any, authority: str, name: str) -> tuple[str, list[dict[str, str]]]:
    s = f"urn:publicid:IDN+{authority}+slice+{name}"
    return s, [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": sa.CreateSlice(s)}]


@contextmanager
def lab_aggregates(root: Path, mode: str, lab_name: str = "ts", rate_mbit: float | None = None) -> Iterator[dict]:
    """The aggregates of MODES[mode], each a `slicex up --substrate netns` on a lab host of its own (h1, h2, …
    on a line of fibres) with its own userspace switch, the stitching cables between neighbours layer-2
    circuits between the hosts named as each driver's trunk; fibres and cables shaped to `rate_mbit` (None:
    unshaped). Yields names, procs (each `up`'s pid record), prefixes, host (name -> LabHost), ams, topology
    and sa; takes everything down after the block."""
    from authority.substrate import hostnet
    from authority.substrate.login import kill_netns_processes
    from authority.substrate.netns_plan import trunk_name
    from lab import edge, line, running
    from slicex.tls_xmlrpc import client
    from stitching.topology import load_topology
    from tests.integration.netns_support import LAB_CHAIN, new_prefix

    names = list(MODES[mode])
    prefixes = {name: new_prefix(LAB_CHAIN) for name in names}
    with running(line(lab_name, hosts=len(names), rate_mbit=rate_mbit)) as lab:
        host = {name: lab.hosts[f"h{i}"] for i, name in enumerate(names, start=1)}
        homes = make_homes(root, MODES[mode], substrate_driver="netns", host=lambda name: host[name].address,
                           netns=lambda name: {"prefix": prefixes[name]})
        done = set()
        for name, peers in MODES[mode].items():  # one cable per pair of neighbours, named as each side's trunk
            for peer in peers:
                if frozenset((name, peer)) not in done:
                    done.add(frozenset((name, peer)))
                    lab.cable(host[name].name, trunk_name(prefixes[name], port(name, peer)),
                              host[peer].name, trunk_name(prefixes[peer], port(peer, name)), rate_mbit)
        ups = {name: Up(home, tuple(edge.inside(host[name].namespace))) for name, home in homes.items()}
        try:
            procs = {name: up.start() for name, up in ups.items()}
            (root / "topology.yaml").write_text("aggregates:\n" + "".join(
                f"- {{substrate: {name}.yaml, url: '{procs[name]['am_url']}'}}\n" for name in homes))
            alice = homes[names[0]]
            cert, key = str(alice.user_cert("alice")), str(alice.user_key("alice"))
            yield {"mode": mode, "names": names, "procs": procs, "prefixes": prefixes, "host": host,
                   "ams": {p["am_url"]: client(p["am_url"], cert, key) for p in procs.values()},
                   "topology": load_topology(root / "topology.yaml"),
                   "sa": client(procs[names[0]]["sa_url"], cert, key)}
        finally:
            for name, up in ups.items():
                up.stop()
                host[name].run([sys.executable, "-m", "cli", "--home", str(homes[name].root), "down"], timeout=60)
            for prefix in prefixes.values():  # node namespaces are the hosts' drivers', named by prefix
                for ns in hostnet.namespaces():
                    if ns.startswith(prefix + "-"):
                        kill_netns_processes(ns)
                        hostnet.del_namespace(ns)
                for d in (Path(f"/run/slicex-{prefix}"), Path(f"/run/slicex-{prefix}-nodes")):
                    shutil.rmtree(d, ignore_errors=True)


def wait_until_ready(ams: dict[str, Any], slice_urn: str, creds: list, seconds: float = 30) -> dict[str, set[str]]:
    """AM URL -> the operational states of the slice's slivers there, polled until every sliver at every AM is
    geni_ready or `seconds` have passed (the caller asserts on what it got)."""
    deadline = time.monotonic() + seconds
    while True:
        states = {u: {x["geni_operational_status"] for x in am.Status([slice_urn], creds, {})["value"]["geni_slivers"]}
                  for u, am in ams.items()}
        if all(v == {"geni_ready"} for v in states.values()) or time.monotonic() > deadline:
            return states
        time.sleep(0.25)
