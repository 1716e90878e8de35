"""FPGA aggregate benchmarks: the shared FIB at 100K prefixes × 4 virtual routers (compile time, updates/s,
lookups/s, CAM size), the overlap and CAM report for 100K prefixes spread over 4 routers against DESIGN §8's
~663 Kbit, the placement scheduler's time for 1,000 virtual networks, B_avg for reconfiguration periods, and
packets lost through a reconfiguration in the emulated data plane.

Run: .venv/bin/python bench/fpga.py [--quick] [--prefixes N]"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bench._common import report  # noqa: E402
from fpga_aggregate.dataplane import EmulatedDataPlane, SoftwareTable, run_plan  # noqa: E402
from fpga_aggregate.fib import SharedFib  # noqa: E402
from fpga_aggregate.migration import bandwidth_report, reconfiguration_plan  # noqa: E402
from fpga_aggregate.placement import Capacity, HardwareSlot, VirtualNetwork, schedule  # noqa: E402
from fpga_aggregate.tables import virtual_router_tables  # noqa: E402

DESIGN_CAM_BITS = 663_000
PAPER_ENTRY_BITS = 51  # 663 Kbit / (13% of 100K prefixes)


def row(measure: str, value, unit: str, detail: str = "") -> dict:
    return {"bench": "fpga", "measure": measure, "value": value, "unit": unit, "detail": detail}


def fib_at_scale(per_router: int, density: float) -> list[dict]:
    """Compile 4 tables of `per_router` prefixes; time updates and lookups."""
    tables = virtual_router_tables(per_router, routers=4, overlap=0.13, seed=0, density=density)
    fib = SharedFib(routers=4, l2_sets=int(4 * per_router / density * 1.2) + 256, cam_entries=1 << 17)
    t0 = time.perf_counter()
    for vid, t in enumerate(tables):
        fib.load(vid, t)
    compile_s = time.perf_counter() - t0
    n = 4 * per_router
    rows = [row("table compile", round(compile_s, 3), "s", f"{n} prefixes, 4 routers, vectorised bulk load"),
            row("compile rate", round(n / compile_s), "prefixes/s", "")]
    updates = [(vid, p, length) for vid, t in enumerate(tables) for p, length, _, _ in t[:: max(1, per_router // 2500)]]
    t0 = time.perf_counter()
    for vid, p, length in updates:
        fib.delete(vid, p, length)
    for vid, p, length in updates:
        fib.insert(vid, p, length, 1, 42)
    rows.append(row("updates", round(2 * len(updates) / (time.perf_counter() - t0)), "updates/s",
                    f"{len(updates)} deletes then re-inserts, incremental"))
    addrs = np.random.default_rng(0).integers(0, 2**32, 1_000_000)
    t0 = time.perf_counter()
    for vid in range(4):
        fib.lookup_many(vid, addrs)
    rows.append(row("lookups (vectorised)", round(4 * len(addrs) / (time.perf_counter() - t0)), "lookups/s",
                    "walk of the image: CAM, owner tag, L1, L2"))
    t0 = time.perf_counter()
    for a in addrs[:100_000].tolist():
        fib.lookup(0, a)
    rows.append(row("lookups (one by one)", round(100_000 / (time.perf_counter() - t0)), "lookups/s",
                    "CAM probed per length present"))
    s = fib.stats()
    rows += [row("prefix overlap", round(s["overlap_pct"], 1), "%", "prefixes with an L1 location another router needs"),
             row("CAM", s["cam_bits"], "bits", f"{s['cam_entries']} entries x {s['cam_entry_bits']} bits"),
             row("L2 sets", s["l2_sets_used"], "sets", f"of 2^13 entries; one 18-Mbit bank holds 64 (density {density:g})")]
    return rows


def cam_report(total: int, density: float) -> list[dict]:
    """DESIGN §8's setting: `total` prefixes spread over 4 routers, 13% shared."""
    tables = virtual_router_tables(total // 4, routers=4, overlap=0.13, seed=1, density=density)
    fib = SharedFib(routers=4, l2_sets=int(total / density * 1.3) + 256, cam_entries=1 << 17)
    for vid, t in enumerate(tables):
        fib.load(vid, t)
    s = fib.stats()
    per_prefix = s["overlapping_prefixes"] * s["cam_entry_bits"]
    return [
        row("report: prefix overlap", round(s["overlap_pct"], 1), "%", f"{total} prefixes over 4 routers (DESIGN: 12-15%)"),
        row("report: CAM", s["cam_bits"], "bits",
            f"{s['cam_entries']} ranges x {s['cam_entry_bits']} bits (VID 2 + prefix 19 + length 5 + index 19)"),
        row("report: CAM, one entry per overlapping prefix", per_prefix, "bits",
            f"{s['overlapping_prefixes']} x {s['cam_entry_bits']}; with 32-bit prefixes "
            f"{s['overlapping_prefixes'] * (s['cam_entry_bits'] + 13)}"),
        row("report: DESIGN §8 figure", DESIGN_CAM_BITS, "bits",
            f"100K prefixes, 13% overlap: ~13000 entries x {PAPER_ENTRY_BITS} bits"),
    ]


def scheduler(count: int) -> list[dict]:
    rng = np.random.default_rng(1)
    nets = [VirtualNetwork(f"v{i}", float(rng.choice([2, 5, 8, 50, 200, 600])), int(rng.integers(100, 20_000)))
            for i in range(count)]
    fpgas = max(1, count // 16)
    cap = Capacity(tuple(HardwareSlot(f"nf{i}/fpga0", 3, 1000.0) for i in range(fpgas)), count * 8 // 10)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        placement, _ = schedule(nets, cap)
        times.append(time.perf_counter() - t0)
    changed = [VirtualNetwork(n.id, n.demand_mbps * (3 if i % 10 == 0 else 1), n.table_entries) for i, n in enumerate(nets)]
    t0 = time.perf_counter()
    _, moves = schedule(changed, cap, placement.where)
    rerun = time.perf_counter() - t0
    return [row(f"scheduler, {count} networks", round(statistics.median(times) * 1000, 2), "ms",
                f"{placement.total_mbps:.0f} Mbps delivered on {fpgas} FPGAs + software, {len(placement.unplaced)} unplaced"),
            row(f"scheduler re-run, {count} networks", round(rerun * 1000, 2), "ms",
                f"10% of demands tripled: {len(moves)} migrations")]


def reconfiguration() -> list[dict]:
    rows = [row(f"B_avg, reconfigure every {r['period_s']:g}s", round(r["b_avg_mbps"], 1), "Mbps",
                f"{r['seconds_in_software']:g} s of each period in software (11 vs 1000 Mbps)")
            for r in bandwidth_report([60.0, 300.0, 3600.0])]
    tables = virtual_router_tables(500, routers=2, overlap=0.13, seed=3, density=20)
    fib = SharedFib(routers=2, l2_sets=256)
    plane = EmulatedDataPlane(buffer_packets=256)
    plane.add_fpga("nf0/fpga0", 1000.0)
    for vid, t in enumerate(tables):
        fib.load(vid, t)
        plane.add_network(f"n{vid}", "nf0/fpga0", lambda a, v=vid: _hw(fib, v, a), SoftwareTable(t))
    traffic = {f"n{vid}": [p for p, _, _, _ in t] for vid, t in enumerate(tables)}
    run_plan(plane, reconfiguration_plan("nf0/fpga0", ["n0", "n1"]), traffic, {"n0": 400.0, "n1": 400.0})
    offered = sum(n.offered for n in plane.networks.values())
    rows.append(row("reconfiguration with migration, packets lost", plane.dropped, "packets",
                    f"of {offered} offered at 2 x 4.8 Mbps"))
    naive = EmulatedDataPlane(buffer_packets=256)
    naive.add_fpga("nf0/fpga0", 1000.0)
    for vid, t in enumerate(tables):
        naive.add_network(f"n{vid}", "nf0/fpga0", lambda a, v=vid: _hw(fib, v, a), SoftwareTable(t))
    run_plan(naive, [s for s in reconfiguration_plan("nf0/fpga0", ["n0"]) if s.action == "reprogram"], traffic,
             {"n0": 400.0, "n1": 400.0})
    rows.append(row("reconfiguration without migration, packets lost", naive.dropped, "packets",
                    f"of {sum(n.offered for n in naive.networks.values())} offered; 256-packet buffers"))
    return rows


def _hw(fib: SharedFib, vid: int, addr: int):
    r = fib.lookup(vid, addr)
    return None if r is None else (r.port, r.next_hop)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prefixes", type=int, default=100_000, help="prefixes per virtual router (default 100000)")
    p.add_argument("--quick", action="store_true", help="10,000 prefixes per router, 100 networks")
    args = p.parse_args()
    per_router = 10_000 if args.quick else args.prefixes
    rows = fib_at_scale(per_router, density=40)
    rows += cam_report(per_router if args.quick else 100_000, density=16)
    rows += scheduler(100 if args.quick else 1000)
    rows += reconfiguration()
    report(rows, ["measure", "value", "unit", "detail"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
