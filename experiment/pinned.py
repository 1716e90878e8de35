"""Pinned re-creation: a slice's exact placement from its manifest, and the request that asks for exactly it.

The placement is what the aggregate chose: each node's component (host), each interface's component (port),
each link's VLAN tag. Re-created from a *bound* request (component_id on nodes and interfaces, vlantag on
links), the aggregate must give the same or refuse (a taken VLAN is VLAN_UNAVAILABLE, a full host
INSUFFICIENT_NODES): a result never silently comes from elsewhere, and `differences` checks the manifest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lxml import etree

from slicex.xmlsafe import parse_xml

RSPEC3 = "http://www.geni.net/resources/rspec/3"


def _q(tag: str) -> str:
    return f"{{{RSPEC3}}}{tag}"


def placement_of(manifest: str) -> dict[str, Any]:
    """{nodes: {client_id: {component_id, component_manager_id}}, interfaces: {client_id: component_id},
    links: {client_id: vlantag}} of a manifest."""
    root = parse_xml(manifest, "manifest")
    nodes, ifaces, links = {}, {}, {}
    for n in root.iter(_q("node")):
        nodes[n.get("client_id")] = {"component_id": n.get("component_id", ""),
                                     "component_manager_id": n.get("component_manager_id", "")}
        for i in n.findall(_q("interface")):
            if i.get("component_id"):
                ifaces[i.get("client_id")] = i.get("component_id")
    for lk in root.iter(_q("link")):
        if lk.get("vlantag"):
            links[lk.get("client_id")] = int(lk.get("vlantag"))
    return {"nodes": nodes, "interfaces": ifaces, "links": links}


def pin_request(request: str, placement: dict[str, Any]) -> str:
    """The request bound to `placement`: what was chosen for each element becomes what it asks for."""
    root = parse_xml(request, "request")
    for n in root.iter(_q("node")):
        p = placement["nodes"].get(n.get("client_id"))
        if p and p.get("component_id"):
            n.set("component_id", p["component_id"])
            if p.get("component_manager_id"):
                n.set("component_manager_id", p["component_manager_id"])
        for i in n.findall(_q("interface")):
            port = placement["interfaces"].get(i.get("client_id"))
            if port:
                i.set("component_id", port)
    for lk in root.iter(_q("link")):
        tag = placement["links"].get(lk.get("client_id"))
        if tag is not None:
            lk.set("vlantag", str(tag))
    return etree.tostring(root, encoding="unicode")


def differences(placement: dict[str, Any], manifest: str) -> list[str]:
    """Where a manifest's placement differs from the recorded one (empty: identical)."""
    got = placement_of(manifest)
    out = []
    for kind in ("nodes", "interfaces", "links"):
        for cid, want in placement[kind].items():
            have = got[kind].get(cid)
            if kind == "nodes":
                want, have = want.get("component_id"), (have or {}).get("component_id")
            if have != want:
                out.append(f"{kind[:-1]} {cid}: recorded {want}, got {have}")
    return out


def save(placement: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(placement, indent=2, sort_keys=True) + "\n")


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())
