"""FPGA aggregate benchmarks: shared FIB compile time, updates/s, lookups/s and CAM size for 100K prefixes ×
4 virtual routers (BGP-like, 13% shared), and the placement scheduler's time for 1,000 virtual networks.

Run: .venv/bin/python bench/fpga.py [--prefixes N] [--quick]"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bench._common import report  # noqa: E402
from fpga_aggregate.fib import SharedFib  # noqa: E402
from fpga_aggregate.migration import average_bandwidth, reconfiguration_plan, seconds_in_software  # noqa: E402
from fpga_aggregate.placement import Capacity, HardwareSlot, VirtualNetwork, schedule  # noqa: E402
from fpga_aggregate.tables import bgp_like  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prefixes", type=int, default=100_000, help="prefixes per virtual router (default 100000)")
    p.add_argument("--quick", action="store_true", help="10,000 prefixes per router")
    args = p.parse_args()
    n = 10_000 if args.quick else args.prefixes
    first = bgp_like(n, 0)
    shared = [(q, length) for q, length, _, _ in first]
    tables = [first] + [bgp_like(n, s, shared=shared, overlap=0.13) for s in range(1, 4)]
    fib = SharedFib(routers=4, l2_sets=40_000, cam_entries=1 << 20)
    t0 = time.perf_counter()
    for vid, t in enumerate(tables):
        for q, length, port, nh in t:
            fib.insert(vid, q, length, port, nh)
    compile_s = time.perf_counter() - t0
    stats = fib.stats()
    rows = [{"bench": "fpga", "measure": "table compile", "value": round(compile_s, 3), "unit": "s",
             "detail": f"{4 * n} prefixes, 4 routers"}]
    updates = [(vid, q, length) for vid, t in enumerate(tables) for q, length, _, _ in t[:5000]]
    t0 = time.perf_counter()
    for vid, q, length in updates:
        fib.delete(vid, q, length)
    for vid, q, length in updates:
        fib.insert(vid, q, length, 1, 42)
    rows.append({"bench": "fpga", "measure": "updates", "value": round(2 * len(updates) / (time.perf_counter() - t0)),
                 "unit": "updates/s", "detail": "delete + re-insert"})
    addrs = np.random.default_rng(0).integers(0, 2**32, 1_000_000)
    t0 = time.perf_counter()
    fib.lookup_many(0, addrs)
    rows.append({"bench": "fpga", "measure": "lookups (vectorised)", "value": round(len(addrs) / (time.perf_counter() - t0)),
                 "unit": "lookups/s", "detail": "image walk as the hardware does it"})
    t0 = time.perf_counter()
    for a in addrs[:100_000].tolist():
        fib.lookup(0, a)
    rows.append({"bench": "fpga", "measure": "lookups (one by one)", "value": round(100_000 / (time.perf_counter() - t0)),
                 "unit": "lookups/s", "detail": ""})
    rows.append({"bench": "fpga", "measure": "prefix overlap", "value": round(stats["overlap_pct"], 1), "unit": "%",
                 "detail": "prefixes sharing an L1 location with another router"})
    rows.append({"bench": "fpga", "measure": "CAM", "value": stats["cam_bits"], "unit": "bits",
                 "detail": f"{stats['cam_entries']} entries × {stats['cam_entry_bits']} bits (DESIGN §8: ~663 Kbit)"})
    rows.append({"bench": "fpga", "measure": "L2 sets", "value": stats["l2_sets_used"], "unit": "sets",
                 "detail": "of 2^13 entries; one 18-Mbit bank holds 64"})
    rng = np.random.default_rng(1)
    nets = [VirtualNetwork(f"v{i}", float(rng.choice([2, 5, 8, 50, 200, 600]))) for i in range(1000)]
    cap = Capacity(tuple(HardwareSlot(f"nf{i}/fpga0", 3, 1000.0) for i in range(64)), 800, 11.0)
    t0 = time.perf_counter()
    placement, _ = schedule(nets, cap)
    rows.append({"bench": "fpga", "measure": "scheduler, 1000 networks", "value": round((time.perf_counter() - t0) * 1000, 2),
                 "unit": "ms", "detail": f"{placement.total_mbps:.0f} Mbps delivered, 64 FPGAs"})
    t_sw = seconds_in_software(reconfiguration_plan("nf0/fpga0", ["v0"]))
    for period in (60, 300, 3600):
        rows.append({"bench": "fpga", "measure": f"B_avg, reconfigure every {period}s",
                     "value": round(average_bandwidth(11, 1000, t_sw, period), 1), "unit": "Mbps",
                     "detail": f"{t_sw:.0f} s in software per reconfiguration"})
    report(rows, ["measure", "value", "unit", "detail"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
