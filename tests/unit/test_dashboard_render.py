"""The dashboard's pure part and its app: the topology pictures, the view over published snapshots, the
Flask pages (escaping, routes, operator access) and snapshot publishing, on a real SQLite store."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from lxml import etree

from operations.dashboard import Aggregate, Dashboard, _host_name, create_app, state_dict, view_of
from operations.dashboard_svg import Series, chart_svg, slice_svg, topology_svg
from operations.snapshot import SNAPSHOTS, VERSION, Publisher, read_snapshots, use_of
from rspec.substrate import default_substrate, load_substrate
from slicex.clock import rfc3339
from slicex.store import open_store

SVG = "{http://www.w3.org/2000/svg}"
NOW = datetime(2030, 1, 1, tzinfo=UTC)
EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
AGG = Aggregate("urn:publicid:IDN+slicex.test+authority+am", "https://127.0.0.1:8001/", "emulated")
DEMO = default_substrate("slicex.test")
PC1, SW1 = DEMO.hosts[0].component_id, DEMO.switches[0].component_id


def vm_keys(host: str, cores: int, chunks: int) -> set[str]:
    return {f"core:{host}:{i}" for i in range(cores)} | {f"mem:{host}:{i}" for i in range(chunks)}


def node(client_id: str, on: str) -> tuple[str, str]:
    return on, client_id


def svg_of(substrate=DEMO, keys=(), slivers=()) -> etree._Element:
    return etree.fromstring(topology_svg(substrate, use_of(keys), slivers).encode())


def texts(root: etree._Element) -> list[str]:
    return [t.text or "" for t in root.iter(f"{SVG}text")]


def boxes(root: etree._Element) -> list[tuple[float, float, float, float, str]]:
    """The switch, host, board and external link boxes: (x, y, width, height, tooltip)."""
    out = []
    for r in root.iter(f"{SVG}rect"):
        title = r.find(f"{SVG}title")
        if title is not None and r.get("rx") == "4":
            out.append((float(r.get("x")), float(r.get("y")), float(r.get("width")), float(r.get("height")),
                        title.text))
    return out


def test_host_shows_cores_and_memory_in_use_and_the_slivers_on_it():
    root = svg_of(keys=vm_keys(PC1, 2, 4), slivers=[node("n1", PC1), node("n2", PC1)])
    assert "cores 2/16 · mem 2/64 GB" in texts(root)
    assert "2 slivers: n1, n2" in texts(root)
    assert texts(root).count("cores 0/16 · mem 0/64 GB") == 2  # pc2, pc3


def test_host_colour_follows_its_use():
    def fill(keys) -> str:
        root = svg_of(keys=keys)
        return next(r.get("fill") for r in root.iter(f"{SVG}rect")
                    if (t := r.find(f"{SVG}title")) is not None and t.text.startswith(PC1))
    assert fill(set()) == "#f7f7f7"
    assert fill(vm_keys(PC1, 2, 2)) == "#dcf0dc"
    assert fill(vm_keys(PC1, 12, 2)) == "#fff0c2"
    assert fill(vm_keys(PC1, 16, 2)) == "#f8d3cf"


def test_taken_bare_metal_node_is_in_use():
    bm1 = DEMO.host("bm1").component_id
    assert "in use · 8 cores, 32 GB" in texts(svg_of(keys={f"node:{bm1}"}))
    assert texts(svg_of()).count("free · 8 cores, 32 GB") == 2


def test_switch_shows_vlan_tags_in_use_of_its_range_and_its_links():
    root = svg_of(keys={f"vlan:{SW1}:1000", f"vlan:{SW1}:1001"}, slivers=[(SW1, "lan0")])
    assert "VLANs 2/100 in use" in texts(root)
    assert "tags 1000-1099 · links: lan0" in texts(root)


def test_every_host_is_cabled_to_its_switch():
    root = svg_of()
    cables = [ln for ln in root.iter(f"{SVG}line") if ln.get("y1") == ln.get("y2")]  # the tick into each host
    assert len(cables) == len(DEMO.hosts)


def test_client_ids_from_experimenters_are_escaped():
    evil = '<script>alert("x")</script> & a<b'
    out = topology_svg(DEMO, use_of(vm_keys(PC1, 1, 2)), [node(evil, PC1)])
    assert "<script>" not in out and "a<b" not in out
    root = etree.fromstring(out.encode())
    assert any(evil in (t.text or "") for t in root.iter(f"{SVG}title"))  # it comes back as text


def test_two_rack_site_draws_sites_trunk_and_external_link_without_overlapping_boxes():
    site = load_substrate(EXAMPLES / "two-rack-site.yaml")
    root = svg_of(site)
    words = texts(root)
    assert {"switch tor-a", "switch tor-b", "host-a1", "host-a2", "bm-a1", "host-b1", "host-b2"} <= set(words)
    assert any(w.startswith("site rack-a") for w in words) and any(w.startswith("site rack-b") for w in words)
    assert "trunk tor-a-tor-b · 40 Gb/s" in words
    assert "external link to-transit" in words and "→ transit.example.net" in words
    assert [p.find(f"{SVG}title").text for p in root.iter(f"{SVG}path")] == [site.trunks[0].component_id]
    drawn = boxes(root)
    assert len(drawn) == len(site.hosts) + len(site.switches) + len(site.external_links)
    for i, (x1, y1, w1, h1, t1) in enumerate(drawn):
        for x2, y2, w2, h2, t2 in drawn[i + 1:]:
            assert x1 + w1 <= x2 or x2 + w2 <= x1 or y1 + h1 <= y2 or y2 + h2 <= y1, f"{t1!r} overlaps {t2!r}"


def test_fpga_boards_show_busy_fpgas():
    site = load_substrate(EXAMPLES / "fpga-site.yaml")
    whole = {"fpga:bee2-1/fpga0", *(f"router:bee2-1:{k}" for k in range(4))}  # as the FPGA kind places it
    root = svg_of(site, keys=whole | {"router:bee2-1:4", "router:nf-1:0"})
    assert "FPGAs whole 1/4 · slots 5/32" in texts(root)  # 4 FPGAs x 4 planes + 16 software planes
    assert "FPGAs whole 0/1 · slots 1/19" in texts(root)  # NetFPGA with SRAM tables: 3 planes


def test_layout_is_deterministic():
    site = load_substrate(EXAMPLES / "two-rack-site.yaml")
    assert topology_svg(site, use_of(set()), []) == topology_svg(site, use_of(set()), [])


def test_long_names_are_clipped_with_the_full_name_in_the_tooltip():
    long = "a-client-id-much-longer-than-any-box-is-wide-" * 2
    root = svg_of(keys=vm_keys(PC1, 1, 2), slivers=[node(long, PC1)])
    assert any(t.endswith("…") and t.startswith("1 sliver: a-client-id") for t in texts(root))
    assert any(long in (t.text or "") for t in root.iter(f"{SVG}title"))



# ---- snapshots and the pages over them ---------------------------------------------------------------------------
SLICE = "urn:publicid:IDN+slicex.test+slice+s"
EVIL = '<script>alert("x")</script>'


def sliver(client_id: str, kind: str = "node", on: str = PC1, **extra) -> dict:
    """A sliver as the slice manager's snapshot holds it (operations/snapshot.py `_sliver_doc`)."""
    return {"urn": f"urn:publicid:IDN+slicex.test+sliver+{abs(hash(client_id))}", "client_id": client_id,
            "kind": kind, "component_id": on, "owner": "urn:publicid:IDN+slicex.test+user+alice",
            "allocation_state": "geni_provisioned", "operational_state": "geni_notready", "state": "Active",
            "pending": "None", "pending_since": "", "reason": "", "start": rfc3339(NOW),
            "end": rfc3339(NOW + timedelta(hours=1)), "shutdown": False, "details": extra.pop("details", {}),
            "ticket": {"id": f"g/{client_id}", "broker": "broker", "start": rfc3339(NOW),
                       "end": rfc3339(NOW + timedelta(hours=1)), "sequence": 1, "units": 2, "labels": []},
            "lease": {"id": f"g/{client_id}", "authority": "am", "start": rfc3339(NOW),
                      "end": rfc3339(NOW + timedelta(hours=1)), "sequence": 1},
            "lease_id": f"g/{client_id}", **extra}


def lan_slivers(evil: str = "n2") -> list[dict]:
    return [sliver("n1", details={"host": "pc1"}), sliver(evil, details={"host": "pc1"}),
            sliver("lan0", "link", SW1, details={"vlan_tag": 1042, "endpoints": ["n1", evil], "capacity_kbps": 0})]


def sm_doc(slivers: list[dict], slice_urn: str = SLICE, at: datetime = NOW, name: str = "sm-1") -> dict:
    return {"name": name, "role": "slice-manager", "version": VERSION, "published_at": rfc3339(at),
            "state": {"slices": {slice_urn: {"urn": slice_urn, "owner": "urn:publicid:IDN+slicex.test+user+alice",
                                             "slivers": slivers, "shut_down": False}},
                      "reservations": {"Active": len(slivers)},
                      "pending": [{"state": "Ticketed", "pending": "Redeeming", "count": 1, "oldest_seconds": 75.0}],
                      "tickets_held": len(slivers), "leases_held": len(slivers),
                      "use": use_of(vm_keys(PC1, 2, 4) | {f"vlan:{SW1}:1042"}).to_doc()},
            "history": [{"at": rfc3339(at), "units": {"core": 2, "mem": 4, "vlan": 1}, "vlans": {SW1: 1}}]}


def authority_doc(lease_ops: dict[str, str], at: datetime = NOW) -> dict:
    return {"name": "authority:am", "role": "authority", "version": VERSION, "published_at": rfc3339(at),
            "state": {"leases": [{"id": lid, "holder": "sm-1", "reservation": lid, "start": rfc3339(NOW),
                                  "end": rfc3339(NOW + timedelta(hours=1)), "sequence": 1, "units": 2, "labels": [],
                                  "operational_state": op, "error": ""} for lid, op in lease_ops.items()],
                      "driver": "emulated"}}


@pytest.fixture
def store(tmp_path: Path):
    s = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    yield s
    s.close()


def client(store, now: datetime = NOW, **kw):
    dash = Dashboard(DEMO, AGG, store, lambda: now, **kw)
    app = create_app(dash)
    app.testing = True
    return dash, app.test_client()


def test_slice_picture_draws_nodes_links_tags_and_stitching_hops_escaped():
    ext = load_substrate(EXAMPLES / "two-rack-site.yaml").external_links[0]
    slivers = [sliver(EVIL, details={"host": "pc1"}), sliver("n2", details={"host": "pc2"}),
               sliver("l0", "link", SW1, details={"vlan_tag": 1042, "endpoints": [EVIL, "n2"],
                                                  "uplinks": [{"port": ext.component_id, "tags": [[0, 3001]]}]})]
    out = slice_svg(slivers, load_substrate(EXAMPLES / "two-rack-site.yaml"))
    assert "<script>" not in out
    words = texts(etree.fromstring(out.encode()))
    assert f"node {EVIL}"[:20] in [w[:20] for w in words] and "node n2" in words
    assert "link l0" in words and "VLAN 1042" in words
    assert "tag 3001" in words and "→ transit.example.net" in words
    assert len(list(etree.fromstring(out.encode()).iter(f"{SVG}line"))) == 3  # two endpoints, one hop


def test_chart_scales_to_the_total_and_says_the_latest_share():
    root = etree.fromstring(chart_svg(Series("cores", [0, 8, 24], 48, ("t0", "t1", "t2"))).encode())
    assert "cores: 24/48 (50 %)" in texts(root)
    ys = [float(p.split(",")[1]) for p in root.find(f"{SVG}polyline").get("points").split()]
    assert ys[0] > ys[1] > ys[2]  # higher use is drawn higher


def test_view_takes_operational_state_from_the_authority_and_flags_stale_actors():
    old = NOW - timedelta(minutes=5)
    view = view_of([sm_doc(lan_slivers()), authority_doc({"g/n1": "geni_ready"}, at=old)], NOW, 15.0)
    ops = {s["client_id"]: (s["operational_state"], s["error"]) for s in view.slivers}
    assert ops["n1"] == ("geni_ready", "")
    assert ops["n2"][0] == "geni_notready" and "no state" in ops["n2"][1]  # its authority said nothing of it
    health = {a["role"]: a for a in view.actors}
    assert not health["slice-manager"]["stale"] and health["authority"]["stale"]
    assert health["authority"]["age"] == 300


def test_state_dict_reports_usage_slivers_tags_and_reservation_counts():
    view = view_of([sm_doc(lan_slivers())], NOW, 15.0)
    state = json.loads(json.dumps(state_dict(DEMO, AGG, view)))
    pc1 = next(h for h in state["hosts"] if h["name"] == "pc1")
    assert pc1["cores"] == {"used": 2, "total": 16} and pc1["memory_mb"] == {"used": 2048, "total": 65536}
    assert pc1["slivers"] == ["n1", "n2"]
    assert state["switches"][0]["vlans_in_use"] == [1042] and state["switches"][0]["vlans_total"] == 100
    assert {s["client_id"]: s["vlan_tag"] for s in state["slices"][SLICE]} == {"n1": None, "n2": None, "lan0": 1042}
    assert state["reservations"]["Active"] == 3 and state["reservations"]["Closed"] == 0
    assert state["snapshot_published_at"] == "2030-01-01T00:00:00Z"


def test_pages_escape_what_experimenters_named(store):
    """A client_id with <script> (client_ids come from experimenters), in every page that shows it."""
    store.put(SNAPSHOTS, "sm-1", sm_doc(lan_slivers(evil=EVIL), slice_urn=SLICE))
    _, c = client(store)
    for path in ("/", "/slices", "/reservations"):
        page = c.get(path).get_data(as_text=True)
        assert "<script>alert" not in page, path
        assert "&lt;script&gt;alert(" in page, path
    assert c.get("/api/state").get_json()["slices"][SLICE][1]["client_id"] == EVIL  # JSON carries it as data


def test_a_slice_urn_with_markup_is_escaped_in_the_slices_page(store):
    evil_urn = 'urn:publicid:IDN+slicex.test+slice+"><script>alert(1)</script>'
    store.put(SNAPSHOTS, "sm-1", sm_doc(lan_slivers(), slice_urn=evil_urn))
    page = client(store)[1].get("/slices").get_data(as_text=True)
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert '"><script>' not in page  # not even inside an attribute


def test_pages_render_from_snapshots_only_with_no_slice_manager_at_all(store):
    """The app is given a store, never a slice manager: the pages come from what was published."""
    store.put(SNAPSHOTS, "sm-1", sm_doc(lan_slivers()))
    store.put(SNAPSHOTS, "authority:am", authority_doc({"g/n1": "geni_ready"}))
    _, c = client(store)
    slices = c.get("/slices").get_data(as_text=True)
    assert "slice s" in slices and "VLAN 1042" in slices and "geni_ready" in slices
    actors = c.get("/actors").get_data(as_text=True)
    assert "sm-1" in actors and "authority:am" in actors and "Redeeming" in actors and "75 s" in actors
    assert "2030-01-01T00:00:00Z" in c.get("/reservations").get_data(as_text=True)


def test_no_snapshot_yet_and_no_peers_are_empty_states(store):
    _, c = client(store)
    page = c.get("/").get_data(as_text=True)
    assert c.get("/").status_code == 200 and "no slice manager snapshot published yet" in page
    assert "No federation peers are configured" in c.get("/federation").get_data(as_text=True)


def test_configured_peers_are_listed(store):
    peers = {"testbed-a": {"root": "peers/a.pem", "namespaces": ["a.example"], "ch_url": "https://a.example/CH",
                           "policy": {"max_nodes": 4}}}
    page = client(store, peers=peers)[1].get("/federation").get_data(as_text=True)
    assert "testbed-a" in page and "a.example" in page and "max_nodes: 4" in page


def test_routes_answer_404_405_and_503(store):
    _, c = client(store)
    assert c.get("/topology.svg").content_type == "image/svg+xml"
    assert c.get("/nope").status_code == 404
    assert c.post("/api/state").status_code == 405
    assert c.open("/", method="BREW").status_code == 405
    assert c.get("/").headers["Content-Security-Policy"].startswith("default-src 'none'")

    class Down:
        def scan(self, table):
            raise ConnectionError("store down")
    assert client(Down())[1].get("/").status_code == 503


def test_loopback_dashboard_refuses_other_host_names(store):
    dash, c = client(store)
    dash.loopback_only = True
    assert c.get("/", headers={"Host": "attacker.example:80"}).status_code == 403
    assert c.get("/", headers={"Host": "127.0.0.1:8004"}).status_code == 200


def test_host_header_names_without_port():
    assert _host_name("127.0.0.1:8004") == "127.0.0.1"
    assert _host_name("LOCALHOST") == "localhost"
    assert _host_name("[::1]:8004") == "[::1]" and _host_name("[::1]") == "[::1]"


def test_only_an_operator_with_the_page_token_shuts_a_slice_down(store, tmp_path):
    from slicex.devpki import add_user, init_ca
    from slicex.home import Home

    home = Home(tmp_path / "home")
    home.root.mkdir()
    (home.root / "slicex.yaml").write_text("authority: slicex.test\n")
    init_ca(home, "slicex.test")
    for name in ("alice", "bob"):
        add_user(home, "slicex.test", name)
    done: list[tuple[str, str]] = []
    store.put(SNAPSHOTS, "sm-1", sm_doc(lan_slivers()))
    dash, c = client(store, operators=frozenset({"urn:publicid:IDN+slicex.test+user+alice"}),
                     shutdown=lambda urn, who: done.append((urn, who)))
    alice = {"SSL_CLIENT_CERT": home.user_cert("alice").read_text()}
    bob = {"SSL_CLIENT_CERT": home.user_cert("bob").read_text()}
    token = dash.token("urn:publicid:IDN+slicex.test+user+alice")
    assert "Shut down this slice" not in c.get("/slices", environ_base=bob).get_data(as_text=True)
    assert "Shut down this slice" in c.get("/slices", environ_base=alice).get_data(as_text=True)
    form = {"slice_urn": SLICE, "token": token}
    assert c.post("/operator/shutdown", data=form).status_code == 403  # no certificate
    assert c.post("/operator/shutdown", data=form, environ_base=bob).status_code == 403  # not an operator
    assert c.post("/operator/shutdown", data={**form, "token": "x"}, environ_base=alice).status_code == 403
    assert c.post("/operator/shutdown", data=form, environ_base=alice,
                  headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403
    assert not done
    assert c.post("/operator/shutdown", data=form, environ_base=alice).status_code == 200
    assert done == [(SLICE, "urn:publicid:IDN+slicex.test+user+alice")]


# ---- publishing ---------------------------------------------------------------------------------------------------
class Ticking:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_publisher_writes_on_change_or_heartbeat_and_keeps_history_across_restarts(store):
    keys = {"k": {f"core:{PC1}:0"}}

    def build(now: datetime) -> dict:
        from operations.snapshot import usage_point
        return {"slices": {}, "n": len(keys["k"]), "point": usage_point(keys["k"], now)}

    mono = Ticking()
    pub = Publisher(store, "sm-1", "slice-manager", build, heartbeat=5.0, history_step=60.0, monotonic=mono)
    assert pub.publish(NOW)
    assert not pub.publish(NOW)  # unchanged, heartbeat not due
    mono.t = 5.0
    assert pub.publish(NOW + timedelta(seconds=5))  # heartbeat
    keys["k"] = {f"core:{PC1}:0", f"core:{PC1}:1", f"vlan:{SW1}:1042"}
    mono.t = 6.0
    assert pub.publish(NOW + timedelta(seconds=6))  # changed
    doc = read_snapshots(store)[0]
    assert doc["published_at"] == rfc3339(NOW + timedelta(seconds=6)) and doc["state"]["n"] == 3
    assert [p["units"].get("core") for p in doc["history"]] == [1, 2]  # the heartbeat added no sample
    assert doc["history"][-1]["vlans"] == {SW1: 1}
    again = Publisher(store, "sm-1", "slice-manager", build, monotonic=Ticking())  # a restarted process
    keys["k"] = set()
    assert again.publish(NOW + timedelta(seconds=7))
    assert [p["units"].get("core", 0) for p in read_snapshots(store)[0]["history"]] == [1, 2, 0]


def test_a_failing_build_is_a_log_line_not_a_dead_loop(store, caplog):
    def build(now: datetime) -> dict:
        raise ConnectionError("store down")
    Publisher(store, "sm-1", "slice-manager", build).tick(NOW)
    assert "snapshot not published" in caplog.text and read_snapshots(store) == []


def test_publishers_on_demand_build_nothing_until_a_dashboard_view_asks_and_stop_after(store):
    """Nobody looking: no snapshot is built or written (a snapshot costs what the live slices are). A view
    asks (`wanted`) and publishes this process's publishers at once; WANTED_SECONDS later they stop again."""
    from operations.snapshot import BEAT, WANTED_SECONDS, Demand

    built: list[datetime] = []
    clock, mono = [NOW], [0.0]

    def build(now: datetime) -> dict:
        built.append(now)
        return {"slices": {}, "n": len(built)}

    pub = Publisher(store, "sm-1", "slice-manager", build, heartbeat=5.0, wanted=Demand(store),
                    token=lambda: "unchanged", monotonic=lambda: mono[0])
    for k in range(3):
        pub.tick(NOW + timedelta(seconds=k))
    assert built == [] and read_snapshots(store) == []
    dash = Dashboard(DEMO, AGG, store, lambda: clock[0], publishers=[pub])
    dash.view()  # asks, and the publisher of this process publishes before the page is read
    assert built == [NOW] and [d["name"] for d in read_snapshots(store)] == ["sm-1"]
    mono[0] = 6.0  # still wanted: its heartbeat, nothing built again (unchanged)
    assert pub.publish(NOW + timedelta(seconds=WANTED_SECONDS - 1)) and built == [NOW]
    late = NOW + timedelta(seconds=WANTED_SECONDS + 1)
    mono[0] = 12.0
    assert not pub.publish(late)  # nobody asked since: nothing written, not even the heartbeat
    assert store.get(SNAPSHOTS, "sm-1" + BEAT)["published_at"] != rfc3339(late)
    clock[0] = late
    dash.view()  # asked again: it publishes (its heartbeat) at once
    assert store.get(SNAPSHOTS, "sm-1" + BEAT)["published_at"] == rfc3339(late) and built == [NOW]
