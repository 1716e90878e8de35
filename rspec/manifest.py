"""Manifest RSpecs: the client's own request, annotated with what was given.

Every node and link keeps its client_id; slicex adds sliver ids, component ids, interface MACs and IPs,
VLAN tags and login services; unknown extension elements pass through unchanged."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from lxml import etree

from rspec.namespaces import MANIFEST_XSD, PUBLIC, RSPEC3, UPDATE, XSI, q
from slicex.clock import rfc3339
from slicex.xmlsafe import parse_xml

SERVICES_EXT = "http://slicex.dev/rspec/ext/services/1"
RACKS_EXT = "http://slicex.dev/rspec/ext/racks/1"  # a link between racks of one aggregate (stitching/racks.py)
"""slicex's manifest extension for what an `execute` service did: a `result` child of each execute element
(state, exit_code, the tail of its output as text)."""

SLIVER_INFO_EXT = "http://groups.geni.net/exogeni/attachment/wiki/RspecExtensions/sliver-info/1"
"""ExoGENI's per-sliver status extension (a `geni_sliver_info` child of each node with a `state`), the form in
which geni-tools' readyToLogin.py and remote-execute.py read whether a node is ready for login."""


@dataclass(frozen=True)
class SliverView:
    """What the manifest shows of one sliver (filled by the slice manager from its records)."""

    client_id: str
    sliver_urn: str
    kind: str  # "node" | "link"
    component_id: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)
    operational_state: str = ""  # the AM API v3 geni_operational_status; "" for views without one


def sliver_info_state(operational_state: str) -> str:
    """An operational state as ExoGENI's geni_sliver_info names it: `ready` when users can log in (also while
    an action runs on a ready node), otherwise the v3 state without its `geni_` prefix."""
    if operational_state in ("geni_ready", "geni_ready_busy"):
        return "ready"
    return operational_state.removeprefix("geni_")


def empty_manifest(now: datetime | None = None) -> str:
    root = etree.Element(q(RSPEC3, "rspec"), nsmap={None: RSPEC3, "xsi": XSI})
    root.set("type", "manifest")
    root.set(q(XSI, "schemaLocation"), f"{RSPEC3} {MANIFEST_XSD}")
    if now is not None:
        root.set("generated", rfc3339(now))
    return etree.tostring(root, encoding="unicode", pretty_print=True)


def build_manifest(requests: Iterable[str], slivers: Iterable[SliverView], component_manager_id: str,
                   now: datetime | None = None) -> str:
    """Merge the requests the slice's slivers came from into one manifest showing exactly `slivers`. During
    a staged Update each element of the change says what the commit will do in `update:action`
    (slice_manager/update.py ACTIONS), and a link it replaces, which has two slivers under one client_id (a
    manifest's client_ids are unique), is the replaced one as allocated with an `update:replacement` child:
    the replacing sliver's id and the new link's interface_refs and properties."""
    views: dict[str, list[SliverView]] = {}
    for s in slivers:
        views.setdefault(s.client_id, []).append(s)
    staged = any(v.details.get("update_action") for vs in views.values() for v in vs)
    root: etree._Element | None = None
    elements: dict[str, list[etree._Element]] = {}  # client_id -> its elements, in the requests' order
    for text in requests:
        req = parse_xml(text, "stored request")
        if root is None:
            extra = {"update": UPDATE} if staged and UPDATE not in req.nsmap.values() else {}
            root = etree.Element(q(RSPEC3, "rspec"), nsmap={**dict(req.nsmap), **extra})
            for k, v in req.attrib.items():
                root.set(k, v)
            root.set("type", "manifest")
            root.set(q(XSI, "schemaLocation"), f"{RSPEC3} {MANIFEST_XSD}")
            if now is not None:
                root.set("generated", rfc3339(now))
            for child in req:
                if isinstance(child.tag, str) and child.tag not in (q(RSPEC3, "node"), q(RSPEC3, "link")):
                    root.append(copy.deepcopy(child))
        for el in req:
            if el.tag in (q(RSPEC3, "node"), q(RSPEC3, "link")) and el.get("client_id") in views:
                elements.setdefault(el.get("client_id"), []).append(el)
    if root is None:
        return empty_manifest(now)
    for cid, els in elements.items():
        by_action = {str(v.details.get("update_action") or ""): v for v in views[cid]}
        replacing = by_action.pop("replacing", None)
        view = next(iter(by_action.values()), None) or replacing
        assert view is not None
        el = els[-1] if view is replacing else els[0]
        out = copy.deepcopy(el)
        (_annotate_node if el.tag == q(RSPEC3, "node") else _annotate_link)(out, view, component_manager_id)
        if view.details.get("update_action"):
            out.set(q(UPDATE, "action"), str(view.details["update_action"]))
        if replacing is not None and view is not replacing:
            _replacement(out, els[-1], replacing)
        root.append(out)
    return etree.tostring(root, encoding="unicode", pretty_print=True)


def _replacement(el: etree._Element, new: etree._Element, v: SliverView) -> None:
    """What a link a staged Update replaces will become at the commit: the new sliver, its interface_refs and
    properties (capacity, latency, loss as the Update asks them)."""
    box = etree.SubElement(el, q(UPDATE, "replacement"), sliver_id=v.sliver_urn)
    box.set("action", "replacing")
    if v.details.get("vlan_tag") is not None:
        box.set("vlantag", str(v.details["vlan_tag"]))
    for child in new:
        if child.tag in (q(RSPEC3, "interface_ref"), q(RSPEC3, "property")):
            box.append(copy.deepcopy(child))


def _annotate_node(el: etree._Element, v: SliverView, cm: str) -> None:
    d = v.details
    el.set("sliver_id", v.sliver_urn)
    if v.component_id:
        el.set("component_id", v.component_id)
    el.set("component_manager_id", cm)
    if "exclusive" in d:
        el.set("exclusive", "true" if d["exclusive"] else "false")
    st = el.find(q(RSPEC3, "sliver_type"))
    if st is None and d.get("sliver_type"):
        st = etree.SubElement(el, q(RSPEC3, "sliver_type"))
    if st is not None and d.get("sliver_type"):
        st.set("name", d["sliver_type"])
        if d.get("disk_image") and st.find(q(RSPEC3, "disk_image")) is None:
            etree.SubElement(st, q(RSPEC3, "disk_image")).set("name", d["disk_image"])
    ifaces: Mapping[str, Mapping[str, str]] = d.get("interfaces", {})
    for i in el.findall(q(RSPEC3, "interface")):
        info = ifaces.get(i.get("client_id", ""), {})
        for attr in ("sliver_id", "component_id", "mac_address"):
            if info.get(attr):
                i.set(attr, info[attr])
        if info.get("ip") and i.find(q(RSPEC3, "ip")) is None:
            ip = etree.SubElement(i, q(RSPEC3, "ip"))
            ip.set("address", info["ip"])
            ip.set("netmask", info.get("netmask", "255.255.255.0"))
            ip.set("type", "ipv4")
    logins = d.get("logins", [])
    if logins or d.get("hostname"):
        services = el.find(q(RSPEC3, "services"))
        if services is None:
            services = etree.SubElement(el, q(RSPEC3, "services"))
        for lg in logins:
            login = etree.SubElement(services, q(RSPEC3, "login"))
            login.set("authentication", "ssh-keys")
            login.set("hostname", lg["hostname"])
            login.set("port", str(lg.get("port", 22)))
            login.set("username", lg["username"])
    _annotate_public_ports(el, d.get("public_ports") or ())
    machine = d.get("container")
    if machine:  # what the node got: its image and the limits the kernel enforces, and what it uses now
        for old in el.findall(q(SERVICES_EXT, "container")):
            el.remove(old)
        box = etree.SubElement(el, q(SERVICES_EXT, "container"), nsmap={"sx": SERVICES_EXT})
        # the host CPUs the node may run on are a cpuset ("0,1"), not a count: records written before it was
        # named so call it "cpus"
        shown = {**machine, "cpuset": machine.get("cpuset", machine.get("cpus"))}
        for attr in ("image", "cores", "memory_mb", "cpuset", "pids", "memory_bytes", "disk_gb", "disk_used_bytes",
                     "machine", "accel", "kernel"):  # the last three: a qemu-vm node's (its accelerator, its kernel)
            if shown.get(attr) not in (None, ""):
                box.set(attr, str(shown[attr]))
    results = d.get("execute") or []
    for x, r in zip(el.findall(f"{q(RSPEC3, 'services')}/{q(RSPEC3, 'execute')}"), results, strict=False):
        for old in x.findall(q(SERVICES_EXT, "result")):
            x.remove(old)
        res = etree.SubElement(x, q(SERVICES_EXT, "result"), nsmap={"sx": SERVICES_EXT})
        res.set("state", str(r.get("state", "")))
        if r.get("exit_code") is not None:
            res.set("exit_code", str(r["exit_code"]))
        res.text = _xml_text(str(r.get("output") or ""))
    fpga = el.find("{http://slicex.dev/rspec/ext/fpga/1}sliver")
    if fpga is not None:
        from rspec.fpga_ext import annotate_manifest

        annotate_manifest(fpga, d)  # where it landed and what it gets (the FPGA model's view once provisioned)
    if v.operational_state:
        for old in el.findall(q(SLIVER_INFO_EXT, "geni_sliver_info")):
            el.remove(old)
        info = etree.SubElement(el, q(SLIVER_INFO_EXT, "geni_sliver_info"), nsmap={"sliver_info": SLIVER_INFO_EXT})
        info.set("state", sliver_info_state(v.operational_state))
    if d.get("hostname"):
        host = el.find(q(RSPEC3, "host"))
        if host is None:
            host = etree.SubElement(el, q(RSPEC3, "host"))
        host.set("name", d["hostname"])


def _annotate_public_ports(el: etree._Element, given: Iterable[Mapping[str, Any]]) -> None:
    """Each public:port the node asked for, with the public port the broker gave it and (once provisioned)
    the gateway's host name: host:public_port reaches the node's port."""
    by_port = {int(g["port"]): g for g in given}
    for p in el.findall(q(PUBLIC, "port")):
        g = by_port.get(int(p.get("port") or 0))
        if g is None:
            continue
        p.set("public_port", str(g["public_port"]))
        if g.get("host"):
            p.set("host", str(g["host"]))


def _xml_text(text: str) -> str:
    """Output as XML can carry it (control characters other than tab/newline are not allowed in XML 1.0)."""
    return "".join(c if c in "\t\n\r" or ord(c) >= 32 else "\ufffd" for c in text)


def _annotate_link(el: etree._Element, v: SliverView, cm: str) -> None:
    d = v.details
    el.set("sliver_id", v.sliver_urn)
    if d.get("vlan_tag") is not None:
        el.set("vlantag", str(d["vlan_tag"]))
    if el.find(q(RSPEC3, "component_manager")) is None:
        etree.SubElement(el, q(RSPEC3, "component_manager")).set("name", cm)
    if d.get("hops"):
        _rack_path(el, d)


def _rack_path(el: etree._Element, d: Mapping[str, Any]) -> None:
    """A link between racks: each interface's tag on its switch and every switch port it crosses with the
    tags on that port's wire (TPID:VID, outermost first), the trunk hops marked."""
    for old in el.findall(q(RACKS_EXT, "path")):
        el.remove(old)
    path = etree.SubElement(el, q(RACKS_EXT, "path"), nsmap={"racks": RACKS_EXT}, kind=str(d.get("rack_path", "")))
    for ref, tag in (d.get("interface_tags") or {}).items():
        etree.SubElement(path, q(RACKS_EXT, "interface"), client_id=str(ref), vlan_tag=str(tag))
    for h in d["hops"]:
        hop = etree.SubElement(path, q(RACKS_EXT, "hop"), switch=str(h["switch"]), port=str(h["port"]),
                               tags=" ".join(f"{int(t):#06x}:{int(v)}" for t, v in h["tags"]))
        if h.get("trunk"):
            hop.set("trunk", str(h["trunk"]))
        if h.get("translation"):
            hop.set("translation", "true")
        if h.get("qinq"):
            hop.set("qinq", str(h["qinq"]))
