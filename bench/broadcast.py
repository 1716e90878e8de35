"""Broadcast flood across slices on the netns substrate's switch: does one slice's broadcast storm cut another
slice's throughput?

The switch is the driver's: a private Open vSwitch with the userspace (netdev) datapath and the driver's own
OpenFlow rules (authority/substrate/flows.py: a segment per link, broadcast flooded to the segment's other
ports only). Two segments, as two slices' links would be:
  slice A   a1 — a2          TCP throughput (iperf3, receiver's goodput, one run = one sample)
  slice B   b1 — b2 — b3     b1 sends UDP broadcast to its segment as fast as it can (no link capacity set:
                             the worst case; a shaped link's token bucket would cap b1's send rate)
Frames are never delivered to A's ports (the rules keep segments apart): what B can take from A is
the switch's CPU, which replicates every broadcast frame to each other port of B's segment.

Each round measures A three times: alone, beside B's flood, and beside it with b1's port policed as the driver
polices every node interface (authority/substrate/hostnet.py `shape_and_police`: broadcast and multicast held
to --bcast-kbps). Beside A's goodput it reports the frames the switch delivered to b2 and the CPU seconds the
switch (ovs-vswitchd) used during the window: the flooder's own CPU is a node's, capped by its cgroup on a real
node, and is not what policing removes.

Run (root, Open vSwitch, iperf3): .venv/bin/python bench/broadcast.py [--rounds N] [--seconds S] [--size BYTES]
     [--bcast-kbps K] [--json PATH]
It takes the host-network lock the netns tests take, so it never runs beside them (one userspace datapath per
host). Prints a table, then one JSON object per row."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from authority.substrate import hostnet  # noqa: E402
from authority.substrate.flows import AccessPort, Segment, segment_flows  # noqa: E402
from authority.substrate.openflow import OfctlProgrammer  # noqa: E402
from authority.substrate.ovs import OvsSwitch  # noqa: E402
from bench._common import machine, report  # noqa: E402

PREFIX = "sxbc"
RUN_DIR = Path("/run/slicex-ovbc01")  # the tests' orphan sweep knows this pattern (tests/conftest.py)
BRIDGE = f"{PREFIX}-br"
DPID = 0xBC01
NODES = {"a1": ("10.61.0.1/24", 101), "a2": ("10.61.0.2/24", 101),
         "b1": ("10.62.0.1/24", 102), "b2": ("10.62.0.2/24", 102), "b3": ("10.62.0.3/24", 102)}
FLOOD = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
data, stop = b"x" * int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
sent = 0
while time.monotonic() < stop:
    for _ in range(256):
        try:
            s.sendto(data, ("10.62.0.255", 9))
            sent += 1
        except OSError:
            pass
print(sent)
"""


def mac(i: int) -> str:
    return f"02:bc:00:00:00:{i:02x}"


def ns(node: str) -> str:
    return f"{PREFIX}-{node}"


def build(ovs: OvsSwitch, policed_kbps: int) -> dict[str, int]:
    """The namespaces, their ports on the bridge and the driver's rules; node -> OpenFlow port."""
    ovs.start()
    ovs.ensure_bridge(BRIDGE, DPID, None)
    ofports: dict[str, int] = {}
    for i, (node, (address, _vlan)) in enumerate(NODES.items(), 1):
        hostnet.add_namespace(ns(node), node)
        host_if = f"{PREFIX}{node}h"
        hostnet.add_veth(ns(node), "eth0", host_if, mac(i))
        hostnet.set_address(ns(node), "eth0", address)
        if policed_kbps:
            hostnet.shape_and_police(ns(node), "eth0", None, policed_kbps)
        hostnet.set_up(ns(node), "eth0", True)
        ofports[node] = ovs.add_port(BRIDGE, host_if)
    segments = [Segment(vlan, tuple(AccessPort(ofports[n], mac(i)) for i, (n, (_a, v)) in enumerate(NODES.items(), 1)
                                    if v == vlan)) for vlan in (101, 102)]
    OfctlProgrammer(ovs).apply(BRIDGE, DPID, segment_flows(segments))
    for node in NODES:
        hostnet.wait_carrier(ns(node), "eth0")
    return ofports


def teardown(ovs: OvsSwitch) -> None:
    for node in NODES:
        hostnet.run(["ip", "link", "del", f"{PREFIX}{node}h"], check=False)
        hostnet.del_namespace(ns(node))
    ovs.stop(remove=True)


def iperf3(seconds: int) -> float:
    srv = subprocess.Popen(["ip", "netns", "exec", ns("a2"), "iperf3", "-s", "-1", "-B", "10.61.0.2"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):
            if ":5201" in hostnet.exec_in(ns("a2"), ["ss", "-ltn"]).stdout:
                break
            time.sleep(0.1)
        out = hostnet.exec_in(ns("a1"), ["iperf3", "-c", "10.61.0.2", "-t", str(seconds), "-O", "1", "-J"],
                              timeout=seconds + 30)
        end = json.loads(out.stdout)["end"]
        return end["sum_received"]["bytes"] * 8 / max(end["sum_sent"]["seconds"], end["sum_received"]["seconds"]) / 1e6
    finally:
        srv.kill()
        srv.wait(5)


def flood(size: int, seconds: float) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", ns("b1"), sys.executable, "-c", FLOOD, str(size), str(seconds)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def delivered(ovs: OvsSwitch, node: str) -> int:
    return ovs.port_counters(f"{PREFIX}{node}h").get("tx_packets", 0)  # the switch sent to the node


def switch_cpu(ovs: OvsSwitch) -> float:
    """CPU seconds ovs-vswitchd has used (user + system)."""
    pid = (ovs.run_dir / "ovs-vswitchd.pid").read_text().split()[0]
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def police_b1(rate: int) -> None:
    """b1's policer on (`rate` kbit/s) or off (0): the flooder's port, as the driver would leave it."""
    if rate:
        hostnet.shape_and_police(ns("b1"), "eth0", None, rate)
    else:
        hostnet.shape(ns("b1"), "eth0", None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--size", type=int, default=64, help="UDP payload of each broadcast (small: most frames)")
    p.add_argument("--bcast-kbps", type=int, default=0, help="the policer's rate (default: the driver's)")
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("bench/broadcast.py needs root (namespaces, veths, Open vSwitch)", file=sys.stderr)
        return 2
    rate = args.bcast_kbps or hostnet.BROADCAST_KBPS
    print(f"broadcast flood across slices: {machine()}; each round: A alone, A beside B's flood unpoliced, A "
          f"beside it policed at {rate} kbit/s on b1's port")
    ovs = OvsSwitch(RUN_DIR)
    rows: list[dict] = []
    cells: dict[str, list[tuple[float, int, float]]] = {"alone": [], "flood": [], "flood_policed": []}
    with hostnet.host_lock("host-network"):
        try:
            teardown(ovs)
            build(ovs, 0)
            iperf3(1)  # warm: ARP, the datapath's caches
            for r in range(1, args.rounds + 1):
                for cell in cells:
                    police_b1(rate if cell == "flood_policed" else 0)
                    before, cpu = delivered(ovs, "b2"), switch_cpu(ovs)
                    f = flood(args.size, args.seconds + 3) if cell != "alone" else None
                    if f is not None:
                        time.sleep(1)
                    mbps = iperf3(args.seconds)
                    if f is not None:
                        f.communicate(timeout=args.seconds + 30)
                    cells[cell].append((mbps, delivered(ovs, "b2") - before, switch_cpu(ovs) - cpu))
                    rows.append({"bench": "broadcast_flood", "round": r, "cell": cell, "a_mbps": round(mbps, 1),
                                 "b2_frames": cells[cell][-1][1], "switch_cpu_s": round(cells[cell][-1][2], 2)})
        finally:
            teardown(ovs)
    load = os.getloadavg()
    for cell, got in cells.items():
        rows.append({"bench": "broadcast_flood", "round": "median", "cell": cell,
                     "a_mbps": round(statistics.median(g[0] for g in got), 1),
                     "b2_frames": int(statistics.median(g[1] for g in got)),
                     "switch_cpu_s": round(statistics.median(g[2] for g in got), 2), "policer_kbps": rate,
                     "payload": args.size, "load_end": f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"})
    report(rows, ["round", "cell", "a_mbps", "b2_frames", "switch_cpu_s"])
    if args.json:
        Path(args.json).write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
