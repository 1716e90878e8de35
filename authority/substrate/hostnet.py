"""Linux host networking edge for the netns substrate: namespaces, veth pairs, addresses, tc qdiscs and
offloads, through iproute2 and ethtool. Every call names its objects; nothing here decides what to create
(that is authority/substrate/netns_plan.py)."""

from __future__ import annotations

import fcntl
import functools
import json
import os
import re
import shutil
import subprocess
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

from slicex.errors import ServerError

NETNS_ETC = Path("/etc/netns")


def run(argv: list[str], check: bool = True, timeout: float = 15) -> subprocess.CompletedProcess:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ServerError(f"`{' '.join(argv)}` did not finish within {timeout:.0f} s") from None
    except FileNotFoundError:
        raise ServerError(f"{argv[0]} is not installed (scripts/system-deps.sh installs it)") from None
    if check and out.returncode != 0:
        raise ServerError(f"`{' '.join(argv)}` failed: {(out.stderr or out.stdout).strip()}")
    return out


# ---- capabilities (probed once per process, in a throwaway namespace) -----------------------------------------
@functools.cache
def capabilities() -> dict[str, str]:
    """Each feature the driver may use: "ok" or why it is unavailable on this host."""
    caps: dict[str, str] = {}
    if os.geteuid() != 0:
        return {"root": "not root: namespaces, veths and qdiscs need CAP_NET_ADMIN"}
    caps["root"] = "ok"
    for tool in ("ip", "tc", "ethtool"):
        caps[tool] = "ok" if shutil.which(tool) else f"{tool} is not installed"
    if caps["ip"] != "ok" or caps["tc"] != "ok":
        return caps
    ns = f"sxprobe-{uuid.uuid4().hex[:8]}"
    if run(["ip", "netns", "add", ns], check=False).returncode != 0:
        caps["netns"] = "cannot create network namespaces (ip netns add failed)"
        return caps
    try:
        caps["netns"] = "ok"
        veth = run(["ip", "-n", ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1"], check=False)
        caps["veth"] = "ok" if veth.returncode == 0 else f"no veth pairs: {veth.stderr.strip()}"
        run(["ip", "-n", ns, "link", "set", "lo", "up"], check=False)
        for qdisc, args in (("tbf", ["tbf", "rate", "1mbit", "burst", "3200", "limit", "10000"]),
                            ("netem", ["netem", "delay", "1ms"])):
            r = run(["tc", "-n", ns, "qdisc", "replace", "dev", "lo", "root", *args], check=False)
            caps[qdisc] = "ok" if r.returncode == 0 else (
                f"the kernel has no {qdisc} qdisc (sch_{qdisc}): {r.stderr.strip()}")
            run(["tc", "-n", ns, "qdisc", "del", "dev", "lo", "root"], check=False)
        if caps["veth"] == "ok":  # what every node interface gets (shape_and_police): sch_htb, cls_u32
            try:
                shape_and_police(ns, "p0", None)
                caps["broadcast_policer"] = "ok"
            except ServerError as exc:
                caps["broadcast_policer"] = f"no broadcast policer (sch_htb, cls_u32): {exc}"
    finally:
        run(["ip", "netns", "del", ns], check=False)
    return caps


# ---- namespaces --------------------------------------------------------------------------------------------------
def namespaces() -> set[str]:
    out = run(["ip", "-j", "netns", "list"], check=False)
    try:
        return {d["name"] for d in json.loads(out.stdout or "[]")}
    except ValueError:
        return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def add_namespace(ns: str, hostname: str) -> None:
    """A namespace with loopback up and its own /etc/hostname and /etc/hosts (`ip netns exec` bind-mounts
    /etc/netns/<ns>/* over /etc), so commands run in it see the node's name."""
    if ns not in namespaces():
        run(["ip", "netns", "add", ns])
    run(["ip", "-n", ns, "link", "set", "lo", "up"])
    etc = NETNS_ETC / ns
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "hostname").write_text(hostname + "\n")
    (etc / "hosts").write_text(f"127.0.0.1\tlocalhost\n127.0.1.1\t{hostname}\n")


def del_namespace(ns: str) -> None:
    """Delete a namespace (its veth ends go with it, and so their peers) and its /etc files."""
    if ns in namespaces():
        run(["ip", "netns", "del", ns])
    shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)


def exec_in(ns: str, argv: list[str], timeout: float = 30, check: bool = False) -> subprocess.CompletedProcess:
    return run(["ip", "netns", "exec", ns, *argv], check=check, timeout=timeout)


# ---- links -------------------------------------------------------------------------------------------------------
def links(ns: str | None = None) -> dict[str, dict]:
    """Interfaces by name (in a namespace, or the host's) with iproute2's JSON details."""
    argv = ["ip", "-j"] + (["-n", ns] if ns else []) + ["link", "show"]
    out = run(argv, check=False)
    try:
        return {d["ifname"]: d for d in json.loads(out.stdout or "[]")}
    except ValueError:
        return {}


def add_veth(ns: str, ns_if: str, host_if: str, mac: str) -> None:
    """A veth pair: `ns_if` inside the namespace with the node's MAC, `host_if` on the host; both with
    transmit checksum offload off (the userspace switch would otherwise pass TCP segments with bad
    checksums)."""
    inside = links(ns)
    if ns_if in inside and host_if in links():
        return
    run(["ip", "link", "del", host_if], check=False)  # half a pair from an interrupted create
    run(["ip", "-n", ns, "link", "del", ns_if], check=False)
    run(["ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if, "netns", ns])
    run(["ip", "-n", ns, "link", "set", ns_if, "address", mac])
    run(["ethtool", "-K", host_if, "tx", "off"], check=False)
    exec_in(ns, ["ethtool", "-K", ns_if, "tx", "off"])
    run(["ip", "link", "set", host_if, "up"])


def remove_prefixed(prefix: str) -> None:
    """Delete the namespaces named `<prefix>-…` and the host links named `<prefix>…` (what a run that used
    `prefix` for its names left behind)."""
    for ns in namespaces():
        if ns.startswith(prefix + "-"):
            del_namespace(ns)
    for name in links():
        if name.startswith(prefix):
            del_link(name)


def add_trunk(a: str, b: str, mtu: int = 9000) -> None:
    """A veth "trunk" between two aggregates' bridges on this host (a stitched cable): both ends up, in the
    host's namespace, checksum offload off, and an MTU above 1500 so a full frame fits under an S-tag and a
    C-tag (a veth drops a frame longer than MTU + one VLAN tag)."""
    # Two aggregates on one host may start a stitched link over the same cable at the same moment (the
    # exchange point starts both halves in parallel): one makes it, the other finds it made. Without the lock
    # the second deleted the pair the first was still setting up.
    with host_lock("trunks"):
        if a in links() and b in links():
            return
        run(["ip", "link", "del", a], check=False)
        run(["ip", "link", "del", b], check=False)
        run(["ip", "link", "add", a, "mtu", str(mtu), "type", "veth", "peer", "name", b, "mtu", str(mtu)])
        for end in (a, b):
            run(["ethtool", "-K", end, "tx", "off"], check=False)
            run(["ip", "link", "set", end, "up"])


@contextmanager
def host_lock(name: str):
    """A lock every process on this host shares (an flock on a file under /run/lock)."""
    path = Path("/run/lock") / f"slicex-{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def set_address(ns: str, ifname: str, address: str) -> None:
    run(["ip", "-n", ns, "addr", "replace", address, "dev", ifname])


def set_up(ns: str, ifname: str, up: bool) -> None:
    run(["ip", "-n", ns, "link", "set", ifname, "up" if up else "down"])


def wait_carrier(ns: str, ifname: str, timeout: float = 3.0) -> bool:
    """Wait until an interface set up is operationally up (its veth peer too), so a node reported ready
    passes packets at once."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if links(ns).get(ifname, {}).get("operstate") == "UP":
            return True
        time.sleep(0.02)
    return False


def is_up(ns: str, ifname: str) -> bool:
    d = links(ns).get(ifname)
    return bool(d) and "UP" in d.get("flags", [])


def move_link(ifname: str, ns: str) -> None:
    """Move a host interface into another network namespace (a switch's on another lab host) and bring it up
    there; one already there is left as it is."""
    if ifname in links(ns):
        return
    run(["ip", "link", "set", ifname, "netns", ns])
    run(["ip", "-n", ns, "link", "set", ifname, "up"])


def del_link(ifname: str, ns: str | None = None) -> None:
    """Delete an interface (a veth's peer goes with it), in namespace `ns` (None: the host's); gone is fine."""
    run(["ip", *(["-n", ns] if ns else []), "link", "del", ifname], check=False)


# ---- traffic control ---------------------------------------------------------------------------------------------
def shape(ns: str | None, ifname: str, tbf: list[str] | None) -> None:
    """Egress token bucket on an interface (None removes it)."""
    base = ["tc"] + (["-n", ns] if ns else [])
    if tbf is None:
        run(base + ["qdisc", "del", "dev", ifname, "root"], check=False)
    else:
        run(base + ["qdisc", "replace", "dev", ifname, "root", *tbf])


BROADCAST_KBPS = 1000
"""What a node interface may send to broadcast and multicast addresses (ARP, IPv6 neighbour discovery, mDNS),
kbit/s: plenty for address resolution, far below what costs the shared userspace switch a core (bench/
broadcast.py: an unpoliced flood of small frames took a third of another slice's TCP throughput)."""
BROADCAST_QUEUE = 32  # frames waiting for the policer's tokens; beyond, a flood is dropped where it starts


def shape_and_police(ns: str, ifname: str, tbf: list[str] | None, broadcast_kbps: int = BROADCAST_KBPS) -> None:
    """A node interface's egress (its namespace's end, which the node's root cannot change): the link's token
    bucket if it has one (root qdisc `tbf`, as `shape` makes it), and beneath it an HTB whose class for frames
    to a group address (the I/G bit of the destination MAC, classified by u32: broadcast and every multicast)
    holds them to `broadcast_kbps` with a short queue; everything else passes unlimited (the tbf above, if any,
    is the link's limit). Built afresh each time (idempotent)."""
    base = ["tc", "-n", ns]
    run(base + ["qdisc", "del", "dev", ifname, "root"], check=False)
    if tbf is not None:
        run(base + ["qdisc", "add", "dev", ifname, "root", "handle", "1:", *tbf])
        run(base + ["qdisc", "add", "dev", ifname, "parent", "1:1", "handle", "10:", "htb", "default", "20"])
    else:
        run(base + ["qdisc", "add", "dev", ifname, "root", "handle", "10:", "htb", "default", "20"])
    rate = f"{broadcast_kbps}kbit"
    run(base + ["class", "add", "dev", ifname, "parent", "10:", "classid", "10:10", "htb", "rate", rate, "ceil", rate])
    run(base + ["class", "add", "dev", ifname, "parent", "10:", "classid", "10:20", "htb", "rate", "100gbit", "burst",
                "1mb", "cburst", "1mb"])
    run(base + ["qdisc", "add", "dev", ifname, "parent", "10:10", "handle", "11:", "pfifo", "limit",
                str(BROADCAST_QUEUE)])
    run(base + ["filter", "add", "dev", ifname, "parent", "10:", "protocol", "all", "prio", "1", "u32", "match",
                "u8", "0x01", "0x01", "at", "-14", "flowid", "10:10"])


def broadcast_policer(ns: str, ifname: str) -> dict[str, int] | None:
    """The broadcast class of a node interface (`shape_and_police`): its rate (bit/s), and the frames it sent
    and dropped; None when the interface has none."""
    out = run(["tc", "-n", ns, "-s", "class", "show", "dev", ifname, "classid", "10:10"], check=False).stdout
    rate = re.search(r"\brate (\d+)([KMG]?)bit", out)
    sent = re.search(r"Sent \d+ bytes (\d+) pkt \(dropped (\d+)", out)
    if "htb" not in out or rate is None or sent is None:
        return None
    scale = {"": 1, "K": 1000, "M": 1000_000, "G": 1000_000_000}[rate.group(2)]
    return {"rate_bps": int(rate.group(1)) * scale, "sent": int(sent.group(1)), "dropped": int(sent.group(2))}


def qdisc(ns: str | None, ifname: str) -> str:
    base = ["tc"] + (["-n", ns] if ns else [])
    return run(base + ["qdisc", "show", "dev", ifname], check=False).stdout


# ---- VM nodes' taps ----------------------------------------------------------------------------------------------
def add_tap(ns: str, name: str, uid: int) -> None:
    """A tap device in namespace `ns` that uid `uid` (a VM node's QEMU) may attach to; up (its carrier follows
    QEMU's attachment). An existing one is kept."""
    if name not in links(ns):
        run(["ip", "-n", ns, "tuntap", "add", "dev", name, "mode", "tap", "user", str(uid), "group", str(uid)])
    run(["ip", "-n", ns, "link", "set", name, "up"])


def join_redirect(ns: str, a: str, b: str) -> None:
    """Join two interfaces of a namespace without a bridge: what arrives on either leaves by the other (an
    ingress u32 match-all with a mirred egress redirect each way), through the other's egress qdiscs (its
    token bucket and broadcast policer). Made afresh each time."""
    for src, dst in ((a, b), (b, a)):
        run(["tc", "-n", ns, "qdisc", "del", "dev", src, "ingress"], check=False)
        run(["tc", "-n", ns, "qdisc", "add", "dev", src, "handle", "ffff:", "ingress"])
        run(["tc", "-n", ns, "filter", "add", "dev", src, "parent", "ffff:", "protocol", "all", "prio", "1", "u32",
             "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", dst])


def no_ipv6(ns: str, ifname: str) -> None:
    """No address of the namespace's own on an interface a guest's NIC is joined to (it would answer or send
    beside the guest, under the guest's MAC)."""
    exec_in(ns, ["sysctl", "-q", "-w", f"net.ipv6.conf.{ifname}.disable_ipv6=1"])
