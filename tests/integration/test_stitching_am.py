"""A slicex aggregate with a port toward another aggregate, driven over the AM API (mutual TLS) with the
request `slicex scs` computes, as the stitcher would send it: the hop's tag is held and reported in the
manifest the way the stitcher parses it (STITCHING.md §1.4); a taken tag is VLAN_UNAVAILABLE (24), too
much capacity INSUFFICIENT_BANDWIDTH (25); GetVersion advertises stitching v2 and not Q-in-Q."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import yaml
from lxml import etree

from rspec.substrate import load_substrate
from stitching.model import Aggregate, Port, Topology
from stitching.scs import compute_path
from stitching.topology import from_substrate
from tests.integration.conftest import AUTHORITY, make_home, start, stop

STITCH = "{http://www.geni.net/resources/rspec/ext/stitch/2/}"
PEER = "peer.test"
AM = f"urn:publicid:IDN+{AUTHORITY}+authority+am"
PEER_AM = f"urn:publicid:IDN+{PEER}+authority+am"
OUR_PORT = f"urn:publicid:IDN+{AUTHORITY}+interface+sw1:uplink"
PEER_PORT = f"urn:publicid:IDN+{PEER}+interface+sw1:to-us"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    root = tmp_path_factory.mktemp("stitch-am")
    sub = {"authority": AUTHORITY,
           "switches": [{"name": "sw1", "vlan_range": ["100-199"], "ports": [{"name": "h1"}, {"name": "h2"},
                                                                              {"name": "uplink"}]}],
           "hosts": [{"name": "pc", "count": 2, "cores": 8, "memory_mb": 16384,
                      "interfaces": [{"name": "eth0", "switch_port": "sw1:h{n}"}]}],
           "external_links": [{"name": "uplink", "switch": "sw1", "port": "uplink", "remote_aggregate": PEER_AM,
                               "remote_port": PEER_PORT, "vlan_range": "150-152", "capacity_kbps": 100000}]}
    (root / "substrate.yaml").write_text(yaml.safe_dump(sub))
    home = make_home(root / "home", substrate=str(root / "substrate.yaml"))
    r = start(home)
    yield r, load_substrate(root / "substrate.yaml")
    stop(r)


def service_request(substrate, link: str = "stitched0", capacity: int = 20000, exclude: str = "") -> str:
    """What the stitcher sends this aggregate: the SCS's expanded request for a link to the peer."""
    peer = Topology.build([Aggregate(PEER_AM, "https://peer/")],
                          [Port(PEER_PORT, PEER_AM, OUR_PORT, frozenset(range(100, 200)))])
    topo = from_substrate(substrate, "https://us/").merged(peer)
    req = f"""<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">
  <node client_id="a" component_manager_id="{AM}" exclusive="false"><sliver_type name="default-vm"/>
    <interface client_id="a:if0"/></node>
  <node client_id="b" component_manager_id="{PEER_AM}" exclusive="false"><sliver_type name="default-vm"/>
    <interface client_id="b:if0"/></node>
  <link client_id="{link}"><component_manager name="{AM}"/><component_manager name="{PEER_AM}"/>
    <interface_ref client_id="a:if0"/><interface_ref client_id="b:if0"/>
    <property source_id="a:if0" dest_id="b:if0" capacity="{capacity}"/></link></rspec>"""
    opts = {"geni_routing_profile": {link: {"hop_exclusion_list": [exclude]}}} if exclude else {}
    res = compute_path(topo, {"slice_urn": "s", "request_rspec": req, "request_options": opts}, datetime.now(UTC))
    assert res["code"]["geni_code"] == 0, res["output"]
    return res["value"]["service_rspec"]


def allocate(r, user: str, slice_name: str, rspec: str) -> dict:
    u = r.user(user)
    urn, creds = u.slice_credential(slice_name)
    return u.am.Allocate(urn, creds, rspec, {})


def test_get_version_advertises_stitching_v2_and_qinq(deployment):
    r, _ = deployment
    v = r.user("alice").am.GetVersion()["value"]
    exts = v["geni_request_rspec_versions"][0]["extensions"]
    assert "http://www.geni.net/resources/rspec/ext/stitch/2/" in exts
    assert "http://slicex.dev/rspec/ext/qinq/1" in exts


def test_own_hop_tag_is_held_and_the_manifest_reports_it_without_empty_elements(deployment):
    r, sub = deployment
    res = allocate(r, "alice", "st1", service_request(sub))
    assert res["code"]["geni_code"] == 0, res["output"]
    root = etree.fromstring(res["value"]["geni_rspec"].encode())
    hop = root.find(f"{STITCH}stitching/{STITCH}path[@id='stitched0']/{STITCH}hop[@id='1']")
    assert hop.find(f"{STITCH}link").get("id") == OUR_PORT
    l2 = hop.find(f".//{STITCH}switchingCapabilitySpecificInfo_L2sc")
    assert l2.findtext(f"{STITCH}suggestedVLANRange") == "150" and l2.findtext(f"{STITCH}vlanRangeAvailability") == "150"
    assert all((c.text or "").strip() for c in l2)
    link = root.find("{http://www.geni.net/resources/rspec/3}link")
    assert link.get("vlantag") == "150"

    taken = allocate(r, "bob", "st2", service_request(sub))  # the same tag for another slice
    assert taken["code"]["geni_code"] == 24, taken
    assert "150" in taken["output"]

    moved = allocate(r, "bob", "st3", service_request(sub, exclude=f"{OUR_PORT}=150"))
    assert moved["code"]["geni_code"] == 0, moved["output"]
    assert 'vlantag="151"' in moved["value"]["geni_rspec"]
    u = r.user("alice")
    urn, creds = u.slice_credential("st1")
    deleted = u.am.Delete([urn], creds, {})
    assert deleted["code"]["am_code"] == 0
    assert {s["geni_allocation_status"] for s in deleted["value"]} == {"geni_unallocated"}


def test_more_capacity_than_the_port_carries_is_insufficient_bandwidth(deployment):
    r, sub = deployment
    res = allocate(r, "alice", "st4", service_request(sub, capacity=20000).replace('capacity="20000"',
                                                                                     'capacity="500000"'))
    assert res["code"]["geni_code"] == 25, res
    assert "100000" in res["output"]
