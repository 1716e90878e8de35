"""What a resource kind is: the small interface every kind of thing an aggregate offers implements, and the
plain data the kinds answer in (a placement, an amount held). Pure: no store, no clock."""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from protocol.delegation import LabelSet, Pool
from rspec.request import RequestLink, RequestNode
from rspec.substrate import Substrate


class Amounts(msgspec.Struct, frozen=True, omit_defaults=True):
    """What one sliver (or a sum of them) holds, as quotas and accounting count it: cores, memory (MB), nodes
    (VMs, bare metal and FPGA nodes), VLAN tags, reserved bandwidth (kbps), FPGA slivers (a whole FPGA or
    a virtual router), public ports of the gateway and disk (GB: the nodes' writable layers)."""

    cores: int = 0
    memory_mb: int = 0
    nodes: int = 0
    vlans: int = 0
    bandwidth_kbps: int = 0
    fpgas: int = 0
    public_ports: int = 0
    disk_gb: int = 0

    def __add__(self, other: Amounts) -> Amounts:
        return Amounts(*(getattr(self, f) + getattr(other, f) for f in RESOURCES))



RESOURCES: tuple[str, ...] = Amounts.__struct_fields__


@dataclass(frozen=True)
class Placement:
    """Where one node or link of a request goes: the component, every unit key it takes (labels included:
    `labels` names the label set and value of each label key among them) and what its driver needs."""

    client_id: str
    kind: str  # node | link
    component_id: str
    keys: tuple[str, ...]
    details: Mapping[str, Any] = field(default_factory=dict)
    labels: Mapping[str, int] = field(default_factory=dict)  # label set name -> value (its key is in `keys`)


@dataclass(frozen=True)
class Constraints:
    """What the aggregate and the requester add to a request: the image policy (reject an image not offered,
    or pass it through), the FPGA parts of the requester's bitstreams, and the broker's host ranking."""

    image_policy: str = "reject"
    bitstream_parts: Mapping[str, str] = field(default_factory=dict)
    ranking: Any = None  # broker/policy.py: orders hosts for the compute kind (first/best/worst fit)


@dataclass(frozen=True)
class Offer:
    """What a kind offers of a substrate, as an authority delegates it (protocol/delegation.py)."""

    pools: tuple[Pool, ...] = ()
    label_sets: tuple[LabelSet, ...] = ()


class NodeKind(Protocol):
    """A kind of node an aggregate offers (compute, FPGA): it names its units, sizes a demand, places it,
    says what a dry run lacks, and what a sliver of it counts."""

    name: str
    unit_kinds: tuple[str, ...]  # the first segment of the unit keys it names (the store's claim namespaces)

    def claims(self, node: RequestNode) -> bool:
        """Whether this kind places `node`."""

    def placed(self, details: Mapping[str, Any]) -> bool:
        """Whether a sliver with these placement details is of this kind."""

    def offer(self, substrate: Substrate) -> Offer: ...

    def place(self, substrate: Substrate, node: RequestNode, taken: Set[str], given: Constraints) -> Placement:
        """Where `node` goes, from units not in `taken`; a GeniError naming what is short or malformed."""

    def needs(self, substrate: Substrate, node: RequestNode, taken: Set[str]) -> list[dict[str, Any]]:
        """Asked vs available per resource and site, for a node that did not fit (a dry run)."""

    def asked(self, substrate: Substrate, node: RequestNode) -> Amounts:
        """What `node` will hold once placed, counted before anything is taken (quotas)."""

    def held(self, details: Mapping[str, Any]) -> Amounts:
        """What a placed sliver of this kind holds, from its placement details (accounting)."""

    def bin_of(self, key: str) -> str:
        """The host, switch, port or board one of its unit keys lives on (metrics, dashboard)."""


class NodePart(Protocol):
    """Something a node may take besides what its kind places (public ports of the gateway): each part adds
    its units and details to the node's placement."""

    name: str
    unit_kinds: tuple[str, ...]

    def offer(self, substrate: Substrate) -> Offer: ...

    def place(self, substrate: Substrate, node: RequestNode, placed: Placement,
              taken: Set[str]) -> tuple[list[str], dict[str, Any]]:
        """(unit keys, details) this part takes for `node`, which its kind placed as `placed`, from units
        neither in `taken` nor in `placed.keys`."""

    def needs(self, substrate: Substrate, node: RequestNode, taken: Set[str]) -> list[dict[str, Any]]: ...

    def asked(self, node: RequestNode) -> Amounts: ...

    def held(self, details: Mapping[str, Any]) -> Amounts: ...

    def bin_of(self, key: str) -> str: ...


class LinkKind(Protocol):
    """A part of what a link takes (VLAN tags and bandwidth across switches, a stitching port's wire and
    capacity): each part adds its units to the link's placement."""

    name: str
    unit_kinds: tuple[str, ...]

    def offer(self, substrate: Substrate) -> Offer: ...

    def place(self, substrate: Substrate, link: RequestLink, host_ifaces: list[str], taken: Set[str],
              keys: list[str]) -> tuple[list[str], dict[str, Any], dict[str, int]]:
        """(unit keys, details, labels) this part takes for `link` whose endpoints sit on `host_ifaces`, from
        units neither in `taken` nor already in `keys` (the link's other parts)."""

    def needs(self, substrate: Substrate, link: RequestLink, host_ifaces: list[str],
              taken: Set[str]) -> list[dict[str, Any]]: ...

    def held(self, details: Mapping[str, Any]) -> Amounts: ...

    def bin_of(self, key: str) -> str: ...
