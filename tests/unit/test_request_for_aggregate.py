"""Which part of a multi-aggregate request is this aggregate's: managers are matched by URN authority, so a
request naming `…+authority+cm` reaches the aggregate `…+authority+am` (as omni's stitcher assumes)."""

from rspec.request import manager_key, parse_request
from tests.factories import request_rspec, vm

OURS = "urn:publicid:IDN+here.test+authority+am"


def test_cm_spelling_of_our_urn_finds_our_nodes_and_links():
    req = parse_request(request_rspec(
        [vm("a", ifaces=["a:0"]) | {"component_manager_id": "urn:publicid:IDN+Here.Test+authority+cm"},
         vm("b", ifaces=["b:0"]) | {"component_manager_id": "urn:publicid:IDN+there.test+authority+am"}],
        [{"client_id": "l", "ifaces": ["a:0", "b:0"]}]))
    mine = req.for_aggregate(OURS)
    assert [n.client_id for n in mine.nodes] == ["a"]
    assert [lk.client_id for lk in mine.links] == ["l"]
    assert req.for_aggregate("urn:publicid:IDN+there.test+authority+cm").nodes[0].client_id == "b"


def test_another_authority_or_sub_authority_is_not_ours():
    assert manager_key(OURS) == manager_key("urn:publicid:IDN+HERE.test+authority+cm")
    assert manager_key(OURS) != manager_key("urn:publicid:IDN+here.test:rack2+authority+am")
    assert manager_key("not-a-urn") == "not-a-urn"
