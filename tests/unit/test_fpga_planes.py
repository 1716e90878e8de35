"""Placement, migration with zero loss, bitstreams, boards, programming time."""

from __future__ import annotations

import pytest

from fpga_aggregate.bitstreams import BitstreamCatalogue, build_bitfile, parse_bit_header
from fpga_aggregate.boards import BEE2, NETFPGA, BoardError, boards_from_config
from fpga_aggregate.dataplane import EmulatedDataPlane, run_with_traffic
from fpga_aggregate.fib import SharedFib
from fpga_aggregate.migration import average_bandwidth, reconfiguration_plan, seconds_in_software
from fpga_aggregate.placement import SOFTWARE, Capacity, HardwareSlot, VirtualNetwork, schedule
from fpga_aggregate.programming import programming_seconds
from slicex.errors import BadArgs, SearchFailed, TooBig
from slicex.store.sqlite_store import SqliteStore


def capacity(fpgas=1, planes=3, sw=10):
    return Capacity(tuple(HardwareSlot(f"nf{i}/fpga0", planes, 1000.0) for i in range(fpgas)), sw, 11.0)


def test_small_networks_go_to_software_large_to_hardware():
    nets = [VirtualNetwork("a", 5), VirtualNetwork("b", 400), VirtualNetwork("c", 300), VirtualNetwork("d", 8)]
    placement, _ = schedule(nets, capacity())
    assert placement.where["a"] == SOFTWARE and placement.where["d"] == SOFTWARE
    assert placement.where["b"] != SOFTWARE and placement.where["c"] != SOFTWARE
    assert placement.total_mbps == 5 + 400 + 300 + 8


def test_hardware_capacity_overflows_to_software_and_reports_unplaced():
    nets = [VirtualNetwork(f"n{i}", 500) for i in range(6)]
    placement, _ = schedule(nets, capacity(fpgas=1, planes=3, sw=2))
    hw = [n for n, w in placement.where.items() if w != SOFTWARE]
    assert len(hw) == 2  # 1 Gbps line rate: two 500-Mbps planes fill it; a third would get nothing
    assert len([w for w in placement.where.values() if w == SOFTWARE]) == 2
    assert len(placement.unplaced) == 2


def test_rerun_keeps_placements_and_emits_migrations_when_demand_changes():
    nets = [VirtualNetwork("a", 300), VirtualNetwork("b", 300)]
    first, moves = schedule(nets, capacity(fpgas=2))
    assert moves == []
    again, moves = schedule(nets, capacity(fpgas=2), current=first.where)
    assert again.where == first.where and moves == []
    shrunk, moves = schedule([VirtualNetwork("a", 5), VirtualNetwork("b", 300)], capacity(fpgas=2), first.where)
    assert [(m.network, m.target) for m in moves] == [("a", SOFTWARE)]


def test_reconfiguration_migrates_unchanged_planes_with_zero_loss():
    fib = SharedFib(routers=2, l2_sets=8)
    fib.insert(0, 0x0A000000, 8, 1, 100)
    fib.insert(1, 0x14000000, 8, 2, 200)
    tables = {"a": lambda addr: _route(fib, 0, addr), "b": lambda addr: _route(fib, 1, addr)}
    plane = EmulatedDataPlane(tables, {"a": "nf0/fpga0", "b": "nf0/fpga0"})
    steps = reconfiguration_plan("nf0/fpga0", ["a", "b"])
    run_with_traffic(plane, steps, {"a": "nf0/fpga0", "b": "nf0/fpga0"},
                     {"a": [0x0A000001, 0x0A0000FF], "b": [0x14000001]})
    assert sum(plane.dropped.values()) == 0
    assert plane.delivered["a"] > 150 and plane.location == {"a": "nf0/fpga0", "b": "nf0/fpga0"}
    assert seconds_in_software(steps) == 20.0


def test_reconfiguring_without_migration_loses_packets():
    plane = EmulatedDataPlane({"a": lambda addr: (1, 1)}, {"a": "nf0/fpga0"})
    naive = [s for s in reconfiguration_plan("nf0/fpga0", ["a"]) if s.action == "reprogram"]
    run_with_traffic(plane, naive, {}, {"a": [1]})
    assert plane.dropped["a"] > 0


def test_average_bandwidth():
    assert average_bandwidth(11, 1000, 20, 100) == pytest.approx((11 * 20 + 1000 * 80) / 100)
    assert average_bandwidth(11, 1000, 20, 10) == 11


def _route(fib, vid, addr):
    r = fib.lookup(vid, addr)
    return None if r is None else (r.port, r.next_hop)


def test_programming_time_model():
    assert [programming_seconds(k) for k in range(1, 5)] == [11, 17, 24, 30]
    assert programming_seconds(5) == pytest.approx(30 + 19 / 3)


def test_boards_from_config():
    boards = boards_from_config([{"name": "b1", "model": "BEE2"}, {"name": "n1", "model": "netfpga"}])
    assert len(boards[0].fpgas) == 4 and boards[0].fpgas[0].hardware_planes == 4
    assert boards[1].fpgas[0].hardware_planes == 3  # NetFPGA defaults to the external-SRAM table
    with pytest.raises(BoardError, match="not one of"):
        boards_from_config([{"name": "x", "model": "Stratix"}])


def test_bitstream_catalogue(tmp_path):
    cat = BitstreamCatalogue(SqliteStore(":memory:"), tmp_path, max_bytes=4_000_000)
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
    with pytest.raises(TooBig):
        cat.upload("alice", "huge.bit", b"\x00" * 4_000_001)
    with pytest.raises(BadArgs, match="not a Xilinx"):
        cat.upload("alice", "junk.bit", b"hello")
    assert BEE2.device == "2vp70ff1704"


def test_emulated_backend_checks_parts_and_times_concurrent_programming(tmp_path):
    from fpga_aggregate.backend import EmulatedFpgaBackend

    bee = boards_from_config([{"name": "b1", "model": "BEE2"}])[0].fpgas
    good = tmp_path / "good.bit"
    good.write_bytes(build_bitfile("d", "xc2vp70ff1704", b"\0" * 64))
    wrong = tmp_path / "wrong.bit"
    wrong.write_bytes(build_bitfile("d", "xc2vp50ff1152", b"\0" * 64))
    backend = EmulatedFpgaBackend()
    assert backend.program([(bee[0], str(good)), (bee[1], str(good))]) == 17
    with pytest.raises(BadArgs, match="bitstream is for"):
        backend.program([(bee[2], str(wrong))])
    fib = SharedFib(routers=1, l2_sets=2)
    fib.insert(0, 0x0A000000, 8, 1, 1)
    fib.export(tmp_path / "fib")
    backend.load_table(bee[3], str(tmp_path / "fib"))
    assert set(backend.loaded) == {"b1/fpga0", "b1/fpga1", "b1/fpga3"}
