"""bench/am_dispatch.py runs the lifecycle through the embedded deployment in-process and reports what it
measured: one row per round for the cycle and for each call, with the samples it timed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_dispatch_bench_times_every_call_of_every_cycle_and_writes_a_profile(tmp_path: Path):
    profile = tmp_path / "dispatch.prof"
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "am_dispatch.py"), "--cycles", "12", "--rounds", "2",
                          "--warmup", "2", "--profile", str(profile)], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [(r["round"], r["what"].strip()) for r in rows] == [
        (rnd, what) for rnd in (1, 2) for what in ("cycle", "Allocate", "Provision", "Status", "Delete")]
    for r in rows:
        assert r["samples"] == 12 and r["cpu_p50_ms"] > 0 and r["cpu_p90_ms"] >= r["cpu_p50_ms"]
        assert r["cpu_p99_ms"] is None  # 12 samples cannot support a p99: not printed as one
    cycle = rows[0]
    assert cycle["cpu_mean_ms"] >= sum(r["cpu_mean_ms"] for r in rows[1:5]) * 0.999  # a cycle is its four calls
    import pstats

    names = {fn for _, _, fn in pstats.Stats(str(profile)).stats}
    assert "dispatch" in names  # the profile covers the dispatched calls
