"""An emulated forwarding plane, packet by packet: each virtual network has a queue and forwards from the
engine it is placed on — an FPGA (the compiled shared FIB, at line rate) or a software plane (its own copy
of the routes, at about 11 Mbps) — so what migration promises can be counted: an FPGA being reprogrammed
forwards nothing, a network still placed on it queues and then drops, and a network moved to software
first keeps forwarding every packet with the same next hops."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from fpga_aggregate.migration import Step
from fpga_aggregate.placement import SOFTWARE, SOFTWARE_MBPS_PER_PLANE

Lookup = Callable[[int], tuple[int, int] | None]  # address → (port, next hop) or None


class SoftwareTable:
    """A software plane's forwarding table: longest-prefix match by hashing each prefix length present."""

    def __init__(self, routes: list[tuple[int, int, int, int]]):
        self.by_len: dict[int, dict[int, tuple[int, int]]] = {}
        for p, length, port, nh in routes:
            self.by_len.setdefault(length, {})[p >> (32 - length) if length else 0] = (port, nh)
        self.lengths = sorted(self.by_len, reverse=True)

    def __call__(self, address: int) -> tuple[int, int] | None:
        for length in self.lengths:
            hit = self.by_len[length].get(address >> (32 - length) if length else 0)
            if hit is not None:
                return hit
        return None


@dataclass
class Network:
    hardware: Lookup  # lookup through the FPGA's table
    software: Lookup  # lookup through the software plane's copy
    engine: str
    queue: deque = field(default_factory=deque)
    credit: float = 0.0
    offered: int = 0
    dropped: int = 0
    unroutable: int = 0
    forwarded: list[tuple[int, int, int, str]] = field(default_factory=list)  # (address, port, next hop, engine)


class EmulatedDataPlane:
    """Engines forward at their rate from per-network queues of bounded size; time advances in ticks."""

    def __init__(self, buffer_packets: int = 1024, packet_bytes: int = 1500,
                 software_mbps: float = SOFTWARE_MBPS_PER_PLANE):
        self.buffer = buffer_packets
        self.packet_bits = packet_bytes * 8
        self.rates: dict[str, float] = {SOFTWARE: software_mbps}  # per plane for software
        self.down: set[str] = set()
        self.networks: dict[str, Network] = {}
        self.now = 0.0

    def add_fpga(self, fpga: str, line_rate_mbps: float) -> None:
        self.rates[fpga] = line_rate_mbps

    def add_network(self, network: str, engine: str, hardware: Lookup, software: Lookup) -> None:
        if engine not in self.rates:
            raise ValueError(f"no engine {engine}")
        self.networks[network] = Network(hardware, software, engine)

    def send(self, network: str, addresses: list[int]) -> None:
        """Packets arrive at the network's input queue; beyond the buffer they are dropped."""
        n = self.networks[network]
        for a in addresses:
            n.offered += 1
            if len(n.queue) >= self.buffer:
                n.dropped += 1
            else:
                n.queue.append(a)

    def advance(self, seconds: float) -> None:
        """Each network forwards what its engine's rate allows in `seconds` (nothing if the engine is down)."""
        self.now += seconds
        for n in self.networks.values():
            if n.engine in self.down:
                continue
            n.credit = min(n.credit + self.rates[n.engine] * 1e6 * seconds / self.packet_bits, self.buffer)
            lookup = n.software if n.engine == SOFTWARE else n.hardware
            while n.queue and n.credit >= 1:
                a = n.queue.popleft()
                n.credit -= 1
                route = lookup(a)
                if route is None:
                    n.unroutable += 1
                else:
                    n.forwarded.append((a, route[0], route[1], n.engine))

    def apply(self, step: Step, phase: str) -> None:
        """A step's effect at its start or end: reprogramming takes the FPGA down; a move switches engines."""
        if step.action == "reprogram":
            (self.down.add if phase == "start" else self.down.discard)(step.source)
        elif phase == "end" and step.network in self.networks:
            self.networks[step.network].engine = step.target

    @property
    def dropped(self) -> int:
        return sum(n.dropped for n in self.networks.values())


def run_plan(plane: EmulatedDataPlane, steps: list[Step], traffic: dict[str, list[int]], pps: dict[str, float],
             tick: float = 0.05, drain: float = 5.0) -> None:
    """Play `steps` on the plane's clock while each network receives `pps[network]` packets per second
    (addresses cycling through `traffic[network]`); afterwards let the queues drain."""
    events = sorted([(s.start, 1, i, "start") for i, s in enumerate(steps)] + [(s.end, 0, i, "end") for i, s in enumerate(steps)])
    end = max((s.end for s in steps), default=0.0) + 1.0
    sent = dict.fromkeys(traffic, 0)
    owed = dict.fromkeys(traffic, 0.0)
    start, k = plane.now, 0
    while plane.now - start < end:
        while k < len(events) and events[k][0] <= plane.now - start + 1e-9:
            _, _, i, phase = events[k]
            plane.apply(steps[i], phase)
            k += 1
        for net, addrs in traffic.items():
            owed[net] += pps[net] * tick
            count = int(owed[net])
            owed[net] -= count
            plane.send(net, [addrs[(sent[net] + j) % len(addrs)] for j in range(count)])
            sent[net] += count
        plane.advance(tick)
    while k < len(events):
        plane.apply(steps[events[k][2]], events[k][3])
        k += 1
    t = 0.0
    while t < drain and any(n.queue for n in plane.networks.values()):
        plane.advance(tick)
        t += tick
