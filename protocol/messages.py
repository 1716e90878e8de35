"""The messages the actors send each other, declared once as msgspec Structs (the methods that carry them:
protocol/api.py; the codec: slicex/codec.py).

Slice manager → broker: `Demands` (what each node and link needs, no unit named) over a term; the broker
answers a `PlaceAnswer` (signed tickets and where each reservation went, or a dry run's report). Slice manager
→ authority: a ticket with its `SliverSpec` (what the driver sets up). Authority → broker: a signed delegation
or reclaim order (slicex/ticket.py). Tickets and leases are slicex/ticket.py's."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar, get_type_hints

import msgspec
from typing_extensions import TypedDict  # pydantic's TypeAdapter reads typing's only from Python 3.12

from rspec.fpga_ext import FpgaRequest
from rspec.request import Request, RequestInterface, RequestLink, RequestNode
from slicex.ticket import Ticket

REWIRE = "slicex_rewire"
"""The authority action (modifyLease) that gives a running node the interfaces its details now list: an AM API
Update added or removed links of it (slice_manager/updater.py); the driver changes its ports in place."""


class NodeDemand(msgspec.Struct, frozen=True, omit_defaults=True):
    """A requested node as a broker places it (what the broker needs of rspec/request.py RequestNode: type,
    size, image, bound component, FPGA kind, interfaces, public ports) and the reservation it becomes ("" in
    a slice manager's record, whose id it is)."""

    client_id: str
    reservation: str = ""
    component_id: str | None = None
    component_manager_id: str | None = None
    exclusive: bool | None = None
    sliver_type: str | None = None
    disk_image: str | None = None
    hardware_type: str | None = None
    interfaces: tuple[RequestInterface, ...] = ()
    fpga: FpgaRequest | None = None
    public_ports: tuple[tuple[int, int], ...] = ()

    @staticmethod
    def of(n: RequestNode, reservation: str = "") -> NodeDemand:
        return NodeDemand(n.client_id, reservation, n.component_id, n.component_manager_id, n.exclusive,
                          n.sliver_type, n.disk_image, n.hardware_type, n.interfaces, n.fpga, n.public_ports)

    def node(self) -> RequestNode:
        return RequestNode(self.client_id, self.component_id, self.component_manager_id, self.exclusive,
                           self.sliver_type, self.disk_image, self.hardware_type, self.interfaces, fpga=self.fpga,
                           public_ports=self.public_ports)


class LinkDemand(msgspec.Struct, frozen=True, omit_defaults=True):
    """A requested link as a broker places it (rspec/request.py RequestLink: endpoints, bandwidth, asked tag,
    stitching uplinks) and the reservation it becomes ("" in a slice manager's record)."""

    client_id: str
    reservation: str = ""
    interface_refs: tuple[str, ...] = ()
    component_managers: tuple[str, ...] = ()
    capacity_kbps: int | None = None
    latency_ms: int | None = None
    packet_loss: float | None = None
    link_type: str | None = None
    shared_vlan: str | None = None
    vlan_tag: int | None = None
    uplinks: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = ()
    mirror_to: str | None = None

    @staticmethod
    def of(lk: RequestLink, reservation: str = "") -> LinkDemand:
        return LinkDemand(lk.client_id, reservation, lk.interface_refs, lk.component_managers, lk.capacity_kbps,
                          lk.latency_ms, lk.packet_loss, lk.link_type, lk.shared_vlan, lk.vlan_tag, lk.uplinks,
                          lk.mirror_to)

    def link(self) -> RequestLink:
        return RequestLink(self.client_id, self.interface_refs, self.component_managers, self.capacity_kbps,
                           self.latency_ms, self.packet_loss, self.link_type, self.shared_vlan, self.vlan_tag,
                           self.uplinks, self.mirror_to)


class Kept(TypedDict, total=False):
    """Update (slice_manager/update.py): a kept node that new links attach to, placed before and not placed
    again: its host, its interfaces' host interfaces, and the interfaces the new links want."""

    component_id: str
    interfaces: dict[str, str]
    wanted: list[str]


class Demands(msgspec.Struct, frozen=True, omit_defaults=True):
    """What a slice manager asks a broker to place: the request's nodes and links, each with the reservation
    it becomes, and the aggregate's constraints on them: its image policy, the FPGA parts of the requester's
    bitstreams, and the images of the catalogue the requester may boot beyond those the substrate offers
    everyone (as the request spells them -> the image URN: their own snapshots and other users' public ones,
    authority/substrate/images.py). An Update adds the slice's kept nodes that new links attach to (client_id
    -> Kept) and the link subnets the slice already uses."""

    nodes: tuple[NodeDemand, ...]
    links: tuple[LinkDemand, ...]
    image_policy: str = "reject"
    bitstream_parts: dict[str, str] = {}
    images: dict[str, str] = {}
    kept: dict[str, Kept] = {}
    subnets: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        named = [e.client_id for e in (*self.nodes, *self.links)]
        if len(set(named)) != len(named):
            raise ValueError("a client_id is named twice")

    @property
    def request(self) -> Request:
        return Request(tuple(n.node() for n in self.nodes), tuple(lk.link() for lk in self.links))

    @property
    def reservations(self) -> dict[str, str]:
        """client_id -> reservation id."""
        return {e.client_id: e.reservation for e in (*self.nodes, *self.links)}


def demands_of(request: Request, reservations: Mapping[str, str], image_policy: str = "reject",
               bitstream_parts: Mapping[str, str] | None = None,
               images: Mapping[str, str] | None = None) -> Demands:
    """The demands of `request` for the reservations `reservations` (client_id -> reservation id), with only
    the bitstream parts its FPGA nodes name and the requester's images (`images`: spelling -> URN) it names."""
    wanted = {n.fpga.bitstream for n in request.nodes if n.fpga is not None and n.fpga.bitstream}
    named = {n.disk_image for n in request.nodes if n.disk_image}
    return Demands(tuple(NodeDemand.of(n, reservations[n.client_id]) for n in request.nodes),
                   tuple(LinkDemand.of(lk, reservations[lk.client_id]) for lk in request.links), image_policy,
                   {ref: part for ref, part in (bitstream_parts or {}).items() if ref in wanted},
                   {spelled: urn for spelled, urn in (images or {}).items() if spelled in named})


E = TypeVar("E", NodeDemand, LinkDemand)


class Demand(msgspec.Struct, Generic[E], frozen=True, omit_defaults=True):
    """One reservation's part of a Demands, as a slice manager's record keeps it: its node or link (decoded
    as `Demand[NodeDemand]` or `Demand[LinkDemand]` by the record's kind), its place in the request, and the
    request's constraints."""

    element: E
    order: int = 0
    image_policy: str = "reject"
    bitstream_parts: dict[str, str] = {}
    images: dict[str, str] = {}
    kept: dict[str, Kept] = {}
    subnets: tuple[str, ...] = ()


class PlaceAnswer(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """A broker's answer to `place`: per reservation its signed ticket and where it went (`kind`,
    `component_id`, `details`: host, interfaces, chosen tag); for a dry run only `report` (asked vs available,
    broker/placement.py `report`)."""

    tickets: Mapping[str, Ticket] = {}
    placements: Mapping[str, Mapping[str, Any]] = {}
    report: Mapping[str, Any] | None = None


class SlotQuery(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """A `find_slot` question: the whole request for `duration_seconds`, starting at or after `earliest`,
    ending by `latest`. `max_duration_seconds` and `horizon` are the aggregate's limits (am.max_lease: how long
    a reservation may be, and how far ahead it may end); None: no limit."""

    duration_seconds: int
    earliest: datetime
    latest: datetime
    max_duration_seconds: int | None = None
    horizon: datetime | None = None

    @property
    def duration(self) -> timedelta:
        return timedelta(seconds=self.duration_seconds)

    @property
    def max_duration(self) -> timedelta | None:
        return None if self.max_duration_seconds is None else timedelta(seconds=self.max_duration_seconds)


class SlotAnswer(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """A broker's answer to `find_slot` ("when can I have this request for that long?"): the earliest `start`
    (and `end` = start + duration) at which the whole request fits, with where it would go (`report`, the
    dry run's shape, broker/placement.py `report`); or `found` False with why (`summary`; `error`, the GENI
    error type of what is short; `report` at `closest`, the start time at which the least was short).
    `tried`: how many start times were weighed (the window's start and each end of a reservation in it)."""

    found: bool
    start: datetime | None = None
    end: datetime | None = None
    summary: str = ""
    tried: int = 0
    report: Mapping[str, Any] = {}
    closest: datetime | None = None
    error: str = ""


class SliverDetails(TypedDict, total=False):
    """Every key a sliver's details may carry from the slice manager to the authority and its driver: what the
    broker's placement said (per resource kind, resources/), what the slice manager added. Declared once, so a
    driver's `spec.details["..."]` is a name a reader can look up, and checked on arrival over the wire
    (SliverSpec: an unknown key or a value of the wrong type is BADARGS naming it)."""

    # compute (resources/compute.py)
    exclusive: bool  # a whole bare-metal host
    sliver_type: str  # raw-pc, a VM size name, fpga-bitstream, virtual-router
    vm_size: str
    disk_image: str  # image URN
    host: str  # host name
    cores: int | float  # a VM size's whole cores; a driver also honours a fraction (a CPU quota)
    memory_mb: int
    disk_gb: int  # the node's disk (its writable layer), from its VM size
    machine: str  # the VM size's machine: "qemu" for a qemu-vm node (a container when absent)
    interfaces: dict[str, dict[str, str | int | None]]  # request interface client_id -> component_id, ip, netmask,
    # and once provisioned its sliver_id, mac_address and its link's vlan_tag (an int, None before a tag is chosen)
    execute: list[dict[str, str]]  # post-boot commands: shell, command
    install: list[dict[str, str]]  # tar archives to unpack: url, install_path
    blockstores: list[dict[str, str]]  # persistent datasets to mount: name, dataset, mountpoint, size_mb (rspec/blockstore.py)
    boot_seconds: float
    public_ports: list[dict[str, int]]  # resources/public_port.py: port (the node's), public_port (the gateway's)
    # FPGAs (resources/fpga.py)
    fpga: str  # board/fpgaN of a whole FPGA
    board: str
    board_model: str
    bitstream: str  # catalogue reference
    demand_mbps: float  # a virtual router's asked bandwidth
    table_size: int
    routes: list[str]  # "a.b.c.d/len port next_hop"
    programming_batch: int  # whole FPGAs programmed together in this Provision
    # links (resources/vlan.py, resources/stitching_port.py)
    vlan_tag: int | None
    capacity_kbps: int
    subnet: str  # the first three octets of the link's addresses
    endpoints: list[str]  # node client_ids
    interface_refs: list[str]
    uplinks: list[dict[str, Any]]  # stitching: port, tags [[TPID, VID], ...] outermost first
    latency_ms: int
    packet_loss: float
    mirror_to: str  # measure:mirror: the capture interface (client_id) the link's packets are copied to
    # a link across racks (resources/vlan.py, stitching/racks.py): its path through the switches
    rack_path: str  # the path's kind
    switch_tags: dict[str, int]  # switch -> the tag the link has on it
    interface_tags: dict[str, int]  # each end's interface -> its tag
    hops: list[dict[str, Any]]  # the path's hops (stitching/racks.py Hop documents)
    switch: str  # the first switch of its path
    bindings: dict[str, dict[str, str]]  # Update: a kept node's new interface -> its node and host interface
    addresses: dict[str, str]  # Update: a link that replaced one, its interfaces' addresses (the kept ones kept)
    # added by the slice manager
    slice_urn: str
    owner: str  # the owner's user URN
    logins: list[dict[str, Any]]  # username, urn, hostname, port, keys
    hostname: str
    geni_start_time: str  # RFC 3339, an advance reservation's start
    started: str  # RFC 3339, when a delayed start began


DETAIL_TYPES: Mapping[str, Any] = get_type_hints(SliverDetails)
DETAIL_KEYS = frozenset(DETAIL_TYPES)


class SliverSpec(msgspec.Struct, frozen=True, omit_defaults=True):
    """What a driver sets up for one lease: the units leased plus what the slice manager planned. Its details
    are checked key by key against SliverDetails wherever a spec is made or read (an unknown key or a value
    of the wrong type is BADARGS naming it)."""

    id: str  # the reservation (sliver) id
    kind: str  # "node" | "link"
    client_id: str = ""
    units: tuple[str, ...] = ()
    labels: tuple[tuple[str, int], ...] = ()  # e.g. the VLAN tag of a link, or of the links a node attaches to
    details: dict[str, Any] = {}  # SliverDetails: declared as a plain struct so an unknown key reaches the check

    def __post_init__(self) -> None:
        unknown = sorted(set(self.details) - DETAIL_KEYS)
        if unknown:
            raise ValueError(f"sliver spec {self.id}: unknown detail(s) {', '.join(unknown)}")
        try:
            msgspec.convert(self.details, SliverDetails)
        except msgspec.ValidationError as exc:
            why, _, path = str(exc).partition(" - at `$")
            raise ValueError(f"sliver spec {self.id}: details{path.rstrip('`')}: "
                             f"{why.replace('`', '').lower()}") from None


class Maintenance(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """The authority's answer to a maintenance order: the host, whether it came back, and (when it went out)
    the pools reclaimed now and those still promised, which drain as their tickets end."""

    host: str
    back: bool
    reclaimed: tuple[str, ...] = ()
    busy: tuple[str, ...] = ()
