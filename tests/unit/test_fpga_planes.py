"""Placement, migration with zero loss, bitstreams, boards, programming time, the backend seam."""

from __future__ import annotations

import numpy as np
import pytest

from fpga_aggregate.backend import EmulatedFpgaBackend
from fpga_aggregate.bitstreams import BitstreamCatalogue, build_bitfile, parse_bit_header
from fpga_aggregate.boards import BEE2, NETFPGA, BoardError, boards_from_config
from fpga_aggregate.dataplane import EmulatedDataPlane, SoftwareTable, run_plan
from fpga_aggregate.fib import SharedFib
from fpga_aggregate.migration import (
    average_bandwidth,
    bandwidth_report,
    migration_steps,
    reconfiguration_plan,
    seconds_in_software,
)
from fpga_aggregate.placement import SOFTWARE, Capacity, HardwareSlot, VirtualNetwork, schedule
from fpga_aggregate.programming import programming_seconds
from slicex.errors import BadArgs, SearchFailed, TooBig
from slicex.store.sqlite_store import SqliteStore
from tests.fpga_oracle import ReferenceLpm, random_table


def capacity(fpgas=1, planes=3, sw=10):
    return Capacity(tuple(HardwareSlot(f"nf{i}/fpga0", planes, 1000.0) for i in range(fpgas)), sw, 11.0)


# ---- placement --------------------------------------------------------------------------------------------------
def test_small_networks_go_to_software_large_to_hardware():
    nets = [VirtualNetwork("a", 5), VirtualNetwork("b", 400), VirtualNetwork("c", 300), VirtualNetwork("d", 8)]
    placement, _ = schedule(nets, capacity())
    assert placement.where["a"] == SOFTWARE and placement.where["d"] == SOFTWARE
    assert placement.where["b"] != SOFTWARE and placement.where["c"] != SOFTWARE
    assert placement.total_mbps == 5 + 400 + 300 + 8


def test_hardware_capacity_overflows_to_software_and_reports_unplaced():
    nets = [VirtualNetwork(f"n{i}", 500) for i in range(6)]
    placement, _ = schedule(nets, capacity(fpgas=1, planes=3, sw=2))
    assert len(placement.on("nf0/fpga0")) == 2  # 1 Gbps line rate: two 500-Mbps planes fill it
    assert len(placement.on(SOFTWARE)) == 2
    assert len(placement.unplaced) == 2


def test_planes_per_fpga_and_table_room_limit_hardware():
    nets = [VirtualNetwork(f"n{i}", 100) for i in range(5)]
    placement, _ = schedule(nets, capacity(fpgas=1, planes=3, sw=10))
    assert len(placement.on("nf0/fpga0")) == 3 and len(placement.on(SOFTWARE)) == 2
    cap = Capacity((HardwareSlot("f", 3, 1000.0, max_table_entries=10_000),), 10)
    big, _ = schedule([VirtualNetwork("a", 100, 8000), VirtualNetwork("b", 90, 8000)], cap)
    assert big.where == {"a": "f", "b": SOFTWARE}


def test_small_networks_use_free_hardware_when_software_is_full():
    placement, _ = schedule([VirtualNetwork("a", 5), VirtualNetwork("b", 5)], capacity(sw=1))
    assert sorted(placement.where.values()) == ["nf0/fpga0", SOFTWARE] and placement.total_mbps == 10


def test_rerun_keeps_placements_and_emits_migrations_when_demand_changes():
    nets = [VirtualNetwork("a", 300), VirtualNetwork("b", 300)]
    first, moves = schedule(nets, capacity(fpgas=2))
    assert moves == []
    again, moves = schedule(list(reversed(nets)), capacity(fpgas=2), current=first.where)
    assert again.where == first.where and moves == []
    shrunk, moves = schedule([VirtualNetwork("a", 5), VirtualNetwork("b", 300)], capacity(fpgas=2), first.where)
    assert [(m.network, m.source, m.target) for m in moves] == [("a", first.where["a"], SOFTWARE)]
    grown, moves = schedule([VirtualNetwork("a", 500), VirtualNetwork("b", 300)], capacity(fpgas=2), shrunk.where)
    assert [(m.network, m.source) for m in moves] == [("a", SOFTWARE)] and grown.where["a"] != SOFTWARE


def test_scheduler_is_deterministic_for_1000_networks():
    nets = [VirtualNetwork(f"v{i}", [2, 5, 8, 50, 200, 600][i % 6]) for i in range(1000)]
    cap = Capacity(tuple(HardwareSlot(f"nf{i}/fpga0", 3, 1000.0) for i in range(64)), 800)
    a, _ = schedule(nets, cap)
    b, _ = schedule(list(reversed(nets)), cap)
    assert a.where == b.where
    hw = [n for n, w in a.where.items() if w != SOFTWARE]
    assert sum(a.delivered_mbps[n] for n in hw) == 64 * 1000  # every FPGA's line rate is used...
    assert all(a.delivered_mbps[n] > 11 for n in hw)  # ...by planes that get more than software would give
    assert len(a.on(SOFTWARE)) == 800 and len(a.unplaced) == 1000 - len(hw) - 800


# ---- migration and the emulated data plane -------------------------------------------------------------------
def test_reconfiguration_plan_times():
    steps = reconfiguration_plan("nf0/fpga0", ["b", "a"], start=100.0)
    assert [(s.action, s.network, s.start, s.end) for s in steps] == [
        ("hw->sw", "a", 100.0, 112.0), ("hw->sw", "b", 100.0, 112.0), ("reprogram", "", 112.0, 117.0),
        ("sw->hw", "a", 117.0, 120.0), ("sw->hw", "b", 117.0, 120.0)]
    assert seconds_in_software(steps) == 8.0  # from the end of the move out to the end of the move back


def _plane_with_two_routers(buffer=4096):
    tables = [random_table(300, 1, min_length=8), random_table(300, 2, min_length=8)]
    fib = SharedFib(routers=2, l2_sets=1024)
    for vid, t in enumerate(tables):
        fib.load(vid, t)
    plane = EmulatedDataPlane(buffer_packets=buffer)
    plane.add_fpga("nf0/fpga0", 1000.0)
    for vid, t in enumerate(tables):
        plane.add_network(f"n{vid}", "nf0/fpga0", lambda a, v=vid: _hw(fib, v, a), SoftwareTable(t))
    traffic = {f"n{vid}": [p | 1 for p, _, _, _ in t] for vid, t in enumerate(tables)}
    return plane, tables, traffic


def _hw(fib, vid, addr):
    r = fib.lookup(vid, addr)
    return None if r is None else (r.port, r.next_hop)


def test_reconfiguration_with_migration_forwards_every_packet_correctly():
    plane, tables, traffic = _plane_with_two_routers()
    steps = reconfiguration_plan("nf0/fpga0", ["n0", "n1"])
    run_plan(plane, steps, traffic, {"n0": 400.0, "n1": 400.0})  # 400 pps × 1500 B = 4.8 Mbps < 11 Mbps
    assert plane.dropped == 0
    for vid, t in enumerate(tables):
        n = plane.networks[f"n{vid}"]
        assert n.offered > 8000 and len(n.forwarded) + n.unroutable == n.offered and not n.queue
        engines = {e for _, _, _, e in n.forwarded}
        assert engines == {"nf0/fpga0", SOFTWARE}  # it really ran in software for a while
        addrs = np.array([a for a, _, _, _ in n.forwarded])
        want_port, want_nh = ReferenceLpm(t).lookup_many(addrs)
        assert [(p, h) for _, p, h, _ in n.forwarded] == list(zip(want_port.tolist(), want_nh.tolist(), strict=True))
        assert n.engine == "nf0/fpga0"


def test_reconfiguring_without_migration_loses_packets():
    plane, _, traffic = _plane_with_two_routers(buffer=256)
    naive = [s for s in reconfiguration_plan("nf0/fpga0", ["n0", "n1"]) if s.action == "reprogram"]
    run_plan(plane, naive, traffic, {"n0": 400.0, "n1": 400.0})
    assert plane.dropped > 0


def test_scheduler_migrations_become_steps():
    _, moves = schedule([VirtualNetwork("a", 5)], capacity(), current={"a": "nf0/fpga0"})
    [step] = migration_steps(moves)
    assert (step.action, step.source, step.target, step.seconds) == ("hw->sw", "nf0/fpga0", SOFTWARE, 12.0)


def test_average_bandwidth_report():
    assert average_bandwidth(11, 1000, 20, 100) == pytest.approx((11 * 20 + 1000 * 80) / 100)
    assert average_bandwidth(11, 1000, 20, 10) == 11
    rows = bandwidth_report([60.0, 3600.0])
    assert rows[0]["b_avg_mbps"] == pytest.approx((11 * 8 + 1000 * 52) / 60)
    assert rows[0]["b_avg_mbps"] < rows[1]["b_avg_mbps"] < 1000


# ---- programming, boards, bitstreams, backend -------------------------------------------------------------------
def test_programming_time_model():
    assert [programming_seconds(k) for k in range(1, 5)] == [11, 17, 24, 30]
    assert programming_seconds(5) == pytest.approx(30 + 19 / 3)
    assert programming_seconds(0) == 0


def test_boards_from_config():
    boards = boards_from_config([{"name": "b1", "model": "BEE2"}, {"name": "n1", "model": "netfpga"}])
    assert len(boards[0].fpgas) == 4 and boards[0].fpgas[0].hardware_planes == 4
    assert boards[0].model.ports_per_fpga == 4 and boards[0].model.port_mbps == 10_000
    assert boards[1].fpgas[0].hardware_planes == 3  # NetFPGA defaults to the external-SRAM table
    assert NETFPGA.sram_banks == 2 and NETFPGA.sram_bank_bits == 18 * 2**20
    with pytest.raises(BoardError, match="not one of"):
        boards_from_config([{"name": "x", "model": "Stratix"}])
    with pytest.raises(BoardError, match="two FPGA boards"):
        boards_from_config([{"name": "x", "model": "BEE2"}, {"name": "x", "model": "BEE2"}])


def test_bitstream_catalogue(tmp_path):
    cat = BitstreamCatalogue(SqliteStore(":memory:"), tmp_path, max_bytes=4_000_000, max_user_bytes=6_000_000)
    good = build_bitfile("router", "xc2vp50ff1152", b"\x00" * 1000)
    assert parse_bit_header(good).part == "xc2vp50ff1152"
    b = cat.upload("alice", "router.bit", good)
    assert cat.get("alice", b.ref).sha256 == b.sha256
    with pytest.raises(SearchFailed):
        cat.get("bob", b.ref)
    fpga = boards_from_config([{"name": "n1", "model": "NetFPGA"}])[0].fpgas[0]
    cat.check_fits(b, fpga)
    bee = boards_from_config([{"name": "b1", "model": "BEE2"}])[0].fpgas[0]
    with pytest.raises(BadArgs, match="built for"):
        cat.check_fits(b, bee)
    big = cat.upload("alice", "big.bit", build_bitfile("big", "2vp50ff1152", b"\x00" * (NETFPGA.bitstream_bytes + 1)))
    with pytest.raises(BadArgs, match="takes"):
        cat.check_fits(big, fpga)
    with pytest.raises(TooBig, match="at most"):
        cat.upload("alice", "huge.bit", b"\x00" * 4_000_001)
    with pytest.raises(TooBig, match="past its"):
        cat.upload("alice", "more.bit", build_bitfile("m", "2vp50ff1152", b"\x01" * 3_700_000))
    with pytest.raises(BadArgs, match="not a Xilinx"):
        cat.upload("alice", "junk.bit", b"hello")
    (tmp_path / f"{b.sha256}.bit").write_bytes(good + b"x")
    with pytest.raises(BadArgs, match="no longer matches"):
        cat.get("alice", b.ref)
    assert cat.delete("alice", big.ref) and not (tmp_path / f"{big.sha256}.bit").exists()
    assert [x.name for x in cat.list("alice")] == ["router.bit"]
    assert BEE2.device == "2vp70ff1704"


def test_a_users_bitstreams_are_listed_without_reading_the_other_users_catalogues(tmp_path):
    """Every Allocate lists its owner's bitstreams: it read every user's catalogue."""
    store = SqliteStore(":memory:")
    cat = BitstreamCatalogue(store, tmp_path)
    for user in ("alice", "bob", "alice2"):
        cat.upload(user, f"{user}.bit", build_bitfile(user, "xc2vp50ff1152", user.encode() * 100))
    read = []
    real_scan = cat.store.scan

    def scan(table, prefix=""):
        docs = real_scan(table, prefix)
        read.extend(d["user"] for d in docs)
        return docs

    cat.store.scan = scan
    assert [b.name for b in cat.list("alice")] == ["alice.bit"]
    assert read == ["alice"]


def test_emulated_backend_checks_parts_times_concurrent_programming_and_reads_tables_back(tmp_path):
    bee = boards_from_config([{"name": "b1", "model": "BEE2"}])[0].fpgas
    good = tmp_path / "good.bit"
    good.write_bytes(build_bitfile("d", "xc2vp70ff1704", b"\0" * 64))
    wrong = tmp_path / "wrong.bit"
    wrong.write_bytes(build_bitfile("d", "xc2vp50ff1152", b"\0" * 64))
    backend = EmulatedFpgaBackend()
    assert "emulated" in backend.description and backend.emulated
    assert backend.program([(bee[0], str(good)), (bee[1], str(good))]) == 17
    with pytest.raises(BadArgs, match="bitstream is for"):
        backend.program([(bee[2], str(good)), (bee[3], str(wrong))])
    assert "b1/fpga2" not in backend.loaded  # all or nothing
    fib = SharedFib(routers=1, l2_sets=2)
    fib.insert(0, 0x0A000000, 8, 1, 1)
    fib.export(tmp_path / "fib")
    backend.load_table(bee[3], str(tmp_path / "fib"))
    assert backend.images["b1/fpga3"].lookup(0, 0x0A000001) == (1, 1)
    assert backend.read_counters(bee[0]) == {"design": "d", "programmings": 1}
    with pytest.raises(BadArgs, match="lacks"):
        backend.load_table(bee[2], str(tmp_path))
    backend.release(bee[0])
    assert set(backend.loaded) == {"b1/fpga1", "b1/fpga3"}
