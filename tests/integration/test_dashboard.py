"""The operator dashboard of a real deployment, read over plain HTTP on 127.0.0.1 as a browser would (and over
TLS with client certificates for operators). The pages come from the snapshots the actors publish."""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
import time
import urllib.error
import urllib.parse
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
        wait_for_snapshot(r.deployment.dashboard_url, urn, 3)
        yield r


def wait_for_snapshot(url: str, slice_urn: str, slivers: int, seconds: float = 10.0) -> dict:
    """/api/state once the slice manager's snapshot shows the slice with that many slivers, all ticketed (a
    snapshot published while Allocate was still running shows them before the broker chose their hosts)."""
    deadline = time.monotonic() + seconds
    while True:
        state = json.loads(get(url + "api/state")[2])
        if len(state["slices"].get(slice_urn, [])) == slivers and state["reservations"]["Ticketed"] >= slivers:
            return state
        assert time.monotonic() < deadline, f"no snapshot with {slice_urn}: {state['slices']}"
        time.sleep(0.05)


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
    assert isinstance(next(s for s in slivers if s["client_id"] == "lan0")["vlan_tag"], int)
    assert state["reservations"]["Ticketed"] == 3
    assert {a["role"] for a in state["actors"]} == {"slice-manager", "broker", "authority"}


def test_page_lists_the_slivers_with_experimenter_text_escaped(dash):
    status, ctype, page = get(dash.deployment.dashboard_url)
    assert status == 200 and ctype.startswith("text/html")
    assert dash.deployment.am_urn in page and "emulated rack" in page
    assert "a&lt;script&gt;" in page and "a<script>" not in page
    assert "cores 2/16" in page and "<svg" in page
    slices = get(dash.deployment.dashboard_url + "slices")[2]
    assert "slice dash" in slices and "a&lt;script&gt;" in slices and "a<script>" not in slices


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


def test_pages_render_from_the_snapshot_while_the_slice_manager_is_stopped(dash):
    """The dashboard never calls into the slice manager: with its publishing stopped and every method that
    reads or locks its state broken, the pages still show the last snapshot."""
    d = dash.deployment
    d.publishers = []  # its loop publishes nothing more: the slice manager is as good as stopped

    def stopped(*args, **kwargs):
        raise AssertionError("the dashboard called the slice manager")
    for name in ("records", "slivers", "sliver", "usage_keys", "reservations", "reap", "_on_slices"):
        setattr(d.sm, name, stopped)
    for path in ("", "slices", "reservations", "actors", "api/state", "topology.svg"):
        status, _, body = get(d.dashboard_url + path)
        assert status == 200, (path, body)
    assert "a&lt;script&gt;" in get(d.dashboard_url + "slices")[2]


def tls_get(url: str, ctx: ssl.SSLContext, data: dict | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, urllib.parse.urlencode(data).encode() if data is not None else None)
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_an_operator_with_a_client_certificate_shuts_a_slice_down_over_tls(pki_home: Home, tmp_path: Path):
    with deployment(pki_home, tmp_path, dashboard_port=0, dashboard_tls=True,
                    operators=["urn:publicid:IDN+slicex.test+user+alice"]) as r:
        bob = r.user("bob")
        urn, creds = bob.slice_credential("bobs")
        ok(bob.am.Allocate(urn, creds, request_rspec([vm("n1")]), {}))
        url = r.deployment.dashboard_url
        assert url.startswith("https://")

        def ctx(user: str | None) -> ssl.SSLContext:
            c = ssl.create_default_context(cafile=str(pki_home.ca_cert))
            c.check_hostname = False  # the AM's certificate names the deployment, not 127.0.0.1
            if user:
                c.load_cert_chain(str(pki_home.user_cert(user)), str(pki_home.user_key(user)))
            return c
        deadline = time.monotonic() + 10
        while "slice bobs" not in (page := tls_get(url + "slices", ctx(None))[1]):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert "Shut down this slice" not in page and "read-only" in page  # anyone may read, nobody may act
        assert "Shut down this slice" not in tls_get(url + "slices", ctx("bob"))[1]
        page = tls_get(url + "slices", ctx("alice"))[1]
        token = re.search(r'name="token" value="([0-9a-f]+)"', page).group(1)
        form = {"slice_urn": urn, "token": token}
        assert tls_get(url + "operator/shutdown", ctx(None), form)[0] == 403
        assert tls_get(url + "operator/shutdown", ctx("bob"), form)[0] == 403
        assert not r.deployment.sm.is_shut_down(urn)
        assert tls_get(url + "operator/shutdown", ctx("alice"), form)[0] == 200
        assert r.deployment.sm.is_shut_down(urn)
