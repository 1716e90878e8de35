"""Reading the stitching topology: from slicex substrate files, from GENI advertisements (the stitching
extension's aggregate/node/port/link with remoteLinkId, as any GENI AM publishes it), or from the operator's
topology file that lists both. Errors name the source and what to fix."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import yaml
from lxml import etree

from rspec.substrate import Substrate, load_substrate
from slicex.xmlsafe import parse_xml
from stitching.model import Aggregate, Port, Topology, parse_vlans

QINQ_NS = "http://slicex.dev/rspec/ext/qinq/1"
CAPACITY_NS = "http://slicex.dev/rspec/ext/capacity/1"
MAX_AD_BYTES = 64 * 1024 * 1024


class TopologyError(ValueError):
    """A topology source that cannot be read, with where and how to fix it."""


def from_substrate(sub: Substrate, url: str = "") -> Topology:
    """The substrate's external links as ports of its aggregate (a Q-in-Q port pushes S-tags from its
    `s_vlan_range`, by default its VLAN range)."""
    agg = Aggregate(sub.component_manager_id, url or sub.am_url)
    ports = []
    for e in sub.external_links:
        vlans = frozenset(t for lo, hi in e.vlan_range for t in range(lo, hi + 1))
        s_range = e.s_vlan_range or e.vlan_range
        s_vlans = frozenset(t for lo, hi in s_range for t in range(lo, hi + 1)) if e.qinq else frozenset()
        ports.append(Port(e.local_port, agg.urn, e.remote_port, vlans, e.vlan_translation, e.qinq, s_vlans,
                          e.capacity_kbps, e.mtu, e.te_metric))
    return Topology.build([agg], ports)


def _local(el: etree._Element) -> str:
    return etree.QName(el).localname if isinstance(el.tag, str) else ""


def _child(el: etree._Element, name: str) -> etree._Element | None:
    return next((c for c in el if _local(c) == name), None)


def _text(el: etree._Element | None, name: str, default: str = "") -> str:
    c = _child(el, name) if el is not None else None
    return (c.text or "").strip() if c is not None and c.text else default


def from_advertisement(text: str | bytes, source: str = "advertisement", url: str = "") -> Topology:
    """The stitching section of an advertisement (either stitch namespace: elements are matched by local
    name, as the stitcher does). `maximumReservableCapacity` (bps or kbps as the ad says: slicex writes kbps)
    is the port's free capacity; `<qinq:tunneling sTagRange>` marks a Q-in-Q port and its S-tags."""
    root = parse_xml(text, source, MAX_AD_BYTES)
    stitching = [c for c in root.iter() if _local(c) == "stitching"]
    if not stitching:
        raise TopologyError(f"{source}: no <stitching> section; fix: the aggregate must advertise its external "
                            f"ports with the GENI stitching extension")
    aggregates, ports = [], []
    for agg_el in (a for st in stitching for a in st if _local(a) == "aggregate"):
        agg_urn = agg_el.get("id") or ""
        if not agg_urn:
            raise TopologyError(f"{source}: a stitching <aggregate> has no id")
        agg = Aggregate(agg_urn, url or agg_el.get("url", ""))
        aggregates.append(agg)
        for node in (n for n in agg_el if _local(n) == "node"):
            for port_el in (p for p in node if _local(p) == "port"):
                for link in (lk for lk in port_el if _local(lk) == "link"):
                    ports.append(_port(link, agg.urn, source))
    return Topology.build(aggregates, ports)


def _port(link: etree._Element, agg: str, source: str) -> Port:
    lid = link.get("id", "")
    l2sc = next((c for c in link.iter() if _local(c) in ("switchingCapabilitySpecificInfo_L2sc",)), None)
    try:
        vlans = parse_vlans(_text(l2sc, "vlanRangeAvailability", "any"))
        capacity = int(_text(link, "maximumReservableCapacity") or _text(link, "capacity") or 10_000_000)
        mtu = int(_text(l2sc, "interfaceMTU") or 1500)
        metric = int(_text(link, "trafficEngineeringMetric") or 10)
        tunneling = next((c for c in l2sc if isinstance(c.tag, str) and c.tag == f"{{{QINQ_NS}}}tunneling"), None) \
            if l2sc is not None else None
        s_vlans = parse_vlans(tunneling.get("sTagRange")) if tunneling is not None else frozenset()
    except ValueError as exc:
        raise TopologyError(f"{source}: stitching link {lid}: {exc}") from None
    return Port(lid, agg, _text(link, "remoteLinkId"), vlans, _text(l2sc, "vlanTranslation").lower() == "true",
                tunneling is not None, s_vlans, capacity, mtu, metric)


TOP_KEYS = {"aggregates"}
AGG_KEYS = {"substrate", "advertisement", "url", "urn", "ports"}
PORT_KEYS = {"urn", "remote", "vlan_range", "vlan_translation", "qinq", "s_vlan_range", "capacity_kbps", "mtu",
             "te_metric"}


def _fetch(where: str, base: Path) -> str:
    if where.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(where, timeout=30) as resp:  # noqa: S310 - operator-configured URL
                return resp.read(MAX_AD_BYTES).decode("utf-8", "replace")
        except OSError as exc:
            raise TopologyError(f"cannot fetch advertisement {where}: {exc}; fix: check the URL, or save the "
                                f"advertisement to a file and name the file") from None
    path = base / where
    try:
        return path.read_text()
    except OSError as exc:
        raise TopologyError(f"cannot read advertisement {path}: {exc.strerror or exc}") from None


def load_topology(path: str | Path) -> Topology:
    """The operator's topology file (YAML): `aggregates:` entries, each one of
    `{substrate: FILE, url: AM_URL}`, `{advertisement: FILE_OR_URL, url?: AM_URL}` or, for a transit network
    that publishes neither, `{urn: AM_URN, url: AM_URL, ports: [{urn, remote, vlan_range, vlan_translation?,
    qinq?, s_vlan_range?, capacity_kbps?}]}`. Relative files are read beside the topology file."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise TopologyError(f"{p}: cannot read topology file: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise TopologyError(f"{p}: not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("aggregates"), list):
        raise TopologyError(f"{p}: expected 'aggregates:' with a list of aggregates")
    extra = set(data) - TOP_KEYS
    if extra:
        raise TopologyError(f"{p}: unknown key(s) {', '.join(sorted(extra))}; allowed: aggregates")
    topo = Topology({}, {})
    for n, entry in enumerate(data["aggregates"], 1):
        topo = topo.merged(_entry(entry, p, n))
    if not topo.aggregates:
        raise TopologyError(f"{p}: no aggregates listed")
    return topo


def _entry(entry: Any, p: Path, n: int) -> Topology:
    where = f"{p}: aggregate #{n}"
    if not isinstance(entry, dict):
        raise TopologyError(f"{where}: expected key: value pairs")
    extra = set(entry) - AGG_KEYS
    if extra:
        raise TopologyError(f"{where}: unknown key(s) {', '.join(sorted(extra))}; allowed: {', '.join(sorted(AGG_KEYS))}")
    url = str(entry.get("url") or "")
    if "substrate" in entry:
        try:
            return from_substrate(load_substrate(p.parent / str(entry["substrate"])), url)
        except ValueError as exc:
            raise TopologyError(f"{where}: {exc}") from None
    if "advertisement" in entry:
        src = str(entry["advertisement"])
        try:
            return from_advertisement(_fetch(src, p.parent), src, url)
        except TopologyError:
            raise
        except Exception as exc:  # noqa: BLE001 - a foreign document: report what is wrong with it
            raise TopologyError(f"{where}: advertisement {src}: {exc}") from None
    urn = entry.get("urn")
    if not urn:
        raise TopologyError(f"{where}: give 'substrate', 'advertisement', or 'urn' with 'ports'")
    ports = []
    for port in entry.get("ports") or []:
        if not isinstance(port, dict) or set(port) - PORT_KEYS or not port.get("urn") or not port.get("remote"):
            raise TopologyError(f"{where}: each port needs urn and remote (allowed keys: {', '.join(sorted(PORT_KEYS))})")
        try:
            ports.append(Port(str(port["urn"]), str(urn), str(port["remote"]),
                              parse_vlans(str(port.get("vlan_range", "any"))), bool(port.get("vlan_translation")),
                              bool(port.get("qinq")),
                              parse_vlans(str(port.get("s_vlan_range") or port.get("vlan_range", "any")))
                              if port.get("qinq") else frozenset(),
                              int(port.get("capacity_kbps", 10_000_000)), int(port.get("mtu", 1500)),
                              int(port.get("te_metric", 10))))
        except ValueError as exc:
            raise TopologyError(f"{where}: port {port.get('urn')}: {exc}") from None
    return Topology.build([Aggregate(str(urn), url)], ports)
