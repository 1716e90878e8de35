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


TPID_8021Q, TPID_8021AD = 0x8100, 0x88A8


@dataclass(frozen=True)
class OwnHop:
    """One of this aggregate's hops: `tag` is the outer tag on its wire (the S-tag inside a Q-in-Q tunnel);
    `qinq` is "push"/"pop" at a tunnel end (with `c_tag` inside), `tunnelled` a hop between the two ends."""

    path_id: str
    hop_id: str
    link: ExternalLink
    tag: int
    qinq: str = ""
    c_tag: int | None = None
    tunnelled: bool = False

    @property
    def wire(self) -> tuple[tuple[int, int], ...]:
        """The tags on the hop's wire, outermost first: what the data plane's uplink pushes and pops."""
        if self.qinq and self.c_tag is not None:
            return ((TPID_8021AD, self.tag), (TPID_8021Q, self.c_tag))
        return ((TPID_8021AD if self.tunnelled else TPID_8021Q, self.tag),)

    @property
    def local(self) -> int:
        """The tag the link's segment uses on this aggregate's switch (the C-tag at a tunnel end)."""
        return self.c_tag if self.qinq and self.c_tag is not None else self.tag


def _qinq(link, where: str) -> tuple[str, int | None, int | None]:
    """(action, c_tag, s_tag) of a hop's `qinq:qinq` element, or ("", None, None)."""
    q = next((c for c in link if isinstance(c.tag, str) and etree.QName(c).namespace == QINQ
              and _local(c) == "qinq"), None)
    if q is None:
        return "", None, None
    edge = next((c for c in q if _local(c) == "edge"), None)
    action = edge.get("action", "") if edge is not None else ""
    c, s = q.get("c_tag", ""), q.get("s_tag", "")
    if action not in ("push", "pop") or not c.isdigit() or not s.isdigit():
        raise BadArgs(f"{where}: qinq:qinq needs c_tag, s_tag and an edge with action push or pop")
    return action, int(c), int(s)


def own_hops(substrate: Substrate, xml: str) -> list[OwnHop]:
    """This aggregate's hops in a request's stitching section, each checked against the external link."""
    root = parse_xml(xml, "request RSpec")
    ports = {e.local_port.lower(): e for e in substrate.external_links}
    out: list[OwnHop] = []
    for st in (c for c in root if _local(c) == "stitching"):
        for path in (p for p in st if _local(p) == "path"):
            in_tunnel = False  # hops after a push and before its pop carry the S-tag as 802.1ad
            for hop in (h for h in path if _local(h) == "hop"):
                link = _find(hop, "link")
                if link is None:
                    continue
                ext = ports.get((link.get("id") or "").lower())
                where = f"path {path.get('id')} hop {hop.get('id')} ({link.get('id')})"
                action, c_tag, s_tag = _qinq(link, where)
                tunnelled = in_tunnel and not action
                in_tunnel = (in_tunnel or action == "push") and action != "pop"
                if ext is None:
                    continue
                if action and not ext.qinq:
                    raise Unsupported(f"{where}: the hop asks for Q-in-Q but port {ext.local_port} cannot push or "
                                      f"pop S-tags (its substrate entry has no 'qinq: true')")
                l2 = next((c for c in link.iter() if _local(c) in L2SC), None)
                suggested = (_find(l2, "suggestedVLANRange").text or "").strip() \
                    if _find(l2, "suggestedVLANRange") is not None else ""
                if not suggested.isdigit():
                    raise BadArgs(f"{where}: suggestedVLANRange {suggested or '(missing)'!r} is not one VLAN tag; "
                                  f"this aggregate needs the tag its path service chose")
                tag = int(suggested)
                if action and tag != s_tag:
                    raise BadArgs(f"{where}: suggestedVLANRange {tag} is not the S-tag {s_tag} of its qinq:qinq")
                avail_el = _find(l2, "vlanRangeAvailability")
                try:
                    avail = parse_vlans(avail_el.text if avail_el is not None else None)
                except ValueError as exc:
                    raise BadArgs(f"{where}: vlanRangeAvailability: {exc}") from None
                space = (ext.s_vlan_range or ext.vlan_range) if action else ext.vlan_range
                ranges = format_vlans(t for lo, hi in space for t in range(lo, hi + 1))
                what = "S-tag" if action else "VLAN"
                if tag not in avail or not any(lo <= tag <= hi for lo, hi in space):
                    raise VlanUnavailable(f"{where}: {what} {tag} is not offered on this port (its range is {ranges}; "
                                          f"the hop allows {format_vlans(avail) or 'none'})")
                own = OwnHop(path.get("id") or "", hop.get("id") or "", ext, tag, action, c_tag, tunnelled)
                if action and not any(lo <= own.local <= hi for lo, hi in ext.vlan_range):
                    raise VlanUnavailable(f"{where}: C-tag {own.local} is outside the port's 802.1Q range "
                                          f"{format_vlans(t for lo, hi in ext.vlan_range for t in range(lo, hi + 1))}")
                sw = substrate.switch(ext.switch_id)
                if sw is not None and not any(lo <= own.local <= hi for lo, hi in sw.vlan_range):
                    raise VlanUnavailable(f"{where}: VLAN {own.local} is in the port's range but outside switch "
                                          f"{sw.name}'s VLAN range; the operator's substrate file must keep external "
                                          f"ranges inside the switch's")
                out.append(own)
    return out


def apply_hops(substrate: Substrate, request: Request, whole: Request | None = None) -> Request:
    """The request with each stitched link's VLAN set to its own hops' local tag (so the ordinary embedding
    holds exactly that tag on the switch, or answers VLAN_UNAVAILABLE) and its uplinks (the tags on each own
    port's wire, held per port by the broker), after checking capacity against the external port. Two own
    hops of one path may differ only where a port translates or a Q-in-Q tunnel starts or ends.

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
    uplinks: dict[str, list[tuple[str, tuple[tuple[int, int], ...]]]] = {}
    for h in hops:
        first = by_path.get(h.path_id)
        changes = (first is not None and first.wire != h.wire
                   and not (first.link.vlan_translation or h.link.vlan_translation or first.qinq or h.qinq))
        if changes:
            raise BadArgs(f"path {h.path_id}: this aggregate's hops ask for VLANs {first.tag} and {h.tag}, and "  # type: ignore[union-attr]
                          f"neither port translates")
        by_path.setdefault(h.path_id, h)
        uplinks.setdefault(h.path_id, []).append((h.link.local_port, h.wire))
    links = []
    for lk in request.links:
        h = by_path.get(lk.client_id)
        if h is None:
            links.append(lk)
            continue
        if lk.vlan_tag is not None and lk.vlan_tag != h.local:
            raise BadArgs(f"link {lk.client_id}: vlantag {lk.vlan_tag} disagrees with its stitching hop's {h.local}")
        if lk.capacity_kbps and lk.capacity_kbps > h.link.capacity_kbps:
            raise InsufficientBandwidth(f"link {lk.client_id}: asked for {lk.capacity_kbps} kbps; the port toward "
                                        f"{h.link.remote_aggregate} ({h.link.local_port}) carries at most "
                                        f"{h.link.capacity_kbps} kbps")
        links.append(replace(lk, vlan_tag=h.local, uplinks=tuple(uplinks[lk.client_id])))
    missing = set(by_path) - {lk.client_id for lk in request.links}
    if missing:
        raise BadArgs(f"stitching path(s) {', '.join(sorted(missing))} name no link of this request")
    return replace(request, links=tuple(links))


def annotate_manifest(manifest: str, substrate: Substrate, tags: Mapping[str, int | Mapping[str, int]]) -> str:
    """The manifest with each own hop of a link in `tags` (link client_id -> assigned tag, or port URN
    (lower case) -> the outer tag on that port's wire, so a translating aggregate shows each hop's own tag)
    as suggestedVLANRange and vlanRangeAvailability, and no empty element under any own hop's `_L2sc`.
    A Q-in-Q hop keeps the request's `qinq:qinq` (C-tag and S-tag) and says vlanTranslation true."""
    if "stitching" not in manifest:
        return manifest
    root = parse_xml(manifest, "manifest", 64 * 1024 * 1024)
    ports = {e.local_port.lower(): e for e in substrate.external_links}
    changed = False
    for st in (c for c in root if _local(c) == "stitching"):
        for path in (p for p in st if _local(p) == "path"):
            assigned = tags.get(path.get("id") or "")
            for hop in (h for h in path if _local(h) == "hop"):
                link = _find(hop, "link")
                ext = ports.get((link.get("id") or "").lower()) if link is not None else None
                l2 = next((c for c in link.iter() if _local(c) in L2SC), None) if ext is not None else None
                if l2 is None:
                    continue
                tag = assigned.get(ext.local_port.lower()) if isinstance(assigned, Mapping) else assigned  # type: ignore[union-attr]
                qinq = any(_local(c) == "qinq" and etree.QName(c).namespace == QINQ for c in link)
                ns = etree.QName(l2).namespace
                values = {"suggestedVLANRange": tag, "vlanRangeAvailability": tag,
                          "vlanTranslation": "true" if ext.vlan_translation or qinq else "false",
                          "interfaceMTU": ext.mtu}
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
