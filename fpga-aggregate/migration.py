"""Reconfiguring an FPGA without stopping the networks on it: move its unchanged data planes to software,
reprogram, move them back (DESIGN §8: about 12 s out, 5 s to reprogram, 3 s back), as timed steps; the
steps that carry out a scheduler's migrations; and the average bandwidth a network sees when its FPGA is
reconfigured every T seconds."""

from __future__ import annotations

from dataclasses import dataclass

from fpga_aggregate.placement import SOFTWARE, Migration

HW_TO_SW_SECONDS = 12.0
REPROGRAM_SECONDS = 5.0
SW_TO_HW_SECONDS = 3.0


@dataclass(frozen=True)
class Step:
    """One step: during [start, end) the network keeps forwarding where it was; at `end` it forwards from
    `target`. A reprogram step takes its FPGA down for its duration."""

    action: str  # "hw->sw" | "reprogram" | "sw->hw" | "hw->hw"
    network: str  # network id, or "" for reprogram
    source: str  # engine it leaves (FPGA id or "software"); the FPGA for reprogram
    target: str  # engine it forwards from at the end
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


def reconfiguration_plan(fpga: str, unchanged: list[str], start: float = 0.0,
                         out_s: float = HW_TO_SW_SECONDS, program_s: float = REPROGRAM_SECONDS,
                         back_s: float = SW_TO_HW_SECONDS) -> list[Step]:
    """The ordered steps; every move out ends before the FPGA goes down and every move back starts after it
    is up again. Moves of different networks run concurrently."""
    steps = [Step("hw->sw", n, fpga, SOFTWARE, start, start + out_s) for n in sorted(unchanged)]
    t = start + (out_s if unchanged else 0.0)
    steps.append(Step("reprogram", "", fpga, fpga, t, t + program_s))
    t += program_s
    steps += [Step("sw->hw", n, SOFTWARE, fpga, t, t + back_s) for n in sorted(unchanged)]
    return steps


def migration_steps(migrations: list[Migration], start: float = 0.0) -> list[Step]:
    """Steps for a scheduler's migrations, all started at once: to software takes the state-copy time of
    hw->sw, to hardware (from software or another FPGA) the table-load time of sw->hw."""
    steps = []
    for m in migrations:
        if m.target == SOFTWARE:
            steps.append(Step("hw->sw", m.network, m.source, m.target, start, start + HW_TO_SW_SECONDS))
        else:
            action = "sw->hw" if m.source == SOFTWARE else "hw->hw"
            steps.append(Step(action, m.network, m.source, m.target, start, start + SW_TO_HW_SECONDS))
    return steps


def seconds_in_software(steps: list[Step]) -> float:
    """How long a network of the plan forwards from software (from the end of its move out to the end of its
    move back; software keeps serving during the move back)."""
    out = min((s.end for s in steps if s.action == "hw->sw"), default=None)
    back = max((s.end for s in steps if s.action == "sw->hw"), default=None)
    return 0.0 if out is None or back is None else back - out


def average_bandwidth(b_sw: float, b_hw: float, t_sw: float, period: float) -> float:
    """B_avg = (B_sw·t + B_hw·(T − t)) / T for a network spending t of every T seconds in software."""
    if period <= 0:
        raise ValueError("reconfiguration period must be positive")
    t = min(t_sw, period)
    return (b_sw * t + b_hw * (period - t)) / period


def bandwidth_report(periods: list[float], b_sw: float = 11.0, b_hw: float = 1000.0) -> list[dict[str, float]]:
    """B_avg of a network on an FPGA reconfigured every T seconds, for each T (DESIGN §8's timings)."""
    t_sw = seconds_in_software(reconfiguration_plan("fpga", ["net"]))
    return [{"period_s": T, "seconds_in_software": min(t_sw, T), "b_avg_mbps": average_bandwidth(b_sw, b_hw, t_sw, T)}
            for T in periods]
