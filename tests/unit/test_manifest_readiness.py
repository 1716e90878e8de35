"""A node's readiness in the manifest as geni-tools' readyToLogin.py reads it (ExoGENI's geni_sliver_info `state`,
"ready" or not), beside the login elements; the manifest stays valid against the GENI v3 manifest schema."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from lxml import etree

from rspec.manifest import SLIVER_INFO_EXT, SliverView, build_manifest
from rspec.validate import validate_rspec
from tests.factories import RSPEC3, request_rspec, vm

NOW = datetime(2030, 1, 1, tzinfo=UTC)
CM = "urn:publicid:IDN+t.org+authority+am"
LOGIN = {"username": "alice", "hostname": "127.0.0.1", "port": 40001}


def _manifest(state: str) -> etree._Element:
    view = SliverView("n1", "urn:publicid:IDN+t.org+sliver+1", "node", "urn:publicid:IDN+t.org+node+pc1",
                      {"logins": [LOGIN]}, state)
    text = build_manifest([request_rspec([vm("n1")])], [view], CM, NOW)
    assert validate_rspec(text, "manifest") == []
    return etree.fromstring(text.encode())


@pytest.mark.parametrize(("operational", "published"), [
    ("geni_ready", "ready"), ("geni_ready_busy", "ready"), ("geni_notready", "notready"),
    ("geni_configuring", "configuring"), ("geni_failed", "failed"), ("geni_stopping", "stopping")])
def test_each_operational_state_is_published_where_ready_to_login_reads_it(operational, published):
    node = _manifest(operational).find(f"{{{RSPEC3}}}node")
    info = node.findall(f"{{{SLIVER_INFO_EXT}}}geni_sliver_info")
    assert [i.get("state") for i in info] == [published]
    login = node.find(f"{{{RSPEC3}}}services/{{{RSPEC3}}}login")
    assert {k: login.get(k) for k in LOGIN} == {k: str(v) for k, v in LOGIN.items()}


def test_a_view_without_a_state_publishes_none():
    assert _manifest("").find(f".//{{{SLIVER_INFO_EXT}}}geni_sliver_info") is None


def test_a_staged_updates_replaced_link_names_its_replacement():
    """The replaced l1 as it was allocated, with update:action and an update:replacement child naming the
    replacing sliver and the new capacity; client_ids stay unique and the manifest validates."""
    from rspec.namespaces import UPDATE

    old = request_rspec([vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0"])],
                        [{"client_id": "l1", "ifaces": ["n1:if0", "n2:if0"]}])
    new = request_rspec([vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0"])],
                        [{"client_id": "l1", "ifaces": ["n1:if0", "n2:if0"], "capacity": 5000}])
    views = [SliverView("n1", "s:n1", "node", details={"update_action": "rewired"}),
             SliverView("n2", "s:n2", "node", details={"update_action": "rewired"}),
             SliverView("l1", "s:old", "link", details={"update_action": "replaced"}),
             SliverView("l1", "s:new", "link", details={"update_action": "replacing", "vlan_tag": 7})]
    manifest = build_manifest([old, new], views, "urn:publicid:IDN+t.org+authority+am")
    root = etree.fromstring(manifest.encode())
    links = list(root.iter(f"{{{RSPEC3}}}link"))
    assert len(links) == 1 and links[0].get("sliver_id") == "s:old"
    assert links[0].get(f"{{{UPDATE}}}action") == "replaced"
    box = links[0].find(f"{{{UPDATE}}}replacement")
    assert box.get("sliver_id") == "s:new" and box.get("action") == "replacing" and box.get("vlantag") == "7"
    assert {p.get("capacity") for p in box.iter(f"{{{RSPEC3}}}property")} == {"5000"}
    assert all(p.get("capacity") != "5000" for p in links[0].findall(f"{{{RSPEC3}}}property"))
    assert {n.get(f"{{{UPDATE}}}action") for n in root.iter(f"{{{RSPEC3}}}node")} == {"rewired"}
    assert validate_rspec(manifest, "manifest") == []
    assert UPDATE not in build_manifest([old], [SliverView("n1", "s:n1", "node")], "urn:publicid:IDN+t.org+authority+am")
