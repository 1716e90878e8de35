"""The shared forwarding table: every lookup equals a reference longest-prefix match."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fpga_aggregate.fib import NO_ROUTE, SharedFib, TableFull
from fpga_aggregate.tables import ReferenceLpm, bgp_like, random_table


def check(fib: SharedFib, vid: int, routes, extra: int = 5000, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    firsts = np.array([p for p, _, _, _ in routes], dtype=np.int64)
    lasts = np.array([p | ((1 << (32 - length)) - 1) for p, length, _, _ in routes], dtype=np.int64)
    addrs = np.concatenate([firsts, lasts, rng.integers(0, 2**32, extra)])
    got_port, got_nh = fib.lookup_many(vid, addrs)
    want_port, want_nh = ReferenceLpm(routes).lookup_many(addrs)
    assert np.array_equal(got_port, want_port)
    routed = want_port != NO_ROUTE
    assert np.array_equal(got_nh[routed], want_nh[routed])


route = st.tuples(st.integers(0, 2**32 - 1), st.integers(12, 32), st.integers(0, 6), st.integers(0, 2**32 - 1))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(route, max_size=40), min_size=2, max_size=3), st.data())
def test_random_tables_insert_and_delete_match_reference(tables, data):
    fib = SharedFib(routers=len(tables), l2_sets=512)
    current = []
    for vid, table in enumerate(tables):
        routes = {}
        for p, length, port, nh in table:
            p = p >> (32 - length) << (32 - length)
            routes[(p, length)] = (port, nh)
            fib.insert(vid, p, length, port, nh)
        current.append(routes)
    for vid, routes in enumerate(current):
        check(fib, vid, [(p, ln, *v) for (p, ln), v in routes.items()], extra=500)
    for vid, routes in enumerate(current):
        doomed = data.draw(st.lists(st.sampled_from(sorted(routes)), unique=True)) if routes else []
        for p, length in doomed:
            assert fib.delete(vid, p, length)
            del routes[(p, length)]
        check(fib, vid, [(p, ln, *v) for (p, ln), v in routes.items()], extra=500)
    # the single-address lookup agrees with the vectorised one
    for vid in range(len(tables)):
        for addr in np.random.default_rng(vid).integers(0, 2**32, 50).tolist():
            r = fib.lookup(vid, addr)
            port, nh = fib.lookup_many(vid, np.array([addr]))
            assert (r is None and port[0] == NO_ROUTE) or (r.port, r.next_hop) == (port[0], nh[0])


def test_random_tables_of_2000_prefixes_times_4():
    fib = SharedFib(routers=4, l2_sets=16384)
    tables = [random_table(2000, s) for s in range(4)]
    for vid, t in enumerate(tables):
        for p, length, port, nh in t:
            fib.insert(vid, p, length, port, nh)
    for vid, t in enumerate(tables):
        check(fib, vid, t, seed=vid)


def test_bgp_like_100k_prefixes_times_4_routers_match_reference_lpm():
    """DESIGN §8 at scale: 100,000 BGP-like prefixes for each of 4 virtual routers, 13% shared."""
    first = bgp_like(100_000, 0)
    shared = [(p, length) for p, length, _, _ in first]
    tables = [first] + [bgp_like(100_000, s, shared=shared, overlap=0.13) for s in range(1, 4)]
    fib = SharedFib(routers=4, l2_sets=40_000, cam_entries=1 << 20)
    for vid, t in enumerate(tables):
        for p, length, port, nh in t:
            fib.insert(vid, p, length, port, nh)
    stats = fib.stats()
    assert stats["prefixes"] == 400_000
    for vid, t in enumerate(tables):
        check(fib, vid, t, extra=100_000, seed=vid)
    for vid, t in enumerate(tables):  # incremental delete keeps it exact
        for p, length, _, _ in t[::4]:
            assert fib.delete(vid, p, length)
        check(fib, vid, [r for i, r in enumerate(t) if i % 4], extra=20_000, seed=10 + vid)


def test_default_l2_bank_is_one_sram_bank_and_says_when_full():
    fib = SharedFib(routers=1)  # 64 sets: one 18-Mbit bank of 2^19 36-bit words
    with pytest.raises(TableFull, match="L2 bank full"):
        for i in range(65):
            fib.insert(0, (i << 13) | 0x100, 24, 1, i)


def test_export_writes_banks_cam_and_description(tmp_path):
    fib = SharedFib(routers=2, l2_sets=8)
    fib.insert(0, 0x0A000000, 16, 1, 7)
    fib.insert(1, 0x0A000000, 16, 2, 8)  # same L1 locations: a conflict through the CAM
    fib.insert(1, 0x0A000100, 24, 3, 9)
    files = fib.export(tmp_path)
    desc = json.loads((tmp_path / "fib.json").read_text())
    assert (tmp_path / "sram_l1.bin").stat().st_size == 8 * 2**19
    assert desc["cam_entries"] == len(fib.cam) > 0
    cam = np.fromfile(files["conflict_cam.bin"], dtype="<u4").reshape(-1, 3)
    vid, loc, slot = cam[0]
    l1 = np.fromfile(files["sram_l1.bin"], dtype="<u8")
    assert (int(l1[slot]) >> 35) & 1 == 1  # router 1's location holds an L2 pointer (it has a /24 there)
    assert fib.lookup(0, 0x0A000105).next_hop == 7 and fib.lookup(1, 0x0A000105).next_hop == 9
