"""ComputePath, as omni's stitcher calls the GENI Stitching Computation Service (../shared/STITCHING.md §2):
`ComputePath({slice_urn, request_rspec, request_options})` -> `{code, value: {service_rspec, workflow_data},
output}`. Pure: the topology is an argument; the HTTP edge is stitching/server.py.

Every stitched link of the request gets a path (stitching/negotiate.py) with concrete tags, all links of
one request de-conflicted against each other (no tag twice through a hop: geni-tools #802). The service
RSpec carries each hop's run range minus excluded tags (#874) and one suggested tag inside it; the workflow
ties each importing hop to its upstream hop, so the stitcher allocates producers first and never reports
success with different tags at the two ends."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from lxml import etree

from slicex.errors import GeniError
from slicex.xmlsafe import parse_xml
from stitching.model import StitchingError, Topology, authority_of, format_vlans, parse_vlans
from stitching.negotiate import Book, Hop, LinkRequest, PathPlan, reserve

STITCH2 = "http://www.geni.net/resources/rspec/ext/stitch/2/"
QINQ = "http://slicex.dev/rspec/ext/qinq/1"
MAX_REQUEST_BYTES = 4 * 1024 * 1024
CODES = {"vlan": 24, "bandwidth": 25, "path": 12, "args": 1}


class ScsError(Exception):
    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.message = message
        self.code = code


def _local(el: Any) -> str:
    return etree.QName(el).localname if isinstance(el.tag, str) else ""


def parse_exclusions(profile: Any, link_id: str) -> dict[str, frozenset[int] | None]:
    """`geni_routing_profile[link].hop_exclusion_list` entries `urn` (the whole hop) or `urn=100-102,105`."""
    if profile is None:
        return {}
    if not isinstance(profile, dict):
        raise ScsError("geni_routing_profile must be a struct of path id -> options")
    entry = profile.get(link_id) or {}
    if not isinstance(entry, dict):
        raise ScsError(f"geni_routing_profile[{link_id!r}] must be a struct")
    if entry.get("hop_inclusion_list"):
        raise ScsError(f"path {link_id}: hop_inclusion_list is not supported by this path service (it computes "
                       f"the path itself); drop --includehop / --includehoponpath", 13)
    out: dict[str, frozenset[int] | None] = {}
    for item in entry.get("hop_exclusion_list") or []:
        if not isinstance(item, str) or not item.strip():
            raise ScsError(f"path {link_id}: hop_exclusion_list entry {item!r} is not 'urn' or 'urn=tags'")
        urn, sep, tags = item.strip().partition("=")
        try:
            excluded = parse_vlans(tags) if sep and tags.strip() else None
        except ValueError as exc:
            raise ScsError(f"path {link_id}: hop_exclusion_list entry {item!r}: {exc}") from None
        prev = out.get(urn, frozenset())
        out[urn] = None if excluded is None or prev is None else prev | excluded
    return out


def _stitched_links(root: etree._Element) -> list[tuple[etree._Element, list[str], int]]:
    """(link element, its two end aggregates, capacity kbps) for each link that spans aggregates."""
    node_cm: dict[str, str] = {}
    for node in root:
        if _local(node) == "node":
            for iface in node:
                if _local(iface) == "interface" and iface.get("client_id"):
                    node_cm[iface.get("client_id", "")] = node.get("component_manager_id", "")
    out = []
    for link in root:
        if _local(link) != "link":
            continue
        if any(_local(c) == "link_shared_vlan" for c in link):
            continue
        lt = next((c.get("name") for c in link if _local(c) == "link_type"), None)
        if lt not in (None, "vlan"):
            continue
        ends: dict[str, str] = {}
        for ref in (c for c in link if _local(c) == "interface_ref"):
            cm = node_cm.get(ref.get("client_id", ""), "")
            if cm:
                ends.setdefault(authority_of(cm), cm)
        if len(ends) < 2:
            continue
        if len(ends) > 2:
            raise ScsError(f"link {link.get('client_id')}: spans {len(ends)} aggregates ({', '.join(ends.values())}); "
                           f"stitched links are point-to-point")
        caps = []
        for prop in (c for c in link if _local(c) == "property"):
            try:
                caps.append(int(float(prop.get("capacity") or 0)))
            except ValueError:
                raise ScsError(f"link {link.get('client_id')}: capacity {prop.get('capacity')!r} is not a "
                               f"number of kbps") from None
        out.append((link, list(ends.values()), max(caps, default=0)))
    return out


def compute_path(topo: Topology, params: Any, now: datetime | None = None) -> dict[str, Any]:
    """The ComputePath result for `params` (never raises: errors are results with a code and output)."""
    try:
        value = _compute(topo, params, now or datetime.now(UTC))
    except ScsError as err:
        return {"code": {"geni_code": err.code}, "output": err.message}
    except StitchingError as err:
        return {"code": {"geni_code": CODES.get(err.kind, 2)}, "output": err.message}
    except GeniError as err:
        return {"code": {"geni_code": err.code}, "output": err.message}
    return {"code": {"geni_code": 0}, "value": value, "output": ""}


def _compute(topo: Topology, params: Any, now: datetime) -> dict[str, Any]:
    if not isinstance(params, dict):
        raise ScsError("ComputePath takes one struct {slice_urn, request_rspec, request_options}")
    rspec = params.get("request_rspec")
    if not isinstance(rspec, str):
        raise ScsError("request_rspec is missing or not a string of XML")
    options = params.get("request_options") or {}
    if not isinstance(options, dict):
        raise ScsError("request_options must be a struct")
    root = parse_xml(rspec, "request_rspec", MAX_REQUEST_BYTES)
    if _local(root) != "rspec":
        raise ScsError(f"request_rspec root is <{_local(root)}>, expected <rspec>")
    links = _stitched_links(root)
    if not links:
        raise ScsError("the request has no link between nodes of different aggregates; nothing to stitch")
    requests = [LinkRequest(link.get("client_id", ""), ends[0], ends[1], cap,
                            parse_exclusions(options.get("geni_routing_profile"), link.get("client_id", "")))
                for link, ends, cap in links]
    _, plans = reserve(topo, Book(), requests, now, now + timedelta(minutes=1), "scs")
    spelled = {authority_of(n.get("component_manager_id", "")): n.get("component_manager_id", "")
               for n in root if _local(n) == "node" and n.get("component_manager_id")}
    workflow: dict[str, Any] = {}
    out = copy.deepcopy(root)
    for old in [c for c in out if _local(c) == "stitching"]:
        out.remove(old)
    st = etree.SubElement(out, f"{{{STITCH2}}}stitching", nsmap={None: STITCH2},
                          lastUpdateTime=now.strftime("%Y%m%d:%H:%M:%S"))
    by_id = {lk.get("client_id"): lk for lk in out if _local(lk) == "link"}
    for plan in plans:
        _add_managers(by_id[plan.link_id], plan, spelled)
        _path(st, plan)
        workflow[plan.link_id] = {"dependencies": _workflow(topo, plan, spelled)}
    return {"service_rspec": etree.tostring(out, encoding="unicode", pretty_print=True), "workflow_data": workflow}


def _add_managers(link: etree._Element, plan: PathPlan, spelled: Mapping[str, str]) -> None:
    """A component_manager per aggregate the path crosses (the stitcher turns new ones into transit AMs)."""
    ns = etree.QName(link).namespace
    have = {authority_of(c.get("name", "")) for c in link if _local(c) == "component_manager"}
    anchor = next((i for i, c in enumerate(link) if _local(c) not in ("component_manager", "interface_ref")), len(link))
    for agg in plan.aggregates:
        if authority_of(agg) not in have:
            el = etree.Element(f"{{{ns}}}component_manager" if ns else "component_manager",
                               name=spelled.get(authority_of(agg), agg))
            link.insert(anchor, el)
            anchor += 1
            have.add(authority_of(agg))


def _t(parent: etree._Element, tag: str, text: object) -> etree._Element:
    el = etree.SubElement(parent, f"{{{STITCH2}}}{tag}")
    el.text = str(text)
    return el


def _path(st: etree._Element, plan: PathPlan) -> None:
    path = etree.SubElement(st, f"{{{STITCH2}}}path", id=plan.link_id)
    for n, hop in enumerate(plan.hops, 1):
        h = etree.SubElement(path, f"{{{STITCH2}}}hop", id=str(n))
        link = etree.SubElement(h, f"{{{STITCH2}}}link", id=hop.port.urn)
        _t(link, "trafficEngineeringMetric", hop.port.metric)
        _t(link, "capacity", hop.port.capacity_kbps * 1000)  # bps, as the SCS writes it
        scd = etree.SubElement(link, f"{{{STITCH2}}}switchingCapabilityDescriptor")
        _t(scd, "switchingcapType", "l2sc")
        _t(scd, "encodingType", "ethernet")
        l2 = etree.SubElement(etree.SubElement(scd, f"{{{STITCH2}}}switchingCapabilitySpecificInfo"),
                              f"{{{STITCH2}}}switchingCapabilitySpecificInfo_L2sc")
        _t(l2, "interfaceMTU", hop.port.mtu)
        _t(l2, "vlanRangeAvailability", format_vlans(hop.available))
        _t(l2, "suggestedVLANRange", hop.tag)
        _t(l2, "vlanTranslation", "true" if hop.translation else "false")
        if hop.qinq and plan.tunnel is not None:
            q = etree.SubElement(link, f"{{{QINQ}}}qinq", nsmap={"qinq": QINQ}, c_tag=str(plan.tunnel.c_tag),
                                 s_tag=str(hop.tag))
            etree.SubElement(q, f"{{{QINQ}}}edge", port=hop.port.urn, action=hop.qinq)
        _t(h, "nextHop", n + 1 if n < len(plan.hops) else "null")


def _dependency_of(plan: PathPlan, i: int) -> int | None:
    """The hop an importing hop takes its tag from: the nearest earlier hop of its run on another aggregate
    (so a transit's second hop depends on the upstream aggregate, and the chain orders the aggregates)."""
    hop = plan.hops[i]
    if hop.imports is None:
        return None
    run = {j for j, h in enumerate(plan.hops) if h.imports == hop.imports or j == hop.imports}
    for j in range(i - 1, -1, -1):
        if j in run and authority_of(plan.hops[j].port.aggregate) != authority_of(hop.port.aggregate):
            return j
    return hop.imports


def _workflow(topo: Topology, plan: PathPlan, spelled: Mapping[str, str]) -> list[dict[str, Any]]:
    """The dependency tree: roots (hops nothing depends on) at the top, each with what it depends on nested."""
    deps = {i: _dependency_of(plan, i) for i in range(len(plan.hops))}
    depended = {d for d in deps.values() if d is not None}

    def dep(i: int) -> dict[str, Any]:
        hop: Hop = plan.hops[i]
        agg = topo.aggregate(hop.port.aggregate)
        if agg is None or not agg.url:
            raise ScsError(f"aggregate {hop.port.aggregate} has no AM API URL in the stitching topology; add "
                           f"'url:' for it in the topology file", 2)
        out: dict[str, Any] = {"hop_urn": hop.port.urn,
                               "aggregate_urn": spelled.get(authority_of(agg.urn), agg.urn),
                               "aggregate_url": agg.url, "import_vlans": hop.imports is not None}
        if deps[i] is not None:
            out["dependencies"] = [dep(deps[i])]
        return out

    return [dep(i) for i in range(len(plan.hops)) if i not in depended]
