"""The Q-in-Q S-tag range of an external port (`s_vlan_range`) through NDL-OWL: substrate -> graph ->
substrate, graph -> advertisement (what `slicex substrate` and GetVersion derive from the NDL model) -> graph,
and Turtle. Before, the graph dropped it and the advertisement generated from NDL offered the port's 802.1Q
range as S-tags."""

from __future__ import annotations

from datetime import UTC, datetime

from lxml import etree
from rdflib import Graph, URIRef
from rdflib.compare import isomorphic

from rspec.advertisement import Usage, build_advertisement
from rspec.ndl import (
    SX,
    advertisement_from_graph,
    advertisement_graph,
    substrate_from_advertisement,
    substrate_from_graph,
    substrate_graph,
)
from rspec.substrate import substrate_from_dict

NOW = datetime(2026, 11, 23, tzinfo=UTC)
QINQ = "{http://slicex.dev/rspec/ext/qinq/1}"


def rack(**ext) -> object:
    return substrate_from_dict({
        "authority": "rack.org",
        "switches": [{"name": "sw0", "vlan_range": ["100-299", "3000-3200"], "ports": [{"name": "p0"}, {"name": "up"}]}],
        "hosts": [{"name": "h", "cores": 4, "memory_mb": 4096,
                   "interfaces": [{"name": "eth1", "switch_port": "sw0:p0"}]}],
        "external_links": [{"name": "ext", "switch": "sw0", "port": "up",
                            "remote_aggregate": "urn:publicid:IDN+peer.org+authority+am",
                            "remote_port": "urn:publicid:IDN+peer.org+interface+x:y",
                            "vlan_range": ["100-110", "120"], "qinq": True, **ext}]})


def s_tag_range(ad: str) -> str:
    return etree.fromstring(ad.encode()).find(f".//{QINQ}tunneling").get("sTagRange")


def test_s_tag_range_survives_substrate_to_ndl_and_back():
    sub = rack(s_vlan_range=["3000-3009", "3100"])
    g = substrate_graph(sub)
    link = URIRef(sub.external_links[0].component_id)
    assert g.value(link, SX.sTagVLANSet) is not None
    assert substrate_from_graph(g).external_links[0].s_vlan_range == ((3000, 3009), (3100, 3100))
    again = Graph().parse(data=g.serialize(format="turtle"), format="turtle")
    assert substrate_from_graph(again).external_links[0].s_vlan_range == ((3000, 3009), (3100, 3100))


def test_advertisement_from_ndl_offers_the_s_tags_and_reads_back_isomorphic():
    sub = rack(s_vlan_range=["3000-3009"])
    g = substrate_graph(sub)
    ad = advertisement_from_graph(g, Usage(), NOW)
    assert s_tag_range(ad) == "3000-3009"  # not the port's 802.1Q range 100-110,120
    assert isomorphic(g, advertisement_graph(build_advertisement(sub, Usage(), NOW)))
    assert substrate_from_advertisement(ad).external_links[0].s_vlan_range == ((3000, 3009),)


def test_without_an_s_tag_range_the_port_pushes_from_its_vlan_range_as_before():
    sub = rack()
    g = substrate_graph(sub)
    assert g.value(URIRef(sub.external_links[0].component_id), SX.sTagVLANSet) is None
    assert substrate_from_graph(g).external_links[0].s_vlan_range == ()
    ad = advertisement_from_graph(g, Usage(), NOW)
    assert s_tag_range(ad) == "100-110,120"
    assert substrate_from_advertisement(ad).external_links[0].s_vlan_range == ()
    assert isomorphic(g, advertisement_graph(ad))
