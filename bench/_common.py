"""Shared output for benchmarks: a table for people, then one JSON object per measurement per line."""

from __future__ import annotations

import json
import os
from typing import Any

from bench.stats import cell, percentile, summarise

__all__ = ["machine", "percentile", "report", "summarise"]


def machine() -> str:
    """What the figures were measured on (the load average says whether the machine was shared)."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{os.cpu_count()} CPUs, load average {load:.2f} at the start"


def report(rows: list[dict[str, Any]], columns: list[str], title: str | None = None, json_lines: bool = True) -> None:
    """Print `rows` as a table (None shows as "n/a (n=<samples>)", a column the row lacks as "-"), then each
    row as one JSON line."""
    if title:
        print(title)
    if rows:
        text = [[cell(r[c], r.get("samples")) if c in r else "-" for c in columns] for r in rows]
        widths = [max(len(c), *(len(t[i]) for t in text)) for i, c in enumerate(columns)]
        print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
        print("  ".join("-" * w for w in widths))
        for t in text:
            print("  ".join(v.ljust(w) for v, w in zip(t, widths, strict=True)))
    print()
    if json_lines:
        emit(rows)


def emit(rows: list[dict[str, Any]]) -> None:
    """One JSON object per measurement, one per line."""
    for r in rows:
        print(json.dumps(r, sort_keys=True))
