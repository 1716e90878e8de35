"""An external port's capacity is shared by every slice's stitched links over it: the aggregate (its broker,
which books the port's bandwidth units all or nothing) refuses with INSUFFICIENT_BANDWIDTH (25) the link
that does not fit beside the others, names the port and what is left, and gives the capacity back when a
slice is deleted. Driven over the AM API (mutual TLS) with the path service's requests, as the stitcher or
slicex's SDK sends them."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import yaml

from rspec.substrate import load_substrate
from stitching.model import Aggregate, Port, Topology
from stitching.scs import compute_path
from stitching.topology import from_substrate
from tests.integration.conftest import AUTHORITY, make_home, start, stop

PEER = "peer.test"
AM = f"urn:publicid:IDN+{AUTHORITY}+authority+am"
PEER_AM = f"urn:publicid:IDN+{PEER}+authority+am"
OUR_PORT = f"urn:publicid:IDN+{AUTHORITY}+interface+sw1:uplink"
PEER_PORT = f"urn:publicid:IDN+{PEER}+interface+sw1:to-us"
PORT_KBPS = 10_000


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    root = tmp_path_factory.mktemp("stitch-bw")
    sub = {"authority": AUTHORITY,
           "switches": [{"name": "sw1", "vlan_range": ["100-199"], "ports": [{"name": "h1"}, {"name": "h2"},
                                                                              {"name": "uplink"}]}],
           "hosts": [{"name": "pc", "count": 2, "cores": 8, "memory_mb": 16384,
                      "interfaces": [{"name": "eth0", "switch_port": "sw1:h{n}"}]}],
           "external_links": [{"name": "uplink", "switch": "sw1", "port": "uplink", "remote_aggregate": PEER_AM,
                               "remote_port": PEER_PORT, "vlan_range": "150-159", "capacity_kbps": PORT_KBPS}]}
    (root / "substrate.yaml").write_text(yaml.safe_dump(sub))
    home = make_home(root / "home", substrate=str(root / "substrate.yaml"))
    r = start(home)
    yield r, load_substrate(root / "substrate.yaml")
    stop(r)


def service_request(substrate, capacity: int, exclude: str = "") -> str:
    """The path service's request for one stitched link to the peer, `capacity` kbps."""
    peer = Topology.build([Aggregate(PEER_AM, "https://peer/")],
                          [Port(PEER_PORT, PEER_AM, OUR_PORT, frozenset(range(100, 200)))])
    topo = from_substrate(substrate, "https://us/").merged(peer)
    req = f"""<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">
  <node client_id="a" component_manager_id="{AM}" exclusive="false"><sliver_type name="default-vm"/>
    <interface client_id="a:if0"/></node>
  <node client_id="b" component_manager_id="{PEER_AM}" exclusive="false"><sliver_type name="default-vm"/>
    <interface client_id="b:if0"/></node>
  <link client_id="st"><component_manager name="{AM}"/><component_manager name="{PEER_AM}"/>
    <interface_ref client_id="a:if0"/><interface_ref client_id="b:if0"/>
    <property source_id="a:if0" dest_id="b:if0" capacity="{capacity}"/></link></rspec>"""
    opts = {"geni_routing_profile": {"st": {"hop_exclusion_list": [exclude]}}} if exclude else {}
    res = compute_path(topo, {"slice_urn": "s", "request_rspec": req, "request_options": opts}, datetime.now(UTC))
    assert res["code"]["geni_code"] == 0, res["output"]
    return res["value"]["service_rspec"]


def test_two_slices_links_over_one_port_cannot_exceed_its_capacity(deployment):
    r, sub = deployment
    alice, bob = r.user("alice"), r.user("bob")
    a_urn, a_creds = alice.slice_credential("bw-a")
    first = alice.am.Allocate(a_urn, a_creds, service_request(sub, 6000), {})
    assert first["code"]["geni_code"] == 0, first["output"]
    assert 'vlantag="150"' in first["value"]["geni_rspec"]
    # another slice, another tag (151), but 6000 + 6000 kbps do not fit on a 10000 kbps port
    b_urn, b_creds = bob.slice_credential("bw-b")
    second = bob.am.Allocate(b_urn, b_creds, service_request(sub, 6000, exclude=f"{OUR_PORT}=150"), {})
    assert second["code"]["geni_code"] == 25, second
    assert OUR_PORT in second["output"] and "4000 kbps are left" in second["output"], second["output"]
    assert bob.am.Status([b_urn], b_creds, {})["code"]["geni_code"] == 12  # nothing of it was kept
    # what is left fits (6000 + 4000 = the port's capacity)
    fits = bob.am.Allocate(b_urn, b_creds, service_request(sub, 4000, exclude=f"{OUR_PORT}=150"), {})
    assert fits["code"]["geni_code"] == 0, fits["output"]
    c_urn, c_creds = bob.slice_credential("bw-c")
    full = bob.am.Allocate(c_urn, c_creds, service_request(sub, 100, exclude=f"{OUR_PORT}=150-151"), {})
    assert full["code"]["geni_code"] == 25 and "0 kbps are left" in full["output"], full
    # deleting a slice gives its share back
    assert alice.am.Delete([a_urn], a_creds, {})["code"]["geni_code"] == 0
    again = bob.am.Allocate(c_urn, c_creds, service_request(sub, 6000, exclude=f"{OUR_PORT}=150-151"), {})
    assert again["code"]["geni_code"] == 0, again["output"]
    for urn, creds in ((b_urn, b_creds), (c_urn, c_creds)):
        assert bob.am.Delete([urn], creds, {})["code"]["geni_code"] == 0
