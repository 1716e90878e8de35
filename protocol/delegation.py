"""Delegation: the document an authority exports its inventory in, and a broker claims into its calendar
(ORCA: export / claim / reclaim). It is a message between two actors, so it lives in the protocol.

A delegation lists pools (units per resource type, per bin: cores and 512 MB memory chunks per VM host, whole
bare-metal nodes, 100 Mbps bandwidth chunks per host port, FPGAs and their planes) and label sets (VLAN
ranges per switch). Unit names are the claim keys of slicex/inventory.py, so what the broker's policy names,
its calendar books and the store claims are the same strings.

On the wire (and in the store) a pool whose units are numbered `<pool name>:0` … `<pool name>:<n-1>` (cores,
memory chunks, bandwidth chunks: nearly all of them) is written as its count, not unit by unit: a VM host's
~400 unit keys, each spelling the host's URN, made a delegation ~22 KB of JSON per host (36 MB of XML-RPC for
1,000 hosts, over the actor servers' request limit). The count is part of the signed body, and decoding
expands it to exactly those keys, so the broker claims what the authority signed. A document of the older
form (every unit listed) still decodes.

A delegation also carries the authority's *substrate description* (hosts, interfaces and their cabling,
switches, VM sizes, images, external ports, FPGA boards), as ORCA's site authorities export their substrate
model (NDL) with the resources they delegate: the broker's placement policy needs topology, not only unit
counts, to pick a host for a VM or a tag common to the switches a link crosses. The broker learns the
substrate only this way, never from the authority's configuration or store, so a broker in another trust
domain places requests exactly as an embedded one. Pure: no store, no clock."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Pool:
    name: str  # "core:<host>": also the prefix of its units' keys
    resource_type: str  # "core", "mem", "node", "bw", "unit", ...
    units: tuple[str, ...] = ()  # empty: an open pool whose units are named by whoever books them
    bin: str = ""  # the host (or board) the pool lives on; pools of one bin are allocated together


@dataclass(frozen=True)
class LabelSet:
    name: str  # "vlan:<switch>": also the prefix of its labels' keys
    ranges: tuple[tuple[int, int], ...]

    def __contains__(self, value: int) -> bool:
        return any(lo <= value <= hi for lo, hi in self.ranges)

    def values(self) -> Iterator[int]:
        for lo, hi in self.ranges:
            yield from range(lo, hi + 1)

    def key(self, value: int) -> str:
        return f"{self.name}:{value}"

    @property
    def size(self) -> int:
        return sum(hi - lo + 1 for lo, hi in self.ranges)


@dataclass(frozen=True)
class Delegation:
    authority: str
    broker: str
    pools: tuple[Pool, ...] = ()
    label_sets: tuple[LabelSet, ...] = ()
    substrate: dict[str, Any] | None = None  # the authority's substrate description (slicex.inventory.to_doc)

    def names(self) -> list[str]:
        return [p.name for p in self.pools] + [ls.name for ls in self.label_sets]

    def only(self, names: Iterable[str]) -> Delegation:
        keep = set(names)
        return Delegation(self.authority, self.broker, tuple(p for p in self.pools if p.name in keep),
                          tuple(ls for ls in self.label_sets if ls.name in keep), self.substrate)

    def on(self, bin_name: str) -> list[str]:
        """The pools of one bin (a host: its cores, memory, node and interface bandwidth)."""
        return [p.name for p in self.pools if p.bin == bin_name]

    def without(self, names: Iterable[str]) -> Delegation:
        drop = set(names)
        return Delegation(self.authority, self.broker, tuple(p for p in self.pools if p.name not in drop),
                          tuple(ls for ls in self.label_sets if ls.name not in drop), self.substrate)

    @property
    def size(self) -> int:
        return sum(len(p.units) for p in self.pools) + sum(ls.size for ls in self.label_sets)

    def to_doc(self) -> dict[str, Any]:
        return {"authority": self.authority, "broker": self.broker,
                "pools": [_pool_doc(p) for p in self.pools],
                "label_sets": [{"name": ls.name, "ranges": [list(r) for r in ls.ranges]} for ls in self.label_sets],
                "substrate": self.substrate}

    @staticmethod
    def from_doc(d: dict[str, Any]) -> Delegation:
        return Delegation(d["authority"], d["broker"], tuple(_pool_of(p) for p in d["pools"]),
                          tuple(LabelSet(ls["name"], tuple((int(lo), int(hi)) for lo, hi in ls["ranges"]))
                                for ls in d["label_sets"]), d.get("substrate"))


MAX_POOL_UNITS = 1_000_000
"""The most units one counted pool may hold (a 1 TB host has 2,048 memory chunks, a 400 Gbps port 4,000
bandwidth chunks): a count beyond it is a broken document, not a pool to expand."""


def numbered(name: str, count: int) -> tuple[str, ...]:
    """The units of a counted pool: `<name>:0` … `<name>:<count-1>`."""
    return tuple(f"{name}:{i}" for i in range(count))


def _pool_doc(p: Pool) -> dict[str, Any]:
    """A pool as data: its count when its units are numbered from its name (the compact form), else each unit."""
    doc: dict[str, Any] = {"name": p.name, "type": p.resource_type, "bin": p.bin}
    if p.units and p.units == numbered(p.name, len(p.units)):
        doc["count"] = len(p.units)
    else:
        doc["units"] = list(p.units)
    return doc


def _pool_of(d: dict[str, Any]) -> Pool:
    """A pool from data in either form (a count, or every unit: documents older than the count); a document
    with both, or a count that is not an integer from 0 to MAX_POOL_UNITS, is refused (ValueError)."""
    if "count" in d:
        count = d["count"]
        if "units" in d or isinstance(count, bool) or not isinstance(count, int) \
                or not 0 <= count <= MAX_POOL_UNITS:
            raise ValueError(f"pool {d.get('name')!r}: 'count' must be an integer from 0 to {MAX_POOL_UNITS}, "
                             f"without 'units'")
        units = numbered(d["name"], count)
    else:
        units = tuple(d["units"])
    return Pool(d["name"], d["type"], units, d.get("bin", ""))


def export_prefixes(authority: str, broker: str, prefixes: Sequence[str]) -> Delegation:
    """A delegation named only by unit prefixes (open pools: whoever books names the units)."""
    return Delegation(authority, broker, tuple(Pool(p, p.split(":", 1)[0]) for p in prefixes))
