"""How long programming FPGAs through the control plane takes (measured on BEE2: 11, 17, 24 and 30 s for
1-4 FPGAs programmed concurrently; beyond 4, about 6.3 s more per FPGA)."""

from __future__ import annotations

MEASURED_SECONDS = {1: 11.0, 2: 17.0, 3: 24.0, 4: 30.0}


def programming_seconds(concurrent: int, table: dict[int, float] | None = None) -> float:
    """Time until `concurrent` FPGAs programmed together are all configured."""
    t = table or MEASURED_SECONDS
    if concurrent <= 0:
        return 0.0
    if concurrent in t:
        return t[concurrent]
    top = max(t)
    slope = (t[top] - t[1]) / (top - 1) if top > 1 else t[1]
    return t[top] + slope * (concurrent - top)
