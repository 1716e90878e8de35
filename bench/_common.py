"""Shared output for benchmarks: a table for people, then one JSON object per measurement per line."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from typing import Any


def percentile(samples: Sequence[float], p: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    k = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def summarise(latencies: Sequence[float], wall: float) -> dict[str, float]:
    return {"calls": len(latencies), "per_second": len(latencies) / wall if wall else float("nan"),
            "p50_ms": percentile(latencies, 50) * 1000, "p99_ms": percentile(latencies, 99) * 1000,
            "mean_ms": statistics.fmean(latencies) * 1000 if latencies else float("nan")}


def report(rows: list[dict[str, Any]], columns: list[str]) -> None:
    widths = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    print("  ".join("-" * widths[c] for c in columns))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).ljust(widths[c]) for c in columns))
    print()
    for r in rows:
        print(json.dumps(r, sort_keys=True))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)
