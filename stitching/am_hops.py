"""The aggregate's side of stitching: its own hops in a request and in the manifest (../shared/STITCHING.md
§1.4). Pure functions over the substrate and the XML; am/api.py calls them.

A hop is this aggregate's when its link id is the local port of one of its external links. Its
`suggestedVLANRange` must be one tag, inside the hop's `vlanRangeAvailability` and the external link's
range; that tag becomes the slice link's VLAN, so the broker holds it on the switch (VLAN_UNAVAILABLE, 24,
when another slice has it). In the manifest the hop says the tag assigned, and every element under `_L2sc`
has text (the stitcher crashes on an empty one and leaves reservations behind)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from lxml import etree

from rspec.request import Request
from rspec.substrate import ExternalLink, Substrate
from slicex.errors import BadArgs, InsufficientBandwidth, Unsupported, VlanUnavailable
from slicex.xmlsafe import parse_xml
from stitching.model import format_vlans, parse_vlans

L2SC = ("switchingCapabilitySpecificInfo_L2sc", "switchingCapabilitySpecificInfo_OpenflowL2sc")
QINQ = "http://slicex.dev/rspec/ext/qinq/1"


def _local(el) -> str:
    return etree.QName(el).localname if isinstance(el.tag, str) else ""


def _find(el, *names: str):
    """The first descendant path by local names (namespaces ignored, as the stitcher matches them)."""
    for name in names:
        el = next((c for c in el if _local(c) == name), None) if el is not None else None
    return el


@dataclass(frozen=True)
class OwnHop:
    path_id: str
    hop_id: str
    link: ExternalLink
    tag: int


def own_hops(substrate: Substrate, xml: str) -> list[OwnHop]:
    """This aggregate's hops in a request's stitching section, each checked against the external link."""
    root = parse_xml(xml, "request RSpec")
    ports = {e.local_port.lower(): e for e in substrate.external_links}
    out: list[OwnHop] = []
    for st in (c for c in root if _local(c) == "stitching"):
        for path in (p for p in st if _local(p) == "path"):
            for hop in (h for h in path if _local(h) == "hop"):
                link = _find(hop, "link")
                ext = ports.get((link.get("id") or "").lower()) if link is not None else None
                if ext is None:
                    continue
                where = f"path {path.get('id')} hop {hop.get('id')} ({ext.local_port})"
                if any(isinstance(c.tag, str) and etree.QName(c).namespace == QINQ for c in link):
                    raise Unsupported(f"{where}: the hop asks for Q-in-Q; this aggregate cannot yet push or hold "
                                      f"S-tags on its ports, so it refuses rather than carry the link untunnelled")
                l2 = next((c for c in link.iter() if _local(c) in L2SC), None)
                suggested = (_find(l2, "suggestedVLANRange").text or "").strip() \
                    if _find(l2, "suggestedVLANRange") is not None else ""
                if not suggested.isdigit():
                    raise BadArgs(f"{where}: suggestedVLANRange {suggested or '(missing)'!r} is not one VLAN tag; "
                                  f"this aggregate needs the tag its path service chose")
                tag = int(suggested)
                avail_el = _find(l2, "vlanRangeAvailability")
                try:
                    avail = parse_vlans(avail_el.text if avail_el is not None else None)
                except ValueError as exc:
                    raise BadArgs(f"{where}: vlanRangeAvailability: {exc}") from None
                ranges = format_vlans(t for lo, hi in ext.vlan_range for t in range(lo, hi + 1))
                if tag not in avail or not any(lo <= tag <= hi for lo, hi in ext.vlan_range):
                    raise VlanUnavailable(f"{where}: VLAN {tag} is not offered on this port (its range is {ranges}; "
                                          f"the hop allows {format_vlans(avail) or 'none'})")
                sw = substrate.switch(ext.switch_id)
                if sw is not None and not any(lo <= tag <= hi for lo, hi in sw.vlan_range):
                    raise VlanUnavailable(f"{where}: VLAN {tag} is in the port's range but outside switch {sw.name}'s "
                                          f"VLAN range; the operator's substrate file must keep external ranges "
                                          f"inside the switch's")
                out.append(OwnHop(path.get("id") or "", hop.get("id") or "", ext, tag))
    return out


def apply_hops(substrate: Substrate, request: Request, whole: Request | None = None) -> Request:
    """The request with each stitched link's VLAN set to its own hop's tag (so the ordinary embedding holds
    exactly that tag, or answers VLAN_UNAVAILABLE), after checking capacity against the external port.

    `whole` is the request before it was cut to this aggregate: a link this aggregate only carries (transit:
    its hops are here, none of its interfaces) is taken from it, so the transit holds the tag too."""
    hops = own_hops(substrate, request.xml) if request.xml else []
    if not hops:
        return request
    have = {lk.client_id for lk in request.links}
    carried = tuple(lk for lk in (whole.links if whole is not None else ())
                    if lk.client_id not in have and any(h.path_id == lk.client_id for h in hops))
    request = replace(request, links=request.links + carried)
    by_path: dict[str, OwnHop] = {}
    for h in hops:
        if h.path_id in by_path and by_path[h.path_id].tag != h.tag:
            raise BadArgs(f"path {h.path_id}: this aggregate's hops ask for VLANs {by_path[h.path_id].tag} and "
                          f"{h.tag}; it does not translate between its own ports")
        by_path[h.path_id] = h
    links = []
    for lk in request.links:
        h = by_path.get(lk.client_id)
        if h is None:
            links.append(lk)
            continue
        if lk.vlan_tag is not None and lk.vlan_tag != h.tag:
            raise BadArgs(f"link {lk.client_id}: vlantag {lk.vlan_tag} disagrees with its stitching hop's {h.tag}")
        if lk.capacity_kbps and lk.capacity_kbps > h.link.capacity_kbps:
            raise InsufficientBandwidth(f"link {lk.client_id}: asked for {lk.capacity_kbps} kbps; the port toward "
                                        f"{h.link.remote_aggregate} ({h.link.local_port}) carries at most "
                                        f"{h.link.capacity_kbps} kbps")
        links.append(replace(lk, vlan_tag=h.tag))
    missing = set(by_path) - {lk.client_id for lk in request.links}
    if missing:
        raise BadArgs(f"stitching path(s) {', '.join(sorted(missing))} name no link of this request")
    return replace(request, links=tuple(links))


def annotate_manifest(manifest: str, substrate: Substrate, tags: Mapping[str, int]) -> str:
    """The manifest with each own hop of a link in `tags` (link client_id -> assigned tag) showing that tag
    as suggestedVLANRange and vlanRangeAvailability, and no empty element under any own hop's `_L2sc`."""
    if "stitching" not in manifest:
        return manifest
    root = parse_xml(manifest, "manifest", 64 * 1024 * 1024)
    ports = {e.local_port.lower(): e for e in substrate.external_links}
    changed = False
    for st in (c for c in root if _local(c) == "stitching"):
        for path in (p for p in st if _local(p) == "path"):
            tag = tags.get(path.get("id") or "")
            for hop in (h for h in path if _local(h) == "hop"):
                link = _find(hop, "link")
                ext = ports.get((link.get("id") or "").lower()) if link is not None else None
                l2 = next((c for c in link.iter() if _local(c) in L2SC), None) if ext is not None else None
                if l2 is None:
                    continue
                ns = etree.QName(l2).namespace
                values = {"suggestedVLANRange": tag, "vlanRangeAvailability": tag,
                          "vlanTranslation": "true" if ext.vlan_translation else "false", "interfaceMTU": ext.mtu}
                for name, value in values.items():
                    el = _find(l2, name)
                    if el is None and value is not None:
                        el = etree.SubElement(l2, f"{{{ns}}}{name}" if ns else name)
                    if el is not None and value is not None and (name in ("suggestedVLANRange",
                                                                          "vlanRangeAvailability")
                                                                 or not (el.text or "").strip()):
                        el.text = str(value)
                for el in list(l2):
                    if isinstance(el.tag, str) and not (el.text or "").strip() and len(el) == 0:
                        l2.remove(el)  # an empty element crashes the stitcher (IndexError, STITCHING.md §1.4)
                changed = True
    return etree.tostring(root, encoding="unicode", pretty_print=True) if changed else manifest
