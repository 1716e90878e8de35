"""NDL-OWL: the substrate graph in ORCA's layout, its round trips (substrate <-> graph, graph -> advertisement
-> graph) over generated substrates, and request graphs."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from rdflib import Graph, URIRef
from rdflib.compare import isomorphic
from rdflib.namespace import RDF

from rspec.advertisement import Usage, build_advertisement
from rspec.ndl import (
    COLL,
    COMP,
    DOM,
    ETH,
    LAYER,
    REQ,
    SX,
    TOPO,
    advertisement_from_graph,
    advertisement_graph,
    request_graph,
    substrate_from_advertisement,
    substrate_from_graph,
    substrate_graph,
)
from rspec.request import parse_request
from rspec.substrate import Substrate, default_substrate, load_substrate, substrate_from_dict
from rspec.validate import validate_rspec
from tests.factories import request_rspec, three_node_lan, vm

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "two-rack-site.yaml"
NOW = datetime(2030, 1, 1, tzinfo=UTC)


def _topology_only(sub: Substrate) -> Substrate:
    """What NDL carries: AM settings (description, boot time, URLs) are not topology, and VM sizes mean nothing
    without a VM host."""
    sizes = sub.vm_sizes if any(not h.exclusive for h in sub.hosts) else ()
    return replace(sub, description="", provisioning_seconds=2.0, am_url="", vm_sizes=sizes,
                   external_links=tuple(replace(e, remote_aggregate_url="") for e in sub.external_links))


def test_switch_vlans_are_laid_out_as_orca_label_sets():
    sub = default_substrate("t.org")
    g = substrate_graph(sub)
    sw = URIRef(sub.switches[0].component_id)
    label_set = g.value(sw, ETH.availableVLANSet)
    assert (label_set, RDF.type, LAYER.LabelSet) in g and (label_set, DOM.hasResourceType, DOM.VLAN) in g
    assert g.value(label_set, COLL.size).toPython() == 100
    (r,) = list(g.objects(label_set, COLL.element))
    assert (r, RDF.type, LAYER.LabelRange) in g
    bounds = [g.value(g.value(r, p), LAYER.label_ID).toPython() for p in (LAYER.lowerBound, LAYER.upperBound)]
    assert bounds == [1000, 1099]
    assert (g.value(r, LAYER.lowerBound), RDF.type, ETH.VLAN) in g
    matrix = g.value(sw, TOPO.hasSwitchMatrix)
    assert (matrix, LAYER.switchingCapability, ETH.EthernetNetworkElement) in g


def test_domain_hosts_and_cables_use_the_orca_vocabulary():
    sub = default_substrate("t.org")
    g = substrate_graph(sub)
    dom = URIRef(sub.component_manager_id)
    assert (dom, RDF.type, TOPO.NetworkDomain) in g and (dom, LAYER.isLabelProducer, None) in g
    service = g.value(dom, DOM.hasService)
    assert (service, RDF.type, DOM.NetworkService) in g and g.value(service, DOM.isAllocatable).toPython() is True
    pc1 = sub.host("pc1")
    node = URIRef(pc1.component_id)
    assert (node, RDF.type, TOPO.Device) in g and (node, RDF.type, COMP.ServerCloud) in g
    assert (node, REQ.inDomain, dom) in g and g.value(node, COMP.numCPUCores).toPython() == 16
    iface = URIRef(pc1.interfaces[0].component_id)
    assert (node, TOPO.hasInterface, iface) in g and (iface, TOPO.interfaceOf, node) in g
    assert (iface, TOPO.connectedTo, URIRef(pc1.interfaces[0].switch_port)) in g
    sizes = {str(g.value(s, TOPO.hasName)) for s in g.subjects(RDF.type, COMP.VM)}
    assert sizes == {s.name for s in sub.vm_sizes}


def test_external_links_carry_labels_and_capabilities():
    sub = load_substrate(EXAMPLE)
    ext = sub.external_links[0]
    g = substrate_graph(sub)
    link = URIRef(ext.component_id)
    assert (URIRef(ext.local_port), TOPO.linkTo, URIRef(ext.remote_port)) in g
    assert (URIRef(ext.remote_port), REQ.inDomain, URIRef(ext.remote_aggregate)) in g
    assert (link, LAYER.tunnelingCapability, ETH.VLAN) in g and (link, LAYER.swappingCapability, None) not in g
    assert g.value(link, LAYER.bandwidth).toPython() == 10_000_000
    used = g.value(URIRef(sub.switches[0].component_id), LAYER.usedLabelSet)
    tags = sorted(g.value(v, LAYER.label_ID).toPython() for v in g.objects(used, COLL.element))
    assert tags == [10, 2001]


def test_example_round_trips_exactly():
    sub = load_substrate(EXAMPLE)
    g = substrate_graph(sub)
    assert substrate_from_graph(g) == _topology_only(sub)
    ad = build_advertisement(sub, Usage(), NOW)
    assert isomorphic(g, advertisement_graph(ad))
    assert substrate_from_advertisement(ad) == _topology_only(sub)
    assert advertisement_from_graph(g, Usage(), NOW) == build_advertisement(_topology_only(sub), Usage(), NOW)


def test_turtle_serialisation_parses_back_isomorphic():
    g = substrate_graph(load_substrate(EXAMPLE))
    again = Graph().parse(data=g.serialize(format="turtle"), format="turtle")
    assert isomorphic(g, again)


names = st.from_regex(r"\A[a-z][a-z0-9]{0,5}\Z")


@st.composite
def substrates(draw) -> Substrate:
    """Random but valid substrate documents: sites, switches with ports, trunks, hosts cabled to them, static and
    shared VLANs outside the dynamic ranges, external links, FPGA boards, images with their own URNs."""
    nsw = draw(st.integers(1, 3))
    sites = [{"name": f"r{k}", **({"country": "US", "latitude": draw(st.floats(-90, 90)),
                                   "longitude": draw(st.floats(-180, 180))} if draw(st.booleans()) else {})}
             for k in range(draw(st.integers(0, 2)))]
    switches = []
    for s in range(nsw):
        lo = draw(st.integers(100, 3000))
        sw = {"name": f"sw{s}", "vlan_range": [f"{lo}-{lo + draw(st.integers(0, 90))}"],
              "ports": [{"name": f"p{i}", "bandwidth_kbps": draw(st.integers(1000, 10**8))} for i in range(5)]
              + [{"name": "up"}, {"name": "tr"}, {"name": "tl"}]}
        if sites and draw(st.booleans()):
            sw["site"] = sites[s % len(sites)]["name"]
        switches.append(sw)
    trunks = [{"name": f"t{s}", "between": [f"sw{s}:tr", f"sw{s + 1}:tl"]} for s in range(nsw - 1)]
    hosts = []
    for i, name in enumerate(draw(st.lists(names, min_size=1, max_size=5, unique=True))):
        h = {"name": name, "cores": draw(st.integers(1, 64)), "memory_mb": draw(st.integers(512, 65536)),
             "exclusive": draw(st.booleans()),
             "interfaces": [{"name": "eth1", "bandwidth_kbps": draw(st.integers(1000, 10**7)),
                             "switch_port": f"sw{i % nsw}:p{i // nsw}"}]}
        if draw(st.booleans()):
            h["interfaces"].append({"name": "eth0", "role": "control"})
        if sites and draw(st.booleans()):
            h["site"] = sites[i % len(sites)]["name"]
        hosts.append(h)
    doc = {"authority": draw(names) + ".org", "sites": sites, "switches": switches, "trunks": trunks, "hosts": hosts,
           "static_vlans": [{"name": f"v{s}", "tag": draw(st.integers(1, 99)), "switch": f"sw{s}",
                             "shared": draw(st.booleans())} for s in range(nsw) if draw(st.booleans())],
           "vm_sizes": [{"name": f"s{k}", "cores": k + 1, "memory_mb": 1024 * (k + 1)}
                        for k in range(draw(st.integers(1, 3)))],
           "images": [{"name": "img1", "os": "Linux", "version": "1"},
                      {"name": "img2", "urn": "urn:publicid:IDN+images.org+image+shared-2", "url": "https://x/i"}]}
    if draw(st.booleans()):
        ext = {"name": "ext", "switch": "sw0", "port": "up",
               "remote_aggregate": "urn:publicid:IDN+peer.org+authority+am",
               "remote_port": "urn:publicid:IDN+peer.org+interface+x:y",
               "vlan_range": ["3000-3010", "3020"], "vlan_translation": draw(st.booleans()),
               "qinq": draw(st.booleans()), "mtu": draw(st.sampled_from([1500, 9000])),
               "capacity_kbps": draw(st.integers(10**5, 10**8))}
        s_tags = draw(st.sampled_from([None, ["3100-3110"], ["3030-3039", "3050"]]))
        if ext["qinq"] and s_tags:  # the Q-in-Q S-tag range (absent: the port's VLAN range)
            ext["s_vlan_range"] = s_tags
        doc["external_links"] = [ext]
    if draw(st.booleans()):
        doc["fpga_boards"] = [{"name": "fpga1", "model": draw(st.sampled_from(["BEE2", "NetFPGA"]))}]
    return substrate_from_dict(doc)


@settings(max_examples=40, deadline=None)
@given(substrates())
def test_substrate_to_graph_and_back_is_exact(sub):
    assert substrate_from_graph(substrate_graph(sub)) == _topology_only(sub)


@settings(max_examples=40, deadline=None)
@given(substrates())
def test_ndl_to_advertisement_to_ndl_is_isomorphic(sub):
    ad = build_advertisement(sub, Usage(), NOW)
    assert validate_rspec(ad, "advertisement") == []
    assert isomorphic(substrate_graph(sub), advertisement_graph(ad))


def test_request_graph_is_one_reservation_of_nodes_and_links_that_depend_on_them():
    g = request_graph(parse_request(three_node_lan()), "urn:publicid:IDN+x+slice+s")
    reservation = URIRef("urn:publicid:IDN+x+slice+s#reservation")
    assert (reservation, RDF.type, REQ.Reservation) in g
    members = {str(g.value(e, TOPO.hasName)) for e in g.objects(reservation, COLL.element)}
    assert members == {"n1", "n2", "n3", "lan0"}
    deps = {str(o).rsplit("#", 1)[1] for o in g.objects(None, REQ.dependOn)}
    assert deps == {"n1", "n2", "n3"}
    assert all((URIRef(f"urn:publicid:IDN+x+slice+s#{n}"), DOM.hasResourceType, COMP.VM) in g
               for n in ("n1", "n2", "n3"))


def test_request_graph_keeps_bindings_images_capacity_and_tags():
    sub = default_substrate("t.org")
    bound = vm("a", component_id=sub.hosts[0].component_id, image=sub.images[0].urn, ifaces=["a:0"])
    bare = {"client_id": "b", "exclusive": True, "sliver_type": "raw-pc", "ifaces": ["b:0"]}
    req = parse_request(request_rspec([bound, bare], [{"client_id": "l", "ifaces": ["a:0", "b:0"],
                                                       "capacity": 20000, "vlantag": 1010}]))
    g = request_graph(req, "urn:publicid:IDN+t.org+slice+s")
    a, b, link = (URIRef(f"urn:publicid:IDN+t.org+slice+s#{c}") for c in ("a", "b", "l"))
    assert (a, SX.componentId, URIRef(sub.hosts[0].component_id)) in g
    assert (a, COMP.diskImage, URIRef(sub.images[0].urn)) in g
    assert (b, DOM.hasResourceType, SX.BareMetalNode) in g
    assert g.value(link, LAYER.bandwidth).toPython() == 20000
    assert g.value(g.value(link, SX.vlan), LAYER.label_ID).toPython() == 1010
