"""Where virtual data planes run: hardware planes on FPGAs (few, fast) or software planes in containers
(many, slow). A greedy scheduler maximises delivered bandwidth (DESIGN §8) and, re-run with the current
placement, emits the migrations that take the data planes from the old placement to the new one."""

from __future__ import annotations

from dataclasses import dataclass, field

SOFTWARE = "software"


@dataclass(frozen=True)
class VirtualNetwork:
    id: str
    demand_mbps: float
    table_entries: int = 1000


@dataclass(frozen=True)
class HardwareSlot:
    fpga: str
    planes: int  # how many hardware data planes fit (table variant)
    line_rate_mbps: float
    max_table_entries: int = 1 << 19


@dataclass(frozen=True)
class Capacity:
    hardware: tuple[HardwareSlot, ...]
    software_planes: int
    software_mbps_per_plane: float = 11.0


@dataclass
class Placement:
    where: dict[str, str] = field(default_factory=dict)  # network id → fpga id | "software"
    delivered_mbps: dict[str, float] = field(default_factory=dict)
    unplaced: list[str] = field(default_factory=list)

    @property
    def total_mbps(self) -> float:
        return sum(self.delivered_mbps.values())


@dataclass(frozen=True)
class Migration:
    network: str
    source: str
    target: str


def schedule(networks: list[VirtualNetwork], capacity: Capacity,
             current: dict[str, str] | None = None) -> tuple[Placement, list[Migration]]:
    """Greedy placement: networks that software can serve fully go to software; the rest, largest demand
    first, to the FPGA (preferring their current one) with the most spare line rate. Deterministic."""
    current = current or {}
    sw_rate = capacity.software_mbps_per_plane
    planes = {s.fpga: s.planes for s in capacity.hardware}
    spare = {s.fpga: s.line_rate_mbps for s in capacity.hardware}
    slots = {s.fpga: s for s in capacity.hardware}
    sw_left = capacity.software_planes
    out = Placement()
    ordered = sorted(networks, key=lambda n: (-n.demand_mbps, n.id))
    small = [n for n in ordered if n.demand_mbps <= sw_rate]
    large = [n for n in ordered if n.demand_mbps > sw_rate]
    overflow: list[VirtualNetwork] = []
    for n in large:
        fits = [f for f in planes if planes[f] > 0 and slots[f].max_table_entries >= n.table_entries]
        if not fits:
            overflow.append(n)
            continue
        best = max(fits, key=lambda f: (f == current.get(n.id), min(spare[f], n.demand_mbps), spare[f], f))
        got = min(spare[best], n.demand_mbps)
        if got < sw_rate and sw_left > 0:
            overflow.append(n)  # software would serve it better than what is left on any FPGA
            continue
        planes[best] -= 1
        spare[best] -= got
        out.where[n.id] = best
        out.delivered_mbps[n.id] = got
    for n in small + overflow:
        if sw_left > 0:
            sw_left -= 1
            out.where[n.id] = SOFTWARE
            out.delivered_mbps[n.id] = min(n.demand_mbps, sw_rate)
        else:
            out.unplaced.append(n.id)
    migrations = [Migration(nid, current[nid], where) for nid, where in sorted(out.where.items())
                  if nid in current and current[nid] != where]
    return out, migrations
