"""Splitting a request RSpec by aggregate (pure). Each node names its domain by `component_manager_id`
(matched by URN authority, so `…+authority+cm` and `…+authority+am` are one AM); a link whose interfaces
are in two domains is a cross-domain link, kept in both domains' parts with a `component_manager` for each
end (what the domains' AMs and the stitching path service expect). Nothing here touches the network."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from lxml import etree

from slicex.errors import BadArgs, SearchFailed
from slicex.xmlsafe import parse_xml

RSPEC3 = "http://www.geni.net/resources/rspec/3"
MAX_REQUEST_BYTES = 2 * 1024 * 1024
STITCHABLE = (None, "vlan", "lan")  # link types a VLAN path can carry; any other (gre-tunnel, egre…) is overlay


def domain_key(urn: str) -> str:
    """What identifies a domain's aggregate: its URN authority, lower-cased (the text itself if not a URN)."""
    parts = urn.split("+")
    return parts[1].lower() if len(parts) > 2 and parts[0].lower() == "urn:publicid:idn" else urn.lower()


def _local(el: etree._Element) -> str:
    return etree.QName(el).localname if isinstance(el.tag, str) else ""


@dataclass(frozen=True)
class CrossLink:
    """A link between two domains: its client id, the two (domain, interface client id, node client id) ends
    and whether a VLAN path could carry it (`stitchable`) or only an overlay can (its link_type says a tunnel)."""

    link_id: str
    ends: tuple[tuple[str, str, str], tuple[str, str, str]]
    stitchable: bool = True

    @property
    def domains(self) -> tuple[str, str]:
        return self.ends[0][0], self.ends[1][0]


@dataclass(frozen=True)
class Split:
    """A request cut by domain: `nodes[d]` the node client ids of domain d (each node's manager spelled as the
    request spells it in `managers`), `links[d]` the links d takes part in, `cross` the cross-domain links."""

    xml: str
    nodes: Mapping[str, tuple[str, ...]]
    links: Mapping[str, tuple[str, ...]]
    cross: tuple[CrossLink, ...]
    managers: Mapping[str, str]

    @property
    def domains(self) -> tuple[str, ...]:
        return tuple(sorted(self.nodes))

    def client_ids(self, domain: str) -> tuple[str, ...]:
        """What the domain's slivers of this request are called (nodes and links): how a part is found again
        at a domain that never answered (Status lists slivers by geni_client_id)."""
        return self.nodes.get(domain, ()) + self.links.get(domain, ())

    def part(self, domain: str, drop_links: Iterable[str] = ()) -> str:
        """The request for one domain: its nodes, its links (cross-domain ones whole, with a component_manager
        per end, and the far end's node, which names the other domain's manager), everything else (stitching section, extensions) as given. `drop_links`: links another
        mechanism joins (the overlay), left out so the domain only makes the nodes' interfaces (without the
        request's addresses, which the overlay claims instead)."""
        return part_xml(self, domain, frozenset(drop_links))


def split_request(text: str | bytes, domains: Mapping[str, str], max_bytes: int = MAX_REQUEST_BYTES) -> Split:
    """Cut a request by domain. `domains` maps each domain key (domain_key of its AM URN) to the AM URN.
    BADARGS when a node names no manager, a link spans more than two domains or names unknown interfaces;
    SEARCHFAILED when a node names a manager that is not one of the exchange point's domains."""
    root = parse_xml(text, "request RSpec", max_bytes)
    if _local(root) != "rspec":
        raise BadArgs(f"request RSpec root is <{_local(root)}>, expected <rspec>")
    if (root.get("type") or "request") != "request":
        raise BadArgs(f"request RSpec has type={root.get('type')!r}; send a request RSpec (type=\"request\")")
    known = ", ".join(sorted(domains.values())) or "none"
    nodes: dict[str, list[str]] = {}
    managers: dict[str, str] = {}
    iface_domain: dict[str, tuple[str, str]] = {}
    for node in (c for c in root if _local(c) == "node"):
        cid = node.get("client_id") or ""
        if not cid:
            raise BadArgs("a node has no client_id")
        cm = node.get("component_manager_id") or ""
        if not cm:
            raise BadArgs(f"node {cid} has no component_manager_id: the exchange point sends each node to the "
                          f"domain it names (one of {known})")
        key = domain_key(cm)
        if key not in domains:
            raise SearchFailed(f"node {cid} names component manager {cm}, which is not a domain of this exchange "
                               f"point (domains: {known})")
        nodes.setdefault(key, []).append(cid)
        managers.setdefault(key, cm)
        for iface in (i for i in node if _local(i) == "interface"):
            if iface.get("client_id"):
                iface_domain[iface.get("client_id", "")] = (key, cid)
    if not nodes:
        raise BadArgs("the request has no nodes; the exchange point splits a request by its nodes' "
                      "component_manager_id")
    links: dict[str, list[str]] = {}
    cross: list[CrossLink] = []
    for link in (c for c in root if _local(c) == "link"):
        lid = link.get("client_id") or ""
        if not lid:
            raise BadArgs("a link has no client_id")
        ends: dict[str, tuple[str, str, str]] = {}
        for ref in (r for r in link if _local(r) == "interface_ref"):
            rid = ref.get("client_id") or ""
            if rid not in iface_domain:
                raise BadArgs(f"link {lid}: interface_ref {rid!r} is not an interface of any node in the request")
            dom, node_id = iface_domain[rid]
            ends.setdefault(dom, (dom, rid, node_id))
        if not ends:
            raise BadArgs(f"link {lid} joins no interfaces")
        if len(ends) > 2:
            raise BadArgs(f"link {lid} spans {len(ends)} domains ({', '.join(sorted(domains[d] for d in ends))}); "
                          f"a cross-domain link joins two: make it one link per pair of domains")
        for dom in ends:
            links.setdefault(dom, []).append(lid)
        if len(ends) == 2:
            lt = next((c.get("name") for c in link if _local(c) == "link_type"), None)
            a, b = sorted(ends.values())
            cross.append(CrossLink(lid, (a, b), lt in STITCHABLE and not any(
                _local(c) == "link_shared_vlan" for c in link)))
    return Split(etree.tostring(root, encoding="unicode"), {k: tuple(v) for k, v in nodes.items()},
                 {k: tuple(v) for k, v in links.items()}, tuple(cross), managers)


def with_transits(split: Split, transits: Mapping[str, Iterable[str]]) -> Split:
    """The split with each stitched link also in the parts of the domains its path crosses without an end there
    (`transits`: link client id -> those domains' keys): a transit domain holds the link's hops (its trunk
    carries the tag, or the S-tag of a Q-in-Q tunnel) and no node of the link, so it gets the link whole and
    both ends' nodes, which name their own managers."""
    nodes = {k: tuple(v) for k, v in split.nodes.items()}
    links = {k: tuple(v) for k, v in split.links.items()}
    for lid, domains in transits.items():
        for d in domains:
            nodes.setdefault(d, ())
            if lid not in links.get(d, ()):
                links[d] = links.get(d, ()) + (lid,)
    return replace(split, nodes=nodes, links=links)


def part_xml(split: Split, domain: str, drop_links: frozenset[str] = frozenset()) -> str:
    """See Split.part."""
    root = parse_xml(split.xml, "request RSpec", 64 * MAX_REQUEST_BYTES)
    mine_links = set(split.links.get(domain, ())) - drop_links
    cross = {c.link_id: c for c in split.cross}
    # the far end's node stays (it names its own manager, so this domain makes no sliver of it): a link must
    # refer to declared interfaces, and the domain's AM learns where the link leads
    mine_nodes = set(split.nodes.get(domain, ())) | {
        node for lid in mine_links if lid in cross for dom, _iface, node in cross[lid].ends if dom != domain}
    # an interface on a link the overlay joins gets its address from the overlay, not from the domain
    overlay_ifaces = {iface for lid in drop_links if lid in cross for _d, iface, _n in cross[lid].ends}
    for el in list(root):
        kind = _local(el)
        if kind == "node" and el.get("client_id") not in mine_nodes:
            root.remove(el)
        elif kind == "node":
            for iface in (i for i in el if _local(i) == "interface" and i.get("client_id") in overlay_ifaces):
                for ip in [c for c in iface if _local(c) == "ip"]:
                    iface.remove(ip)
        elif kind == "link":
            lid = el.get("client_id")
            if lid not in mine_links:
                root.remove(el)
            elif lid in cross:
                _add_managers(el, [split.managers[d] for d in cross[lid].domains])
    return etree.tostring(root, encoding="unicode")


def _add_managers(link: etree._Element, managers: list[str]) -> None:
    """A component_manager child per domain of a cross-domain link, unless the request has one already."""
    have = {domain_key(c.get("name", "")) for c in link if _local(c) == "component_manager"}
    anchor = next((i for i, c in enumerate(link) if _local(c) not in ("component_manager", "interface_ref")),
                  len(link))
    for m in managers:
        if domain_key(m) not in have:
            link.insert(anchor, etree.Element(f"{{{RSPEC3}}}component_manager", name=m))
            anchor += 1
            have.add(domain_key(m))


def interface_addresses(text: str) -> dict[str, str]:
    """interface client id -> the IPv4/IPv6 address the request gives it (what an overlay is asked to claim)."""
    root = parse_xml(text, "request RSpec", 64 * MAX_REQUEST_BYTES)
    return {i.get("client_id", ""): ip.get("address", "") for node in root if _local(node) == "node"
            for i in node if _local(i) == "interface" for ip in i if _local(ip) == "ip" and ip.get("address")}


def link_capacities(text: str) -> dict[str, int]:
    """link client id -> the capacity (kbps) its properties ask for, the largest (links asking none: absent)."""
    root = parse_xml(text, "request RSpec", 64 * MAX_REQUEST_BYTES)
    out: dict[str, int] = {}
    for link in root:
        if _local(link) != "link":
            continue
        asked = [int(p.get("capacity", "")) for p in link if _local(p) == "property"
                 and p.get("capacity", "").isdigit()]
        if asked and max(asked) > 0:
            out[link.get("client_id", "")] = max(asked)
    return out


def without_links(text: str, drop: Iterable[str]) -> str:
    """The request without these links (handed to the path service when the overlay joins them)."""
    gone = set(drop)
    root = parse_xml(text, "request RSpec", 64 * MAX_REQUEST_BYTES)
    for el in list(root):
        if _local(el) == "link" and el.get("client_id") in gone:
            root.remove(el)
    return etree.tostring(root, encoding="unicode")
