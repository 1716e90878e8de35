"""The lab's edge: realise a LabPlan with `ip netns`, veth pairs, tc and nftables, relay the operator's Redis
to the hosts, and take it all down. It decides nothing (lab/plan.py does); its record of a running lab is
the spec it was made from, in the lab's state directory."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from authority.substrate import hostnet
from authority.substrate.netns_plan import tbf_args
from lab.plan import MGMT_IF, LabPlan, LabSpec, plan
from slicex.errors import ServerError, Unsupported

RELAY_PORT = 6379
ROOT = Path(__file__).resolve().parents[1]


def state_dir(lab: str) -> Path:
    base = Path("/run") if os.access("/run", os.W_OK) else Path("/tmp")
    return base / f"slicex-lab-{lab}"


def missing_capabilities() -> list[str]:
    """What this machine lacks for a lab (empty when it can make one): probed, never assumed."""
    caps = hostnet.capabilities()
    missing = [f"{k}: {caps.get(k, 'not probed')}" for k in ("root", "netns", "veth", "tbf") if caps.get(k) != "ok"]
    for tool in ("nft", "socat"):
        if shutil.which(tool) is None:
            missing.append(f"{tool} is not installed (scripts/system-deps.sh installs it)")
    return missing


def up(spec: LabSpec, redis_url: str | None = None) -> LabPlan:
    """Make the lab (idempotent: an existing one of the same name is taken down first) and, given the
    operator's Redis URL, relay it to the hosts at the operator's address."""
    missing = missing_capabilities()
    if missing:
        raise Unsupported("the lab needs: " + "; ".join(missing))
    p = plan(spec)
    down(spec.name)
    taken = _routed_elsewhere([p.operator_address, *(h.address for h in p.hosts)])
    if taken:
        raise ServerError(f"lab {spec.name}: this machine already routes {taken} (another lab on "
                          f"{spec.network}?); give this one another --network")
    d = state_dir(spec.name)
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    (d / "lab.json").write_text(json.dumps(spec.document(), indent=1) + "\n")
    try:
        _realise(p)
        if redis_url:
            _start_relay(p, redis_url)
    except BaseException:
        down(spec.name)
        raise
    return p


def _realise(p: LabPlan) -> None:
    for h in p.hosts:
        hostnet.add_namespace(h.namespace, h.name)
        hostnet.exec_in(h.namespace, ["sysctl", "-qw", "net.ipv4.ip_forward=1"], check=True)
        # a host's one address sits on every link it has: loose reverse-path checks, as on a router
        for scope in ("all", "default"):  # the kernel applies the stricter of `all` and the interface's own
            hostnet.exec_in(h.namespace, ["sysctl", "-qw", f"net.ipv4.conf.{scope}.rp_filter=0"], check=True)
    for root_if, name in p.mgmt_links:
        h = p.host(name)
        hostnet.run(["ip", "link", "add", root_if, "type", "veth", "peer", "name", MGMT_IF, "netns", h.namespace])
        hostnet.run(["ip", "addr", "add", f"{p.operator_address}/32", "peer", f"{h.address}/32", "dev", root_if])
        hostnet.run(["ip", "link", "set", root_if, "up"])
    made: set[frozenset[str]] = set()
    for h in p.hosts:
        for link in h.links:
            if link.peer == "operator" or frozenset((h.name, link.peer)) in made:
                continue
            made.add(frozenset((h.name, link.peer)))
            other = p.host(link.peer)
            back = next(x for x in other.links if x.peer == h.name)
            hostnet.run(["ip", "link", "add", link.ifname, "netns", h.namespace, "type", "veth", "peer", "name",
                         back.ifname, "netns", other.namespace])
    for h in p.hosts:
        for link in h.links:
            hostnet.run(["ip", "-n", h.namespace, "addr", "add", f"{h.address}/32", "peer",
                         f"{link.peer_address}/32", "dev", link.ifname])
            hostnet.set_up(h.namespace, link.ifname, True)
            if link.tbf:
                hostnet.shape(h.namespace, link.ifname, list(link.tbf))
        for dst, via in h.routes:
            hostnet.run(["ip", "-n", h.namespace, "route", "replace", f"{dst}/32", "via", via])
        if h.nat_outside:
            _nat(h.namespace, h.nat_inside, h.nat_outside)
    for h in p.hosts:  # reported ready only once every link passes packets
        for link in h.links:
            if not hostnet.wait_carrier(h.namespace, link.ifname):
                raise ServerError(f"lab host {h.name}: link {link.ifname} did not come up")


def _routed_elsewhere(addresses: list[str]) -> str | None:
    """The first of `addresses` the root namespace already has an address or a route for, with its device."""
    for a in addresses:
        for argv in (["ip", "-j", "route", "show", f"{a}/32"], ["ip", "-j", "addr", "show", "to", f"{a}/32"]):
            found = json.loads(hostnet.run(argv, check=False).stdout or "[]")
            if found:
                return f"{a} (on {found[0].get('dev') or found[0].get('ifname')})"
    return None


def _nat(ns: str, inside: tuple[str, ...], outside: tuple[str, ...]) -> None:
    """Masquerade from inside out; forward from outside in only what answers the inside (conntrack)."""
    ins, outs = ", ".join(f'"{i}"' for i in inside), ", ".join(f'"{o}"' for o in outside)
    rules = f"""table ip slicexlab {{
  chain postrouting {{
    type nat hook postrouting priority srcnat;
    iifname {{ {ins} }} oifname {{ {outs} }} masquerade
  }}
  chain forward {{
    type filter hook forward priority filter; policy accept;
    iifname {{ {outs} }} oifname {{ {ins} }} ct state established,related accept
    iifname {{ {outs} }} oifname {{ {ins} }} drop
  }}
}}
"""
    out = subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=rules, capture_output=True, text=True,
                         timeout=15)
    if out.returncode != 0:
        raise ServerError(f"nft in {ns} failed: {out.stderr.strip()}")


def add_cable(p: LabPlan, a: str, a_if: str, b: str, b_if: str, rate_mbit: float | None = None,
              mtu: int = 9000) -> None:
    """A layer-2 circuit between two hosts (a stitching trunk, as a wide-area VLAN circuit is beside a site's IP
    uplink): a veth pair named as each side's switch expects, no address, an MTU that fits an S-tag and a
    C-tag over a full frame, checksum offload off (a userspace switch forwards it), optionally shaped."""
    ha, hb = p.host(a), p.host(b)
    hostnet.run(["ip", "link", "add", a_if, "netns", ha.namespace, "mtu", str(mtu), "type", "veth", "peer", "name",
                 b_if, "netns", hb.namespace, "mtu", str(mtu)])
    for h, ifname in ((ha, a_if), (hb, b_if)):
        hostnet.exec_in(h.namespace, ["ethtool", "-K", ifname, "tx", "off"])
        hostnet.set_up(h.namespace, ifname, True)
        if rate_mbit is not None:
            hostnet.shape(h.namespace, ifname, tbf_args(round(rate_mbit * 1000)))
    for h, ifname in ((ha, a_if), (hb, b_if)):
        if not hostnet.wait_carrier(h.namespace, ifname):
            raise ServerError(f"lab cable {a}:{a_if} - {b}:{b_if} did not come up")


# ---- the operator's Redis, relayed ------------------------------------------------------------------------------
def _relay_pid_file(lab: str) -> Path:
    return state_dir(lab) / "redis-relay.pid"


def _start_relay(p: LabPlan, redis_url: str) -> None:
    """socat listening on the operator's lab address, forwarding to the operator's Redis (which listens on
    loopback, out of the hosts' reach)."""
    u = urlsplit(redis_url)
    target = f"TCP:{u.hostname or '127.0.0.1'}:{u.port or 6379}"
    proc = subprocess.Popen(["socat", f"TCP-LISTEN:{RELAY_PORT},bind={p.operator_address},reuseaddr,fork", target],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=open(state_dir(p.spec.name) / "redis-relay.log", "ab"), start_new_session=True)
    _relay_pid_file(p.spec.name).write_text(f"{proc.pid}\n")
    (state_dir(p.spec.name) / "redis.json").write_text(json.dumps({"url": redis_url}) + "\n")
    deadline = time.monotonic() + 5
    while f"{p.operator_address}:{RELAY_PORT}" not in hostnet.run(["ss", "-ltnH"], check=False).stdout:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise ServerError(f"the lab's Redis relay did not listen on {p.operator_address}:{RELAY_PORT}; see "
                              f"{state_dir(p.spec.name) / 'redis-relay.log'}")
        time.sleep(0.05)


def hosts_redis_url(p: LabPlan, redis_url: str) -> str:
    """The operator's Redis URL as a lab host reaches it (the relay): same database, password and options."""
    u = urlsplit(redis_url)
    auth = u.netloc.rpartition("@")[0]
    return urlunsplit((u.scheme, (auth + "@" if auth else "") + f"{p.operator_address}:{RELAY_PORT}", u.path,
                       u.query, u.fragment))


def _stop_relay(lab: str) -> None:
    f = _relay_pid_file(lab)
    try:
        pid = int(f.read_text())
        if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"socat"):
            os.killpg(pid, signal.SIGTERM)
    except (OSError, ValueError):
        pass
    f.unlink(missing_ok=True)


# ---- down and status --------------------------------------------------------------------------------------------
def recorded(lab: str) -> LabSpec | None:
    try:
        return LabSpec.from_document(json.loads((state_dir(lab) / "lab.json").read_text()))
    except (OSError, ValueError):
        return None


def down(lab: str) -> list[str]:
    """Remove the lab: its relay, its hosts' namespaces (their veths go with them) and the management links'
    root ends; what it removed. Whatever the record says, namespaces named for this lab go too."""
    removed = []
    _stop_relay(lab)
    _down_homes(lab)
    prefix = f"sxlab-{lab}-"
    for ns in sorted(hostnet.namespaces()):
        if ns.startswith(prefix):
            _end_processes(ns)
            hostnet.del_namespace(ns)
            removed.append(ns)
    for name in hostnet.links():
        if name.startswith(f"sxl{lab}-"):
            hostnet.del_link(name)
    shutil.rmtree(state_dir(lab), ignore_errors=True)
    return removed


def inside(ns: str) -> list[str]:
    """The argv prefix that runs a command in a lab host: its network namespace only. Not `ip netns exec`,
    whose private mount namespace would hide the namespaces the command makes (a `slicex up --substrate netns`
    makes its nodes'; they must be reachable by name from every process, as on a real host)."""
    return ["nsenter", f"--net=/run/netns/{ns}"]


def tree_env() -> dict[str, str]:
    """The caller's environment with this source tree first on PYTHONPATH (`python -m cli` in a host runs it)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


def home_dir(lab_dir: Path, host: str, name: str) -> Path:
    """Where a lab host's slicex home lives (under the lab's state directory: it goes with the lab)."""
    return lab_dir / "homes" / host / name


def _down_homes(lab: str) -> None:
    """`slicex down` for every home of the lab's hosts, inside its host (the way an operator stops one)."""
    for home in sorted(state_dir(lab).glob("homes/*/*/slicex.yaml")):
        ns = f"sxlab-{lab}-{home.parent.parent.name}"
        if ns in hostnet.namespaces():
            subprocess.run([*inside(ns), sys.executable, "-m", "cli", "--home", str(home.parent), "down"],
                           capture_output=True, timeout=60, env=tree_env())


def _end_processes(ns: str, grace: float = 5.0) -> None:
    """End what still runs in a lab host's namespace (a `slicex up` not taken down, a switch, a router): a
    namespace outlives its deletion while a process holds it, listening on the host's address."""
    def pids() -> list[int]:
        return [int(x) for x in hostnet.run(["ip", "netns", "pids", ns], check=False).stdout.split()]

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids():
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + grace
        while pids() and time.monotonic() < deadline:
            time.sleep(0.05)


@dataclass(frozen=True)
class HostStatus:
    name: str
    namespace: str
    address: str
    exists: bool
    links: dict[str, str]  # interface -> "UP"/"DOWN"/"missing" (+ qdisc kind when shaped)


def status(lab: str) -> tuple[LabPlan | None, list[HostStatus]]:
    spec = recorded(lab)
    if spec is None:
        return None, []
    p = plan(spec)
    present = hostnet.namespaces()
    out = []
    for h in p.hosts:
        links = {}
        if h.namespace in present:
            found = hostnet.links(h.namespace)
            for link in h.links:
                d = found.get(link.ifname)
                state = d.get("operstate", "?") if d else "missing"
                if d and link.tbf:
                    q = hostnet.qdisc(h.namespace, link.ifname)
                    state += " tbf" if "tbf" in q else " UNSHAPED"
                links[link.ifname] = state
        out.append(HostStatus(h.name, h.namespace, h.address, h.namespace in present, links))
    return p, out
