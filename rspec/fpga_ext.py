"""slicex's FPGA RSpec extension (namespace http://slicex.dev/rspec/ext/fpga/1, schema schemas/fpga-1.xsd).

In a request node:
  <fpga:sliver type="fpga-bitstream" bitstream="sha256:<digest>"/>            a whole FPGA, your bitstream
  <fpga:sliver type="virtual-router" bandwidth_mbps="200" table_size="5000"/> a data plane on a shared FPGA
Optional `board="NAME"` binds to a board. A virtual router's forwarding table comes as children
  <fpga:route prefix="10.0.0.0/8" port="1" next_hop="192.0.2.1"/>      port 0-6, next hop an IPv4 address
Manifests repeat the element with `fpga="board/fpgaN"` (or `board/software`), `placement="hardware|software"`
and what the sliver gets (`delivered_mbps`, `programming_seconds`, and for a router in hardware the shared
table's Conflict CAM: `cam_entries`, `cam_bits` of the FPGA, `router_cam_entries` of this router).
Advertisements carry an <fpga:board> per board with one <fpga:fpga> per user FPGA."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from lxml import etree

from slicex.errors import BadArgs

FPGA_NS = "http://slicex.dev/rspec/ext/fpga/1"
KINDS = ("fpga-bitstream", "virtual-router")
SCHEMA_PATH = Path(__file__).with_name("schemas") / "fpga-1.xsd"
SCHEMA_LOCATION = "http://slicex.dev/rspec/ext/fpga/1/fpga-1.xsd"
_SHA256 = re.compile(r"^sha256:[0-9a-fA-F]{64}$")
MAX_TABLE_SIZE = 1 << 22
MAX_PORT = 6  # port 7 is the shared table's "no route"
Route = tuple[int, int, int, int]  # prefix, length, port, next hop (IPv4 as integers)


@dataclass(frozen=True)
class FpgaRequest:
    kind: str
    bitstream: str = ""
    bandwidth_mbps: float = 0.0
    table_size: int = 1000
    board: str = ""
    routes: tuple[str, ...] = ()  # a virtual router's table, "a.b.c.d/len port next_hop" (route_text; plain
    # strings cross XML-RPC, whose integers stop at 2^31)

    def table(self) -> list[Route]:
        """The routes as (prefix, length, port, next hop) integers."""
        return [route_of(r) for r in self.routes]


def _q(name: str) -> str:
    return f"{{{FPGA_NS}}}{name}"


def parse_fpga_request(node: etree._Element, client_id: str) -> FpgaRequest | None:
    """The FPGA request inside a request node, or None if it has none; BadArgs says what to fix."""
    found = node.findall(_q("sliver"))
    if not found:
        return None
    if len(found) > 1:
        raise BadArgs(f"node {client_id}: one fpga:sliver per node (found {len(found)})")
    el = found[0]
    kind = el.get("type", "")
    if kind not in KINDS:
        raise BadArgs(f"node {client_id}: fpga sliver type {kind!r} is not one of {', '.join(KINDS)}")
    try:
        bw = float(el.get("bandwidth_mbps", "0"))
        table = int(el.get("table_size", "1000"))
    except ValueError:
        raise BadArgs(f"node {client_id}: bandwidth_mbps and table_size must be numbers") from None
    if not (bw >= 0 and bw != float("inf")) or not 1 <= table <= MAX_TABLE_SIZE:
        raise BadArgs(f"node {client_id}: bandwidth_mbps must be a finite number >= 0 and table_size 1-{MAX_TABLE_SIZE}")
    bitstream = el.get("bitstream", "")
    if kind == "fpga-bitstream" and not _SHA256.match(bitstream):
        raise BadArgs(f"node {client_id}: an fpga-bitstream sliver needs bitstream=\"sha256:<64 hex digits>\" of a "
                      f"bitstream in your catalogue (slicex fpga upload prints it)")
    if kind == "virtual-router" and bitstream:
        raise BadArgs(f"node {client_id}: a virtual-router sliver runs the aggregate's router design; drop the "
                      f"bitstream attribute or ask for type=\"fpga-bitstream\"")
    routes = tuple(_route(r, client_id) for r in el.findall(_q("route")))
    if routes and kind != "virtual-router":
        raise BadArgs(f"node {client_id}: fpga:route belongs in a virtual-router sliver")
    if len(routes) > table:
        raise BadArgs(f"node {client_id}: {len(routes)} fpga:route elements exceed table_size={table}; raise it")
    return FpgaRequest(kind, bitstream.lower(), bw, table, el.get("board", ""), routes)


def route_text(route: Route) -> str:
    prefix, length, port, hop = route
    return f"{ipaddress.IPv4Address(prefix)}/{length} {port} {ipaddress.IPv4Address(hop)}"


def route_of(text: str) -> Route:
    """The inverse of route_text; BadArgs if it is not one."""
    try:
        prefix, port, hop = text.split()
        net = ipaddress.IPv4Network(prefix, strict=True)
        return int(net.network_address), net.prefixlen, int(port), int(ipaddress.IPv4Address(hop))
    except ValueError:
        raise BadArgs(f"malformed route {text!r}: want \"a.b.c.d/len port a.b.c.d\"") from None


def _route(el: etree._Element, client_id: str) -> str:
    """One <fpga:route prefix="a.b.c.d/len" port="p" next_hop="a.b.c.d"/> as route_text; BadArgs names the
    bad one."""
    text = f'prefix="{el.get("prefix", "")}" port="{el.get("port", "")}" next_hop="{el.get("next_hop", "")}"'
    try:
        net = ipaddress.IPv4Network(el.get("prefix", ""), strict=True)
        port = int(el.get("port", ""))
        hop = int(ipaddress.IPv4Address(el.get("next_hop", "")))
    except ValueError as exc:
        raise BadArgs(f"node {client_id}: fpga:route {text}: {exc} (want prefix=\"a.b.c.d/len\" with no host "
                      f"bits set, port 0-{MAX_PORT}, next_hop an IPv4 address)") from None
    if not 0 <= port <= MAX_PORT:
        raise BadArgs(f"node {client_id}: fpga:route {text}: port must be 0-{MAX_PORT} (7 means no route)")
    return route_text((int(net.network_address), net.prefixlen, port, hop))


def sliver_element(req: FpgaRequest, fpga: str = "", placement: str = "", delivered_mbps: float | None = None,
                   programming_seconds: float | None = None) -> etree._Element:
    """The <fpga:sliver> element for a request (no placement) or a manifest (with where it landed)."""
    el = etree.Element(_q("sliver"), nsmap={"fpga": FPGA_NS})
    el.set("type", req.kind)
    if req.bitstream:
        el.set("bitstream", req.bitstream)
    if req.kind == "virtual-router":
        el.set("bandwidth_mbps", _num(req.bandwidth_mbps))
        el.set("table_size", str(req.table_size))
    if req.board:
        el.set("board", req.board)
    if fpga:
        el.set("fpga", fpga)
    if placement:
        el.set("placement", placement)
    if delivered_mbps is not None:
        el.set("delivered_mbps", _num(delivered_mbps))
    if programming_seconds is not None:
        el.set("programming_seconds", _num(programming_seconds))
    for r in req.table():
        route_element(el, r)
    return el


def route_element(parent: etree._Element, route: Route) -> etree._Element:
    prefix, length, port, hop = route
    return etree.SubElement(parent, _q("route"), prefix=f"{ipaddress.IPv4Address(prefix)}/{length}", port=str(port),
                            next_hop=str(ipaddress.IPv4Address(hop)))


MANIFEST_KEYS = ("fpga", "delivered_mbps", "programming_seconds", "cam_entries", "cam_bits",
                 "router_cam_entries")


def annotate_manifest(el: etree._Element, details: Mapping[str, Any]) -> None:
    """Fill a manifest's <fpga:sliver> from the sliver's details: where it landed (the broker's reservation
    at Allocate; the FPGA model's placement once provisioned) and what it gets."""
    if not details.get("fpga"):
        return
    el.set("placement", str(details.get("placement") or "hardware"))  # a whole FPGA is hardware
    for key in MANIFEST_KEYS:
        v = details.get(key)
        if v is None or v == "":
            continue
        el.set(key, _num(v) if isinstance(v, float) else str(v))


def board_element(board: dict[str, Any]) -> etree._Element:
    """An advertisement's <fpga:board> from FpgaAggregate.advertise() (or any dict of the same shape)."""
    el = etree.Element(_q("board"), nsmap={"fpga": FPGA_NS})
    for key in ("name", "model", "device", "fpgas", "ports_per_fpga", "port_mbps", "table", "hardware_planes",
                "sram_banks", "sram_bank_bits", "inter_chip_channels", "software_planes", "emulated"):
        if key in board:
            v = board[key]
            el.set(key, ("true" if v else "false") if isinstance(v, bool) else str(v))
    for f in board.get("fpga_state", []):
        sub = etree.SubElement(el, _q("fpga"))
        sub.set("id", f["id"])
        sub.set("available", "true" if f["available"] else "false")
        sub.set("planes_free", str(f["planes_free"]))
    return el


@cache
def schema() -> etree.XMLSchema:
    return etree.XMLSchema(etree.parse(str(SCHEMA_PATH)))


def validate(el: etree._Element) -> None:
    """Check one extension element against schemas/fpga-1.xsd; BadArgs names the first problem."""
    s = schema()
    if not s.validate(el):
        raise BadArgs(f"fpga extension element does not match fpga-1.xsd: {s.error_log.last_error.message}")


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))
