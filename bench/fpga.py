"""FPGA aggregate benchmarks: the shared FIB at 100K prefixes × 4 virtual routers (compile time, updates/s,
lookups/s), the prefix overlap found in the generated tables and the Conflict CAM the compiled FIB holds
(read back from it) for 100K prefixes over 4 routers, the placement scheduler's time for 1,000 virtual
networks, and packets lost through a reconfiguration in the emulated data plane.

Measurements and model values are printed apart: the "model" table holds values of formulas (DESIGN §8's
B_avg migration bandwidth, a CAM sized at one entry per overlapping prefix), never among measurements.
The generator's overlap setting is an input and shows only in a row's detail. `samples` says how many
timed runs (or, for a rate, how many operations in the timed batch) a row comes from.

Run: .venv/bin/python bench/fpga.py [--quick] [--prefixes N] [--compiles N]"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bench._common import emit, machine, report  # noqa: E402
from bench.stats import percentile  # noqa: E402
from fpga_aggregate.dataplane import EmulatedDataPlane, SoftwareTable, run_plan  # noqa: E402
from fpga_aggregate.fib import SharedFib  # noqa: E402
from fpga_aggregate.migration import bandwidth_report, reconfiguration_plan  # noqa: E402
from fpga_aggregate.placement import Capacity, HardwareSlot, VirtualNetwork, schedule  # noqa: E402
from fpga_aggregate.tables import virtual_router_tables  # noqa: E402

GENERATOR_OVERLAP = 0.13  # an input: the share of each table the generator makes common to all routers


def row(measure: str, value, unit: str, detail: str = "", samples: int | None = 1, kind: str = "measured") -> dict:
    return {"bench": "fpga", "kind": kind, "measure": measure, "value": value, "unit": unit, "samples": samples,
            "detail": detail}


def table_overlap(tables) -> tuple[float, int, int]:
    """Measured on the generated tables: the share of all routes whose prefix (address, length) another
    router's table also holds; (percent, such routes, all routes)."""
    seen: dict[tuple[int, int], int] = {}
    for t in tables:
        for p, length in {(p, length) for p, length, _, _ in t}:
            seen[(p, length)] = seen.get((p, length), 0) + 1
    total = sum(len(t) for t in tables)
    shared = sum(1 for t in tables for p, length, _, _ in t if seen[(p, length)] > 1)
    return 100.0 * shared / total, shared, total


def cam_rows(fib: SharedFib, tables, prefix: str, detail: str) -> list[dict]:
    """Overlap found in the tables and in the compiled image, and the Conflict CAM read back from the FIB."""
    pct, shared, total = table_overlap(tables)
    s = fib.stats()
    entries = fib.cam_entries()  # what a loader writes to the board's CAM
    bits = fib.cam_entry_bits()
    return [
        row(f"{prefix}prefix overlap in the tables", round(pct, 1), "%",
            f"{shared} of {total} routes share their prefix with another router ({detail}; generator set to "
            f"{GENERATOR_OVERLAP:.0%})", samples=None),
        row(f"{prefix}prefix overlap in the compiled FIB", round(s["overlap_pct"], 1), "%",
            f"{s['overlapping_prefixes']} routes with an L1 location another router needs", samples=None),
        row(f"{prefix}Conflict CAM in use", len(entries) * bits, "bits",
            f"{len(entries)} entries read back x {bits} bits (VID {fib.vid_bits} + prefix 19 + length 5 + "
            f"index 19); built with room for {fib.cam_capacity} ({fib.cam_capacity * bits} bits)", samples=None),
    ]


def fib_at_scale(per_router: int, density: float, compiles: int) -> list[dict]:
    """Compile 4 tables of `per_router` prefixes; time updates and lookups."""
    tables = virtual_router_tables(per_router, routers=4, overlap=GENERATOR_OVERLAP, seed=0, density=density)
    times = []
    for _ in range(compiles):
        fib = SharedFib(routers=4, l2_sets=int(4 * per_router / density * 1.2) + 256, cam_entries=1 << 17)
        t0 = time.perf_counter()
        for vid, t in enumerate(tables):
            fib.load(vid, t)
        times.append(time.perf_counter() - t0)
    n = 4 * per_router
    compile_s = percentile(times, 50)
    rows = [row("table compile (median)", None if compile_s is None else round(compile_s, 3), "s",
                f"{n} prefixes, 4 routers, vectorised bulk load, each run into a new FIB", samples=len(times)),
            row("compile rate", None if compile_s is None else round(n / compile_s), "prefixes/s",
                "prefixes / median compile time", samples=len(times))]
    updates = [(vid, p, length) for vid, t in enumerate(tables) for p, length, _, _ in t[:: max(1, per_router // 2500)]]
    lat = []
    for vid, p, length in updates:
        t0 = time.perf_counter()
        fib.delete(vid, p, length)
        lat.append(time.perf_counter() - t0)
    for vid, p, length in updates:
        t0 = time.perf_counter()
        fib.insert(vid, p, length, 1, 42)
        lat.append(time.perf_counter() - t0)
    p50, p99 = percentile(lat, 50), percentile(lat, 99)
    rows.append(row("updates", round(len(lat) / sum(lat)), "updates/s",
                    f"{len(updates)} deletes then re-inserts, each timed: p50 {p50 * 1e6:.0f} us, "
                    f"p99 {p99 * 1e6:.0f} us" if p99 is not None else f"{len(updates)} deletes then re-inserts",
                    samples=len(lat)))
    addrs = np.random.default_rng(0).integers(0, 2**32, 1_000_000)
    t0 = time.perf_counter()
    for vid in range(4):
        fib.lookup_many(vid, addrs)
    rows.append(row("lookups (vectorised)", round(4 * len(addrs) / (time.perf_counter() - t0)), "lookups/s",
                    "walk of the image: CAM, owner tag, L1, L2; one timed batch", samples=4 * len(addrs)))
    t0 = time.perf_counter()
    for a in addrs[:100_000].tolist():
        fib.lookup(0, a)
    rows.append(row("lookups (one by one)", round(100_000 / (time.perf_counter() - t0)), "lookups/s",
                    "CAM probed per length present; one timed batch", samples=100_000))
    s = fib.stats()
    rows += cam_rows(fib, tables, "", f"{n} prefixes, 4 routers")
    rows.append(row("L2 sets in use", s["l2_sets_used"], "sets",
                    f"of 2^13 entries; one 18-Mbit bank holds 64 (density {density:g})", samples=None))
    return rows


def cam_report(total: int, density: float) -> tuple[list[dict], list[dict]]:
    """DESIGN §8's setting, `total` prefixes spread over 4 routers: (measured rows, model rows)."""
    tables = virtual_router_tables(total // 4, routers=4, overlap=GENERATOR_OVERLAP, seed=1, density=density)
    fib = SharedFib(routers=4, l2_sets=int(total / density * 1.3) + 256, cam_entries=1 << 17)
    for vid, t in enumerate(tables):
        fib.load(vid, t)
    measured = cam_rows(fib, tables, "report: ", f"{total} prefixes over 4 routers")
    _pct, shared, _total = table_overlap(tables)
    bits = fib.cam_entry_bits()
    model = [row("CAM if every overlapping route took one entry", shared * bits, "bits",
                 f"{shared} overlapping routes (measured) x {bits} bits; with 32-bit prefixes {shared * (bits + 13)}. "
                 f"DESIGN §8 quotes ~663 Kbit for 100K prefixes at 13%", samples=None, kind="model")]
    return measured, model


def scheduler(count: int, runs: int) -> list[dict]:
    rng = np.random.default_rng(1)
    nets = [VirtualNetwork(f"v{i}", float(rng.choice([2, 5, 8, 50, 200, 600])), int(rng.integers(100, 20_000)))
            for i in range(count)]
    fpgas = max(1, count // 16)
    cap = Capacity(tuple(HardwareSlot(f"nf{i}/fpga0", 3, 1000.0) for i in range(fpgas)), count * 8 // 10)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        placement, _ = schedule(nets, cap)
        times.append(time.perf_counter() - t0)
    changed = [VirtualNetwork(n.id, n.demand_mbps * (3 if i % 10 == 0 else 1), n.table_entries) for i, n in enumerate(nets)]
    t0 = time.perf_counter()
    _, moves = schedule(changed, cap, placement.where)
    rerun = time.perf_counter() - t0
    return [row(f"scheduler, {count} networks (median)", round(statistics.median(times) * 1000, 2), "ms",
                f"{placement.total_mbps:.0f} Mbps delivered on {fpgas} FPGAs + software, {len(placement.unplaced)} unplaced",
                samples=len(times)),
            row(f"scheduler re-run, {count} networks", round(rerun * 1000, 2), "ms",
                f"10% of demands tripled: {len(moves)} migrations")]


def bandwidth_model() -> list[dict]:
    """B_avg = (B_sw·t + B_hw·(T−t))/T with DESIGN §8's timings: a formula, not a measurement."""
    return [row(f"B_avg, reconfigure every {r['period_s']:g}s", round(r["b_avg_mbps"], 1), "Mbps",
                f"(B_sw t + B_hw (T - t)) / T: t = {r['seconds_in_software']:g} s in software, B_sw 11, "
                f"B_hw 1000 Mbps", samples=None, kind="model")
            for r in bandwidth_report([60.0, 300.0, 3600.0])]


def reconfiguration() -> list[dict]:
    rows = []
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
                    f"of {offered} offered at 2 x 4.8 Mbps (emulated data plane)"))
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
    p.add_argument("--compiles", type=int, default=3, help="timed compiles of the tables (default 3)")
    p.add_argument("--scheduler-runs", type=int, default=5, help="timed scheduler runs (default 5)")
    args = p.parse_args()
    per_router = 10_000 if args.quick else args.prefixes
    print(f"machine: {machine()}\n")
    rows = fib_at_scale(per_router, density=40, compiles=args.compiles)
    measured, model = cam_report(per_router if args.quick else 100_000, density=16)
    rows += measured
    rows += scheduler(100 if args.quick else 1000, args.scheduler_runs)
    rows += reconfiguration()
    model += bandwidth_model()
    columns = ["measure", "value", "unit", "samples", "detail"]
    report(rows, columns, title="measured", json_lines=False)
    report(model, columns, title="model (values of formulas, not measurements)", json_lines=False)
    emit(rows + model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
