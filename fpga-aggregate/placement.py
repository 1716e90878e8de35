"""Where virtual data planes run: hardware planes on FPGAs (few, fast) or software planes in containers
(many, slow). A greedy scheduler maximises delivered bandwidth (DESIGN §8) and, re-run with the current
placement whenever networks come, go or change their demand, emits the migrations that take the data
planes from the old placement to the new one. Pure and deterministic: same input, same answer."""

from __future__ import annotations

from dataclasses import dataclass, field

SOFTWARE = "software"
SOFTWARE_MBPS_PER_PLANE = 11.0


@dataclass(frozen=True)
class VirtualNetwork:
    id: str
    demand_mbps: float
    table_entries: int = 1000
    fpgas: frozenset[str] = frozenset()  # the FPGAs it may use (a request bound to a board); empty: any


@dataclass(frozen=True)
class HardwareSlot:
    """One FPGA's capacity for virtual data planes."""

    fpga: str
    planes: int  # hardware planes that fit (4 with on-chip TCAM, 3 with the external-SRAM table)
    line_rate_mbps: float  # shared by the planes on this FPGA
    max_table_entries: int = 1 << 19  # routes the FPGA's forwarding table holds for all its planes together


@dataclass(frozen=True)
class Capacity:
    hardware: tuple[HardwareSlot, ...]
    software_planes: int
    software_mbps_per_plane: float = SOFTWARE_MBPS_PER_PLANE


@dataclass
class Placement:
    where: dict[str, str] = field(default_factory=dict)  # network id → fpga id | "software"
    delivered_mbps: dict[str, float] = field(default_factory=dict)
    unplaced: list[str] = field(default_factory=list)

    @property
    def total_mbps(self) -> float:
        return sum(self.delivered_mbps.values())

    def on(self, engine: str) -> list[str]:
        return sorted(n for n, w in self.where.items() if w == engine)


@dataclass(frozen=True)
class Migration:
    network: str
    source: str
    target: str


def schedule(networks: list[VirtualNetwork], capacity: Capacity,
             current: dict[str, str] | None = None) -> tuple[Placement, list[Migration]]:
    """Greedy placement maximising delivered bandwidth.

    Networks a software plane cannot serve fully (demand above its rate) are taken largest first; each goes
    to the FPGA where it gets the most bandwidth (its current FPGA on a tie, so re-runs move nothing that
    need not move), unless a software plane would give it more. Everything else fills software planes; when
    those run out, leftover hardware planes take what they can, and the rest is reported unplaced."""
    current = current or {}
    sw_rate = capacity.software_mbps_per_plane
    planes = {s.fpga: s.planes for s in capacity.hardware}
    spare = {s.fpga: float(s.line_rate_mbps) for s in capacity.hardware}
    entries = {s.fpga: s.max_table_entries for s in capacity.hardware}
    sw_left = capacity.software_planes
    out = Placement()

    def best_fpga(n: VirtualNetwork) -> str | None:
        fits = [f for f in planes if planes[f] > 0 and entries[f] >= n.table_entries and (not n.fpgas or f in n.fpgas)]
        if not fits:
            return None
        return max(fits, key=lambda f: (min(spare[f], n.demand_mbps), f == current.get(n.id), spare[f], f))

    def put(n: VirtualNetwork, f: str) -> None:
        got = min(spare[f], n.demand_mbps)
        planes[f] -= 1
        spare[f] -= got
        entries[f] -= n.table_entries
        out.where[n.id] = f
        out.delivered_mbps[n.id] = got

    ordered = sorted(networks, key=lambda n: (-n.demand_mbps, n.id))
    rest: list[VirtualNetwork] = []
    for n in ordered:
        f = best_fpga(n) if n.demand_mbps > sw_rate else None
        if f is None or (min(spare[f], n.demand_mbps) <= min(n.demand_mbps, sw_rate) and sw_left > 0):
            rest.append(n)
        else:
            put(n, f)
    for n in sorted(rest, key=lambda n: (current.get(n.id) != SOFTWARE, -n.demand_mbps, n.id)):
        if sw_left > 0:
            sw_left -= 1
            out.where[n.id] = SOFTWARE
            out.delivered_mbps[n.id] = min(n.demand_mbps, sw_rate)
            continue
        f = best_fpga(n)
        if f is not None and min(spare[f], n.demand_mbps) > 0:
            put(n, f)
        else:
            out.unplaced.append(n.id)
    out.unplaced.sort()
    migrations = [Migration(nid, current[nid], where) for nid, where in sorted(out.where.items())
                  if nid in current and current[nid] != where]
    return out, migrations
