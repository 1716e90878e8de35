"""The operator dashboard of a real deployment, read over plain HTTP on 127.0.0.1 as a browser would."""

from __future__ import annotations

import http.client
import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from lxml import etree

from slicex.home import Home
from tests.factories import request_rspec, vm
from tests.integration.conftest import AUTHORITY, Running, start, stop
from tests.integration.test_am_api import ok

SVG = "{http://www.w3.org/2000/svg}"
PC1 = f"urn:publicid:IDN+{AUTHORITY}+node+pc1"
SW1 = f"urn:publicid:IDN+{AUTHORITY}+node+sw1"


@contextmanager
def deployment(home: Home, tmp_path: Path, **config) -> Iterator[Running]:
    """A deployment on its own SQLite store with `config` on top of the session's; the config is restored."""
    saved = (home.root / "slicex.yaml").read_text()
    cfg = {**yaml.safe_load(saved), "store": f"sqlite:///{tmp_path / 'state.db'}", **config}
    (home.root / "slicex.yaml").write_text(yaml.safe_dump(cfg))
    r = start(home)
    try:
        yield r
    finally:
        stop(r)
        (home.root / "slicex.yaml").write_text(saved)


@pytest.fixture
def dash(pki_home: Home, tmp_path: Path) -> Iterator[Running]:
    """A deployment with its dashboard on a free port, and alice's 2-node LAN allocated (one client_id is
    `a<script>`: client_ids come from experimenters)."""
    with deployment(pki_home, tmp_path, dashboard_port=0) as r:
        alice = r.user("alice")
        urn, creds = alice.slice_credential("dash")
        ok(alice.am.Allocate(urn, creds, request_rspec(
            [vm("n1", ifaces=["n1:if0"]), vm("a&lt;script&gt;", ifaces=["a:if0"])],
            [{"client_id": "lan0", "ifaces": ["n1:if0", "a:if0"]}]), {}))
        yield r


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def send(url: str, method: str, headers: dict[str, str] | None = None) -> int:
    conn = http.client.HTTPConnection(url.split("/")[2], timeout=10)
    try:
        conn.request(method, "/", headers=headers or {})
        return conn.getresponse().status
    finally:
        conn.close()


def test_api_state_shows_the_lan_its_host_and_its_vlan(dash):
    status, ctype, body = get(dash.deployment.dashboard_url + "api/state")
    assert status == 200 and ctype == "application/json"
    state = json.loads(body)
    assert state["aggregate"]["url"] == dash.deployment.endpoints.am_url
    pc1 = next(h for h in state["hosts"] if h["component_id"] == PC1)
    assert pc1["cores"] == {"used": 2, "total": 16}
    assert pc1["memory_mb"]["used"] == 2048
    assert sorted(pc1["slivers"]) == ["a<script>", "n1"]
    sw1 = next(s for s in state["switches"] if s["component_id"] == SW1)
    assert len(sw1["vlans_in_use"]) == 1 and sw1["vlans_total"] == 100
    slivers = state["slices"][f"urn:publicid:IDN+{AUTHORITY}+slice+dash"]
    assert {s["client_id"] for s in slivers} == {"n1", "a<script>", "lan0"}
    assert {s["allocation_state"] for s in slivers} == {"geni_allocated"}
    assert state["reservations"]["Ticketed"] == 3


def test_page_lists_the_slivers_with_experimenter_text_escaped(dash):
    status, ctype, page = get(dash.deployment.dashboard_url)
    assert status == 200 and ctype.startswith("text/html")
    assert dash.deployment.am_urn in page and "emulated rack" in page
    assert "a&lt;script&gt;" in page and "a<script>" not in page
    assert "cores 2/16" in page and "<svg" in page


def test_topology_svg_is_xml_with_the_host_in_use(dash):
    status, ctype, body = get(dash.deployment.dashboard_url + "topology.svg")
    assert status == 200 and ctype == "image/svg+xml"
    root = etree.fromstring(body.encode())
    assert root.tag == f"{SVG}svg"
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "cores 2/16 · mem 2/64 GB" in texts
    assert "VLANs 1/100 in use" in texts
    assert any(t and "a<script>" in t for t in texts)  # parsed back from &lt;: it was escaped


def test_unknown_paths_are_404_and_other_methods_405(dash):
    url = dash.deployment.dashboard_url
    assert get(url + "nothing")[0] == 404
    assert get(url + "api/state/../../etc/passwd")[0] == 404
    assert send(url, "POST") == 405
    assert send(url, "DELETE") == 405
    assert send(url, "BREW") == 405
    assert send(url, "GET", {"Host": "attacker.example:80"}) == 403  # a rebound DNS name
    assert get(url + "?refresh=1")[0] == 200  # and it still serves


def test_dashboard_is_read_only(dash):
    before = dash.deployment.sm.usage_keys()
    for path in ("", "topology.svg", "api/state"):
        get(dash.deployment.dashboard_url + path)
    assert dash.deployment.sm.usage_keys() == before


def test_dashboard_port_null_disables_it(pki_home, tmp_path):
    with deployment(pki_home, tmp_path, dashboard_port=None) as r:
        assert r.deployment.dashboard_url is None


def test_a_taken_port_leaves_the_aggregate_running_without_its_dashboard(pki_home, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with deployment(pki_home, tmp_path, dashboard_port=taken.getsockname()[1]) as r:
            assert r.deployment.dashboard_url is None
            assert ok(r.user("alice").am.GetVersion())["geni_api_versions"]
