"""The shared forwarding table: every lookup equals a reference longest-prefix match, through inserts,
deletes, relocations and the exported image."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fpga_aggregate.fib import (
    INDIRECT,
    L2_SETS_PER_BANK,
    NO_ROUTE,
    RELOCATION_BASE,
    ExportedImage,
    SharedFib,
    TableFull,
)
from fpga_aggregate.tables import virtual_router_tables
from tests.fpga_oracle import ReferenceLpm, probe_addresses, random_table


def check(fib: SharedFib, vid: int, routes, extra: int = 2000, seed: int = 0) -> None:
    addrs = probe_addresses(routes, extra, seed)
    got_port, got_nh = fib.lookup_many(vid, addrs)
    want_port, want_nh = ReferenceLpm(routes).lookup_many(addrs)
    wrong = np.flatnonzero((got_port != want_port) | ((want_port != NO_ROUTE) & (got_nh != want_nh)))
    assert not len(wrong), f"router {vid}: {len(wrong)} wrong lookups, first {hex(int(addrs[wrong[0]]))}"


def as_list(routes: dict) -> list:
    return [(p, ln, port, nh) for (p, ln), (port, nh) in routes.items()]


route = st.tuples(st.integers(0, 2**32 - 1), st.integers(8, 32), st.integers(0, 6), st.integers(0, 2**32 - 1))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(route, max_size=30), min_size=2, max_size=4), st.lists(st.booleans(), min_size=4, max_size=4),
       st.data())
def test_random_tables_insert_delete_match_reference(tables, defaults, data):
    fib = SharedFib(routers=len(tables), l2_sets=512)
    current = []
    for vid, table in enumerate(tables):
        routes = {}
        if defaults[vid]:
            routes[(0, 0)] = (vid, 1000 + vid)
            fib.insert(vid, 0, 0, vid, 1000 + vid)
        for p, length, port, nh in table:
            p = p >> (32 - length) << (32 - length)
            routes[(p, length)] = (port, nh)
            fib.insert(vid, p, length, port, nh)
        current.append(routes)
    for vid, routes in enumerate(current):
        check(fib, vid, as_list(routes), extra=300, seed=vid)
    for vid, routes in enumerate(current):
        doomed = data.draw(st.lists(st.sampled_from(sorted(routes)), unique=True)) if routes else []
        for p, length in doomed:
            assert fib.delete(vid, p, length)
            del routes[(p, length)]
        if (1 << 24, 8) not in routes:
            assert not fib.delete(vid, 1 << 24, 8)  # not there: nothing to do
    for vid, routes in enumerate(current):
        check(fib, vid, as_list(routes), extra=300, seed=10 + vid)
        for addr in np.random.default_rng(vid).integers(0, 2**32, 30).tolist():
            r = fib.lookup(vid, addr)  # the CAM walk agrees with the vectorised mirror
            port, nh = fib.lookup_many(vid, np.array([addr]))
            assert (r is None and port[0] == NO_ROUTE) or (r.port, r.next_hop) == (port[0], nh[0])


def test_100k_prefixes_times_4_routers_match_reference_lpm_through_updates():
    """DESIGN §8 at scale: 100,000 BGP-like prefixes for each of 4 virtual routers, 13% shared between them.
    Every prefix's first and last address and 50,000 random addresses per router, before and after 5% of
    each table is deleted and 1% re-inserted with new next hops."""
    tables = virtual_router_tables(100_000, routers=4, overlap=0.13, seed=0, density=40)
    fib = SharedFib(routers=4, l2_sets=12_000, cam_entries=1 << 16)  # a board with more L2 memory
    for vid, t in enumerate(tables):
        fib.load(vid, t)
    assert fib.stats()["prefixes"] == 400_000
    for vid, t in enumerate(tables):
        check(fib, vid, t, extra=50_000, seed=vid)
    for vid, t in enumerate(tables):
        routes = {(p, ln): (port, nh) for p, ln, port, nh in t}
        for p, ln, _, _ in t[::20]:
            assert fib.delete(vid, p, ln)
            del routes[(p, ln)]
        for p, ln, port, nh in t[5::100]:
            fib.insert(vid, p, ln, (port + 1) % 7, nh ^ 0xFFFF)
            routes[(p, ln)] = ((port + 1) % 7, nh ^ 0xFFFF)
        check(fib, vid, as_list(routes), extra=10_000, seed=10 + vid)


def test_inserting_one_by_one_and_loading_in_bulk_agree():
    tables = [random_table(1500, s, min_length=12) for s in range(4)]
    one, bulk = SharedFib(routers=4, l2_sets=8192), SharedFib(routers=4, l2_sets=8192)
    for vid, t in enumerate(tables):
        for r in t:
            one.insert(vid, *r)
        bulk.load(vid, t)
    for vid, t in enumerate(tables):
        check(one, vid, t, seed=vid)
        check(bulk, vid, t, seed=vid)
    assert one.stats()["overlap_pct"] == bulk.stats()["overlap_pct"] > 0


def test_conflicting_routers_share_l1_through_the_cam_and_delete_restores_shadowed_prefixes():
    fib = SharedFib(routers=2, l2_sets=8)
    fib.insert(0, 0x0A000000, 16, 1, 100)  # 10.0/16: 8 L1 locations, held directly by router 0
    fib.insert(1, 0x0A000000, 16, 2, 200)  # the same locations for router 1: one CAM entry, relocated
    fib.insert(1, 0x0A000100, 24, 3, 300)  # a longer prefix inside: an L2 set in router 1's block
    [entry] = fib.cam_entries()
    assert (entry.vid, entry.prefix, entry.length, entry.size) == (1, 0x0A000000 >> 13, 16, 8)
    assert fib.owner[entry.index] == INDIRECT and entry.index >= RELOCATION_BASE
    assert fib.lookup(0, 0x0A000105) == (1, 100) and fib.lookup(1, 0x0A000105) == (3, 300)
    assert fib.lookup(1, 0x0A00F005) == (2, 200)
    assert fib.lookup(0, 0x0B000000) is None and fib.lookup(1, 0x0A020000) is None  # outside: no route
    fib.delete(1, 0x0A000100, 24)
    assert fib.lookup(1, 0x0A000105) == (2, 200)  # the /16 it shadowed answers again
    fib.delete(1, 0x0A000000, 16)
    assert fib.cam_entries() == [] and fib.stats()["relocated_locations"] == 0


def test_a_block_in_the_way_of_a_direct_route_moves():
    fib = SharedFib(routers=2, l2_sets=8)
    fib.insert(0, 0x0A000000, 19, 1, 1)
    fib.insert(1, 0x0A000000, 19, 2, 2)  # relocated to the first free location at 224.0.0.0
    [before] = fib.cam_entries()
    assert before.index == RELOCATION_BASE
    fib.insert(0, 0xE0000000, 24, 4, 4)  # router 0 now needs that location itself
    [after] = fib.cam_entries()
    assert after.index != before.index and fib.owner[before.index] == 1
    assert fib.lookup(1, 0x0A000001) == (2, 2) and fib.lookup(0, 0xE0000001) == (4, 4)


def test_default_routes_live_in_registers_not_in_sram():
    fib = SharedFib(routers=2, l2_sets=8)
    fib.insert(0, 0, 0, 5, 55)
    fib.insert(1, 0, 0, 6, 66)
    assert fib.stats()["l1_used"] == 0
    fib.insert(1, 0x0A000000, 8, 1, 11)
    assert fib.lookup(0, 0x0A000001) == (5, 55) and fib.lookup(1, 0x0A000001) == (1, 11)
    assert fib.lookup(1, 0x0B000001) == (6, 66)
    fib.delete(1, 0, 0)
    assert fib.lookup(1, 0x0B000001) is None


def test_default_l2_bank_is_one_sram_bank_and_a_route_that_does_not_fit_changes_nothing():
    fib = SharedFib(routers=1)
    assert fib.l2_capacity == L2_SETS_PER_BANK == 64  # one 18-Mbit bank of 2^19 36-bit words
    routes = [((i << 13) | 0x100, 24, 1, i) for i in range(64)]
    for r in routes:
        fib.insert(0, *r)
    with pytest.raises(TableFull, match="L2 bank full"):
        fib.insert(0, (64 << 13) | 0x100, 24, 1, 64)
    assert fib.lookup(0, (64 << 13) | 0x100) is None
    check(fib, 0, routes)
    fib.insert(0, 0x00002100, 24, 2, 99)  # replacing a route needs no new set
    assert fib.lookup(0, 0x00002101) == (2, 99)


def test_cam_capacity_is_enforced():
    fib = SharedFib(routers=2, l2_sets=8, cam_entries=1)
    fib.insert(0, 0x0A000000, 19, 1, 1)
    fib.insert(0, 0x0B000000, 19, 1, 1)
    fib.insert(1, 0x0A000000, 19, 2, 2)
    with pytest.raises(TableFull, match="Conflict CAM full"):
        fib.insert(1, 0x0B000000, 19, 2, 2)
    assert fib.lookup(1, 0x0A000001) == (2, 2) and fib.lookup(1, 0x0B000001) is None


def test_export_writes_banks_cam_and_description_that_answer_the_same_lookups(tmp_path):
    tables = [random_table(400, s, min_length=14) for s in range(3)]
    fib = SharedFib(routers=3, l2_sets=1024)
    for vid, t in enumerate(tables):
        fib.load(vid, t)
    fib.insert(2, 0, 0, 3, 33)
    files = fib.export(tmp_path)
    assert (tmp_path / "sram_l1.bin").stat().st_size == 8 * 2**19
    assert len(np.fromfile(files["conflict_cam.bin"], dtype="<u8")) == len(fib.cam_entries()) > 0
    image = ExportedImage(tmp_path)
    for vid, t in enumerate(tables):
        for addr in probe_addresses(t, 200, vid)[::3].tolist():
            assert image.lookup(vid, addr) == fib.lookup(vid, addr)


def test_overlap_and_cam_report_for_100k_prefixes_over_4_routers():
    tables = virtual_router_tables(25_000, routers=4, overlap=0.13, seed=1)
    fib = SharedFib(routers=4, l2_sets=16_000, cam_entries=1 << 16)
    for vid, t in enumerate(tables):
        fib.load(vid, t)
    s = fib.stats()
    assert s["prefixes"] == 100_000 and 12 <= s["overlap_pct"] <= 15
    assert s["cam_entry_bits"] == 2 + 19 + 5 + 19
    assert s["cam_bits"] == s["cam_entries"] * 45 and 0 < s["cam_entries"] <= s["overlapping_prefixes"]
