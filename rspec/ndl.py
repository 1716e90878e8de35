"""NDL-OWL: the substrate as an RDF graph in ORCA's vocabulary (rdflib), and the conversions around it.

    substrate_graph(Substrate)      the operator's substrate as NDL-OWL
    substrate_from_graph(Graph)     and back: the graph is a complete description (`slicex substrate ndl` output
                                    can be loaded as a substrate file)
    advertisement_graph(ad XML)     the graph rebuilt from an advertisement slicex wrote, so
                                    NDL -> advertisement -> parse -> NDL is checked isomorphic (rdflib.compare)
    advertisement_from_graph(...)   the advertisement generated from an NDL model
    request_graph(Request)          a request RSpec as an NDL request: a request:Reservation whose elements are
                                    compute elements and network connections that depend on them

Resources are named by their GENI URNs; the parts of a resource (label sets, switching matrices, sites) get
fragment names under it. Classes and properties come from ORCA's ontologies at
http://geni-orca.renci.org/owl/<name>.owl# laid out as ORCA's substrate files do (LabelSet
-collections:element-> LabelRange -lowerBound/upperBound-> ethernet:VLAN with label_ID); what ORCA's
ontologies lack (VM sizes, image metadata, hardware types, exclusivity, roles, document order) uses the
slicex namespace."""

from __future__ import annotations

import json
from datetime import datetime

from lxml import etree
from rdflib import Graph, Literal, Namespace, URIRef
from rdflib.namespace import RDF, XSD

from rspec.advertisement import FPGA_SLIVER_TYPES, Usage, build_advertisement
from rspec.namespaces import CAPACITY, OPSTATE, QINQ, RSPEC3, STITCH2, q
from rspec.request import Request
from rspec.substrate import (
    ExternalLink,
    Host,
    Image,
    Interface,
    Port,
    Site,
    StaticVlan,
    Substrate,
    SubstrateError,
    Switch,
    Trunk,
    VmSize,
    parse_range,
    urn_name,
)
from slicex.xmlsafe import parse_xml

ORCA = "http://geni-orca.renci.org/owl/"
TOPO = Namespace(ORCA + "topology.owl#")
LAYER = Namespace(ORCA + "layer.owl#")
ETH = Namespace(ORCA + "ethernet.owl#")
DOM = Namespace(ORCA + "domain.owl#")
COMP = Namespace(ORCA + "compute.owl#")
REQ = Namespace(ORCA + "request.owl#")
COLL = Namespace(ORCA + "collections.owl#")
LOC = Namespace(ORCA + "location.owl#")
GEO = Namespace("http://www.w3.org/2003/01/geo/wgs84_pos#")
SX = Namespace("http://slicex.dev/ndl/slicex.owl#")

PREFIXES = (("topology", TOPO), ("layer", LAYER), ("ethernet", ETH), ("domain", DOM), ("compute", COMP),
            ("request", REQ), ("collections", COLL), ("location", LOC), ("wgs84_pos", GEO), ("slicex", SX))


def new_graph() -> Graph:
    g = Graph()
    for prefix, ns in PREFIXES:
        g.bind(prefix, ns)
    return g


def _int(n: int) -> Literal:
    return Literal(int(n), datatype=XSD.integer)


def _text(s: str) -> Literal:
    return Literal(s)


class _Builder:
    """One way to write each fact, used by the substrate and the advertisement readers alike (that is what
    makes the round trip meaningful)."""

    def __init__(self, authority: str, cm: str):
        self.g = new_graph()
        self.authority = authority
        self.domain = URIRef(cm)
        g = self.g
        g.add((self.domain, RDF.type, TOPO.NetworkDomain))
        g.add((self.domain, TOPO.hasName, _text(authority)))
        g.add((self.domain, LAYER.isLabelProducer, Literal(True)))
        service = URIRef(cm + "#service")
        g.add((self.domain, DOM.hasService, service))
        g.add((service, RDF.type, DOM.NetworkService))
        g.add((service, DOM.isAllocatable, Literal(True)))
        g.add((service, LAYER.atLayer, ETH.EthernetNetworkElement))

    def site(self, order: int, name: str, description: str, country: str, lat: float | None,
             lon: float | None) -> None:
        s = URIRef(f"{self.domain}#site/{name}")
        g = self.g
        g.add((self.domain, COLL.element, s))
        g.add((s, RDF.type, COLL.Set))
        g.add((s, TOPO.hasName, _text(name)))
        g.add((s, SX.order, _int(order)))
        if description:
            g.add((s, SX.description, _text(description)))
        if country:
            loc = URIRef(f"{s}/location")
            g.add((s, LOC.locatedAt, loc))
            g.add((loc, RDF.type, LOC.Location))
            g.add((loc, SX.country, _text(country)))
            if lat is not None:
                g.add((loc, GEO.lat, Literal(float(lat), datatype=XSD.double)))
                g.add((loc, GEO.long, Literal(float(lon), datatype=XSD.double)))

    def device(self, order: int, cid: str, name: str, hardware_type: str, exclusive: bool, site: str) -> URIRef:
        d = URIRef(cid)
        g = self.g
        g.add((d, RDF.type, TOPO.Device))
        g.add((d, REQ.inDomain, self.domain))
        g.add((d, TOPO.hasName, _text(name)))
        g.add((d, SX.hardwareType, _text(hardware_type)))
        g.add((d, SX.exclusive, Literal(exclusive)))
        g.add((d, SX.order, _int(order)))
        if site:
            g.add((URIRef(f"{self.domain}#site/{site}"), COLL.element, d))
        return d

    def compute(self, node: URIRef, cores: int, memory_mb: int) -> None:
        self.g.add((node, COMP.numCPUCores, _int(cores)))
        self.g.add((node, COMP.memoryCapacity, _int(memory_mb)))

    def interface(self, device: URIRef, order: int, cid: str, bandwidth_kbps: int, role: str) -> URIRef:
        i = URIRef(cid)
        g = self.g
        g.add((device, TOPO.hasInterface, i))
        g.add((i, TOPO.interfaceOf, device))
        g.add((i, RDF.type, TOPO.Interface))
        g.add((i, RDF.type, ETH.EthernetNetworkElement))
        g.add((i, LAYER.bandwidth, _int(bandwidth_kbps)))
        g.add((i, SX.role, _text(role)))
        g.add((i, SX.order, _int(order)))
        return i

    def connect(self, a: str, b: str) -> None:
        self.g.add((URIRef(a), TOPO.connectedTo, URIRef(b)))

    def label_set(self, owner: URIRef, prop: URIRef, name: str, ranges: list[tuple[int, int]]) -> URIRef:
        """ORCA's layout: owner -prop-> LabelSet -collections:element-> LabelRange -lower/upperBound-> VLAN."""
        g = self.g
        ls = URIRef(f"{owner}#{name}")
        g.add((owner, prop, ls))
        g.add((ls, RDF.type, LAYER.LabelSet))
        g.add((ls, DOM.hasResourceType, DOM.VLAN))
        g.add((ls, COLL.size, _int(sum(hi - lo + 1 for lo, hi in ranges))))
        for n, (lo, hi) in enumerate(sorted(ranges), 1):
            r = URIRef(f"{ls}/{n}")
            g.add((ls, COLL.element, r))
            g.add((r, RDF.type, LAYER.LabelRange))
            g.add((r, LAYER.lowerBound, self.vlan(owner, lo)))
            g.add((r, LAYER.upperBound, self.vlan(owner, hi)))
        return ls

    def vlan(self, owner: URIRef, tag: int) -> URIRef:
        v = URIRef(f"{owner}#vlan/{tag}")
        self.g.add((v, RDF.type, ETH.VLAN))
        self.g.add((v, LAYER.label_ID, _int(tag)))
        return v

    def switch(self, order: int, sw: Switch) -> URIRef:
        d = self.device(order, sw.component_id, sw.name, "switch", False, sw.site)
        matrix = URIRef(f"{sw.component_id}#matrix")
        self.g.add((d, TOPO.hasSwitchMatrix, matrix))
        self.g.add((matrix, RDF.type, ETH.EthernetSwitchingMatrix))
        self.g.add((matrix, LAYER.switchingCapability, ETH.EthernetNetworkElement))
        self.label_set(d, ETH.availableVLANSet, "availableVLANSet", list(sw.vlan_range))
        return d

    def static_vlan(self, v: StaticVlan) -> None:
        """Tags configured outside the allocator are the switch's used labels; shared ones carry a name."""
        g = self.g
        sw = URIRef(v.switch)
        used = URIRef(f"{sw}#usedLabelSet")
        g.add((sw, LAYER.usedLabelSet, used))
        g.add((used, RDF.type, LAYER.LabelSet))
        g.add((used, DOM.hasResourceType, DOM.VLAN))
        label = self.vlan(sw, v.tag)
        g.add((used, COLL.element, label))
        g.add((label, TOPO.hasName, _text(v.name)))
        g.add((label, SX.shared, Literal(v.shared)))
        if v.description:
            g.add((label, SX.description, _text(v.description)))

    def trunk(self, order: int, t: Trunk) -> None:
        g = self.g
        link = URIRef(t.component_id)
        g.add((link, RDF.type, TOPO.NetworkConnection))
        g.add((link, REQ.inDomain, self.domain))
        g.add((link, TOPO.hasName, _text(t.name)))
        g.add((link, SX.order, _int(order)))
        g.add((link, LAYER.bandwidth, _int(t.bandwidth_kbps)))
        for p in (t.port_a, t.port_b):
            g.add((link, TOPO.hasInterface, URIRef(p)))
        self.connect(t.port_a, t.port_b)
        if t.vlan_range:  # the tags its wire carries (absent: those either switch hands out)
            self.label_set(link, SX.trunkVLANSet, "trunkVLANSet", list(t.vlan_range))
        for p in t.translation:  # a trunk's capabilities are its ports' (ORCA's terms, on the interface)
            g.add((URIRef(p), LAYER.swappingCapability, ETH.VLAN))
        for p in t.qinq:
            g.add((URIRef(p), LAYER.tunnelingCapability, ETH.VLAN))
        if t.s_vlan_range:
            self.label_set(link, SX.sTagVLANSet, "sTagVLANSet", list(t.s_vlan_range))

    def vm_size(self, order: int, name: str, cores: int, memory_mb: int, disk_gb: int) -> None:
        s = URIRef(f"urn:publicid:IDN+{self.authority}+vmsize+{name}")
        g = self.g
        g.add((s, RDF.type, COMP.VM))
        g.add((s, REQ.inDomain, self.domain))
        g.add((s, TOPO.hasName, _text(name)))
        self.compute(s, cores, memory_mb)
        g.add((s, SX.diskGB, _int(disk_gb)))
        g.add((s, SX.order, _int(order)))

    def image(self, order: int, img: Image) -> None:
        i = URIRef(img.urn)
        g = self.g
        g.add((i, RDF.type, COMP.VMImage))
        g.add((i, REQ.inDomain, self.domain))
        g.add((i, TOPO.hasName, _text(img.name)))
        g.add((i, SX.os, _text(img.os)))
        g.add((i, SX.version, _text(img.version)))
        g.add((i, SX.description, _text(img.description)))
        g.add((i, SX.order, _int(order)))
        if img.url:
            g.add((i, TOPO.hasURL, _text(img.url)))

    def external(self, order: int, ext: ExternalLink) -> None:
        g = self.g
        link = URIRef(ext.component_id)
        local, remote, remote_domain = URIRef(ext.local_port), URIRef(ext.remote_port), URIRef(ext.remote_aggregate)
        g.add((link, RDF.type, TOPO.NetworkConnection))
        g.add((link, REQ.inDomain, self.domain))
        g.add((link, TOPO.hasName, _text(ext.name)))
        g.add((link, SX.order, _int(order)))
        g.add((link, TOPO.hasInterface, local))
        g.add((link, TOPO.hasInterface, remote))
        g.add((local, TOPO.linkTo, remote))
        g.add((remote, RDF.type, TOPO.Interface))
        g.add((remote, REQ.inDomain, remote_domain))
        g.add((remote_domain, RDF.type, TOPO.NetworkDomain))
        g.add((link, LAYER.bandwidth, _int(ext.capacity_kbps)))
        g.add((link, SX.minimumCapacity, _int(ext.min_capacity_kbps)))
        g.add((link, SX.granularity, _int(ext.granularity_kbps)))
        g.add((link, SX.trafficEngineeringMetric, _int(ext.te_metric)))
        g.add((link, SX.mtu, _int(ext.mtu)))
        self.label_set(link, ETH.availableVLANSet, "availableVLANSet", list(ext.vlan_range))
        if ext.vlan_translation:
            g.add((link, LAYER.swappingCapability, ETH.VLAN))
        if ext.qinq:
            g.add((link, LAYER.tunnelingCapability, ETH.VLAN))
            if ext.s_vlan_range and tuple(ext.s_vlan_range) != tuple(ext.vlan_range):
                # the 802.1ad S-tags the port pushes (ORCA has no term for them); absent: its VLAN range
                self.label_set(link, SX.sTagVLANSet, "sTagVLANSet", list(ext.s_vlan_range))

    def fpga_board(self, order: int, cid: str, board: dict) -> None:
        d = self.device(order, cid, str(board.get("name")), str(board.get("model")), False, "")
        self.g.add((d, RDF.type, SX.FpgaBoard))
        self.g.add((d, SX.configuration, _text(json.dumps(board, sort_keys=True))))


def substrate_graph(sub: Substrate) -> Graph:
    """The substrate as NDL-OWL (AM settings such as provisioning_seconds and am_url are not topology and stay out)."""
    b = _Builder(sub.authority, sub.component_manager_id)
    for n, s in enumerate(sub.all_sites):
        b.site(n, s.name, s.description, s.country, s.latitude, s.longitude)
    order = 0
    for h in sub.hosts:
        d = b.device(order, h.component_id, h.name, h.hardware_type, h.exclusive, h.site)
        order += 1
        b.g.add((d, RDF.type, COMP.ServerCloud if not h.exclusive else SX.BareMetalNode))
        b.compute(d, h.cores, h.memory_mb)
        if h.disk_gb:
            b.g.add((d, SX.diskGB, _int(h.disk_gb)))
        for k, i in enumerate(h.interfaces):
            b.interface(d, k, i.component_id, i.bandwidth_kbps, i.role)
            if i.switch_port:
                b.connect(i.component_id, i.switch_port)
    for sw in sub.switches:
        d = b.switch(order, sw)
        order += 1
        for k, p in enumerate(sw.ports):
            b.interface(d, k, p.component_id, p.bandwidth_kbps, "experimental")
    for board in sub.fpga_boards:
        b.fpga_board(order, sub.fpga_board_id(board), board)
        order += 1
    for v in sub.static_vlans:
        b.static_vlan(v)
    for n, t in enumerate(sub.trunks):
        b.trunk(n, t)
    if any(not h.exclusive for h in sub.hosts):  # sizes mean nothing without a VM host (nor does an ad show them)
        for n, s in enumerate(sub.vm_sizes):
            b.vm_size(n, s.name, s.cores, s.memory_mb, s.disk_gb)
    for n, img in enumerate(sub.images):
        b.image(n, img)
    for n, ext in enumerate(sub.external_links):
        b.external(n, ext)
    return b.g


# ---- advertisement -> NDL ----------------------------------------------------------------------------------------

def _ranges(text: str | None) -> list[tuple[int, int]]:
    out = []
    for part in (text or "").split(","):
        if part.strip() and part.strip() not in ("any", "null"):
            out.append(parse_range(part))
    return out


def advertisement_graph(ad: str | bytes) -> Graph:
    """Rebuild the NDL-OWL substrate graph from an advertisement slicex generated (with no slivers in use)."""
    return substrate_graph(substrate_from_advertisement(ad))


def substrate_from_advertisement(ad: str | bytes, source: str = "advertisement") -> Substrate:
    """The Substrate an advertisement slicex wrote describes (its capacity extension carries the numbers).
    VLAN ranges are read from what is free, so read an ad generated with nothing in use."""
    root = parse_xml(ad, source, 256 * 1024 * 1024)
    if root.tag != q(RSPEC3, "rspec") or root.get("type") != "advertisement":
        raise SubstrateError(f"{source}: not a GENI v3 advertisement; fix: give the output of ListResources or "
                             f"`slicex substrate ad`")
    op = root.find(q(OPSTATE, "rspec_opstate"))
    nodes = root.findall(q(RSPEC3, "node"))
    cm = op.get("aggregate_manager_id") if op is not None else (nodes[0].get("component_manager_id") if nodes else "")
    if not cm or cm.count("+") < 3:
        raise SubstrateError(f"{source}: cannot tell which aggregate it describes (no component_manager_id)")
    authority = cm.split("+")[1]
    sites = tuple(Site(s.get("name"), s.get("description", ""), s.get("country", ""),
                       float(s.get("latitude")) if s.get("latitude") else None,
                       float(s.get("longitude")) if s.get("longitude") else None)
                  for s in root.findall(q(CAPACITY, "site")))
    bandwidth = {p.get("component_id"): int(p.get("bandwidth_kbps")) for p in root.iter(q(CAPACITY, "port"))}
    cables: dict[str, str] = {}
    trunk_links = []
    ext_links: dict[str, tuple[str, str]] = {}
    for link in root.findall(q(RSPEC3, "link")):
        refs = [r.get("component_id") for r in link.findall(q(RSPEC3, "interface_ref"))]
        prop = link.find(q(RSPEC3, "property"))
        kind = link.find(q(RSPEC3, "link_type"))
        if len(refs) != 2:
            continue
        if kind is not None and kind.get("name") == "vlan":
            ext_links[refs[0]] = (link.get("component_id"), link.get("component_name"))
            continue
        cables[refs[0]] = refs[1]
        trunk_links.append((link, refs, int(prop.get("capacity")) if prop is not None else 10_000_000))
    hosts, switches, boards = [], [], []
    sizes: dict[str, VmSize] = {}
    images: dict[str, Image] = {}
    statics = []
    port_ids: set[str] = set()
    for n in nodes:
        hw = n.find(q(RSPEC3, "hardware_type"))
        hardware = hw.get("name") if hw is not None else ""
        site_ref = n.find(q(CAPACITY, "site_ref"))
        site = site_ref.get("name") if site_ref is not None else ""
        cid, name = n.get("component_id"), n.get("component_name") or urn_name(n.get("component_id"))
        vlans = n.find(q(CAPACITY, "vlans"))
        board = n.find(q(CAPACITY, "fpga_board"))
        if board is not None:
            boards.append(json.loads(board.get("config")))
            continue
        if vlans is not None:
            ports = tuple(Port(urn_name(i.get("component_id")).split(":", 1)[1], i.get("component_id"),
                               bandwidth.get(i.get("component_id"), 10_000_000))
                          for i in n.findall(q(RSPEC3, "interface")))
            port_ids |= {p.component_id for p in ports}
            switches.append(Switch(name, cid, ports, tuple(_ranges(vlans.get("ranges"))), site))
            for v in n.findall(q(CAPACITY, "static_vlan")):
                statics.append(StaticVlan(v.get("name"), int(v.get("tag")), cid, v.get("shared") == "true",
                                          v.get("description", "")))
            continue
        compute = n.find(q(CAPACITY, "compute"))
        if compute is None:
            continue
        ifaces = tuple(Interface(urn_name(i.get("component_id")).split(":", 1)[1], i.get("component_id"),
                                 bandwidth.get(i.get("component_id"), 10_000_000), cables.get(i.get("component_id")),
                                 i.get("role") or "experimental")
                       for i in n.findall(q(RSPEC3, "interface")))
        hosts.append(Host(name, cid, int(compute.get("cores")), int(compute.get("memory_mb")), hardware,
                          n.get("exclusive") == "true", ifaces, site, int(compute.get("disk_gb", 0))))
        for st in n.findall(q(RSPEC3, "sliver_type")):
            c = st.find(q(CAPACITY, "compute"))
            if c is not None and st.get("name") not in sizes:
                sizes[st.get("name")] = VmSize(st.get("name"), int(c.get("cores")), int(c.get("memory_mb")),
                                               int(c.get("disk_gb", 0)))
            for img in st.findall(q(RSPEC3, "disk_image")):
                urn = img.get("name")
                if urn not in images:
                    images[urn] = Image(img.get(q(CAPACITY, "name"), urn_name(urn)), urn, img.get("os", ""),
                                        img.get("version", ""), img.get("description", ""), img.get("url", ""))
    trunks = tuple(_trunk_from_ad(link, refs, cap) for link, refs, cap in trunk_links
                   if refs[0] in port_ids and refs[1] in port_ids)
    externals = _externals_from_ad(root, ext_links)
    return Substrate(authority, tuple(hosts), tuple(switches), tuple(sizes.values()), tuple(images.values()),
                     externals, tuple(boards), sites=sites, trunks=trunks, static_vlans=tuple(statics))


def _trunk_from_ad(link: etree._Element, refs: list[str], capacity: int) -> Trunk:
    """A trunk with the wire ranges and port capabilities its capacity:trunk element carries (none: defaults)."""
    info = link.find(q(CAPACITY, "trunk"))
    if info is None:
        return Trunk(link.get("component_name"), link.get("component_id"), refs[0], refs[1], capacity)
    ends = tuple(refs[:2])
    return Trunk(link.get("component_name"), link.get("component_id"), refs[0], refs[1], capacity,
                 tuple(_ranges(info.get("vlan_ranges"))),
                 tuple(p for p in ends if p in (info.get("translation") or "").split()),
                 tuple(p for p in ends if p in (info.get("qinq") or "").split()),
                 tuple(_ranges(info.get("s_vlan_ranges"))))


def _externals_from_ad(root: etree._Element, ext_links: dict[str, tuple[str, str]]) -> tuple[ExternalLink, ...]:
    stitching = root.find(q(STITCH2, "stitching"))
    if stitching is None:
        return ()
    remote_am = {e.get("component_id"): e.get("component_manager_id") for e in root.findall(q(RSPEC3, "external_ref"))}
    out = []
    for port in stitching.iter(q(STITCH2, "port")):
        link = port.find(q(STITCH2, "link"))
        info = link.find(f".//{q(STITCH2, 'switchingCapabilitySpecificInfo_L2sc')}")
        local = link.get("id")
        remote = (link.findtext(q(STITCH2, "remoteLinkId")) or "").strip()
        cid, name = ext_links.get(local, (local, urn_name(local)))
        vlans = tuple(_ranges(info.findtext(q(STITCH2, "vlanRangeAvailability"))))
        tunneling = info.find(q(QINQ, "tunneling"))
        s_tags = tuple(_ranges(tunneling.get("sTagRange"))) if tunneling is not None else ()
        out.append(ExternalLink(
            name, cid, local, remote_am.get(remote, ""), remote,
            vlans,
            int(link.findtext(q(STITCH2, "capacity"))),
            (info.findtext(q(STITCH2, "vlanTranslation")) or "").strip() == "true",
            tunneling is not None, "",
            int(info.findtext(q(STITCH2, "interfaceMTU")) or 9000),
            int(link.findtext(q(STITCH2, "minimumReservableCapacity")) or 1),
            int(link.findtext(q(STITCH2, "granularity")) or 1),
            int(link.findtext(q(STITCH2, "trafficEngineeringMetric")) or 10),
            s_tags if s_tags != vlans else ()))  # the ad names the S-tags always; equal to the VLANs: the default
    return tuple(out)


# ---- NDL -> substrate -> advertisement ---------------------------------------------------------------------------

def _one(g: Graph, s, p, default=None):
    return next(iter(g.objects(s, p)), default)


def _ordered(g: Graph, subjects) -> list:
    return sorted(subjects, key=lambda s: (int(_one(g, s, SX.order, 0)), str(s)))


def _label_ranges(g: Graph, label_set) -> tuple[tuple[int, int], ...]:
    out = []
    for r in g.objects(label_set, COLL.element):
        lo, hi = _one(g, r, LAYER.lowerBound), _one(g, r, LAYER.upperBound)
        out.append((int(_one(g, lo, LAYER.label_ID)), int(_one(g, hi, LAYER.label_ID))))
    return tuple(sorted(out))


def substrate_from_graph(g: Graph, source: str = "<graph>") -> Substrate:
    """Read a Substrate back from its NDL-OWL graph (as substrate_graph writes it)."""
    domains = [d for d in g.subjects(RDF.type, TOPO.NetworkDomain) if (d, DOM.hasService, None) in g]
    if len(domains) != 1:
        raise SubstrateError(f"{source}: expected one topology:NetworkDomain with a domain:hasService, found "
                             f"{len(domains)}; fix: give the output of `slicex substrate ndl`")
    dom = domains[0]
    authority = str(_one(g, dom, TOPO.hasName, ""))
    try:
        return _substrate_from_graph(g, dom, authority)
    except (TypeError, ValueError) as exc:
        raise SubstrateError(f"{source}: incomplete NDL description ({exc}); fix: regenerate it with "
                             f"`slicex substrate ndl`") from None


def _substrate_from_graph(g: Graph, dom, authority: str) -> Substrate:
    sites, member_site = [], {}
    for s in _ordered(g, [s for s in g.objects(dom, COLL.element) if (s, RDF.type, COLL.Set) in g]):
        loc = _one(g, s, LOC.locatedAt)
        lat = _one(g, loc, GEO.lat) if loc is not None else None
        lon = _one(g, loc, GEO.long) if loc is not None else None
        name = str(_one(g, s, TOPO.hasName))
        sites.append(Site(name, str(_one(g, s, SX.description, "")),
                          str(_one(g, loc, SX.country, "")) if loc is not None else "",
                          float(lat) if lat is not None else None, float(lon) if lon is not None else None))
        for m in g.objects(s, COLL.element):
            member_site[m] = name
    devices = _ordered(g, [d for d in g.subjects(REQ.inDomain, dom) if (d, RDF.type, TOPO.Device) in g])
    hosts, switches, boards = [], [], []

    def interfaces(d):
        return _ordered(g, g.objects(d, TOPO.hasInterface))

    for d in devices:
        name, site = str(_one(g, d, TOPO.hasName)), member_site.get(d, "")
        if (d, RDF.type, SX.FpgaBoard) in g:
            boards.append(json.loads(str(_one(g, d, SX.configuration))))
        elif (d, TOPO.hasSwitchMatrix, None) in g:
            ports = tuple(Port(urn_name(str(i)).split(":", 1)[1], str(i), int(_one(g, i, LAYER.bandwidth)))
                          for i in interfaces(d))
            switches.append(Switch(name, str(d), ports, _label_ranges(g, _one(g, d, ETH.availableVLANSet)), site))
        else:
            ifaces = tuple(Interface(urn_name(str(i)).split(":", 1)[1], str(i), int(_one(g, i, LAYER.bandwidth)),
                                     str(_one(g, i, TOPO.connectedTo)) if _one(g, i, TOPO.connectedTo) else None,
                                     str(_one(g, i, SX.role, "experimental")))
                           for i in interfaces(d))
            hosts.append(Host(name, str(d), int(_one(g, d, COMP.numCPUCores)), int(_one(g, d, COMP.memoryCapacity)),
                              str(_one(g, d, SX.hardwareType)), bool(_one(g, d, SX.exclusive).toPython()), ifaces,
                              site, int(_one(g, d, SX.diskGB, 0))))
    statics = []
    for n, sw in enumerate(switches):
        used = _one(g, URIRef(sw.component_id), LAYER.usedLabelSet)
        for v in g.objects(used, COLL.element) if used is not None else ():
            statics.append((n, int(_one(g, v, LAYER.label_ID)),
                            StaticVlan(str(_one(g, v, TOPO.hasName)), int(_one(g, v, LAYER.label_ID)), sw.component_id,
                                       bool(_one(g, v, SX.shared).toPython()), str(_one(g, v, SX.description, "")))))
    statics = [v for _n, _t, v in sorted(statics, key=lambda x: x[:2])]
    connections = [c for c in g.subjects(REQ.inDomain, dom) if (c, RDF.type, TOPO.NetworkConnection) in g]
    trunks, externals = [], []
    for c in _ordered(g, connections):
        ends = sorted(str(i) for i in g.objects(c, TOPO.hasInterface))
        if (c, ETH.availableVLANSet, None) in g:  # an external link
            local = next(i for i in ends if (URIRef(i), TOPO.linkTo, None) in g)
            remote = str(_one(g, URIRef(local), TOPO.linkTo))
            externals.append(ExternalLink(
                str(_one(g, c, TOPO.hasName)), str(c), local, str(_one(g, URIRef(remote), REQ.inDomain)), remote,
                _label_ranges(g, _one(g, c, ETH.availableVLANSet)), int(_one(g, c, LAYER.bandwidth)),
                (c, LAYER.swappingCapability, ETH.VLAN) in g, (c, LAYER.tunnelingCapability, ETH.VLAN) in g, "",
                int(_one(g, c, SX.mtu)), int(_one(g, c, SX.minimumCapacity)), int(_one(g, c, SX.granularity)),
                int(_one(g, c, SX.trafficEngineeringMetric)),
                _label_ranges(g, _one(g, c, SX.sTagVLANSet)) if (c, SX.sTagVLANSet, None) in g else ()))
        else:
            a = next(i for i in ends if (URIRef(i), TOPO.connectedTo, None) in g)
            b = str(_one(g, URIRef(a), TOPO.connectedTo))
            ports = (a, b)
            trunks.append(Trunk(str(_one(g, c, TOPO.hasName)), str(c), a, b, int(_one(g, c, LAYER.bandwidth)),
                                _label_ranges(g, _one(g, c, SX.trunkVLANSet)) if (c, SX.trunkVLANSet, None) in g
                                else (),
                                tuple(p for p in ports if (URIRef(p), LAYER.swappingCapability, ETH.VLAN) in g),
                                tuple(p for p in ports if (URIRef(p), LAYER.tunnelingCapability, ETH.VLAN) in g),
                                _label_ranges(g, _one(g, c, SX.sTagVLANSet)) if (c, SX.sTagVLANSet, None) in g
                                else ()))
    sizes = tuple(VmSize(str(_one(g, s, TOPO.hasName)), int(_one(g, s, COMP.numCPUCores)),
                         int(_one(g, s, COMP.memoryCapacity)), int(_one(g, s, SX.diskGB)))
                  for s in _ordered(g, [s for s in g.subjects(RDF.type, COMP.VM) if (s, REQ.inDomain, dom) in g]))
    images = tuple(Image(str(_one(g, i, TOPO.hasName)), str(i), str(_one(g, i, SX.os, "")),
                         str(_one(g, i, SX.version, "")), str(_one(g, i, SX.description, "")),
                         str(_one(g, i, TOPO.hasURL, "")))
                   for i in _ordered(g, [i for i in g.subjects(RDF.type, COMP.VMImage) if (i, REQ.inDomain, dom) in g]))
    return Substrate(authority, tuple(hosts), tuple(switches), sizes, images, tuple(externals), tuple(boards),
                     sites=tuple(sites), trunks=tuple(trunks), static_vlans=tuple(statics))


def advertisement_from_graph(g: Graph, usage: Usage, now: datetime, available_only: bool = False) -> str:
    """The advertisement an NDL-OWL substrate model yields (DESIGN §5: ads are generated from the NDL model)."""
    return build_advertisement(substrate_from_graph(g), usage, now, available_only)


def load_graph(text: str, source: str) -> Graph:
    """Parse an operator's NDL-OWL file (Turtle, N-Triples or RDF/XML); DTDs and entities are refused."""
    if "<!DOCTYPE" in text or "<!ENTITY" in text:
        raise SubstrateError(f"{source}: contains a DOCTYPE or ENTITY declaration; fix: remove it (slicex does not "
                             f"expand XML entities)")
    suffix = source.rsplit(".", 1)[-1].lower()
    fmt = {"nt": "nt", "rdf": "xml", "owl": "xml", "xml": "xml"}.get(suffix)
    if fmt is None:
        fmt = "xml" if text.lstrip().startswith(("<?xml", "<rdf:RDF")) else "turtle"
    g = new_graph()
    try:
        g.parse(data=text, format=fmt)
    except Exception as exc:  # rdflib raises many parser-specific types; all mean "not valid RDF"
        syntax = {"xml": "RDF/XML", "nt": "N-Triples", "turtle": "Turtle"}[fmt]
        raise SubstrateError(f"{source}: not valid {syntax} ({exc}); "
                             f"fix: correct the syntax there") from None
    return g


# ---- requests ------------------------------------------------------------------------------------------------

def request_graph(request: Request, slice_urn: str = "urn:publicid:IDN+unknown+slice+request") -> Graph:
    """A request as an NDL request: one request:Reservation whose collections:element are compute elements
    (bound ones name their component) and network connections that request:dependOn the nodes they join."""
    g = new_graph()
    base = slice_urn + "#"
    reservation = URIRef(base + "reservation")
    g.add((reservation, RDF.type, REQ.Reservation))
    g.add((reservation, TOPO.hasName, _text(slice_urn)))
    g.add((reservation, LAYER.atLayer, ETH.EthernetNetworkElement))
    for n in request.nodes:
        r = URIRef(base + n.client_id)
        g.add((reservation, COLL.element, r))
        g.add((r, RDF.type, COMP.ComputeElement))
        g.add((r, DOM.hasResourceType, SX.BareMetalNode if n.exclusive else COMP.VM))
        g.add((r, TOPO.hasName, _text(n.client_id)))
        if n.component_manager_id:
            g.add((r, REQ.inDomain, URIRef(n.component_manager_id)))
        if n.component_id:
            g.add((r, SX.componentId, URIRef(n.component_id)))
        if n.exclusive is not None:
            g.add((r, SX.exclusive, Literal(n.exclusive)))
        if n.sliver_type:
            g.add((r, SX.sliverType, _text(n.sliver_type)))
        if n.hardware_type:
            g.add((r, SX.hardwareType, _text(n.hardware_type)))
        if n.disk_image:
            g.add((r, COMP.diskImage, URIRef(n.disk_image)))
            g.add((URIRef(n.disk_image), RDF.type, COMP.VMImage))
        for i in n.interfaces:
            iface = URIRef(base + i.client_id)
            g.add((r, TOPO.hasInterface, iface))
            g.add((iface, RDF.type, TOPO.Interface))
            g.add((iface, TOPO.hasName, _text(i.client_id)))
            if i.component_id:
                g.add((iface, SX.componentId, URIRef(i.component_id)))
            if i.ip:
                g.add((iface, SX.ipAddress, _text(i.ip)))
            if i.netmask:
                g.add((iface, SX.netmask, _text(i.netmask)))
    owners = {i.client_id: n.client_id for n in request.nodes for i in n.interfaces}
    for lk in request.links:
        r = URIRef(base + lk.client_id)
        g.add((reservation, COLL.element, r))
        g.add((r, RDF.type, TOPO.NetworkConnection))
        g.add((r, TOPO.hasName, _text(lk.client_id)))
        g.add((r, LAYER.atLayer, ETH.EthernetNetworkElement))
        if lk.capacity_kbps:
            g.add((r, LAYER.bandwidth, _int(lk.capacity_kbps)))
        if lk.latency_ms is not None:
            g.add((r, SX.latencyMs, _int(lk.latency_ms)))
        if lk.packet_loss is not None:
            g.add((r, SX.packetLoss, Literal(lk.packet_loss, datatype=XSD.double)))
        if lk.shared_vlan:
            g.add((r, SX.sharedVlan, _text(lk.shared_vlan)))
        if lk.vlan_tag is not None:
            tag = URIRef(f"{r}/vlan")
            g.add((r, SX.vlan, tag))
            g.add((tag, RDF.type, ETH.VLAN))
            g.add((tag, LAYER.label_ID, _int(lk.vlan_tag)))
        for cm in lk.component_managers:
            g.add((r, REQ.inDomain, URIRef(cm)))
        for ref in lk.interface_refs:
            g.add((r, TOPO.hasInterface, URIRef(base + ref)))
            if ref in owners:
                g.add((r, REQ.dependOn, URIRef(base + owners[ref])))
    return g


__all__ = ["ORCA", "TOPO", "LAYER", "ETH", "DOM", "COMP", "REQ", "COLL", "LOC", "GEO", "SX", "new_graph",
           "substrate_graph", "substrate_from_graph", "advertisement_graph", "substrate_from_advertisement",
           "advertisement_from_graph", "load_graph", "request_graph", "FPGA_SLIVER_TYPES"]
