"""Percentiles that a sample count can support, and the summary row every benchmark prints.

A percentile p is printed only when at least one sample lies above it: n >= 100 / (100 - p) samples
(2 for p50, 10 for p90, 100 for p99, 1000 for p99.9). Below that the "p99" of a run is just its maximum,
so the value is None (JSON null) and tables print "n/a (n=…)"."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def min_samples(p: float) -> int:
    """The fewest samples that support percentile `p` (0 < p < 100)."""
    if not 0 < p < 100:
        raise ValueError(f"percentile {p} is not strictly between 0 and 100")
    return math.ceil(100 / (100 - p) - 1e-9)


def percentile(samples: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile, or None when `samples` are too few to support it."""
    n = len(samples)
    if n < min_samples(p):
        return None
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(p / 100 * n) - 1)]


def summarise(latencies: Sequence[float], wall: float | None, percentiles: Sequence[float] = (50, 99),
              rate_unit: str | None = "calls/s") -> dict[str, object]:
    """samples, rate (len / wall, labelled by `rate_unit`; None when `wall` is None), mean and percentiles in ms."""
    n = len(latencies)
    row: dict[str, object] = {"samples": n}
    if wall is not None and rate_unit is not None:
        row["rate"] = n / wall if wall > 0 else None
        row["rate_unit"] = rate_unit
    row["mean_ms"] = statistics.fmean(latencies) * 1000 if n else None
    for p in percentiles:
        v = percentile(latencies, p)
        row[f"p{p:g}_ms"] = None if v is None else v * 1000
    return row


def cell(value: object, samples: object = None) -> str:
    """How a table shows one value: floats to 2 places, None as "n/a (n=…)" when the sample count is known."""
    if value is None:
        return f"n/a (n={samples})" if samples is not None else "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)
