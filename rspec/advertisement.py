"""Advertisements: what this aggregate offers, generated from the substrate and live usage.

Layout follows the advertisements real GENI racks published (InstaGENI, 2014): external_ref for the far
ends of external links, the shared-VLAN list, the opstate state machine, a <node> per host, switch and
FPGA board, a <link> per cable, and the stitching extension describing each external port with the VLANs
still free. Numbers GENI v3 has no element for (cores, memory, VLAN ranges, sites) travel in slicex's
capacity extension, so the NDL-OWL model can be rebuilt from the ad (rspec.ndl.advertisement_graph)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from lxml import etree

from rspec.namespaces import (
    AD_XSD,
    CAPACITY,
    OPSTATE,
    OPSTATE_XSD,
    QINQ,
    RSPEC3,
    SHARED_VLAN_GENI,
    STITCH2,
    XSI,
    q,
)
from rspec.substrate import ExternalLink, Host, Site, Substrate, urn_name
from slicex.clock import rfc3339

AD_LIFETIME = timedelta(hours=1)
AGGREGATE_TYPE = "slicex"
SHARED_VLAN_AD_XSD = "http://www.geni.net/resources/rspec/ext/shared-vlan/1/ad.xsd"
STITCH2_XSD = "http://hpn.east.isi.edu/rspec/ext/stitch/2/stitch-schema.xsd"


@dataclass(frozen=True)
class Usage:
    """What is in use now, so the ad's `available` flags are live."""

    cores: Mapping[str, int] = field(default_factory=dict)      # host component_id -> cores in use
    memory_mb: Mapping[str, int] = field(default_factory=dict)  # host component_id -> MB in use
    taken: frozenset[str] = frozenset()                          # exclusive (bare-metal) node component_ids in use
    vlans: Mapping[str, frozenset[int]] = field(default_factory=dict)  # switch / external link component_id -> tags
    bandwidth_kbps: Mapping[str, int] = field(default_factory=dict)    # external link component_id -> kbps in use

    def key(self) -> tuple:
        """A hashable summary: equal usages give equal keys (the advertisement cache's key)."""
        return (tuple(sorted(self.cores.items())), tuple(sorted(self.memory_mb.items())), tuple(sorted(self.taken)),
                tuple(sorted((k, tuple(sorted(v))) for k, v in self.vlans.items() if v)),
                tuple(sorted(self.bandwidth_kbps.items())))


# The operational state machine the AM implements (authority/substrate/emulated.py), in the opstate extension's
# terms: per state, the actions a user may perform and the waits the aggregate resolves on its own.
OPSTATE_MACHINE: tuple[tuple[str, tuple[tuple[str, str, str], ...], tuple[tuple[str, str], ...], str], ...] = (
    ("geni_notready",
     (("geni_start", "geni_configuring", "Boot the node"),),
     (),
     "Slivers begin stopped; geni_start boots them."),
    ("geni_configuring",
     (("geni_restart", "geni_configuring", "Start booting again"),
      ("geni_stop", "geni_stopping", "Stop booting and power down")),
     (("geni_success", "geni_ready"), ("geni_failure", "geni_failed")),
     "Booting happens asynchronously in this state."),
    ("geni_ready",
     (("geni_restart", "geni_configuring", "Reboot the node"),
      ("geni_stop", "geni_stopping", "Power down or stop the node"),
      ("geni_update_users", "geni_ready_busy", "Install the given users' SSH keys")),
     (),
     "The sliver is up and ready to use."),
    ("geni_ready_busy",
     (),
     (("geni_success", "geni_ready"),),
     "Updating users; the sliver returns to geni_ready."),
    ("geni_stopping",
     (),
     (("geni_success", "geni_notready"), ("geni_failure", "geni_failed")),
     "The sliver is being stopped."),
    ("geni_failed",
     (("geni_start", "geni_configuring", "Boot the node again"),
      ("geni_restart", "geni_configuring", "Reboot the node")),
     (),
     "Booting failed; start or restart it, or delete it."),
)

FPGA_SLIVER_TYPES = ("fpga-bitstream", "virtual-router")
_T_NODE, _T_LINK, _T_SLIVER_TYPE, _T_DISK_IMAGE = (q(RSPEC3, t) for t in ("node", "link", "sliver_type", "disk_image"))
_T_HARDWARE_TYPE, _T_AVAILABLE, _T_INTERFACE = (q(RSPEC3, t) for t in ("hardware_type", "available", "interface"))
_T_COMPONENT_MANAGER, _T_INTERFACE_REF, _T_PROPERTY, _T_LINK_TYPE = (
    q(RSPEC3, t) for t in ("component_manager", "interface_ref", "property", "link_type"))
_T_CAP_COMPUTE, _T_CAP_PORT, _T_SITE_REF = (q(CAPACITY, t) for t in ("compute", "port", "site_ref"))
RAW_PC = "raw-pc"


def format_ranges(ranges: Iterable[tuple[int, int]], used: frozenset[int] | set[int] = frozenset()) -> str:
    """`1000-1099,1200` for the tags of `ranges` not in `used` (the stitching extension's vlanRangeAvailability)."""
    out: list[str] = []
    for lo, hi in sorted(ranges):
        start = lo
        for t in sorted(u for u in used if lo <= u <= hi) if used else ():
            if t > start:
                out.append(f"{start}-{t - 1}" if t - 1 != start else str(start))
            start = t + 1
        if start <= hi:
            out.append(f"{start}-{hi}" if hi != start else str(start))
    return ",".join(out)


def smallest_vm(sub: Substrate):
    return min(sub.vm_sizes, key=lambda s: (s.cores, s.memory_mb)) if sub.vm_sizes else None


def host_available(h: Host, sub: Substrate, usage: Usage) -> bool:
    """A bare-metal node is available while nobody holds it; a VM host while the smallest VM size still fits."""
    if h.exclusive:
        return h.component_id not in usage.taken
    smallest = smallest_vm(sub)
    if smallest is None:
        return False
    return (h.cores - usage.cores.get(h.component_id, 0) >= smallest.cores
            and h.memory_mb - usage.memory_mb.get(h.component_id, 0) >= smallest.memory_mb)


def external_tags_in_use(ext: ExternalLink, usage: Usage) -> frozenset[int]:
    """Tags an external link cannot offer: held on the link itself, its port, or (same VLAN space) its switch."""
    out: set[int] = set()
    for key in (ext.component_id, ext.local_port, ext.switch_id):
        out |= usage.vlans.get(key, frozenset())
    return frozenset(out)


def build_advertisement(substrate: Substrate, usage: Usage, now: datetime, available_only: bool = False,
                        *, am_url: str | None = None) -> str:
    """The GENI v3 advertisement for `substrate` as used by `usage` at `now` (valid against rspec/schemas).
    `available_only` (geni_available) leaves out nodes that are fully used, and the links to them."""
    sub = substrate
    url = sub.am_url if am_url is None else am_url
    root = etree.Element(q(RSPEC3, "rspec"), nsmap={None: RSPEC3, "xsi": XSI, "cap": CAPACITY})
    root.set("type", "advertisement")
    root.set("generated", rfc3339(now))
    root.set("expires", rfc3339(now + AD_LIFETIME))
    locations = [f"{RSPEC3} {AD_XSD}", f"{OPSTATE} {OPSTATE_XSD}"]
    if sub.shared_vlans:
        locations.append(f"{SHARED_VLAN_GENI} {SHARED_VLAN_AD_XSD}")
    if sub.external_links:
        locations.append(f"{STITCH2} {STITCH2_XSD}")
    root.set(q(XSI, "schemaLocation"), " ".join(locations))
    cm = sub.component_manager_id

    for ext in sub.external_links:
        etree.SubElement(root, q(RSPEC3, "external_ref"), component_id=ext.remote_port,
                         component_manager_id=ext.remote_aggregate)
    sites = {s.name: s for s in sub.all_sites}
    for site in sites.values():
        el = etree.SubElement(root, q(CAPACITY, "site"), name=site.name)
        if site.description:
            el.set("description", site.description)
        if site.country:
            el.set("country", site.country)
        if site.latitude is not None:
            el.set("latitude", _num(site.latitude))
            el.set("longitude", _num(site.longitude))
    if sub.shared_vlans:
        sv = etree.SubElement(root, q(SHARED_VLAN_GENI, "rspec_shared_vlan"), nsmap={None: SHARED_VLAN_GENI})
        for v in sub.shared_vlans:
            etree.SubElement(sv, q(SHARED_VLAN_GENI, "available"), name=v.name)

    offered = [h for h in sub.hosts if not available_only or host_available(h, sub, usage)]
    sliver_types = sorted({RAW_PC for h in offered if h.exclusive}
                          | ({s.name for s in sub.vm_sizes} if any(not h.exclusive for h in offered) else set())
                          | (set(FPGA_SLIVER_TYPES) if sub.fpga_boards else set()))
    _opstate(root, cm, sliver_types)

    templates = {False: _sliver_types(sub, list(sub.vm_sizes)), True: _sliver_types(sub, [None])}
    for h in offered:
        _host_node(root, h, host_available(h, sub, usage), cm, sites, templates[h.exclusive])
    for sw in sub.switches:
        node = _node(root, sub, sw.component_id, sw.name, False, "switch", sw.site, cm)
        vlans = etree.SubElement(node, q(CAPACITY, "vlans"), ranges=format_ranges(sw.vlan_range))
        vlans.set("available", format_ranges(sw.vlan_range, usage.vlans.get(sw.component_id, frozenset())))
        for v in sub.static_vlans:
            if v.switch == sw.component_id:
                sv = etree.SubElement(node, q(CAPACITY, "static_vlan"), name=v.name, tag=str(v.tag),
                                      shared="true" if v.shared else "false")
                if v.description:
                    sv.set("description", v.description)
        etree.SubElement(node, q(RSPEC3, "available"), now="true")
        _location(node, sites, sw.site)
        for p in sw.ports:
            etree.SubElement(node, q(RSPEC3, "interface"), component_id=p.component_id, role="experimental")
        _port_bandwidths(node, sw.ports)
    for board in sub.fpga_boards:
        name = str(board.get("name"))
        node = _node(root, sub, sub.fpga_board_id(board), name, False, str(board.get("model")), "", cm)
        etree.SubElement(node, q(CAPACITY, "fpga_board"), config=json.dumps(board, sort_keys=True, default=str))
        for t in FPGA_SLIVER_TYPES:
            etree.SubElement(node, q(RSPEC3, "sliver_type"), name=t)
        etree.SubElement(node, q(RSPEC3, "available"), now="true")

    shown = {i.component_id for h in offered for i in h.interfaces}
    for h in offered:
        for i in h.interfaces:
            if i.switch_port and i.component_id in shown:
                _link(root, cm, (cm,), f"{h.name}:{i.name}-{urn_name(i.switch_port)}", i.component_id, i.switch_port,
                      i.bandwidth_kbps, "lan")
    for t in sub.trunks:
        link = _link(root, cm, (cm,), t.name, t.port_a, t.port_b, t.bandwidth_kbps, "lan", t.component_id)
        if t.vlan_range or t.translation or t.qinq:  # what the aggregate may do at its own trunks' ends
            trunk = etree.SubElement(link, q(CAPACITY, "trunk"), translation=" ".join(t.translation),
                                     qinq=" ".join(t.qinq))
            for attr, ranges in (("vlan_ranges", t.vlan_range), ("s_vlan_ranges", t.s_vlan_range)):
                if ranges:
                    trunk.set(attr, format_ranges(ranges))
    for ext in sub.external_links:
        _link(root, cm, (cm, ext.remote_aggregate), ext.name, ext.local_port, ext.remote_port, ext.capacity_kbps,
              "vlan", ext.component_id)
    if sub.external_links:
        _stitching(root, sub, usage, now, url)
    return etree.tostring(root, encoding="unicode", pretty_print=True)


def _num(x: float | None) -> str:
    return repr(float(x)) if x is not None else ""


def _node(root, sub: Substrate, cid: str, name: str, exclusive: bool, hardware: str, site: str, cm: str):
    node = etree.SubElement(root, q(RSPEC3, "node"), component_id=cid, component_manager_id=cm, component_name=name,
                            exclusive="true" if exclusive else "false")
    etree.SubElement(node, q(RSPEC3, "hardware_type"), name=hardware)
    if site:
        etree.SubElement(node, q(CAPACITY, "site_ref"), name=site)
    return node


def _location(node, sites: Mapping[str, Site], site_name: str) -> None:
    site = sites.get(site_name) if site_name else None
    if site is not None and site.country:
        loc = etree.SubElement(node, q(RSPEC3, "location"), country=site.country)
        if site.latitude is not None:
            loc.set("latitude", _num(site.latitude))
            loc.set("longitude", _num(site.longitude))


def _port_bandwidths(node, ports) -> None:
    for p in ports:
        etree.SubElement(node, q(CAPACITY, "port"), component_id=p.component_id, bandwidth_kbps=str(p.bandwidth_kbps))


def _sliver_types(sub: Substrate, sizes: list) -> list[etree._Element]:
    """The sliver_type elements a VM host (sizes) or a bare-metal node ([None]) offers; every such host offers
    the same, so they are built once per advertisement and copied."""
    out = []
    for size in sizes:
        st = etree.Element(_T_SLIVER_TYPE, name=size.name if size else RAW_PC)
        if size is not None:
            etree.SubElement(st, _T_CAP_COMPUTE, cores=str(size.cores), memory_mb=str(size.memory_mb),
                             disk_gb=str(size.disk_gb))
        for n, img in enumerate(sub.images):
            di = etree.SubElement(st, _T_DISK_IMAGE, name=img.urn, os=img.os, version=img.version,
                                  description=img.description, default="true" if n == 0 else "false")
            if img.url:
                di.set("url", img.url)
            if img.name != urn_name(img.urn):
                di.set(q(CAPACITY, "name"), img.name)
        out.append(st)
    return out


def _host_node(root, h: Host, available: bool, cm: str, sites: Mapping[str, Site],
               sliver_types: list[etree._Element]) -> None:
    node = etree.SubElement(root, _T_NODE, component_id=h.component_id, component_manager_id=cm,
                            component_name=h.name, exclusive="true" if h.exclusive else "false")
    etree.SubElement(node, _T_HARDWARE_TYPE, name=h.hardware_type)
    if h.site:
        etree.SubElement(node, _T_SITE_REF, name=h.site)
    disk = {"disk_gb": str(h.disk_gb)} if h.disk_gb else {}
    etree.SubElement(node, _T_CAP_COMPUTE, cores=str(h.cores), memory_mb=str(h.memory_mb), **disk)
    node.extend([t.__deepcopy__(None) for t in sliver_types])  # lxml's C copy, without copy.deepcopy's memo
    etree.SubElement(node, _T_AVAILABLE, now="true" if available else "false")
    _location(node, sites, h.site)
    for i in h.interfaces:
        etree.SubElement(node, _T_INTERFACE, component_id=i.component_id, role=i.role)
    for i in h.interfaces:
        etree.SubElement(node, _T_CAP_PORT, component_id=i.component_id, bandwidth_kbps=str(i.bandwidth_kbps))


def _link(root, cm: str, managers: tuple[str, ...], name: str, a: str, b: str, capacity_kbps: int, link_type: str,
          cid: str | None = None) -> etree._Element:
    authority = cm.split("+")[1]
    link = etree.SubElement(root, _T_LINK, component_id=cid or f"urn:publicid:IDN+{authority}+link+{name}",
                            component_name=name)
    for m in managers:
        etree.SubElement(link, _T_COMPONENT_MANAGER, name=m)
    etree.SubElement(link, _T_INTERFACE_REF, component_id=a)
    etree.SubElement(link, _T_INTERFACE_REF, component_id=b)
    capacity = str(capacity_kbps)
    for s, d in ((a, b), (b, a)):
        etree.SubElement(link, _T_PROPERTY, source_id=s, dest_id=d, capacity=capacity, latency="0", packet_loss="0")
    etree.SubElement(link, _T_LINK_TYPE, name=link_type)
    return link


def _opstate(root, cm: str, sliver_types: list[str]) -> None:
    op = etree.SubElement(root, q(OPSTATE, "rspec_opstate"), nsmap={None: OPSTATE}, aggregate_manager_id=cm,
                          start="geni_notready")
    for t in sliver_types:
        etree.SubElement(op, q(OPSTATE, "sliver_type"), name=t)
    for state, actions, waits, description in OPSTATE_MACHINE:
        s = etree.SubElement(op, q(OPSTATE, "state"), name=state)
        for action, nxt, text in actions:
            a = etree.SubElement(s, q(OPSTATE, "action"), name=action, next=nxt)
            etree.SubElement(a, q(OPSTATE, "description")).text = text
        for kind, nxt in waits:
            etree.SubElement(s, q(OPSTATE, "wait"), type=kind, next=nxt)
        etree.SubElement(s, q(OPSTATE, "description")).text = description


def _text(parent, tag: str, value: object) -> None:
    etree.SubElement(parent, q(STITCH2, tag)).text = str(value)


def _stitching(root, sub: Substrate, usage: Usage, now: datetime, url: str) -> None:
    st = etree.SubElement(root, q(STITCH2, "stitching"), nsmap={None: STITCH2}, lastUpdateTime=rfc3339(now))
    agg = etree.SubElement(st, q(STITCH2, "aggregate"), id=sub.component_manager_id)
    if url:
        agg.set("url", url)
    _text(agg, "aggregatetype", AGGREGATE_TYPE)
    _text(agg, "stitchingmode", "chainANDTree")
    _text(agg, "scheduledservices", "false")
    _text(agg, "negotiatedservices", "false")
    life = etree.SubElement(agg, q(STITCH2, "lifetime"), id="life")
    etree.SubElement(life, q(STITCH2, "start"), type="time").text = rfc3339(now)
    etree.SubElement(life, q(STITCH2, "end"), type="time").text = rfc3339(now + AD_LIFETIME)
    nodes: dict[str, etree._Element] = {}
    for ext in sub.external_links:
        node = nodes.get(ext.switch_id)
        if node is None:
            node = nodes[ext.switch_id] = etree.SubElement(agg, q(STITCH2, "node"), id=ext.switch_id)
        free_kbps = max(0, ext.capacity_kbps - usage.bandwidth_kbps.get(ext.component_id, 0))
        port = etree.SubElement(node, q(STITCH2, "port"), id=ext.stitch_port_id)
        _capacities(port, ext, free_kbps)
        link = etree.SubElement(port, q(STITCH2, "link"), id=ext.local_port)
        _text(link, "remoteLinkId", ext.remote_port)
        _text(link, "trafficEngineeringMetric", ext.te_metric)
        _capacities(link, ext, free_kbps)
        scd = etree.SubElement(link, q(STITCH2, "switchingCapabilityDescriptor"))
        _text(scd, "switchingcapType", "l2sc")
        _text(scd, "encodingType", "ethernet")
        info = etree.SubElement(etree.SubElement(scd, q(STITCH2, "switchingCapabilitySpecificInfo")),
                                q(STITCH2, "switchingCapabilitySpecificInfo_L2sc"))
        _text(info, "interfaceMTU", ext.mtu)
        _text(info, "vlanRangeAvailability", format_ranges(ext.vlan_range, external_tags_in_use(ext, usage)))
        _text(info, "vlanTranslation", "true" if ext.vlan_translation else "false")
        if ext.qinq:
            etree.SubElement(info, q(QINQ, "tunneling"), nsmap={"qinq": QINQ}, tpid="0x88a8",
                             sTagRange=format_ranges(ext.s_vlan_range or ext.vlan_range))


def _capacities(parent, ext: ExternalLink, free_kbps: int) -> None:
    _text(parent, "capacity", ext.capacity_kbps)
    _text(parent, "maximumReservableCapacity", free_kbps)
    _text(parent, "minimumReservableCapacity", ext.min_capacity_kbps)
    _text(parent, "granularity", ext.granularity_kbps)


class AdvertisementCache:
    """Repeated ListResources with unchanged usage reuse the last documents. Keyed on the substrate object
    (identity: a new substrate is a change), the usage and geni_available; any other key replaces the old
    entries, and `invalidate()` drops them (call it when the substrate file is reloaded)."""

    def __init__(self, ttl: timedelta = timedelta(minutes=5)):
        self._lock = threading.Lock()
        self._substrate: Substrate | None = None
        self._entries: dict[tuple, tuple[datetime, str]] = {}
        self.ttl = ttl
        self.hits = 0
        self.misses = 0
        self._keyed: tuple[Usage, tuple] | None = None  # the last usage object and its key

    def get(self, substrate: Substrate, usage: Usage, now: datetime, available_only: bool = False,
            *, am_url: str | None = None) -> str:
        """The advertisement for `usage`; a caller that passes the same Usage object again while nothing
        changed (the deployment keeps one per broker answer) skips computing its key (sorting every host)."""
        with self._lock:
            keyed = self._keyed
        if keyed is not None and keyed[0] is usage:
            usage_key = keyed[1]
        else:
            usage_key = usage.key()
            with self._lock:
                self._keyed = (usage, usage_key)
        key = (usage_key, available_only, am_url)
        with self._lock:
            if self._substrate is substrate:
                hit = self._entries.get(key)
                if hit is not None and timedelta(0) <= now - hit[0] < self.ttl:
                    self.hits += 1
                    return hit[1]
        ad = build_advertisement(substrate, usage, now, available_only, am_url=am_url)
        with self._lock:
            self.misses += 1
            if self._substrate is not substrate:
                self._substrate, self._entries = substrate, {}
            # both geni_available variants of the current usage may live side by side; older usages go
            self._entries = {k: v for k, v in self._entries.items() if k[0] == key[0] and k != key}
            self._entries[key] = (now, ad)
        return ad

    def invalidate(self) -> None:
        with self._lock:
            self._substrate, self._entries = None, {}
