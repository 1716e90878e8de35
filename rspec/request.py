"""Request RSpecs (GENI v3): parse untrusted XML into plain data the slice manager embeds.

The original document is kept (`Request.xml`) because the manifest is the request annotated: unknown
extension elements pass through unchanged.

Numbers are untrusted too: every numeric attribute is parsed as a finite number inside a stated range, or the
request is BADARGS saying which attribute and what is allowed (`1e999`, `nan`, `inf`, negatives and absurd
sizes never reach the embedding, where they used to surface as SERVERERROR)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from lxml import etree

from rspec.blockstore import Blockstore, parse_blockstores
from rspec.fpga_ext import FpgaRequest, parse_fpga_request
from rspec.namespaces import MEASURE, PGV2, PUBLIC, RSPEC3, SHARED_VLAN, SHARED_VLAN_GENI, q
from slicex.errors import BadArgs, BadVersion
from slicex.xmlsafe import parse_xml

MAX_REQUEST_BYTES = 2 * 1024 * 1024
MAX_ELEMENTS = 5000
MAX_CAPACITY_KBPS = 10**9  # 1 Tbps: beyond any link this aggregate could offer
MAX_LATENCY_MS = 60_000
MAX_NUMBER_TEXT = 64  # characters; longer "numbers" are refused before parsing


@dataclass(frozen=True)
class RequestInterface:
    client_id: str
    component_id: str | None = None
    ip: str | None = None
    netmask: str | None = None


@dataclass(frozen=True)
class RequestNode:
    client_id: str
    component_id: str | None = None
    component_manager_id: str | None = None
    exclusive: bool | None = None
    sliver_type: str | None = None
    disk_image: str | None = None
    hardware_type: str | None = None
    interfaces: tuple[RequestInterface, ...] = ()
    extensions: tuple[str, ...] = ()  # tags of foreign-namespace children, e.g. '{ns}fpga'
    fpga: FpgaRequest | None = None
    execute: tuple[tuple[str, str], ...] = ()  # post-boot services/execute: (shell, command)
    install: tuple[tuple[str, str], ...] = ()  # services/install: (url of a tar archive, install_path)
    # public:port (schemas/public-1.xsd): (the node's TCP port, the public port asked for, 0: any free one)
    public_ports: tuple[tuple[int, int], ...] = ()
    blockstores: tuple[Blockstore, ...] = ()  # persistent datasets it mounts (emulab:blockstore)


@dataclass(frozen=True)
class RequestLink:
    client_id: str
    interface_refs: tuple[str, ...] = ()
    component_managers: tuple[str, ...] = ()
    capacity_kbps: int | None = None
    latency_ms: int | None = None
    packet_loss: float | None = None
    link_type: str | None = None
    shared_vlan: str | None = None
    vlan_tag: int | None = None
    # stitching: (external port URN, tags on its wire outermost first as (TPID, VID)), set by the aggregate
    # from its own hops (stitching/am_hops.py), never read from the RSpec
    uplinks: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = ()
    mirror_to: str | None = None  # measure:mirror: the capture interface (client_id) the link's packets are copied to


@dataclass(frozen=True)
class Request:
    nodes: tuple[RequestNode, ...]
    links: tuple[RequestLink, ...]
    xml: str = field(repr=False, default="")

    def node(self, client_id: str) -> RequestNode | None:
        return next((n for n in self.nodes if n.client_id == client_id), None)

    def for_aggregate(self, component_manager_id: str) -> Request:
        """The part of a multi-aggregate request this aggregate must satisfy. Managers are matched by URN
        authority, as omni's stitcher and the path service match them: `…+authority+cm` names the aggregate
        whose URN is `…+authority+am` (users copy either spelling from other testbeds' examples)."""
        cm = manager_key(component_manager_id)
        nodes = tuple(n for n in self.nodes
                      if not n.component_manager_id or manager_key(n.component_manager_id) == cm)
        ours = {i.client_id for n in nodes for i in n.interfaces}
        links = tuple(lk for lk in self.links
                      if (not lk.component_managers or cm in {manager_key(c) for c in lk.component_managers})
                      and (not lk.interface_refs or any(r in ours for r in lk.interface_refs)))
        return Request(nodes, links, self.xml)


def manager_key(urn: str) -> str:
    """What identifies a component manager: its URN's authority, lower-cased (the text itself when it is
    not a URN)."""
    parts = urn.split("+")
    return parts[1].lower() if len(parts) > 2 and parts[0].lower() == "urn:publicid:idn" else urn.lower()


def _bool(text: str | None) -> bool | None:
    if text is None:
        return None
    if text.lower() in ("true", "1"):
        return True
    if text.lower() in ("false", "0"):
        return False
    raise BadArgs(f"{text!r} is not a boolean (true/false)")


def _number(text: str | None, what: str, low: float, high: float, unit: str = "",
            integer: bool = False) -> float | None:
    """A finite number in [low, high] (None when absent), else BadArgs naming the attribute and the range."""
    if text is None or text.strip() == "":
        return None
    allowed = f"{low:g}–{high:g}{' ' + unit if unit else ''}"
    if len(text) > MAX_NUMBER_TEXT:
        raise BadArgs(f"{what} {text[:20]!r}… is not a number in {allowed}")
    try:
        value = float(text)
    except ValueError:
        raise BadArgs(f"{what} {text!r} is not a number; give a number in {allowed}") from None
    if not math.isfinite(value) or not low <= value <= high:
        raise BadArgs(f"{what} {text!r} is out of range; give a number in {allowed}")
    if integer and value != int(value):
        raise BadArgs(f"{what} {text!r} must be a whole number in {allowed}")
    return value


def _int(text: str | None, what: str, low: int, high: int, unit: str = "", integer: bool = False) -> int | None:
    value = _number(text, what, low, high, unit, integer)
    return None if value is None else int(value)


def parse_request(text: str | bytes, max_bytes: int = MAX_REQUEST_BYTES) -> Request:
    """Parse a GENI v3 request RSpec or raise BadArgs/BadVersion/TooBig saying what is wrong."""
    root = parse_xml(text, "request RSpec", max_bytes)
    if etree.QName(root).localname != "rspec":
        raise BadArgs(f"request RSpec root element is <{etree.QName(root).localname}>, expected <rspec>")
    ns = etree.QName(root).namespace
    if ns == PGV2:
        raise BadVersion(f"request is a ProtoGENI v2 RSpec ({PGV2}); this aggregate takes GENI v3 ({RSPEC3})")
    if ns != RSPEC3:
        raise BadVersion(f"request namespace {ns!r} is not GENI RSpec v3 ({RSPEC3})")
    kind = root.get("type")
    if kind != "request":
        raise BadArgs(f"RSpec type is {kind!r}; Allocate needs type=\"request\" (an advertisement or manifest "
                      f"is not a request)")
    if sum(1 for _ in root.iter()) > MAX_ELEMENTS:
        raise BadArgs(f"request has more than {MAX_ELEMENTS} elements")
    from rspec.validate import validate_rspec

    problems = validate_rspec(root, "request")
    if problems:
        raise BadArgs("request RSpec is not valid GENI v3: " + "; ".join(problems[:5]))
    nodes: list[RequestNode] = []
    seen: set[str] = set()
    for el in root.findall(q(RSPEC3, "node")):
        nodes.append(_node(el, seen))
    links = [_link(el, seen) for el in root.findall(q(RSPEC3, "link"))]
    iface_ids = {i.client_id for n in nodes for i in n.interfaces}
    for lk in links:
        for ref in lk.interface_refs:
            if ref not in iface_ids:
                raise BadArgs(f"link {lk.client_id!r} refers to interface {ref!r}, which no node declares")
    _check_mirrors(links, iface_ids)
    text_out = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    return Request(tuple(nodes), tuple(links), text_out)


def _client_id(el: etree._Element, what: str, seen: set[str]) -> str:
    cid = el.get("client_id")
    if not cid:
        raise BadArgs(f"a <{what}> has no client_id")
    if len(cid) > 128:
        raise BadArgs(f"client_id {cid[:40]!r}… is longer than 128 characters")
    if cid in seen:
        raise BadArgs(f"client_id {cid!r} is used twice; client_ids must be unique in a request")
    seen.add(cid)
    return cid


def _node(el: etree._Element, seen: set[str]) -> RequestNode:
    cid = _client_id(el, "node", seen)
    st = el.find(q(RSPEC3, "sliver_type"))
    image = st.find(q(RSPEC3, "disk_image")) if st is not None else None
    hw = el.find(q(RSPEC3, "hardware_type"))
    ifaces = []
    for i in el.findall(q(RSPEC3, "interface")):
        icid = _client_id(i, "interface", seen)
        ip = i.find(q(RSPEC3, "ip"))
        ifaces.append(RequestInterface(icid, i.get("component_id"), ip.get("address") if ip is not None else None,
                                       ip.get("netmask") if ip is not None else None))
    ext = tuple(str(c.tag) for c in el if isinstance(c.tag, str) and etree.QName(c).namespace != RSPEC3)
    execute = tuple((x.get("shell") or "sh", x.get("command") or "")
                    for x in el.findall(f"{q(RSPEC3, 'services')}/{q(RSPEC3, 'execute')}"))
    install = tuple((x.get("url") or "", x.get("install_path") or "")
                    for x in el.findall(f"{q(RSPEC3, 'services')}/{q(RSPEC3, 'install')}"))
    return RequestNode(cid, el.get("component_id"), el.get("component_manager_id"), _bool(el.get("exclusive")),
                       st.get("name") if st is not None else None, image.get("name") if image is not None else None,
                       hw.get("name") if hw is not None else None, tuple(ifaces), ext, parse_fpga_request(el, cid),
                       execute, install, _public_ports(el, cid), parse_blockstores(el, cid))


def _public_ports(el: etree._Element, cid: str) -> tuple[tuple[int, int], ...]:
    """(node port, asked public port or 0) of each public:port of a node; a node port named twice is refused
    (one public port reaches one node port)."""
    out: list[tuple[int, int]] = []
    for p in el.findall(q(PUBLIC, "port")):
        port = _int(p.get("port"), f"node {cid} public port", 1, 65535, integer=True)
        if port is None:
            raise BadArgs(f"node {cid}: a public:port has no port attribute (the node's TCP port to reach)")
        asked = _int(p.get("public_port"), f"node {cid} public_port", 1, 65535, integer=True) or 0
        if any(port == have for have, _ in out):
            raise BadArgs(f"node {cid}: public:port {port} is asked twice")
        out.append((port, asked))
    return tuple(out)


def _link(el: etree._Element, seen: set[str]) -> RequestLink:
    cid = _client_id(el, "link", seen)
    refs = tuple(r.get("client_id", "") for r in el.findall(q(RSPEC3, "interface_ref")))
    cms = tuple(c.get("name", "") for c in el.findall(q(RSPEC3, "component_manager")))
    cap = lat = None
    loss = None
    for p in el.findall(q(RSPEC3, "property")):
        cap = max(cap or 0, _int(p.get("capacity"), f"link {cid} capacity", 0, MAX_CAPACITY_KBPS, "kbps") or 0) or cap
        lat = _int(p.get("latency"), f"link {cid} latency", 0, MAX_LATENCY_MS, "ms") if p.get("latency") else lat
        if p.get("packet_loss"):
            loss = _number(p.get("packet_loss"), f"link {cid} packet_loss", 0, 1, "(a fraction)")
    lt = el.find(q(RSPEC3, "link_type"))
    shared = None
    for ns in (SHARED_VLAN, SHARED_VLAN_GENI):
        sv = el.find(q(ns, "link_shared_vlan"))
        if sv is not None:
            shared = sv.get("name")
    tag = _int(el.get("vlantag"), f"link {cid} vlantag", 1, 4094, integer=True)
    mirrors = el.findall(q(MEASURE, "mirror"))
    if len(mirrors) > 1:
        raise BadArgs(f"link {cid}: one measure:mirror per link (a capture interface sees all of its packets)")
    return RequestLink(cid, refs, cms, cap, lat, loss, lt.get("name") if lt is not None else None, shared, tag,
                       mirror_to=mirrors[0].get("to") if mirrors else None)


def _check_mirrors(links: list[RequestLink], iface_ids: set[str]) -> None:
    """A mirror's capture interface is one of the request's own, on no link and no other mirror's: it then
    sees the mirrored link's packets and nothing else."""
    on_links = {r for lk in links for r in lk.interface_refs}
    taken: dict[str, str] = {}
    for lk in links:
        to = lk.mirror_to
        if to is None:
            continue
        if to not in iface_ids:
            raise BadArgs(f"link {lk.client_id}: measure:mirror to {to!r}, which no node of the request declares")
        if to in on_links:
            raise BadArgs(f"link {lk.client_id}: measure:mirror to {to!r}, which is on a link; a capture interface "
                          f"must be on none")
        if to in taken:
            raise BadArgs(f"links {taken[to]} and {lk.client_id} both mirror to {to!r}; give each its own")
        taken[to] = lk.client_id
