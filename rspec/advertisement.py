"""Advertisements: what this aggregate offers, generated from the substrate and live usage.

Nodes carry their sliver types and images and a live `available` flag; host↔switch cables are links;
the opstate extension describes the operational state machine; external ports appear in the stitching
extension with the VLANs still free."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from lxml import etree

from rspec.namespaces import AD_XSD, CAPACITY, OPSTATE, OPSTATE_XSD, RSPEC3, STITCH2, XSI, q
from rspec.substrate import Host, Substrate
from slicex.clock import rfc3339


@dataclass(frozen=True)
class Usage:
    """What is in use now, so the ad's `available` flags are live."""

    cores: Mapping[str, int] = field(default_factory=dict)
    memory_mb: Mapping[str, int] = field(default_factory=dict)
    taken: frozenset[str] = frozenset()
    vlans: Mapping[str, frozenset[int]] = field(default_factory=dict)

    def key(self) -> tuple:
        return (tuple(sorted(self.cores.items())), tuple(sorted(self.memory_mb.items())), tuple(sorted(self.taken)),
                tuple(sorted((k, tuple(sorted(v))) for k, v in self.vlans.items())))


def _host_available(h: Host, sub: Substrate, usage: Usage) -> bool:
    if h.exclusive:
        return h.component_id not in usage.taken
    smallest = min(sub.vm_sizes, key=lambda s: (s.cores, s.memory_mb)) if sub.vm_sizes else None
    if smallest is None:
        return False
    return (h.cores - usage.cores.get(h.component_id, 0) >= smallest.cores
            and h.memory_mb - usage.memory_mb.get(h.component_id, 0) >= smallest.memory_mb)


def _ranges(ranges: tuple[tuple[int, int], ...], used: frozenset[int]) -> str:
    free = [t for lo, hi in ranges for t in range(lo, hi + 1) if t not in used]
    out, start, prev = [], None, None
    for t in free:
        if start is None:
            start = prev = t
        elif t == prev + 1:
            prev = t
        else:
            out.append(f"{start}-{prev}" if start != prev else str(start))
            start = prev = t
    if start is not None:
        out.append(f"{start}-{prev}" if start != prev else str(start))
    return ",".join(out)


OPSTATE_MACHINE = [
    ("geni_notready", [("geni_start", "geni_configuring")], "Nodes are allocated but not yet started"),
    ("geni_configuring", [], "Booting; becomes geni_ready or geni_failed"),
    ("geni_ready", [("geni_stop", "geni_stopping"), ("geni_restart", "geni_configuring"),
                    ("geni_update_users", "geni_ready_busy")], "Running"),
    ("geni_ready_busy", [], "Updating users; returns to geni_ready"),
    ("geni_stopping", [], "Stopping; becomes geni_notready"),
    ("geni_failed", [("geni_start", "geni_configuring"), ("geni_restart", "geni_configuring")], "Failed"),
]


def build_advertisement(substrate: Substrate, usage: Usage, now: datetime, available_only: bool = False) -> str:
    root = etree.Element(q(RSPEC3, "rspec"), nsmap={None: RSPEC3, "xsi": XSI, "opstate": OPSTATE, "cap": CAPACITY})
    root.set("type", "advertisement")
    root.set("generated", rfc3339(now))
    root.set("expires", rfc3339(now + timedelta(hours=1)))
    root.set(q(XSI, "schemaLocation"), f"{RSPEC3} {AD_XSD} {OPSTATE} {OPSTATE_XSD}")
    cm = substrate.component_manager_id
    sliver_types: set[str] = set()
    for h in substrate.hosts:
        available = _host_available(h, substrate, usage)
        if available_only and not available:
            continue
        node = etree.SubElement(root, q(RSPEC3, "node"), component_id=h.component_id, component_manager_id=cm,
                                component_name=h.name, exclusive="true" if h.exclusive else "false")
        etree.SubElement(node, q(RSPEC3, "hardware_type"), name=h.hardware_type)
        etree.SubElement(node, q(CAPACITY, "compute"), cores=str(h.cores), memory_mb=str(h.memory_mb))
        sizes = [None] if h.exclusive else list(substrate.vm_sizes)
        for size in sizes:
            t = size.name if size else "raw-pc"
            sliver_types.add(t)
            st = etree.SubElement(node, q(RSPEC3, "sliver_type"), name=t)
            if size is not None:
                etree.SubElement(st, q(CAPACITY, "compute"), cores=str(size.cores), memory_mb=str(size.memory_mb),
                                 disk_gb=str(size.disk_gb))
            for n, img in enumerate(substrate.images):
                etree.SubElement(st, q(RSPEC3, "disk_image"), name=img.urn, os=img.os, version=img.version,
                                 description=img.description, default="true" if n == 0 else "false")
        etree.SubElement(node, q(RSPEC3, "available"), now="true" if available else "false")
        for i in h.interfaces:
            etree.SubElement(node, q(RSPEC3, "interface"), component_id=i.component_id, role="experimental")
    for sw in substrate.switches:
        node = etree.SubElement(root, q(RSPEC3, "node"), component_id=sw.component_id, component_manager_id=cm,
                                component_name=sw.name, exclusive="false")
        etree.SubElement(node, q(RSPEC3, "hardware_type"), name="switch")
        etree.SubElement(node, q(CAPACITY, "vlans"), ranges=_ranges(sw.vlan_range, frozenset()))
        etree.SubElement(node, q(RSPEC3, "available"), now="true")
        for p in sw.ports:
            etree.SubElement(node, q(RSPEC3, "interface"), component_id=p.component_id, role="experimental")
    for board in substrate.fpga_boards:
        name = str(board.get("name"))
        node = etree.SubElement(root, q(RSPEC3, "node"), component_id=f"urn:publicid:IDN+{substrate.authority}+node+{name}",
                                component_manager_id=cm, component_name=name, exclusive="false")
        etree.SubElement(node, q(RSPEC3, "hardware_type"), name=str(board.get("model")))
        for t in ("fpga-bitstream", "virtual-router"):
            sliver_types.add(t)
            etree.SubElement(node, q(RSPEC3, "sliver_type"), name=t)
        etree.SubElement(node, q(RSPEC3, "available"), now="true")
    for h in substrate.hosts:
        for i in h.interfaces:
            if not i.switch_port:
                continue
            name = f"{h.name}:{i.name}-{i.switch_port.split('+')[-1]}"
            link = etree.SubElement(root, q(RSPEC3, "link"),
                                    component_id=f"urn:publicid:IDN+{substrate.authority}+link+{name}",
                                    component_name=name)
            etree.SubElement(link, q(RSPEC3, "component_manager"), name=cm)
            etree.SubElement(link, q(RSPEC3, "interface_ref"), component_id=i.component_id)
            etree.SubElement(link, q(RSPEC3, "interface_ref"), component_id=i.switch_port)
            etree.SubElement(link, q(RSPEC3, "property"), source_id=i.component_id, dest_id=i.switch_port,
                             capacity=str(i.bandwidth_kbps))
            etree.SubElement(link, q(RSPEC3, "link_type"), name="lan")
    _opstate(root, cm, sorted(sliver_types))
    if substrate.external_links:
        _stitching(root, substrate, usage, now)
    return etree.tostring(root, encoding="unicode", pretty_print=True)


def _opstate(root: etree._Element, cm: str, sliver_types: list[str]) -> None:
    op = etree.SubElement(root, q(OPSTATE, "rspec_opstate"), aggregate_manager_id=cm, start="geni_notready")
    for t in sliver_types:
        etree.SubElement(op, q(OPSTATE, "sliver_type"), name=t)
    for state, actions, description in OPSTATE_MACHINE:
        s = etree.SubElement(op, q(OPSTATE, "state"), name=state)
        for action, nxt in actions:
            a = etree.SubElement(s, q(OPSTATE, "action"), name=action, next=nxt)
            etree.SubElement(a, q(OPSTATE, "description")).text = f"{action} from {state}"
        etree.SubElement(s, q(OPSTATE, "description")).text = description


def _stitching(root: etree._Element, substrate: Substrate, usage: Usage, now: datetime) -> None:
    st = etree.SubElement(root, q(STITCH2, "stitching"), nsmap={"stitch": STITCH2}, lastUpdateTime=rfc3339(now))
    agg = etree.SubElement(st, q(STITCH2, "aggregate"), id=substrate.component_manager_id, url="")
    etree.SubElement(agg, q(STITCH2, "aggregateType")).text = "slicex"
    etree.SubElement(agg, q(STITCH2, "stitchingmode")).text = "chainANDTree"
    etree.SubElement(agg, q(STITCH2, "scheduledservices")).text = "false"
    etree.SubElement(agg, q(STITCH2, "negotiatedservices")).text = "false"
    for ext in substrate.external_links:
        node = etree.SubElement(agg, q(STITCH2, "node"), id=ext.local_port.rsplit(":", 1)[0])
        port = etree.SubElement(node, q(STITCH2, "port"), id=ext.local_port)
        etree.SubElement(port, q(STITCH2, "capacity")).text = str(ext.capacity_kbps)
        etree.SubElement(port, q(STITCH2, "maximumReservableCapacity")).text = str(ext.capacity_kbps)
        etree.SubElement(port, q(STITCH2, "minimumReservableCapacity")).text = "1"
        etree.SubElement(port, q(STITCH2, "granularity")).text = "1"
        link = etree.SubElement(port, q(STITCH2, "link"), id=ext.component_id)
        etree.SubElement(link, q(STITCH2, "remoteLinkId")).text = ext.remote_port
        etree.SubElement(link, q(STITCH2, "trafficEngineeringMetric")).text = "10"
        etree.SubElement(link, q(STITCH2, "capacity")).text = str(ext.capacity_kbps)
        etree.SubElement(link, q(STITCH2, "maximumReservableCapacity")).text = str(ext.capacity_kbps)
        etree.SubElement(link, q(STITCH2, "minimumReservableCapacity")).text = "1"
        etree.SubElement(link, q(STITCH2, "granularity")).text = "1"
        scd = etree.SubElement(link, q(STITCH2, "switchingCapabilityDescriptor"))
        etree.SubElement(scd, q(STITCH2, "switchingcapType")).text = "l2sc"
        etree.SubElement(scd, q(STITCH2, "encodingType")).text = "ethernet"
        info = etree.SubElement(etree.SubElement(scd, q(STITCH2, "switchingCapabilitySpecificInfo")),
                                q(STITCH2, "switchingCapabilitySpecificInfo_L2sc"))
        etree.SubElement(info, q(STITCH2, "interfaceMTU")).text = "9000"
        etree.SubElement(info, q(STITCH2, "vlanRangeAvailability")).text = _ranges(
            ext.vlan_range, usage.vlans.get(ext.component_id, frozenset()))
        etree.SubElement(info, q(STITCH2, "suggestedVLANRange")).text = _ranges(ext.vlan_range, frozenset())
        etree.SubElement(info, q(STITCH2, "vlanTranslation")).text = "true" if ext.vlan_translation else "false"
        if ext.qinq:
            etree.SubElement(info, q(CAPACITY, "tunneling"), type="802.1ad")


class AdvertisementCache:
    """Repeated ListResources with unchanged usage reuse the last document (keyed on substrate and usage)."""

    def __init__(self, ttl: timedelta = timedelta(minutes=5)):
        self._lock = threading.Lock()
        self._entries: dict[tuple, tuple[datetime, str]] = {}
        self.ttl = ttl

    def get(self, substrate: Substrate, usage: Usage, now: datetime, available_only: bool = False) -> str:
        key = (id(substrate), usage.key(), available_only)
        with self._lock:
            hit = self._entries.get(key)
            if hit and now - hit[0] < self.ttl:
                return hit[1]
        ad = build_advertisement(substrate, usage, now, available_only)
        with self._lock:
            self._entries = {key: (now, ad)}  # one entry: any change of usage invalidates
        return ad
