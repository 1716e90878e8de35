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
