"""Round trips over generated requests: request -> parse -> embed -> manifest keeps every client_id, binds
what was bound, copies unknown extensions unchanged, and the manifest is valid; the NDL request graph names
every node and link of the request."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st
from lxml import etree
from rdflib import URIRef

from broker.placement import plan
from rspec.manifest import SliverView, build_manifest
from rspec.ndl import COLL, TOPO, request_graph
from rspec.request import parse_request
from rspec.substrate import default_substrate
from rspec.validate import validate_rspec
from tests.factories import RSPEC3, request_rspec, vm

NOW = datetime(2030, 1, 1, tzinfo=UTC)
SUB = default_substrate("t.org")
EXT_NS = "urn:example:unknown-extension"
client_ids = st.from_regex(r"\A[a-z][a-z0-9_-]{0,8}\Z")


@st.composite
def requests(draw) -> tuple[str, set[str], dict[str, str]]:
    """A request of up to 6 VMs (some bound to a host) with interfaces, LANs over them and foreign extensions;
    returns the XML, every client_id in it and the bindings asked for."""
    names = draw(st.lists(client_ids, min_size=1, max_size=6, unique=True))
    nodes, ifaces, bound = [], [], {}
    vm_hosts = [h for h in SUB.hosts if not h.exclusive]
    for k, name in enumerate(names):
        mine = [f"{name}:if{j}" for j in range(draw(st.integers(0, 2)))]
        ifaces += mine
        extra = f'<x:note xmlns:x="{EXT_NS}" n="{k}">kept as is</x:note>' if draw(st.booleans()) else ""
        node = vm(name, ifaces=mine, extra=extra)
        if draw(st.booleans()):
            node["component_id"] = bound[name] = vm_hosts[k % len(vm_hosts)].component_id
        nodes.append(node)
    links, free = [], list(ifaces)
    while len(free) >= 2 and draw(st.booleans()):
        size = draw(st.integers(2, len(free)))
        links.append({"client_id": f"lan{len(links)}", "ifaces": free[:size]})
        free = free[size:]
    top = f'<x:slice-note xmlns:x="{EXT_NS}">experiment 7</x:slice-note>' if draw(st.booleans()) else ""
    xml = request_rspec(nodes, links, extra=top)
    return xml, set(names) | set(ifaces) | {lk["client_id"] for lk in links}, bound


@settings(max_examples=40, deadline=None)
@given(requests())
def test_request_to_manifest_keeps_every_client_id_and_extension(case):
    xml, ids, bound = case
    req = parse_request(xml)
    views = [SliverView(p.client_id, f"urn:publicid:IDN+t.org+sliver+{n}", p.kind, p.component_id, p.details)
             for n, p in enumerate(plan(SUB, req, set()))]
    manifest = build_manifest([req.xml], views, SUB.component_manager_id, NOW)
    assert validate_rspec(manifest, "manifest") == []
    root = etree.fromstring(manifest.encode())
    found = {el.get("client_id") for el in root.iter(f"{{{RSPEC3}}}node", f"{{{RSPEC3}}}link",
                                                      f"{{{RSPEC3}}}interface")}
    assert found == ids
    for el in root.iter(f"{{{RSPEC3}}}node"):
        assert el.get("sliver_id") and el.get("component_id")
        if el.get("client_id") in bound:
            assert el.get("component_id") == bound[el.get("client_id")]
    original = etree.fromstring(xml.encode())
    def canonical(doc: etree._Element) -> list[bytes]:
        return sorted(etree.tostring(e, method="c14n", exclusive=True, with_tail=False)
                      for e in doc.iter(f"{{{EXT_NS}}}*"))

    assert canonical(root) == canonical(original)


@settings(max_examples=30, deadline=None)
@given(requests())
def test_request_graph_names_every_node_and_link(case):
    xml, _ids, _bound = case
    req = parse_request(xml)
    g = request_graph(req, "urn:publicid:IDN+t.org+slice+s")
    members = {str(g.value(e, TOPO.hasName)) for e in g.objects(URIRef("urn:publicid:IDN+t.org+slice+s#reservation"),
                                                                 COLL.element)}
    assert members == {n.client_id for n in req.nodes} | {lk.client_id for lk in req.links}
