"""The dashboard's pure part: usage from claim keys, the topology picture, the JSON, the page, the routes."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from lxml import etree

from am.dashboard import (
    Aggregate,
    Dashboard,
    Snapshot,
    _host_name,
    page_html,
    state_dict,
    topology_svg,
    use_of,
)
from am.slice_manager import Sliver
from rspec.substrate import default_substrate, load_substrate

SVG = "{http://www.w3.org/2000/svg}"
NOW = datetime(2030, 1, 1, tzinfo=UTC)
EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
AGG = Aggregate("urn:publicid:IDN+slicex.test+authority+am", "https://127.0.0.1:8001/", "emulated")
DEMO = default_substrate("slicex.test")
PC1, SW1 = DEMO.hosts[0].component_id, DEMO.switches[0].component_id


def vm_keys(host: str, cores: int, chunks: int) -> set[str]:
    return {f"core:{host}:{i}" for i in range(cores)} | {f"mem:{host}:{i}" for i in range(chunks)}


def node(client_id: str, on: str, slice_name: str = "s") -> Sliver:
    return Sliver(f"urn:publicid:IDN+slicex.test+sliver+{client_id}", f"urn:publicid:IDN+slicex.test+slice+{slice_name}",
                  client_id, "node", "geni_allocated", "geni_pending_allocation", NOW, component_id=on)


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
    link = Sliver("urn:x", "urn:s", "lan0", "link", "geni_allocated", "geni_pending_allocation", NOW, component_id=SW1)
    root = svg_of(keys={f"vlan:{SW1}:1000", f"vlan:{SW1}:1001"}, slivers=[link])
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
    page = page_html(DEMO, AGG, Snapshot(NOW, frozenset(), (node(evil, PC1),)))
    assert "<script>alert" not in page and "&lt;script&gt;alert(&quot;x&quot;)" in page


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
    root = svg_of(site, keys={"fpga:bee2-1/fpga0", "vplane:bee2-1/fpga1:0", "swplane:nf-1:0"})
    assert "FPGAs busy 2/4" in texts(root)
    assert "FPGAs busy 0/1 · sw planes 1" in texts(root)


def test_layout_is_deterministic():
    site = load_substrate(EXAMPLES / "two-rack-site.yaml")
    assert topology_svg(site, use_of(set()), []) == topology_svg(site, use_of(set()), [])


def test_long_names_are_clipped_with_the_full_name_in_the_tooltip():
    long = "a-client-id-much-longer-than-any-box-is-wide-" * 2
    root = svg_of(keys=vm_keys(PC1, 1, 2), slivers=[node(long, PC1)])
    assert any(t.endswith("…") and t.startswith("1 sliver: a-client-id") for t in texts(root))
    assert any(long in (t.text or "") for t in root.iter(f"{SVG}title"))


def test_state_dict_reports_usage_slivers_and_reservation_counts():
    snap = Snapshot(NOW, frozenset(vm_keys(PC1, 2, 4) | {f"vlan:{SW1}:1042"}), (node("n1", PC1), node("n2", PC1)),
                    {"Ticketed": 2, "Closed": 1})
    state = json.loads(json.dumps(state_dict(DEMO, AGG, snap)))
    pc1 = next(h for h in state["hosts"] if h["name"] == "pc1")
    assert pc1["cores"] == {"used": 2, "total": 16} and pc1["memory_mb"] == {"used": 2048, "total": 65536}
    assert pc1["slivers"] == ["n1", "n2"]
    assert state["switches"][0]["vlans_in_use"] == [1042] and state["switches"][0]["vlans_total"] == 100
    assert [s["client_id"] for s in state["slices"]["urn:publicid:IDN+slicex.test+slice+s"]] == ["n1", "n2"]
    assert state["reservations"]["Ticketed"] == 2 and state["reservations"]["Active"] == 0
    assert state["aggregate"]["url"] == AGG.url and state["now"] == "2030-01-01T00:00:00Z"


def test_routes_answer_404_405_and_503_without_raising():
    dash = Dashboard(DEMO, AGG, lambda: Snapshot(NOW))
    assert dash.respond("GET", "/").status == 200
    assert dash.respond("GET", "/?auto=1").status == 200
    assert dash.respond("GET", "/topology.svg").content_type == "image/svg+xml"
    assert json.loads(dash.respond("GET", "/api/state").body)["hosts"]
    assert dash.respond("GET", "/nope").status == 404
    assert dash.respond("POST", "/api/state").status == 405

    def broken() -> Snapshot:
        raise ConnectionError("store down")
    assert Dashboard(DEMO, AGG, broken).respond("GET", "/").status == 503


def test_host_header_names_without_port():
    assert _host_name("127.0.0.1:8004") == "127.0.0.1"
    assert _host_name("LOCALHOST") == "localhost"
    assert _host_name("[::1]:8004") == "[::1]" and _host_name("[::1]") == "[::1]"
