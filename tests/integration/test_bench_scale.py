"""bench/scale.py --quick fills a generated substrate to each L through the AM API and reports, at every L,
every measurement with the samples it took: a table, JSON lines (on stdout and in --json FILE) and a PNG."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TIMED = ("lifecycle cycle (1 node) server CPU", "lifecycle cycle wall", "  Allocate (1 node) wall",
         "Status (3-node slice) server CPU", "Describe (3-node slice) server CPU")
SINGLE = ("slicex up to GetVersion answered", "slicex up to the first Allocate placed", "RSS after up",
          "idle server CPU", "store", "store bytes per live sliver")


def test_the_scale_bench_measures_every_cost_at_every_live_slice_count(tmp_path: Path):
    jsonl, png = tmp_path / "scale.jsonl", tmp_path / "scale.png"
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "scale.py"), "--quick", "--quiet", "--json", str(jsonl),
                          "--plot", str(png), "--keep-home", str(tmp_path / "kept")], capture_output=True, text=True,
                         timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert rows == [json.loads(line) for line in jsonl.read_text().splitlines()]  # the file holds what was printed
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {r["live_slices"] for r in rows} == {0, 50}
    for live in (0, 50):
        at = {r["what"]: r for r in rows if r["live_slices"] == live}
        assert all(at[w]["live_slivers"] == (0 if live == 0 else 99) for w in at)  # 17 × 1 + 17 × 2 + 16 × 3
        for what in TIMED:
            r = at[what]
            assert r["samples"] == 20 and 0 < r["p50"] <= r["p95"], (live, r)  # 20 samples support a p95
        listed = at["ListResources (geni_available) wall"]
        assert listed["samples"] == 3 and listed["p50"] > 0 and listed["p95"] is None  # 3 cannot support a p95
        for what in SINGLE[:5]:
            assert at[what]["value"] > 0, (live, at[what])
        assert at["lifecycle cycle server CPU net of idle (model: mean - idle rate x mean wall)"]["model"] is True
        per_sliver = at["store bytes per live sliver"]["value"]
        assert per_sliver is None if live == 0 else per_sliver == at["store"]["value"] / 99
    added = next(r for r in rows if r["what"] == "store bytes per live sliver above L=0")
    stores = {r["live_slices"]: r["value"] for r in rows if r["what"] == "store"}
    assert added["live_slices"] == 50 and added["value"] == (stores[50] - stores[0]) / 99
    assert "live_slices" in out.stdout.splitlines()[2]  # the table's header, under the machine and the title

    # a later run starts from the kept home (no second fill to 50): L below it in a new home, the rest on a copy
    kept = json.loads((tmp_path / "kept" / "scale-home.json").read_text())
    assert kept == {"hosts": 50, "racks": 5, "store": None, "live": 50}
    kept_db = (tmp_path / "kept" / "home" / "state.db").read_bytes()
    again = subprocess.run([sys.executable, str(ROOT / "bench" / "scale.py"), "--from-home", str(tmp_path / "kept"),
                            "--live", "5,50,52", "--samples", "2", "--list-samples", "1", "--idle-seconds", "1",
                            "--quiet"], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert again.returncode == 0, again.stderr[-3000:]
    later = [json.loads(line) for line in again.stdout.splitlines() if line.startswith("{")]
    fills = {r["live_slices"]: r["value"] for r in later if r["what"].startswith("fill rate")}
    assert set(fills) == {5, 52}  # 50 was not filled again
    assert {r["live_slices"] for r in later} == {5, 50, 52}
    assert (tmp_path / "kept" / "home" / "state.db").read_bytes() == kept_db  # the kept home stays as it was


def test_the_scale_bench_refuses_a_shrinking_list_of_live_slice_counts():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "scale.py"), "--live", "100,50"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2 and "ascending" in out.stderr


def test_an_earlier_run_is_drawn_beside_this_one_under_its_label(tmp_path: Path):
    sys.path.insert(0, str(ROOT))
    from bench.scale import _line, earlier, plot

    before = tmp_path / "before.jsonl"
    row = {"bench": "scale", "store": "sqlite (embedded)", "live_slices": 0, "what": "idle server CPU", "value": 3.0}
    before.write_text(json.dumps(row) + "\n")
    rows = earlier(before, "main")
    assert [_line(r) for r in [row, *rows]] == ["sqlite (embedded)", "sqlite (embedded), main"]
    plot([row, *rows], tmp_path / "both.png", "two runs")
    assert (tmp_path / "both.png").read_bytes()[:4] == b"\x89PNG"
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "scale.py"), "--compare", f"main={before}"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2 and "--plot" in out.stderr
