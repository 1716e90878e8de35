"""NDL-OWL: the substrate as an RDF graph in the ORCA vocabulary (rdflib), and conversions.

substrate_graph(Substrate)    the operator's substrate as NDL-OWL
advertisement_graph(ad XML)   the same graph rebuilt from an advertisement slicex generated, so
                              NDL → advertisement → parse → NDL is checked isomorphic (rdflib.compare)
request_graph(Request)        a request as NDL request reservations (request:Reservation, dependOn)
Resources are named by their GENI URNs; what ORCA's ontologies lack (VM sizes, images, hardware type,
exclusivity) uses the slicex namespace."""

from __future__ import annotations

from rdflib import BNode, Graph, Literal, Namespace, URIRef
from rdflib.namespace import RDF, XSD

from rspec.namespaces import CAPACITY, RSPEC3, STITCH2, q
from rspec.request import Request
from rspec.substrate import Substrate
from slicex.xmlsafe import parse_xml

ORCA = "http://geni-orca.renci.org/owl/"
TOPO = Namespace(ORCA + "topology.owl#")
LAYER = Namespace(ORCA + "layer.owl#")
ETH = Namespace(ORCA + "ethernet.owl#")
DOM = Namespace(ORCA + "domain.owl#")
COMP = Namespace(ORCA + "compute.owl#")
REQ = Namespace(ORCA + "request.owl#")
SX = Namespace("http://slicex.dev/ndl/slicex.owl#")


def new_graph() -> Graph:
    g = Graph()
    for prefix, ns in (("topology", TOPO), ("layer", LAYER), ("ethernet", ETH), ("domain", DOM),
                       ("compute", COMP), ("request", REQ), ("slicex", SX)):
        g.bind(prefix, ns)
    return g


def _int(n: int) -> Literal:
    return Literal(n, datatype=XSD.integer)


class _Builder:
    """One way to write each fact, used by both the substrate and the advertisement readers."""

    def __init__(self, authority: str, cm: str):
        self.g = new_graph()
        self.domain = URIRef(cm)
        self.g.add((self.domain, RDF.type, TOPO.NetworkDomain))
        self.g.add((self.domain, TOPO.hasName, Literal(authority)))
        service = URIRef(cm + "#service")
        self.g.add((self.domain, DOM.hasService, service))
        self.g.add((service, RDF.type, DOM.NetworkService))
        self.g.add((service, DOM.isAllocatable, Literal(True)))

    def device(self, cid: str, name: str, hardware_type: str, exclusive: bool) -> URIRef:
        d = URIRef(cid)
        self.g.add((d, RDF.type, TOPO.Device))
        self.g.add((d, REQ.inDomain, self.domain))
        self.g.add((d, TOPO.hasName, Literal(name)))
        self.g.add((d, SX.hardwareType, Literal(hardware_type)))
        self.g.add((d, SX.exclusive, Literal(exclusive)))
        return d

    def compute(self, node: URIRef, cores: int, memory_mb: int) -> None:
        self.g.add((node, COMP.numCPUCores, _int(cores)))
        self.g.add((node, COMP.memoryCapacity, _int(memory_mb)))

    def interface(self, device: URIRef, cid: str, bandwidth_kbps: int | None) -> URIRef:
        i = URIRef(cid)
        self.g.add((device, TOPO.hasInterface, i))
        self.g.add((i, RDF.type, TOPO.Interface))
        if bandwidth_kbps is not None:
            self.g.add((i, LAYER.bandwidth, _int(bandwidth_kbps)))
        return i

    def connect(self, a: str, b: str) -> None:
        self.g.add((URIRef(a), TOPO.connectedTo, URIRef(b)))

    def vlan_set(self, owner: URIRef, ranges: list[tuple[int, int]]) -> None:
        label_set = BNode()
        self.g.add((owner, ETH.availableVLANSet, label_set))
        self.g.add((label_set, RDF.type, LAYER.LabelSet))
        for lo, hi in ranges:
            r = BNode()
            self.g.add((label_set, LAYER.LabelRange, r))
            for pred, value in ((LAYER.lowerBound, lo), (LAYER.upperBound, hi)):
                tag = BNode()
                self.g.add((r, pred, tag))
                self.g.add((tag, RDF.type, ETH.VLAN))
                self.g.add((tag, LAYER.label_ID, _int(value)))

    def vm_size(self, authority: str, name: str, cores: int, memory_mb: int, disk_gb: int) -> None:
        s = URIRef(f"urn:publicid:IDN+{authority}+vmsize+{name}")
        self.g.add((s, RDF.type, COMP.VM))
        self.g.add((s, REQ.inDomain, self.domain))
        self.g.add((s, TOPO.hasName, Literal(name)))
        self.compute(s, cores, memory_mb)
        self.g.add((s, SX.diskGB, _int(disk_gb)))

    def image(self, urn: str, os: str, version: str, description: str) -> None:
        i = URIRef(urn)
        self.g.add((i, RDF.type, SX.DiskImage))
        self.g.add((i, REQ.inDomain, self.domain))
        self.g.add((i, SX.os, Literal(os)))
        self.g.add((i, SX.version, Literal(version)))
        self.g.add((i, SX.description, Literal(description)))

    def external(self, cid: str, local_port: str, remote_port: str, ranges: list[tuple[int, int]],
                 capacity_kbps: int, translation: bool, qinq: bool) -> None:
        link = URIRef(cid)
        self.g.add((link, RDF.type, TOPO.NetworkConnection))
        self.g.add((link, REQ.inDomain, self.domain))
        self.g.add((URIRef(local_port), TOPO.linkTo, URIRef(remote_port)))
        self.g.add((link, TOPO.hasInterface, URIRef(local_port)))
        self.g.add((link, LAYER.bandwidth, _int(capacity_kbps)))
        self.vlan_set(link, ranges)
        if translation:
            self.g.add((link, LAYER.swappingCapability, ETH.VLAN))
        if qinq:
            self.g.add((link, LAYER.tunnelingCapability, ETH.VLAN))


def substrate_graph(sub: Substrate) -> Graph:
    b = _Builder(sub.authority, sub.component_manager_id)
    for h in sub.hosts:
        d = b.device(h.component_id, h.name, h.hardware_type, h.exclusive)
        b.compute(d, h.cores, h.memory_mb)
        for i in h.interfaces:
            b.interface(d, i.component_id, i.bandwidth_kbps)
            if i.switch_port:
                b.connect(i.component_id, i.switch_port)
    for sw in sub.switches:
        d = b.device(sw.component_id, sw.name, "switch", False)
        for p in sw.ports:
            b.interface(d, p.component_id, None)
        b.vlan_set(d, list(sw.vlan_range))
    for board in sub.fpga_boards:
        b.device(f"urn:publicid:IDN+{sub.authority}+node+{board.get('name')}", str(board.get("name")),
                 str(board.get("model")), False)
    offers_vms = any(not h.exclusive for h in sub.hosts)  # sizes mean nothing without a VM host
    for s in sub.vm_sizes if offers_vms else ():
        b.vm_size(sub.authority, s.name, s.cores, s.memory_mb, s.disk_gb)
    for img in sub.images:
        b.image(img.urn, img.os, img.version, img.description)
    for ext in sub.external_links:
        b.external(ext.component_id, ext.local_port, ext.remote_port, list(ext.vlan_range), ext.capacity_kbps,
                   ext.vlan_translation, ext.qinq)
    return b.g


def _parse_ranges(text: str) -> list[tuple[int, int]]:
    out = []
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.append((int(lo), int(hi or lo)))
    return out


def advertisement_graph(ad: str | bytes) -> Graph:
    """Rebuild the NDL-OWL substrate graph from an advertisement (slicex's own, with the capacity extension)."""
    root = parse_xml(ad, "advertisement", 64 * 1024 * 1024)
    nodes = root.findall(q(RSPEC3, "node"))
    cm = nodes[0].get("component_manager_id") if nodes else ""
    authority = cm.split("+")[1] if cm.count("+") >= 3 else ""
    b = _Builder(authority, cm)
    bandwidth: dict[str, int] = {}
    for link in root.findall(q(RSPEC3, "link")):
        refs = [r.get("component_id") for r in link.findall(q(RSPEC3, "interface_ref"))]
        prop = link.find(q(RSPEC3, "property"))
        if len(refs) == 2:
            b.connect(refs[0], refs[1])
            if prop is not None and prop.get("capacity"):
                bandwidth[refs[0]] = int(prop.get("capacity"))
    sizes: dict[str, tuple[int, int, int]] = {}
    images: dict[str, tuple[str, str, str]] = {}
    for n in nodes:
        hw = n.find(q(RSPEC3, "hardware_type"))
        hardware = hw.get("name") if hw is not None else ""
        d = b.device(n.get("component_id"), n.get("component_name"), hardware, n.get("exclusive") == "true")
        compute = n.find(q(CAPACITY, "compute"))
        if compute is not None:
            b.compute(d, int(compute.get("cores")), int(compute.get("memory_mb")))
        vlans = n.find(q(CAPACITY, "vlans"))
        if vlans is not None:
            b.vlan_set(d, _parse_ranges(vlans.get("ranges")))
        for i in n.findall(q(RSPEC3, "interface")):
            b.interface(d, i.get("component_id"), bandwidth.get(i.get("component_id")) if hardware != "switch"
                        else None)
        for st in n.findall(q(RSPEC3, "sliver_type")):
            c = st.find(q(CAPACITY, "compute"))
            if c is not None:
                sizes[st.get("name")] = (int(c.get("cores")), int(c.get("memory_mb")), int(c.get("disk_gb", 0)))
            for img in st.findall(q(RSPEC3, "disk_image")):
                images[img.get("name")] = (img.get("os", ""), img.get("version", ""), img.get("description", ""))
    for name, (cores, mem, disk) in sizes.items():
        b.vm_size(authority, name, cores, mem, disk)
    for urn, (os, version, description) in images.items():
        b.image(urn, os, version, description)
    stitching = root.find(q(STITCH2, "stitching"))
    if stitching is not None:
        for port in stitching.iter(q(STITCH2, "port")):
            link = port.find(q(STITCH2, "link"))
            info = link.find(f".//{q(STITCH2, 'switchingCapabilitySpecificInfo_L2sc')}")
            b.external(link.get("id"), port.get("id"), link.findtext(q(STITCH2, "remoteLinkId")),
                       _parse_ranges(info.findtext(q(STITCH2, "suggestedVLANRange"))),
                       int(link.findtext(q(STITCH2, "capacity"))),
                       info.findtext(q(STITCH2, "vlanTranslation")) == "true",
                       info.find(q(CAPACITY, "tunneling")) is not None)
    return b.g


def request_graph(request: Request, slice_urn: str = "urn:publicid:IDN+unknown+slice+request") -> Graph:
    """A request as NDL reservations: one per node and link; links depend on the nodes they join."""
    g = new_graph()
    base = slice_urn + "#"
    for n in request.nodes:
        r = URIRef(base + n.client_id)
        g.add((r, RDF.type, REQ.Reservation))
        g.add((r, RDF.type, COMP.VM if not n.exclusive else TOPO.Device))
        g.add((r, TOPO.hasName, Literal(n.client_id)))
        if n.component_id:
            g.add((r, REQ.inDomain, URIRef(n.component_manager_id or n.component_id)))
            g.add((r, SX.boundTo, URIRef(n.component_id)))
        if n.sliver_type:
            g.add((r, SX.sliverType, Literal(n.sliver_type)))
        if n.disk_image:
            g.add((r, SX.diskImage, URIRef(n.disk_image)))
        for i in n.interfaces:
            iface = URIRef(base + i.client_id)
            g.add((r, TOPO.hasInterface, iface))
            g.add((iface, RDF.type, TOPO.Interface))
    owners = {i.client_id: n.client_id for n in request.nodes for i in n.interfaces}
    for lk in request.links:
        r = URIRef(base + lk.client_id)
        g.add((r, RDF.type, REQ.Reservation))
        g.add((r, RDF.type, TOPO.NetworkConnection))
        g.add((r, TOPO.hasName, Literal(lk.client_id)))
        if lk.capacity_kbps:
            g.add((r, LAYER.bandwidth, _int(lk.capacity_kbps)))
        for ref in lk.interface_refs:
            g.add((r, TOPO.hasInterface, URIRef(base + ref)))
            if ref in owners:
                g.add((r, REQ.dependOn, URIRef(base + owners[ref])))
    return g
