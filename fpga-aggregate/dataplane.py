"""An emulated forwarding plane: each virtual network forwards through the engine it is placed on (an FPGA
or the software plane) using its own table. An FPGA that is being reprogrammed forwards nothing, so any
network still placed on it loses packets; the migration plan exists so none is."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from fpga_aggregate.migration import Step
from fpga_aggregate.placement import SOFTWARE

Lookup = Callable[[int], tuple[int, int] | None]  # address → (port, next hop) or None


@dataclass
class EmulatedDataPlane:
    tables: dict[str, Lookup]
    location: dict[str, str]
    down: set[str] = field(default_factory=set)
    delivered: Counter = field(default_factory=Counter)
    dropped: Counter = field(default_factory=Counter)

    def send(self, network: str, address: int) -> tuple[int, int] | None:
        engine = self.location[network]
        if engine != SOFTWARE and engine in self.down:
            self.dropped[network] += 1
            return None
        route = self.tables[network](address)
        if route is None:
            self.dropped[network] += 1  # no route is a drop too; tests use covered addresses
            return None
        self.delivered[network] += 1
        return route

    def apply(self, step: Step, phase: str, home: str) -> None:
        """Carry out one step at its start ("start") or end ("end")."""
        if step.action == "hw->sw" and phase == "end":
            self.location[step.target] = SOFTWARE
        elif step.action == "reprogram":
            (self.down.add if phase == "start" else self.down.discard)(step.target)
        elif step.action == "sw->hw" and phase == "end":
            self.location[step.target] = home


def run_with_traffic(plane: EmulatedDataPlane, steps: list[Step], homes: dict[str, str],
                     addresses: dict[str, list[int]], tick: float = 0.1) -> None:
    """Advance time in ticks through `steps`, sending one packet per network per tick."""
    events = sorted([(s.start, 0, s, "start") for s in steps] + [(s.end, 1, s, "end") for s in steps],
                    key=lambda e: (e[0], e[1]))
    end = max((s.end for s in steps), default=0.0) + 1.0
    t, k, i = 0.0, 0, 0
    while t <= end:
        while i < len(events) and events[i][0] <= t:
            _, _, step, phase = events[i]
            plane.apply(step, phase, homes.get(step.target, step.target))
            i += 1
        for net, addrs in addresses.items():
            plane.send(net, addrs[k % len(addrs)])
        k += 1
        t = round(t + tick, 6)
