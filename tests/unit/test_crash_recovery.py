"""Kill the slice manager at every message boundary of ticket, redeem, extend and close; a fresh one on the
same store converges: nothing pending, no leaked units, every remaining reservation's units still held."""

from __future__ import annotations

from datetime import timedelta

import pytest

from am import reservation as rs
from am.embedded import SLIVERS, Crash, EmbeddedSliceManager
from am.substrate.emulated import EmulatedDriver
from rspec.request import parse_request
from rspec.substrate import default_substrate
from slicex.clock import ManualClock
from slicex.store.sqlite_store import SqliteStore
from tests.factories import three_node_lan

SLICE = "urn:publicid:IDN+t.org+slice+crash"
BOUNDARIES = ["ticket:pending", "ticket:granted", "redeem:pending", "redeem:granted", "extend:pending",
              "extend:ticketed", "close:pending"]


def crash_at(boundary):
    def hook(b):
        if b == boundary:
            raise Crash(b)
    return hook


def make(store, sub, hook=None):
    driver = EmulatedDriver(sub)
    sm = EmbeddedSliceManager(store, sub, driver, fault=hook)
    return sm


def held_units(store) -> set[str]:
    keys = set()
    for d in store.scan(SLIVERS):
        r = d["details"].get("reservation", {})
        if r.get("state") in (rs.TICKETED, rs.ACTIVE, rs.ACTIVE_TICKETED):
            keys |= set(d["details"]["keys"])
    return keys


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_crash_at_each_boundary_converges(tmp_path, boundary):
    sub = default_substrate("t.org")
    store = SqliteStore(str(tmp_path / "s.db"))
    clock = ManualClock()
    now = clock.now()
    first = make(store, sub, crash_at(boundary))
    broker, authority = first.broker, first.authority
    try:
        slivers = first.allocate(SLICE, "o", parse_request(three_node_lan()), now + timedelta(hours=1), now)
        urns = [s.urn for s in slivers]
        first.provision(urns, now + timedelta(hours=2), [], now)
        first.renew(urns, now + timedelta(hours=3), now, False)
        first.delete(urns, now)
    except Crash:
        pass
    # restart: a new slice manager over the same store and the same (persisted) broker key
    second = EmbeddedSliceManager(store, sub, EmulatedDriver(sub), broker=broker, authority=authority)
    clock.advance(timedelta(minutes=10))
    second.reap(clock.now())
    pending = [r for r in second.reservations() if r.pending != rs.NONE]
    assert pending == []
    assert second.usage_keys() == held_units(store)  # no leaked units, no lost ones
    for r in second.reservations():
        assert r.state in (rs.TICKETED, rs.ACTIVE, rs.FAILED)
        if r.state == rs.FAILED:
            assert "did not answer" in r.reason
    # and everything that remains can be closed cleanly
    second.delete([r.id for r in second.reservations()], clock.now()) if second.reservations() else None
    assert second.usage_keys() == set()
