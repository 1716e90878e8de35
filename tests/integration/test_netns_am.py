"""Real slivers through the AM API: `slicex up --substrate netns` in a process of its own, driven over mutual
TLS as omni drives it. A 3-node LAN whose nodes ping each other, a 10 Mbit/s link measured with iperf3, two
slices that cannot reach each other, SIGKILL of the aggregate and a restart that adopts the live slivers and
removes what belongs to none, and after Delete nothing of the slices on the host."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from lxml import etree

from authority.substrate import hostnet
from authority.substrate.netns import NetnsDriver
from authority.substrate.netns_plan import netns_name, owned
from slicex import procs
from slicex.tls_xmlrpc import client
from tests.factories import RSPEC3, request_rspec, vm
from tests.integration.conftest import AUTHORITY, make_home
from tests.integration.netns_support import (
    assert_shaped,
    cleanup,
    have_iperf3,
    iperf3_mbps,
    link_ends,
    new_prefix,
    ping,
    require_host,
)


def ok(reply: dict):
    assert reply["code"]["geni_code"] == 0, reply.get("output")
    return reply["value"]


def lan(capacity_kbps: int | None = None, n: int = 3) -> str:
    ifaces = [f"n{k}:if0" for k in range(1, n + 1)]
    link = {"client_id": "lan0", "ifaces": ifaces}
    if capacity_kbps:
        link["capacity"] = capacity_kbps
    return request_rspec([vm(f"n{k}", ifaces=[ifaces[k - 1]]) for k in range(1, n + 1)], [link])


class Up:
    """`slicex up --substrate <substrate>` (netns by default) as a child process (foreground), as an operator
    runs it."""

    def __init__(self, home, substrate: str = "netns", cwd: Path | None = None):
        self.home = home
        self.substrate = substrate
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None

    def start(self) -> str:
        with open(self.home.root / "up.log", "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "cli", "--home", str(self.home.root), "up",
                                          "--substrate", self.substrate], stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, cwd=self.cwd)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.home.root / "up.log").read_text()[-2000:]
            rec = procs.read(self.home.pid_file)
            if rec is not None and rec.pid == self.proc.pid:
                return rec.info["am_url"]
            time.sleep(0.1)
        raise AssertionError("slicex up did not start: " + (self.home.root / "up.log").read_text()[-2000:])

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@contextmanager
def up_then_down(home, prefix: str) -> Iterator[Up]:
    """An `Up` of a netns home for the caller to start; on leaving, the process stopped, `slicex down` run and
    whatever the prefix's driver left on the host removed, even when the test failed half-way."""
    up = Up(home)
    try:
        yield up
    finally:
        up.stop()
        subprocess.run([sys.executable, "-m", "cli", "--home", str(home.root), "down"], capture_output=True,
                       timeout=60)
        cleanup(NetnsDriver(prefix))


def slice_of(home, am_url: str, user: str, name: str) -> tuple[Any, str, list[dict]]:
    """A new slice `name` created at the home's SA by `user`: the user's AM client, the slice's URN and the
    credentials the AM API takes (both clients over mutual TLS with the user's certificate)."""
    cert, key = str(home.user_cert(user)), str(home.user_key(user))
    sa = client(procs.read(home.pid_file).info["sa_url"], cert, key)
    urn = f"urn:publicid:IDN+{AUTHORITY}+slice+{name}"
    return client(am_url, cert, key), urn, [{"geni_type": "geni_sfa", "geni_version": "3",
                                              "geni_value": sa.CreateSlice(urn)}]


@pytest.fixture
def netns_home(tmp_path: Path):
    require_host()
    prefix = new_prefix()
    home = make_home(tmp_path / "home", substrate_driver="netns", netns={"prefix": prefix}, sa_port=0, am_port=0)
    with up_then_down(home, prefix) as up:
        yield home, up, prefix


def namespaces_of(manifest: str, prefix: str) -> dict[str, str]:
    """client_id -> the namespace of each node of a manifest (named from its sliver URN)."""
    root = etree.fromstring(manifest.encode())
    return {n.get("client_id"): netns_name(prefix, n.get("sliver_id")) for n in root.iter(f"{{{RSPEC3}}}node")}


def test_slices_through_the_am_api_are_real_isolated_survive_sigkill_and_leave_nothing(netns_home):
    home, up, prefix = netns_home
    am_url = up.start()
    am_a, urn_a, cred_a = slice_of(home, am_url, "alice", "nsa")
    am_b, urn_b, cred_b = slice_of(home, am_url, "bob", "nsb")
    ok(am_a.Allocate(urn_a, cred_a, lan(capacity_kbps=10_000), {}))
    ok(am_b.Allocate(urn_b, cred_b, lan(n=2), {}))
    ns: dict[str, dict[str, str]] = {}
    for am, urn, cred in ((am_a, urn_a, cred_a), (am_b, urn_b, cred_b)):
        manifest = ok(am.Provision([urn], cred, {"geni_users": []}))["geni_rspec"]
        ns[urn] = namespaces_of(manifest, prefix)
        ok(am.PerformOperationalAction([urn], cred, "geni_start", {}))
        status = ok(am.Status([urn], cred, {}))
        assert {s["geni_operational_status"] for s in status["geni_slivers"]} == {"geni_ready"}, status
    a, b = ns[urn_a], ns[urn_b]
    assert sorted(n for n in hostnet.namespaces() if n.startswith(prefix + "-")) == sorted([*a.values(),
                                                                                            *b.values()])
    assert hostnet.exec_in(a["n2"], ["cat", "/etc/hostname"]).stdout.strip() == "n2"
    # slice a: n1..n3 on 10.10.0.1-3; slice b: n1, n2 on 10.10.0.1-2 (the same addresses, another VLAN)
    a_n1 = a["n1"]
    rtts = []
    for k in (2, 3):
        reached, rtt = ping(a_n1, f"10.10.0.{k}", count=3)
        assert reached
        rtts.append(rtt)
    print(f"\nping RTT n1->n2, n1->n3 in slice a: {rtts} ms")
    assert ping(b["n1"], "10.10.0.2", count=2)[0]  # slice b's own n2
    for n in b.values():
        assert not ping(n, "10.10.0.3", count=2)[0]  # slice a's n3 is unreachable from slice b
    if have_iperf3():
        mbps = iperf3_mbps(a["n2"], "10.10.0.2", a_n1, seconds=3)
        print(f"iperf3 TCP on the 10 Mbit/s LAN: {mbps:.2f} Mbit/s")
        assert_shaped(mbps, 10_000, link_ends(list(a.values())))

    # a crash: the aggregate dies with SIGKILL mid-life; a namespace of a creation it never recorded is left
    stray = f"{prefix}-{'0' * 12}"
    hostnet.add_namespace(stray, "stray")
    up.kill9()
    assert ping(a_n1, "10.10.0.2", count=2)[0]  # the switch and controller keep forwarding meanwhile
    am_url = up.start()  # a new process on new ports: new connections
    am_a = client(am_url, str(home.user_cert("alice")), str(home.user_key("alice")))
    am_b = client(am_url, str(home.user_cert("bob")), str(home.user_key("bob")))
    assert stray not in hostnet.namespaces()
    assert {*a.values(), *b.values()} <= hostnet.namespaces()  # live slivers adopted
    assert ping(a_n1, "10.10.0.3", count=2)[0]
    status = ok(am_a.Status([urn_a], cred_a, {}))
    assert {s["geni_operational_status"] for s in status["geni_slivers"]} == {"geni_ready"}

    ok(am_a.Delete([urn_a], cred_a, {}))
    ok(am_b.Delete([urn_b], cred_b, {}))
    assert NetnsDriver(prefix).leftovers() == []
    down = subprocess.run([sys.executable, "-m", "cli", "--home", str(home.root), "down"],
                          capture_output=True, text=True, timeout=60)
    assert down.returncode == 0, down.stderr
    assert not NetnsDriver(prefix).ovs.running()
    assert yaml.safe_load(home.config_file.read_text())["substrate_driver"] == "netns"


def _qdiscs(prefix: str, namespaces: list[str]) -> dict[str, str]:
    """The root qdisc kind of both ends of every link of a deployment: the host ends (on the switch) and the
    node ends (in the node namespaces), by "host:<dev>" / "<ns>:<dev>"."""
    ends = [(None, name) for name in hostnet.links() if owned(prefix, name) and name != f"{prefix}-br"]
    ends += [(ns, name) for ns in namespaces for name in hostnet.links(ns) if name != "lo"]
    return {f"{ns or 'host'}:{dev}": (hostnet.qdisc(ns, dev).split() or ["none"])[1] for ns, dev in ends}


def _host_objects(prefix: str) -> dict[str, list[str]]:
    """What a deployment with this prefix has made on the host: namespaces, links (bridge included), the
    Open vSwitch bridges of its run directory, its /run and /var/lib entries."""
    run_entries = sorted(str(p) for p in Path("/run").glob(f"slicex-{prefix}*"))
    return {"namespaces": sorted(n for n in hostnet.namespaces() if n.startswith(prefix + "-")),
            "links": sorted(n for n in hostnet.links() if n.startswith(prefix)),
            "bridges": NetnsDriver(prefix).ovs.bridges() if NetnsDriver(prefix).ovs.running() else [],
            "run": run_entries, "state": sorted(str(p) for p in Path("/var/lib").glob(f"slicex-{prefix}*"))}


def test_links_are_shaped_both_ways_after_provision_and_restart_and_down_leaves_nothing(netns_home):
    """Every end of a 10 Mbit/s link has its token bucket right after Provision (the switch side lost it
    before: Open vSwitch drops a root qdisc on an interface it adds as a port) and again after the aggregate
    restarts and adopts the slice; once the slice is deleted, `slicex down` leaves no namespace, link,
    bridge or /run directory of the deployment (main left `<prefix>-br` and /run/slicex-<prefix>/)."""
    home, up, prefix = netns_home
    before = _host_objects(prefix)
    am_url = up.start()
    sa_url = procs.read(home.pid_file).info["sa_url"]
    cert, key = str(home.user_cert("alice")), str(home.user_key("alice"))
    am, sa = client(am_url, cert, key), client(sa_url, cert, key)
    urn = f"urn:publicid:IDN+{AUTHORITY}+slice+shaped"
    cred = [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": sa.CreateSlice(urn)}]
    ok(am.Allocate(urn, cred, lan(capacity_kbps=10_000, n=2), {}))
    manifest = ok(am.Provision([urn], cred, {"geni_users": []}))["geni_rspec"]
    nodes = sorted(namespaces_of(manifest, prefix).values())
    shaped = _qdiscs(prefix, nodes)
    assert len(shaped) == 4 and set(shaped.values()) == {"tbf"}, shaped  # 2 veths, both ends each

    up.stop()  # SIGTERM, as `slicex down` stops it: the slivers stay, the next start adopts them
    am_url = up.start()
    assert _qdiscs(prefix, nodes) == shaped
    am = client(am_url, cert, key)
    ok(am.Delete([urn], cred, {}))
    up.stop()
    down = subprocess.run([sys.executable, "-m", "cli", "--home", str(home.root), "down"],
                          capture_output=True, text=True, timeout=60)
    assert down.returncode == 0, down.stderr
    assert _host_objects(prefix) == before, (before, _host_objects(prefix))
