"""The FPGA aggregate service through the AM API life cycle, and its RSpec extension against its schema."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from lxml import etree

from fpga_aggregate.aggregate import FpgaAggregate
from fpga_aggregate.backend import EmulatedFpgaBackend
from fpga_aggregate.bitstreams import BitstreamCatalogue, build_bitfile
from fpga_aggregate.boards import boards_from_config
from fpga_aggregate.tables import bgp_like, virtual_router_tables
from rspec.fpga_ext import (
    FPGA_NS,
    FpgaRequest,
    annotate_manifest,
    board_element,
    parse_fpga_request,
    sliver_element,
    validate,
)
from slicex.clock import ManualClock
from slicex.errors import BadArgs, InsufficientBandwidth, InsufficientNodes, SearchFailed, Unsupported
from slicex.store.sqlite_store import SqliteStore
from tests.fpga_oracle import ReferenceLpm, probe_addresses, random_table

ALICE = "urn:publicid:IDN+slicex+user+alice"
BOB = "urn:publicid:IDN+slicex+user+bob"
RSPEC3 = "http://www.geni.net/resources/rspec/3"


def sliver(name: str) -> str:
    return f"urn:publicid:IDN+slicex+sliver+{name}"


@pytest.fixture
def agg(tmp_path):
    store = SqliteStore(str(tmp_path / "state.db"))
    boards = boards_from_config([{"name": "bee1", "model": "BEE2"}, {"name": "nf1", "model": "NetFPGA"}])
    clock = ManualClock()
    cat = BitstreamCatalogue(store, tmp_path / "bits")
    a = FpgaAggregate(boards, cat, EmulatedFpgaBackend(), clock, store, tmp_path / "work", software_planes_per_board=2)
    a.bee_bit = cat.upload(ALICE, "design.bit", build_bitfile("design", "xc2vp70ff1704", b"\x01" * 2048))
    return a


def table(n: int, seed: int):
    """BGP-like: long prefixes packed in /19 blocks, so they fit one SRAM bank of L2 sets."""
    return bgp_like(n, seed, density=30)


def manifest_element(agg: FpgaAggregate, urn: str) -> etree._Element:
    """A sliver's fpga:sliver in its manifest, as the AM makes it: the request's element annotated with where
    the model placed it (rspec/manifest.py, from the driver's view)."""
    el = sliver_element(agg.sliver(urn).request())
    annotate_manifest(el, agg.placement_of(urn))
    return el


def request_node(inner: str) -> etree._Element:
    return etree.fromstring(f'<node xmlns="{RSPEC3}" xmlns:fpga="{FPGA_NS}" client_id="n">{inner}</node>')


# ---- RSpec extension ----------------------------------------------------------------------------------------
def test_request_elements_parse_and_validate():
    el = request_node('<fpga:sliver type="virtual-router" bandwidth_mbps="300" table_size="5000" board="nf1"/>')
    req = parse_fpga_request(el, "n")
    assert req == FpgaRequest("virtual-router", "", 300.0, 5000, "nf1")
    validate(el[0])
    assert parse_fpga_request(request_node(""), "n") is None
    digest = "ab" * 32
    req = parse_fpga_request(request_node(f'<fpga:sliver type="fpga-bitstream" bitstream="sha256:{digest}"/>'), "n")
    assert req.bitstream == f"sha256:{digest}"


@pytest.mark.parametrize("inner, message", [
    ('<fpga:sliver type="asic"/>', "not one of"),
    ('<fpga:sliver type="fpga-bitstream" bitstream="design.bit"/>', "64 hex digits"),
    ('<fpga:sliver type="virtual-router" bandwidth_mbps="fast"/>', "must be numbers"),
    ('<fpga:sliver type="virtual-router" bandwidth_mbps="-1"/>', ">= 0"),
    ('<fpga:sliver type="virtual-router" bandwidth_mbps="nan"/>', ">= 0"),
    ('<fpga:sliver type="virtual-router" table_size="0"/>', "table_size"),
    ('<fpga:sliver type="virtual-router" bitstream="sha256:' + "0" * 64 + '"/>', "router design"),
    ('<fpga:sliver type="virtual-router"/><fpga:sliver type="virtual-router"/>', "one fpga:sliver"),
])
def test_bad_requests_say_what_to_fix(inner, message):
    with pytest.raises(BadArgs, match=message):
        parse_fpga_request(request_node(inner), "n")


def test_emitted_elements_match_the_schema_and_the_schema_refuses_garbage(agg):
    validate(sliver_element(FpgaRequest("virtual-router", "", 12.5, 100), "nf1/fpga0", "hardware", 12.5))
    validate(sliver_element(FpgaRequest("fpga-bitstream", "sha256:" + "0" * 64), "bee1/fpga0", "hardware", None, 11))
    for board in agg.advertise():
        validate(board_element(board))
    bad = etree.fromstring(f'<fpga:sliver xmlns:fpga="{FPGA_NS}" type="virtual-router" placement="orbit"/>')
    with pytest.raises(BadArgs, match="fpga-1.xsd"):
        validate(bad)


# ---- whole FPGAs ------------------------------------------------------------------------------------------------
def test_fpga_sliver_allocate_provision_programs_for_the_measured_time_and_delete_releases(agg):
    clock = agg.clock
    urns = [sliver("f0"), sliver("f1")]
    for u in urns:
        s = agg.allocate(u, ALICE, FpgaRequest("fpga-bitstream", agg.bee_bit.ref))
        assert s.placement == "exclusive" and s.fpga.startswith("bee1/")
    assert agg.status(urns[0])["geni_operational_status"] == "geni_pending_allocation"
    agg.provision(urns)
    assert agg.status(urns[0])["geni_operational_status"] == "geni_configuring"
    clock.advance(timedelta(seconds=16))
    assert agg.status(urns[1])["geni_operational_status"] == "geni_configuring"  # two at once take 17 s
    clock.advance(timedelta(seconds=1))
    assert agg.status(urns[1])["geni_operational_status"] == "geni_ready"
    assert agg.backend.read_counters(agg.fpgas["bee1/fpga0"])["design"] == "design"
    el = manifest_element(agg, urns[0])
    validate(el)
    assert el.get("fpga") == "bee1/fpga0"
    agg.perform([urns[0]], "geni_restart")
    assert agg.status(urns[0])["geni_operational_status"] == "geni_configuring"
    with pytest.raises(Unsupported, match="geni_start"):
        agg.perform([urns[0]], "geni_explode")
    assert agg.delete(urns + [sliver("nothing")]) == urns
    assert "bee1/fpga0" not in agg.backend.loaded
    with pytest.raises(SearchFailed):
        agg.status(urns[0])


def test_fpga_slivers_refuse_foreign_or_unfit_bitstreams_and_run_out(agg):
    with pytest.raises(SearchFailed, match="catalogue"):
        agg.allocate(sliver("x"), BOB, FpgaRequest("fpga-bitstream", agg.bee_bit.ref))
    nf = agg.catalogue.upload(ALICE, "nf.bit", build_bitfile("nf", "xc2vp50ff1152", b"\x02" * 64))
    assert agg.allocate(sliver("nf"), ALICE, FpgaRequest("fpga-bitstream", nf.ref)).fpga == "nf1/fpga0"
    with pytest.raises(InsufficientNodes, match="in use"):
        agg.allocate(sliver("nf2"), ALICE, FpgaRequest("fpga-bitstream", nf.ref))
    other = agg.catalogue.upload(ALICE, "v4.bit", build_bitfile("v4", "xc4vfx100", b"\x03" * 64))
    with pytest.raises(InsufficientNodes, match="xc4vfx100"):
        agg.allocate(sliver("v4"), ALICE, FpgaRequest("fpga-bitstream", other.ref))
    with pytest.raises(SearchFailed, match="no FPGA board"):
        agg.allocate(sliver("b"), ALICE, FpgaRequest("fpga-bitstream", nf.ref, board="nowhere"))


# ---- virtual routers ------------------------------------------------------------------------------------------
def test_virtual_router_slivers_forward_through_hardware_or_software(agg):
    fast, slow = sliver("fast"), sliver("slow")
    assert agg.allocate(fast, ALICE, FpgaRequest("virtual-router", bandwidth_mbps=800, table_size=500)).placement == "hardware"
    assert agg.allocate(slow, BOB, FpgaRequest("virtual-router", bandwidth_mbps=5)).placement == "software"
    routes = {fast: table(200, 1), slow: random_table(50, 2, min_length=8)}
    agg.provision([fast, slow], routes=routes)
    with pytest.raises(BadArgs, match="not forwarding yet"):
        agg.forward(fast, 0)
    agg.clock.advance(timedelta(seconds=20))
    assert agg.status(fast)["geni_operational_status"] == "geni_ready"
    for urn, rs in routes.items():  # every prefix's last address forwards as longest-prefix match says
        addrs = probe_addresses(rs, 0, 0)[len(rs):]
        ports, nhs = ReferenceLpm(rs).lookup_many(addrs)
        assert [agg.forward(urn, a) for a in addrs.tolist()] == list(zip(ports.tolist(), nhs.tolist(), strict=True))
    hw = agg.status(fast)
    assert hw["engine"] == hw["fpga"] and agg.backend.read_counters(agg.fpgas[hw["fpga"]])["design"] == \
        "slicex-virtual-router"
    image = agg.backend.images[hw["fpga"]]  # what the board was loaded with answers like the compiler
    p, length, port, nh = routes[fast][0]
    assert image.lookup(0, p) == agg.forward(fast, p)
    validate(manifest_element(agg, slow))
    agg.delete([fast])
    assert agg.forward(slow, routes[slow][0][0]) is not None


def test_a_router_moves_back_to_hardware_by_timed_steps_forwarding_all_along(agg):
    """When its board leaves maintenance, a router the maintenance moved to software goes back by the timed
    steps: placed in hardware at once, forwarding from software (busy) until the FPGA holds its table."""
    u = sliver("r")
    agg.allocate(u, ALICE, FpgaRequest("virtual-router", "", 400, 100, "nf1"))
    table = bgp_like(100, 3)
    agg.provision([u], routes={u: table})
    agg.clock.advance(timedelta(seconds=30))
    agg.start_maintenance("nf1")
    agg.clock.advance(timedelta(seconds=13))
    assert agg.status(u)["engine"] == "software"
    [step] = agg.end_maintenance("nf1")
    assert (step.action, step.source) == ("sw->hw", "software")
    st = agg.status(u)
    assert st["placement"] == "hardware" and st["engine"] == "software"  # still forwarding from software
    assert st["geni_operational_status"] == "geni_ready_busy"
    probe = table[0][0]
    before = agg.forward(u, probe)
    agg.clock.advance(timedelta(seconds=3))
    assert agg.status(u)["engine"] == st["fpga"] and agg.forward(u, probe) == before


def test_reconfiguring_a_shared_fpga_keeps_its_routers_forwarding(agg):
    urns = [sliver(f"v{i}") for i in range(2)]
    tables = {}
    for i, u in enumerate(urns):
        agg.allocate(u, ALICE, FpgaRequest("virtual-router", bandwidth_mbps=400, board="nf1"))
        tables[u] = table(100, 10 + i)
    agg.provision(urns, routes=tables)
    agg.clock.advance(timedelta(seconds=30))
    fpga = agg.status(urns[0])["fpga"]
    steps = agg.reconfigure(fpga)
    assert [s.action for s in steps] == ["hw->sw", "hw->sw", "reprogram", "sw->hw", "sw->hw"]
    probes = {u: [p for p, _, _, _ in t[:20]] for u, t in tables.items()}
    want = {u: [agg.forward(u, a) for a in probes[u]] for u in urns}
    for second in range(0, 22):  # every second of the plan, every router answers, and the same
        for u in urns:
            assert [agg.forward(u, a) for a in probes[u]] == want[u], f"at {second}s"
        engine = agg.status(urns[0])["engine"]
        assert engine == ("software" if 12 <= second < 20 else fpga)
        agg.clock.advance(timedelta(seconds=1))
    assert agg.status(urns[0])["geni_operational_status"] == "geni_ready" and not agg.down


def test_no_room_is_insufficient_bandwidth_or_nodes(agg):
    agg.software_planes = 1
    agg.allocate(sliver("s"), ALICE, FpgaRequest("virtual-router", bandwidth_mbps=1))
    for i in range(5):  # each BEE2 FPGA has 10 Gbps of line rate, the NetFPGA 1 Gbps
        assert agg.allocate(sliver(f"h{i}"), ALICE, FpgaRequest("virtual-router", bandwidth_mbps=10_000)).placement \
            == "hardware"
    with pytest.raises(InsufficientBandwidth, match="10000 Mbps: 14 hardware planes are free with 0 Mbps"):
        agg.allocate(sliver("late"), ALICE, FpgaRequest("virtual-router", bandwidth_mbps=10_000))
    with pytest.raises(InsufficientNodes, match="0 of 1 software planes"):
        agg.allocate(sliver("tiny"), ALICE, FpgaRequest("virtual-router", bandwidth_mbps=1))
    agg.delete([sliver("h0")])
    assert agg.allocate(sliver("late"), ALICE, FpgaRequest("virtual-router", bandwidth_mbps=10_000)).placement == "hardware"


def test_state_survives_a_restart(agg, tmp_path):
    u = sliver("r")
    agg.allocate(u, ALICE, FpgaRequest("virtual-router", bandwidth_mbps=700))
    routes = table(100, 5)
    agg.provision([u], routes={u: routes})
    agg.clock.advance(timedelta(seconds=20))
    want = [agg.forward(u, p) for p, _, _, _ in routes]
    again = FpgaAggregate(agg.boards, agg.catalogue, EmulatedFpgaBackend(), agg.clock, agg.store, tmp_path / "work",
                          software_planes_per_board=2)
    assert [again.forward(u, p) for p, _, _, _ in routes] == want


def test_a_table_too_big_for_the_sram_is_refused_and_the_fpgas_other_router_kept(agg):
    """Provision compiles the new router's table into the FPGA's shared one; a table that does not fit is
    refused and the router already running there keeps forwarding."""
    u, big = sliver("r"), sliver("big")
    agg.allocate(u, ALICE, FpgaRequest("virtual-router", bandwidth_mbps=400, board="nf1"))
    small = table(50, 6)
    agg.provision([u], routes={u: small})
    agg.clock.advance(timedelta(seconds=30))
    before = [agg.forward(u, p) for p, _, _, _ in small]
    assert all(before)
    agg.allocate(big, ALICE, FpgaRequest("virtual-router", bandwidth_mbps=400, board="nf1"))
    assert agg.sliver(big).fpga == agg.sliver(u).fpga
    spread = [((i << 19) | 0x100, 24, 1, i) for i in range(65)]  # 65 /19 blocks with a /24: 65 L2 sets
    with pytest.raises(InsufficientNodes, match="L2 bank full"):
        agg.provision([big], routes={big: spread})
    assert [agg.forward(u, p) for p, _, _, _ in small] == before


# ---- the worked example in docs/examples (docs/fpga-aggregate.md, "Using it with omni") -------------------------
EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def test_fpga_worked_example_places_a_whole_fpga_and_a_virtual_router():
    from broker.placement import plan
    from rspec.request import parse_request
    from rspec.substrate import check_substrate, load_substrate

    sub = load_substrate(EXAMPLES / "fpga-site.yaml")
    assert [b["name"] for b in sub.fpga_boards] == ["nf-1", "bee2-1"]
    assert all("FPGA" not in w for w in check_substrate(sub))
    ref = "sha256:" + "ab" * 32
    whole = parse_request((EXAMPLES / "fpga-whole.xml").read_text().replace("BITSTREAM_REF", ref))
    [p] = plan(sub, whole, set(), "reject", {ref: "xc2vp70ff1704"})
    # a whole FPGA takes its own key and as many of its board's router slots as it has hardware planes
    assert p.keys == ("fpga:bee2-1/fpga0", *(f"router:bee2-1:{k}" for k in range(4)))
    assert p.details["sliver_type"] == "fpga-bitstream"
    router = parse_request((EXAMPLES / "fpga-virtual-router.xml").read_text())
    [p] = plan(sub, router, set(), "reject", {})
    # a router takes a slot of a board; which plane it runs in is the FPGA model's choice (resources/fpga.py)
    assert p.keys == ("router:nf-1:0",) and p.details["board"] == "nf-1" and "placement" not in p.details


# ---- routes in the request; the model as the AM's driver uses it ------------------------------------------------
def test_routes_parse_to_the_table_and_back():
    el = request_node('<fpga:sliver type="virtual-router" bandwidth_mbps="50" table_size="2">'
                      '<fpga:route prefix="10.0.0.0/8" port="1" next_hop="192.0.2.1"/>'
                      '<fpga:route prefix="10.1.2.0/24" port="6" next_hop="198.51.100.9"/></fpga:sliver>')
    validate(el[0])
    req = parse_fpga_request(el, "n")
    assert req.table() == [(10 << 24, 8, 1, 0xC0000201), ((10 << 24) | (1 << 16) | (2 << 8), 24, 6, 0xC6336409)]
    again = sliver_element(req)
    validate(again)
    assert parse_fpga_request(request_node(etree.tostring(again).decode()), "n") == req


@pytest.mark.parametrize("route, message", [
    ('prefix="10.0.0.1/8" port="1" next_hop="192.0.2.1"', "host bits"),
    ('prefix="10.0.0.0/8" port="7" next_hop="192.0.2.1"', "port must be 0-6"),
    ('prefix="10.0.0.0/8" port="x" next_hop="192.0.2.1"', "invalid literal"),
    ('prefix="10.0.0.0/8" port="1" next_hop="300.0.0.1"', "next_hop"),
])
def test_bad_routes_say_which(route, message):
    el = request_node(f'<fpga:sliver type="virtual-router"><fpga:route {route}/></fpga:sliver>')
    with pytest.raises(BadArgs, match=message):
        parse_fpga_request(el, "n")


def test_routes_only_for_virtual_routers_and_within_table_size():
    route = '<fpga:route prefix="10.0.0.0/8" port="1" next_hop="192.0.2.1"/>'
    with pytest.raises(BadArgs, match="belongs in a virtual-router"):
        parse_fpga_request(request_node(f'<fpga:sliver type="fpga-bitstream" bitstream="sha256:{"0" * 64}">'
                                        f'{route}</fpga:sliver>'), "n")
    with pytest.raises(BadArgs, match="exceed table_size=1"):
        parse_fpga_request(request_node(f'<fpga:sliver type="virtual-router" table_size="1">{route}{route}'
                                        f'</fpga:sliver>'), "n")


def test_manifest_reports_placement_and_the_cam_the_shared_table_allocated(agg):
    a, b = virtual_router_tables(40, routers=2, overlap=0.3, seed=5)
    for name, routes in (("ra", a), ("rb", b)):
        agg.allocate(sliver(name), ALICE, FpgaRequest("virtual-router", "", 400, 100, "nf1"))
        agg.provision([sliver(name)], routes={sliver(name): routes})
    fib = agg.fibs["nf1/fpga0"]
    assert len(fib.cam) > 0
    pa, pb = agg.placement_of(sliver("ra")), agg.placement_of(sliver("rb"))
    assert (pa["placement"], pa["fpga"], pa["board"]) == ("hardware", "nf1/fpga0", "nf1")
    assert pa["cam_entries"] == pb["cam_entries"] == len(fib.cam)
    assert pa["cam_bits"] == len(fib.cam) * fib.cam_entry_bits()
    assert pa["router_cam_entries"] + pb["router_cam_entries"] == len(fib.cam)
    el = manifest_element(agg, sliver("rb"))
    validate(el)
    assert el.get("cam_entries") == str(len(fib.cam))


def test_forward_answers_from_the_image_the_board_holds(agg):
    routes = table(300, 3)
    agg.allocate(sliver("r"), ALICE, FpgaRequest("virtual-router", "", 400, 1000, "nf1"))
    agg.provision([sliver("r")], routes={sliver("r"): routes})
    agg.clock.advance(timedelta(seconds=30))
    addresses = probe_addresses(routes, 50, seed=1)
    ports, hops = ReferenceLpm(routes).lookup_many(addresses)
    for addr, port, hop in zip(addresses.tolist(), ports.tolist(), hops.tolist(), strict=True):
        assert agg.forward(sliver("r"), addr) == (None if port == 7 else (port, hop))
    assert agg.backend.read_counters(agg.fpgas["nf1/fpga0"])["lookups"] == len(addresses)


def test_a_whole_fpga_on_the_brokers_choice_moves_routers_off_it_first(agg):
    agg.allocate(sliver("r"), ALICE, FpgaRequest("virtual-router", "", 400, 100, "bee1"))
    agg.provision([sliver("r")], routes={sliver("r"): table(50, 2)})
    on = agg.sliver(sliver("r")).fpga
    assert on.startswith("bee1/")
    with pytest.raises(InsufficientNodes, match="is a 2vp50ff1152"):
        agg.allocate(sliver("w0"), ALICE, FpgaRequest("fpga-bitstream", agg.bee_bit.ref), fpga="nf1/fpga0")
    agg.allocate(sliver("w"), ALICE, FpgaRequest("fpga-bitstream", agg.bee_bit.ref), fpga=on)
    r = agg.sliver(sliver("r"))
    assert r.fpga != on and r.placement == "hardware" and not r.moves  # moved at once: its FPGA is taken
    assert agg.sliver(sliver("w")).fpga == on
    with pytest.raises(InsufficientNodes, match="already runs whole-FPGA sliver"):
        agg.allocate(sliver("w2"), ALICE, FpgaRequest("fpga-bitstream", agg.bee_bit.ref), fpga=on)


def test_board_maintenance_migrates_its_routers_through_the_scheduler(agg):
    agg.allocate(sliver("r"), ALICE, FpgaRequest("virtual-router", "", 400, 100, "nf1"))
    agg.provision([sliver("r")], routes={sliver("r"): table(50, 4)})
    agg.clock.advance(timedelta(seconds=30))
    steps = agg.start_maintenance("nf1")
    assert [(s.action, s.source, s.target) for s in steps] == [("hw->sw", "nf1/fpga0", "software")]
    assert agg.placement_of(sliver("r"))["fpga"] == "nf1/software"
    agg.clock.advance(timedelta(seconds=13))
    steps = agg.end_maintenance("nf1")
    assert [(s.action, s.target) for s in steps] == [("sw->hw", "nf1/fpga0")]
    assert agg.placement_of(sliver("r"))["placement"] == "hardware"
    agg.allocate(sliver("w"), ALICE, FpgaRequest("fpga-bitstream", agg.bee_bit.ref))
    with pytest.raises(InsufficientNodes, match="whole-FPGA slivers"):
        agg.start_maintenance("bee1")
    with pytest.raises(SearchFailed, match="no FPGA board"):
        agg.start_maintenance("nope")
