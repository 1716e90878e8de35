"""bench/stats.py: a percentile is printed only when the sample count supports it."""

from __future__ import annotations

import json
import os
import time

import pytest

from bench.stats import cell, min_samples, percentile, summarise


def test_min_samples_per_percentile():
    assert [min_samples(p) for p in (50, 90, 99, 99.9)] == [2, 10, 100, 1000]


def test_p99_of_fewer_than_100_samples_is_refused():
    assert percentile([0.001] * 99, 99) is None
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0


def test_nearest_rank_median():
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0], 50) == 1.0
    assert percentile([5.0], 50) is None


def test_percentile_outside_0_100_is_an_error():
    with pytest.raises(ValueError):
        min_samples(100)


def test_summary_row_prints_n_a_with_the_sample_count_and_null_in_json():
    row = summarise([0.002] * 20, wall=1.0, rate_unit="cycles/s")
    assert row["samples"] == 20 and row["rate"] == 20.0 and row["rate_unit"] == "cycles/s"
    assert row["p50_ms"] == pytest.approx(2.0) and row["p99_ms"] is None
    assert cell(row["p99_ms"], row["samples"]) == "n/a (n=20)"
    assert json.loads(json.dumps(row))["p99_ms"] is None


def test_summary_without_wall_has_no_rate():
    assert "rate" not in summarise([0.1, 0.2], wall=None)


def test_am_api_cpu_accounting_counts_a_deployments_children_and_labels_the_ceiling_a_model():
    """bench/am_api.py charges a deployment with the CPU of its child processes (distributed actors), and its
    ceiling row is computed from measured CPU, labelled "model"."""
    import subprocess
    import sys

    from bench.am_api import _tree_cpu_seconds, ceiling_rows

    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, '-c', "
                               "'import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.4: pass\\n"
                               "time.sleep(5)'])"])
    try:
        deadline = time.monotonic() + 20
        while _tree_cpu_seconds([parent.pid]) < 0.4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _tree_cpu_seconds([parent.pid]) >= 0.4  # the grandchild's busy loop, not the idle parent's
    finally:
        parent.kill()
        parent.wait()
    rows = [{"deployment": "embedded", "connection": "new per call", "concurrency": 1,
             "operation": "lifecycle (1 node)", "rate_unit": "cycles/s", "server_cpu_ms": 30.0, "client_cpu_ms": 20.0},
            {"deployment": "embedded", "connection": "new per call", "concurrency": 1,
             "operation": "  Allocate (per call)", "server_cpu_ms": None, "client_cpu_ms": None}]
    (model,) = ceiling_rows(rows)
    assert "(model)" in model["operation"]
    assert abs(model["rate"] - (os.cpu_count() or 1) / 0.05) < 1e-6
