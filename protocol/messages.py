"""The messages the actors send each other, declared once (the methods that carry them: protocol/api.py).

Slice manager → broker: `Demands` (what each node and link needs, no unit named) over a term; the broker
answers a `PlaceAnswer` (signed tickets and where each reservation went, or a dry run's report). Slice manager
→ authority: a ticket with its `SliverSpec` (what the driver sets up). Authority → broker: a signed delegation
or reclaim order (slicex/ticket.py). Tickets and leases are slicex/ticket.py's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, get_type_hints

from typing_extensions import TypedDict  # pydantic's TypeAdapter reads typing's only from Python 3.12

from protocol.codec import decode
from rspec.fpga_ext import FpgaRequest
from rspec.request import Request, RequestInterface, RequestLink, RequestNode
from slicex.errors import BadArgs
from slicex.inventory import from_doc, to_doc
from slicex.ticket import Ticket

REWIRE = "slicex_rewire"
"""The authority action (modifyLease) that gives a running node the interfaces its details now list: an AM API
Update added or removed links of it (slice_manager/updater.py); the driver changes its ports in place."""

NODE_FIELDS = ("client_id", "component_id", "component_manager_id", "exclusive", "sliver_type", "disk_image",
               "hardware_type", "interfaces", "fpga", "public_ports")
LINK_FIELDS = ("client_id", "interface_refs", "component_managers", "capacity_kbps", "latency_ms", "packet_loss",
               "link_type", "shared_vlan", "vlan_tag", "uplinks", "mirror_to")


@dataclass(frozen=True)
class Demands:
    """What a slice manager asks a broker to place: the request's nodes and links (type, size, image, bound
    component, FPGA kind and interfaces; endpoints, bandwidth, asked tag, stitching uplinks), the reservation
    each becomes (client_id -> reservation id), and the aggregate's constraints on them: its image policy,
    the FPGA parts of the requester's bitstreams, and the images of the catalogue the requester may boot
    beyond those the substrate offers everyone (as the request spells them -> the image URN: their own
    snapshots and other users' public ones, authority/substrate/images.py)."""

    request: Request
    reservations: Mapping[str, str]
    image_policy: str = "reject"
    bitstream_parts: Mapping[str, str] = field(default_factory=dict)
    images: Mapping[str, str] = field(default_factory=dict)
    # Update (slice_manager/update.py): the slice's kept nodes that new links attach to, placed before and not
    # placed again (client_id -> {component_id: host, interfaces: {iface: host interface}, wanted: [ifaces]}),
    # and the link subnets the slice already uses
    kept: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    subnets: tuple[str, ...] = ()

    def to_doc(self) -> dict[str, Any]:
        def node_doc(n: RequestNode) -> dict[str, Any]:
            return {"reservation": self.reservations[n.client_id], **{k: to_doc(getattr(n, k)) for k in NODE_FIELDS}}

        def link_doc(lk: RequestLink) -> dict[str, Any]:
            return {"reservation": self.reservations[lk.client_id],
                    **{k: to_doc(getattr(lk, k)) for k in LINK_FIELDS}}

        return {"nodes": [node_doc(n) for n in self.request.nodes],
                "links": [link_doc(lk) for lk in self.request.links],
                "image_policy": self.image_policy, "bitstream_parts": dict(self.bitstream_parts),
                "images": dict(self.images),
                **({"kept": {k: dict(v) for k, v in self.kept.items()}, "subnets": list(self.subnets)}
                   if self.kept or self.subnets else {})}

    @staticmethod
    def from_doc(d: Mapping[str, Any]) -> Demands:
        """The demands a wire document carries; BADARGS naming what is malformed."""
        try:
            nodes = tuple(from_doc(RequestNode, {k: n.get(k) for k in NODE_FIELDS if k in n}) for n in d["nodes"])
            links = tuple(from_doc(RequestLink, {k: lk.get(k) for k in LINK_FIELDS if k in lk}) for lk in d["links"])
            rids = {x["client_id"]: str(x["reservation"]) for x in [*d["nodes"], *d["links"]]}
            parts = {str(k): str(v) for k, v in (d.get("bitstream_parts") or {}).items()}
            images = {str(k): str(v) for k, v in (d.get("images") or {}).items()}
            kept = {str(cid): {"component_id": str(k["component_id"]),
                               "interfaces": {str(i): str(h) for i, h in dict(k.get("interfaces") or {}).items()},
                               "wanted": [str(i) for i in k.get("wanted") or ()]}
                    for cid, k in dict(d.get("kept") or {}).items()}
            subnets = tuple(str(s) for s in d.get("subnets") or ())
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BadArgs(f"malformed placement demand: {type(exc).__name__}: {exc}") from None
        for n in nodes:
            if not isinstance(n.interfaces, tuple) or any(not isinstance(i, RequestInterface) for i in n.interfaces):
                raise BadArgs(f"malformed placement demand: interfaces of node {n.client_id}")
            if n.fpga is not None and not isinstance(n.fpga, FpgaRequest):
                raise BadArgs(f"malformed placement demand: fpga of node {n.client_id}")
        if len(rids) != len(nodes) + len(links):
            raise BadArgs("malformed placement demand: a client_id is named twice")
        return Demands(Request(nodes, links), rids, str(d.get("image_policy") or "reject"), parts, images, kept,
                       subnets)


def demands_of(request: Request, reservations: Mapping[str, str], image_policy: str = "reject",
               bitstream_parts: Mapping[str, str] | None = None,
               images: Mapping[str, str] | None = None) -> Demands:
    """The demands of `request` for the reservations `reservations` (client_id -> reservation id), with only
    the bitstream parts its FPGA nodes name and the requester's images (`images`: spelling -> URN) it names."""
    wanted = {n.fpga.bitstream for n in request.nodes if n.fpga is not None and n.fpga.bitstream}
    named = {n.disk_image for n in request.nodes if n.disk_image}
    return Demands(request, dict(reservations), image_policy,
                   {ref: part for ref, part in (bitstream_parts or {}).items() if ref in wanted},
                   {spelled: urn for spelled, urn in (images or {}).items() if spelled in named})


@dataclass(frozen=True)
class PlaceAnswer:
    """A broker's answer to `place`: per reservation its signed ticket and where it went (`kind`,
    `component_id`, `details`: host, interfaces, chosen tag); for a dry run only `report` (asked vs available,
    broker/placement.py `report`)."""

    tickets: Mapping[str, Ticket] = field(default_factory=dict)
    placements: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    report: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class SlotQuery:
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


@dataclass(frozen=True)
class SlotAnswer:
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
    report: Mapping[str, Any] = field(default_factory=dict)
    closest: datetime | None = None
    error: str = ""


class SliverDetails(TypedDict, total=False):
    """Every key a sliver's details may carry from the slice manager to the authority and its driver: what the
    broker's placement said (per resource kind, resources/), what the slice manager added. Declared once, so a
    driver's `spec.details["..."]` is a name a reader can look up, and checked on arrival over the wire
    (`SliverSpec.from_wire`: an unknown key or a value of the wrong type is BADARGS naming it)."""

    # compute (resources/compute.py)
    exclusive: bool  # a whole bare-metal host
    sliver_type: str  # raw-pc, a VM size name, fpga-bitstream, virtual-router
    vm_size: str
    disk_image: str  # image URN
    host: str  # host name
    cores: int
    memory_mb: int
    disk_gb: int  # the node's disk (its writable layer), from its VM size
    interfaces: dict[str, dict[str, str]]  # request interface client_id -> component_id, ip, netmask
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


@dataclass(frozen=True)
class SliverSpec:
    """What a driver sets up for one lease: the units leased plus what the slice manager planned."""

    id: str  # the reservation (sliver) id
    kind: str  # "node" | "link"
    client_id: str = ""
    units: tuple[str, ...] = ()
    labels: tuple[tuple[str, int], ...] = ()  # e.g. the VLAN tag of a link, or of the links a node attaches to
    details: SliverDetails = field(default_factory=lambda: SliverDetails())

    def to_doc(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "client_id": self.client_id, "units": list(self.units),
                "labels": [list(lb) for lb in self.labels], "details": dict(self.details)}

    @staticmethod
    def from_wire(d: Mapping[str, Any]) -> SliverSpec:
        """A spec from another process: its details checked key by key against SliverDetails."""
        details = d.get("details") or {}
        if not isinstance(details, Mapping):
            raise BadArgs(f"sliver spec {d.get('id')}: details must be a struct")
        unknown = sorted(set(details) - set(DETAIL_TYPES))
        if unknown:
            raise BadArgs(f"sliver spec {d.get('id')}: unknown detail(s) {', '.join(unknown)}")
        checked = {k: decode(v, DETAIL_TYPES[k], f"sliver spec {d.get('id')}: details.{k}")
                   for k, v in details.items()}
        return SliverSpec.from_doc({**d, "details": checked})

    @staticmethod
    def from_doc(d: Mapping[str, Any]) -> SliverSpec:
        return SliverSpec(d["id"], d["kind"], d.get("client_id", ""), tuple(d.get("units", ())),
                          tuple((str(k), int(v)) for k, v in d.get("labels", ())),
                          SliverDetails(**d.get("details", {})))


@dataclass(frozen=True)
class Maintenance:
    """The authority's answer to a maintenance order: the host, whether it came back, and (when it went out)
    the pools reclaimed now and those still promised, which drain as their tickets end."""

    host: str
    back: bool
    reclaimed: tuple[str, ...] = ()
    busy: tuple[str, ...] = ()
