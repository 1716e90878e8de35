"""Resource kinds as plug-ins: each kind of thing an aggregate offers owns, in one module, how its units are
named, how a demand for it is sized and placed, what a dry run says when it does not fit, what an authority
delegates of it and what a sliver of it counts against quotas:

  compute.py         VMs (cores, memory, disk), bare-metal nodes   core:, mem:, disk:, node:
  vlan.py            links inside the aggregate (tags, bandwidth)  vlan:, bw:<host interface>
  stitching_port.py  external ports of stitched links              wire:, bw:<port>
  fpga.py            whole FPGAs and virtual routers                fpga:, router:
  public_port.py     the gateway's public TCP ports (a node part)   pport:

`Kinds` is the set an aggregate offers (`STANDARD`: all five); the broker's placement (broker/placement.py),
the authority's delegation (`export_substrate`), quotas, accounting, metrics and the dashboard ask it and
know no unit key themselves. A new kind is a class with the NodeKind, NodePart or LinkKind interface
(resources/kind.py) added to a `Kinds`. Pure: no store, no clock."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, replace
from typing import Any

from protocol.delegation import Delegation, Pool
from resources.compute import MEM_CHUNK_MB, Compute
from resources.fpga import Fpgas
from resources.kind import Amounts, Constraints, LinkKind, NodeKind, NodePart, Placement
from resources.public_port import PublicPorts
from resources.stitching_port import StitchingPorts
from resources.vlan import VlanLinks
from rspec.request import Request, RequestNode
from rspec.substrate import Substrate
from slicex.errors import BadArgs
from slicex.inventory import to_doc


@dataclass(frozen=True)
class Kinds:
    """The resource kinds an aggregate offers: node kinds (the first that claims a node places it), the parts a
    node may take besides (public ports) and the parts every link is made of."""

    nodes: tuple[NodeKind, ...]
    links: tuple[LinkKind, ...]
    node_parts: tuple[NodePart, ...] = ()

    @property
    def _all(self) -> tuple[NodeKind | NodePart | LinkKind, ...]:
        return (*self.nodes, *self.node_parts, *self.links)

    @property
    def unit_kinds(self) -> tuple[str, ...]:
        """The first segment of every unit key (the broker's claim namespaces in the store)."""
        return tuple(dict.fromkeys(u for k in self._all for u in k.unit_kinds))

    def node_kind(self, node: RequestNode) -> NodeKind:
        kind = next((k for k in self.nodes if k.claims(node)), None)
        if kind is None:
            raise BadArgs(f"node {node.client_id}: no resource kind here places it "
                          f"(offered: {', '.join(k.name for k in self.nodes)})")
        return kind

    def place_node(self, substrate: Substrate, node: RequestNode, taken: Set[str], given: Constraints) -> Placement:
        """Where `node` goes: its kind's placement with what each node part adds (units and details)."""
        p = self.node_kind(node).place(substrate, node, taken, given)
        for part in self.node_parts:
            keys, details = part.place(substrate, node, p, taken)
            if keys or details:
                p = replace(p, keys=(*p.keys, *keys), details={**p.details, **details})
        return p

    def node_needs(self, substrate: Substrate, node: RequestNode, taken: Set[str]) -> list[dict[str, Any]]:
        """Asked vs available for a node that did not fit: its kind's and its parts'."""
        return [*self.node_kind(node).needs(substrate, node, taken),
                *(n for part in self.node_parts for n in part.needs(substrate, node, taken))]

    def pools(self, substrate: Substrate) -> list[Pool]:
        """Every pool the kinds offer of `substrate` (what a delegation of all of it lists)."""
        return [p for k in self._all for p in k.offer(substrate).pools]

    def export(self, substrate: Substrate, authority: str, broker: str) -> Delegation:
        """Everything a substrate offers, as a delegation to `broker`, with the substrate's description."""
        offers = [k.offer(substrate) for k in self._all]
        return Delegation(authority, broker, tuple(p for o in offers for p in o.pools),
                          tuple(ls for o in offers for ls in o.label_sets), to_doc(substrate))

    def asked(self, substrate: Substrate, request: Request) -> Amounts:
        """What a request will hold once placed, counted before anything is taken: each node as its kind
        sizes it and its parts count, one VLAN per link, each link's capacity as asked."""
        out = Amounts()
        for node in request.nodes:
            out = out + self.node_kind(node).asked(substrate, node)
            for part in self.node_parts:
                out = out + part.asked(node)
        for link in request.links:
            out = out + Amounts(vlans=1, bandwidth_kbps=int(link.capacity_kbps or 0))
        return out

    def held(self, kind: str, details: Mapping[str, Any]) -> Amounts:
        """What a placed sliver holds, from the details the slice manager reports (the manifest's source)."""
        if kind == "node":
            out = next(k for k in self.nodes if k.placed(details)).held(details)
            for node_part in self.node_parts:
                out = out + node_part.held(details)
            return out
        out = Amounts()
        for part in self.links:
            out = out + part.held(details)
        return out

    def bin_of(self, key: str) -> tuple[str, str]:
        """(unit kind, the host, switch, port or board it lives on) of a unit key."""
        kind = key.partition(":")[0]
        owner = next((k for k in self._all if kind in k.unit_kinds), None)
        return kind, owner.bin_of(key) if owner is not None else key.partition(":")[2]

    def is_unit(self, key: str) -> bool:
        """Whether a claim key names a unit of inventory (not a lock, a lease marker or a slice-name claim)."""
        kind, sep, _rest = key.partition(":")
        return bool(sep) and kind in self.unit_kinds


STANDARD = Kinds(nodes=(Fpgas(), Compute()), links=(VlanLinks(), StitchingPorts()), node_parts=(PublicPorts(),))


def export_substrate(substrate: Substrate, authority: str, broker: str, kinds: Kinds = STANDARD) -> Delegation:
    """What an authority delegates of its whole substrate to `broker` (deployment/actors.py at start)."""
    return kinds.export(substrate, authority, broker)


def units_under(pools: Iterable[Pool], names: Set[str]) -> set[str]:
    """Every unit of the pools named (inventory reclaimed, e.g. for maintenance: unavailable)."""
    return {u for p in pools if p.name in names for u in p.units}


@dataclass(frozen=True)
class InUse:
    """What is in use now, as the broker's availability query answers it: claims per pool counter (`core:<host>`
    → cores claimed on it; every kind but the named ones) and the units named one by one (bare-metal nodes,
    VLAN tags, units promised and not claimed yet)."""

    counts: Mapping[str, int]
    units: frozenset[str]


def usage_counts(keys: Iterable[str], counts: Mapping[str, int] | None = None
                 ) -> tuple[dict[str, int], dict[str, int], frozenset[str], dict[str, frozenset[int]]]:
    """(cores per host, MB per host, bare-metal nodes taken, VLAN tags per switch) from unit keys in use and
    claims per pool counter (`counts`, slicex.store.counter_of)."""
    cores: Counter[str] = Counter()
    mb: Counter[str] = Counter()
    for counter, n in (counts or {}).items():
        kind, _, host = counter.partition(":")
        if kind == "core":
            cores[host] += n
        elif kind == "mem":
            mb[host] += n * MEM_CHUNK_MB
    taken: set[str] = set()
    vlans: dict[str, set[int]] = {}
    for key in keys:
        kind, _, rest = key.partition(":")
        if kind == "core":
            cores[rest.rsplit(":", 1)[0]] += 1
        elif kind == "mem":
            mb[rest.rsplit(":", 1)[0]] += MEM_CHUNK_MB
        elif kind == "node":
            taken.add(rest)
        elif kind == "vlan":
            switch, _, tag = rest.rpartition(":")
            vlans.setdefault(switch, set()).add(int(tag))
    return dict(cores), dict(mb), frozenset(taken), {k: frozenset(v) for k, v in vlans.items()}
