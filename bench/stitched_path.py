"""The stitched path across lab hosts beside the direct path between the same hosts: RTT and TCP throughput.

A lab (docs/lab.md) of one host per aggregate of the chosen shape (tests/integration/stitching_support.py
MODES: direct = two aggregates, translated and qinq = a transit aggregate on a third host between them), each
a `slicex up --substrate netns` with its own userspace Open vSwitch, the stitching cables layer-2 circuits
between the hosts. slicex's stitching SDK allocates, provisions and starts one stitched VLAN link (capacity
--capacity-mbit) between a node on the first host and a node on the last; then
    stitched  node to node over the link (each node's veth into its host's userspace switch, VLAN-tagged on
              the cables, translated or Q-in-Q at the transit when the shape says so)
    direct    host to host over the IP fibres between the same hosts (the kernel path)
Fibres and cables are shaped alike to --rate Mbit/s (0: unshaped), so both paths have the same wire.

Setup (lab, aggregates, slice, ARP) is outside every timed window. RTT: ping every 10 ms after three untimed
pings. Throughput: iperf3, the receiver's figure, one run = one sample. Needs root, what the lab needs and
what the netns substrate needs; says what is missing and measures nothing otherwise. Waits for the
host-network lock the netns tests take (tests/conftest.py), so it never shares the host's switches with them.

Run: .venv/bin/python bench/stitched_path.py [--modes direct,translated,qinq] [--rate MBIT]
     [--capacity-mbit MBIT] [--pings N] [--iperf-runs N] [--iperf-seconds S] [--json PATH]
Prints the tables, then one JSON object per row per line (and all of them to --json PATH)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import emit, machine, report  # noqa: E402
from bench.overlay import iperf3, ping_rtts  # noqa: E402
from bench.stats import summarise  # noqa: E402

RSPEC3 = "{http://www.geni.net/resources/rspec/3}"


def _node_namespaces(racks: dict, manifests: dict, ends: tuple[str, str]) -> dict[str, str]:
    from lxml import etree

    from authority.substrate.netns_plan import netns_name

    out = {}
    for name in ends:
        node = etree.fromstring(manifests[racks["procs"][name]["am_url"]].encode()).find(f"{RSPEC3}node")
        out[name] = netns_name(racks["prefixes"][name], node.get("sliver_id"))
    return out


def _ready(racks: dict, s: str, creds: list) -> None:
    deadline = time.monotonic() + 60
    while True:
        states = {u: {x["geni_operational_status"] for x in am.Status([s], creds, {})["value"]["geni_slivers"]}
                  for u, am in racks["ams"].items()}
        if all(v == {"geni_ready"} for v in states.values()):
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"the stitched slice did not become ready: {states}")
        time.sleep(0.25)


def measure(mode: str, rate_mbit: float | None, capacity_mbit: float, pings: int, runs: int,
            seconds: float) -> tuple[list[dict], list[dict]]:
    """One lab of the shape `mode`: rows of RTT and of throughput for the stitched and the direct path."""
    from stitching.client import StitchClient
    from tests.integration.stitching_support import lab_aggregates, request, slice_credential

    rtt_rows, tput_rows = [], []
    with tempfile.TemporaryDirectory(prefix="slicex-bench-stitched-") as tmp, \
            lab_aggregates(Path(tmp), mode, lab_name="bs", rate_mbit=rate_mbit) as racks:
        ends = (racks["names"][0], racks["names"][-1])
        sdk = StitchClient(racks["ams"], racks["topology"])
        s, creds = slice_credential(racks["sa"], f"{ends[0]}.test", "bench" + mode)
        got = sdk.allocate(s, creds, request(*ends, capacity_kbps=int(capacity_mbit * 1000)))
        try:
            manifests = sdk.provision(s, creds, got)
            sdk.start(s, creds, got)
            _ready(racks, s, creds)
            ns = _node_namespaces(racks, manifests, ends)
            first, last = (racks["host"][n] for n in ends)
            tags = "/".join(str(h.tag) for h in got.links["st0"].hops)
            # (path, client namespace, server namespace, server address)
            paths = [("stitched", ns[ends[0]], ns[ends[1]], "10.77.0.2"),
                     ("direct", first.namespace, last.namespace, last.address)]
            common = {"mode": mode, "hosts": len(racks["names"]), "wire_mbit_s": rate_mbit}
            for path, src, _dst, address in paths:
                rtt_rows.append({"bench": "stitched_rtt", "path": path, **common,
                                 **summarise(ping_rtts(src, address, pings), None, (50, 90, 99))})
            for path, src, dst, address in paths:
                mbps = [iperf3(dst, address, src, seconds) for _ in range(runs)]
                tput_rows.append({"bench": "stitched_throughput", "path": path, **common,
                                  "link_capacity_mbit_s": capacity_mbit if path == "stitched" else None,
                                  "vlan_tags": tags if path == "stitched" else "",
                                  "samples": len(mbps), "seconds_each": seconds, "mbit_s_mean": statistics.fmean(mbps),
                                  "mbit_s_min": min(mbps), "mbit_s_max": max(mbps)})
        finally:
            sdk.release(s, creds, list(got.manifests))
    direct = next(r["mbit_s_mean"] for r in tput_rows if r["path"] == "direct")
    for r in tput_rows:
        r["share_of_direct"] = r["mbit_s_mean"] / direct
    return rtt_rows, tput_rows


def missing() -> list[str]:
    """What this machine lacks for the bench (empty: it can run)."""
    from authority.substrate import hostnet
    from authority.substrate.netns import NEEDED
    from authority.substrate.ovs import missing_tools
    from lab.edge import missing_capabilities

    caps = hostnet.capabilities()
    return [*missing_capabilities(), *(f"{k}: {caps.get(k, 'not probed')}" for k in NEEDED if caps.get(k) != "ok"),
            *missing_tools()]


def main() -> int:
    from tests.integration.stitching_support import MODES

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", default="direct", help=f"path shapes, comma-separated: {', '.join(MODES)} "
                                                     f"(default direct)")
    p.add_argument("--rate", type=float, default=1000.0, help="fibres and cables in Mbit/s (default 1000; 0: "
                                                              "unshaped)")
    p.add_argument("--capacity-mbit", type=float, default=1000.0, help="the stitched link's requested capacity "
                                                                       "(default 1000)")
    p.add_argument("--pings", type=int, default=200, help="timed pings per path (default 200, for p99)")
    p.add_argument("--iperf-runs", type=int, default=3, help="iperf3 runs per path (default 3)")
    p.add_argument("--iperf-seconds", type=float, default=5.0, help="seconds per iperf3 run (default 5)")
    p.add_argument("--json", type=Path, help="also write every row (and the machine) to this file")
    args = p.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        p.error(f"--modes: unknown {', '.join(unknown)} ({', '.join(MODES)})")
    where = machine()
    print(f"machine: {where}\n")
    lacking = missing()
    if lacking:
        print("not measured: this machine lacks " + "; ".join(lacking))
        return 2
    from authority.substrate import hostnet

    rtt, tput = [], []
    with hostnet.host_lock("host-network"):  # the netns tests' turn on the host's network (tests/conftest.py)
        for mode in modes:
            got = measure(mode, args.rate or None, args.capacity_mbit, args.pings, args.iperf_runs,
                          args.iperf_seconds)
            rtt, tput = rtt + got[0], tput + got[1]
    report(rtt, ["mode", "path", "samples", "mean_ms", "p50_ms", "p90_ms", "p99_ms"],
           title="RTT across lab hosts, ping every 10 ms (ms)", json_lines=False)
    report(tput, ["mode", "path", "wire_mbit_s", "link_capacity_mbit_s", "vlan_tags", "samples", "seconds_each",
                  "mbit_s_mean", "mbit_s_min", "mbit_s_max", "share_of_direct"],
           title="TCP throughput across lab hosts, iperf3 receiver (Mbit/s; one sample = one run)", json_lines=False)
    emit(rtt + tput)
    if args.json:
        args.json.write_text(json.dumps({"machine": where, "rows": rtt + tput}, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
