"""Reconfiguring an FPGA without stopping the networks on it: move its unchanged data planes to software,
reprogram, move them back (DESIGN §8: about 12 s out, 5 s to reprogram, 3 s back), step by step on a
clock, and the average bandwidth a network sees over a reconfiguration period."""

from __future__ import annotations

from dataclasses import dataclass

HW_TO_SW_SECONDS = 12.0
REPROGRAM_SECONDS = 5.0
SW_TO_HW_SECONDS = 3.0


@dataclass(frozen=True)
class Step:
    action: str  # "hw->sw" | "reprogram" | "sw->hw"
    target: str  # network id, or the FPGA for reprogram
    start: float
    end: float


def reconfiguration_plan(fpga: str, unchanged: list[str], start: float = 0.0,
                         out_s: float = HW_TO_SW_SECONDS, program_s: float = REPROGRAM_SECONDS,
                         back_s: float = SW_TO_HW_SECONDS) -> list[Step]:
    """The ordered steps; each network's move out finishes before the FPGA goes down, each move back starts
    after it is up again. Moves of different networks run concurrently."""
    steps = [Step("hw->sw", n, start, start + out_s) for n in sorted(unchanged)]
    t = start + (out_s if unchanged else 0.0)
    steps.append(Step("reprogram", fpga, t, t + program_s))
    t += program_s
    steps += [Step("sw->hw", n, t, t + back_s) for n in sorted(unchanged)]
    return steps


def seconds_in_software(steps: list[Step]) -> float:
    out = min((s.start for s in steps if s.action == "hw->sw"), default=None)
    back = max((s.end for s in steps if s.action == "sw->hw"), default=None)
    return 0.0 if out is None else back - out


def average_bandwidth(b_sw: float, b_hw: float, t_sw: float, period: float) -> float:
    """B_avg = (B_sw·t + B_hw·(T − t)) / T for a network spending t of every T seconds in software."""
    if period <= 0:
        raise ValueError("reconfiguration period must be positive")
    t = min(t_sw, period)
    return (b_sw * t + b_hw * (period - t)) / period
