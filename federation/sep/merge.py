"""Merging the domains' answers into one document (pure): the union of their manifests (or advertisements),
so omni and jFed see one slice with both halves. A cross-domain link appears in both domains' manifests: it
becomes one link with both ends' interface_refs and managers; each stitching hop is taken from the manifest
of the domain that owns its port (the one that filled in the tag it assigned)."""

from __future__ import annotations

import copy
from collections.abc import Sequence

from lxml import etree

from slicex.xmlsafe import parse_xml

MAX_DOC_BYTES = 64 * 1024 * 1024
EMPTY_MANIFEST = '<rspec xmlns="http://www.geni.net/resources/rspec/3" type="manifest"/>'


def _local(el: etree._Element) -> str:
    return etree.QName(el).localname if isinstance(el.tag, str) else ""


def _authority(urn: str) -> str:
    parts = urn.split("+")
    return parts[1].lower() if len(parts) > 2 else urn.lower()


def merge_rspecs(docs: Sequence[tuple[str, str]], kind: str = "manifest") -> str:
    """One RSpec from (domain key, document) pairs: root attributes and namespaces from the first, every
    node once (first wins), every link once with the interface_refs and component_managers of all its copies,
    one stitching section whose paths take each hop from the domain that owns the hop's port."""
    if not docs:
        return EMPTY_MANIFEST.replace('"manifest"', f'"{kind}"')
    roots = [(dom, parse_xml(text, f"{kind} from {dom}", MAX_DOC_BYTES)) for dom, text in docs]
    nsmap: dict[str | None, str] = {}
    for _, r in roots:
        for prefix, uri in r.nsmap.items():
            nsmap.setdefault(prefix, uri)
    first = roots[0][1]
    out = etree.Element(first.tag, nsmap=nsmap)
    for k, v in first.attrib.items():
        out.set(k, v)
    out.set("type", kind)
    seen_nodes: set[str] = set()
    links: dict[str, etree._Element] = {}
    hops: dict[tuple[str, str], tuple[etree._Element, bool]] = {}  # (path, hop id) -> (hop, from its owner)
    path_order: list[str] = []
    path_attrs: dict[str, dict[str, str]] = {}
    stitching_attrs: dict[str, str] = {}
    others: list[etree._Element] = []
    for dom, root in roots:
        for el in root:
            name = _local(el)
            if name == "node":
                cid = el.get("client_id") or el.get("component_id") or ""
                if cid not in seen_nodes:
                    seen_nodes.add(cid)
                    out.append(copy.deepcopy(el))
            elif name == "link":
                lid = el.get("client_id") or el.get("component_id") or ""
                if lid not in links:
                    links[lid] = copy.deepcopy(el)
                    out.append(links[lid])
                else:
                    _join_link(links[lid], el)
            elif name == "stitching":
                stitching_attrs.update({k: v for k, v in el.attrib.items() if k not in stitching_attrs})
                for path in (p for p in el if _local(p) == "path"):
                    pid = path.get("id") or ""
                    if pid not in path_attrs:
                        path_order.append(pid)
                        path_attrs[pid] = dict(path.attrib)
                    for hop in (h for h in path if _local(h) == "hop"):
                        link = next((c for c in hop if _local(c) == "link"), None)
                        owned = link is not None and _authority(link.get("id") or "") == dom
                        key = (pid, hop.get("id") or "")
                        if key not in hops or (owned and not hops[key][1]):
                            hops[key] = (copy.deepcopy(hop), owned)
            elif isinstance(el.tag, str) and not any(etree.tostring(el) == etree.tostring(o) for o in others):
                others.append(copy.deepcopy(el))
    for el in others:
        out.append(el)
    if path_order:
        ns = next(etree.QName(el).namespace for _, r in roots for el in r if _local(el) == "stitching")
        st = etree.SubElement(out, f"{{{ns}}}stitching", nsmap={None: ns}, **stitching_attrs)
        for pid in path_order:
            path = etree.SubElement(st, f"{{{ns}}}path", **path_attrs[pid])
            for (_p, _), (hop, _) in sorted(((k, v) for k, v in hops.items() if k[0] == pid),
                                           key=lambda kv: _hop_order(kv[0][1])):
                path.append(hop)
    return etree.tostring(out, encoding="unicode", pretty_print=True)


def _hop_order(hop_id: str) -> tuple[int, str]:
    return (int(hop_id), "") if hop_id.isdigit() else (1 << 30, hop_id)


def _join_link(into: etree._Element, other: etree._Element) -> None:
    """Add `other`'s interface_refs and component_managers (and any child `into` lacks) to `into`."""
    have = {etree.tostring(c) for c in into}
    refs = {c.get("client_id") for c in into if _local(c) == "interface_ref"}
    cms = {_authority(c.get("name") or "") for c in into if _local(c) == "component_manager"}
    for c in other:
        name = _local(c)
        if name == "interface_ref":
            if c.get("client_id") not in refs:
                into.append(copy.deepcopy(c))
                refs.add(c.get("client_id"))
        elif name == "component_manager":
            if _authority(c.get("name") or "") not in cms:
                into.append(copy.deepcopy(c))
                cms.add(_authority(c.get("name") or ""))
        elif isinstance(c.tag, str) and etree.tostring(c) not in have and name in ("property", "login"):
            into.append(copy.deepcopy(c))
    for k, v in other.attrib.items():
        if k not in into.attrib:
            into.set(k, v)
