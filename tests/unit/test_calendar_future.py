"""Advance reservations in the broker's calendar and the slice manager: overlapping bookings never exceed a
pool's capacity nor hold one unit twice at any instant (properties over the pure calendar and over
`Broker.place` with future terms); the broker's availability over a future window agrees with what it
booked; an advance ticket is claimed at its start, and one whose unit someone else holds then fails the
reservation with the broker's reason."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from authority.substrate.emulated import EmulatedDriver
from broker.broker import Broker
from broker.calendar import Calendar, CalendarError
from deployment.actors import ActorKeys, embedded_slice_manager
from protocol.delegation import Pool
from protocol.messages import demands_of
from resources import export_substrate
from rspec.request import parse_request
from rspec.substrate import default_substrate
from slice_manager import reservation as rs
from slicex.errors import InsufficientNodes, Refused
from slicex.store.sqlite_store import SqliteStore
from slicex.term import Term
from tests.factories import request_rspec, vm

T0 = datetime(2030, 1, 1, tzinfo=UTC)
MIN = timedelta(minutes=1)
SUB = default_substrate("t.org")
AUTH = "urn:publicid:IDN+t.org+authority+am"
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
BARE = [h.component_id for h in SUB.hosts if h.exclusive]


def held_at(bookings: dict[str, tuple[frozenset[str], Term]], when: datetime) -> list[str]:
    """Every unit held at instant `when`, once per booking that holds it."""
    return [u for units, term in bookings.values() if term.start <= when < term.end for u in units]


terms = st.tuples(st.integers(0, 60), st.integers(1, 40)).map(lambda t: Term(T0 + t[0] * MIN, T0 + (t[0] + t[1]) * MIN))


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 4),
       ops=st.lists(st.tuples(st.sampled_from(["fit", "exact", "release"]), terms, st.integers(1, 4),
                              st.integers(0, 3)), max_size=30))
def test_overlapping_bookings_never_exceed_capacity_nor_hold_a_unit_twice(size, ops):
    pool = Pool("core:h", "core", tuple(f"core:h:{i}" for i in range(size)), bin="h")
    cal = Calendar()
    cal.add_pool(pool)
    ours: dict[str, tuple[frozenset[str], Term]] = {}
    for n, (op, term, count, pick) in enumerate(ops):
        holder = f"g{n}/r"
        if op == "release":
            if ours:
                gone = sorted(ours)[pick % len(ours)]
                cal.release(gone)
                del ours[gone]
            continue
        if op == "fit":  # the broker's way: the units free over the whole term, first fit
            free = cal.free_units(pool.name, term, limit=count)
            assert len(free) == min(count, cal.free_count(pool.name, term))
            if len(free) < count:
                continue
            units = free
        else:  # units named outright, taken or not: the calendar must refuse an overlap
            units = [pool.units[(pick + i) % size] for i in range(min(count, size))]
        try:
            cal.book(holder, units, term)
        except CalendarError:
            assert op == "exact" and any(cal.holders(u, term) for u in units)
            continue
        ours[holder] = (frozenset(units), term)
    for minute in range(0, 101):
        when = T0 + minute * MIN
        held = held_at(ours, when)
        assert len(held) <= size and len(held) == len(set(held)), (when, held)
        instant = Term(when, when + MIN)
        assert cal.free_count(pool.name, instant) >= size - len(set(held_at(ours, when)))
    assert set(cal.bookings) == set(ours)


def broker(tmp_path: Path) -> Broker:
    store = SqliteStore(str(tmp_path / "b.db"))
    b = Broker("broker", store, KEY, authority=AUTH)
    b.accept(export_substrate(SUB, AUTH, "broker"))
    return b


def bare_demands(cid: str) -> dict:
    req = parse_request(request_rspec([{"client_id": cid, "sliver_type": "raw-pc"}]))
    return demands_of(req, {cid: cid})


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(asks=st.lists(terms, min_size=1, max_size=8), window=terms)
def test_future_placements_never_promise_a_bare_metal_node_twice_and_availability_agrees(tmp_path_factory, asks,
                                                                                          window):
    b = broker(tmp_path_factory.mktemp("place"))
    now = T0 - 10 * MIN  # every term is in the future: advance reservations, nothing claimed yet
    granted: dict[str, tuple[frozenset[str], Term]] = {}
    for n, term in enumerate(asks):
        try:
            answer = b.place("sm", bare_demands("b"), term, now, group=f"g{n}")
        except InsufficientNodes as exc:
            assert "advance term" in str(exc)
            overlapping = {u for units, t in granted.values() if t.start < term.end and term.start < t.end
                           for u in units}
            assert len(overlapping) == len(BARE)  # refused only when every node is booked during the term
            continue
        (ticket,) = answer.tickets.values()
        assert ticket.start == term.start and ticket.end == term.end
        granted[ticket.id] = (frozenset(ticket.units), term)
    assert b.store.all_claims() == {}
    for minute in range(-10, 101):
        held = held_at(granted, T0 + minute * MIN)
        assert len(held) == len(set(held)) <= len(BARE)
    busy = set(b.availability("", now, window)["units"])
    during = {u for units, t in granted.values() if t.start < window.end and window.start < t.end for u in units}
    assert {u for u in busy if u.startswith("node:")} == during


def test_an_advance_ticket_is_claimed_at_its_start_and_the_reservation_then_provisions(tmp_path):
    store = SqliteStore(str(tmp_path / "s.db"))
    sm = embedded_slice_manager(store, SUB, EmulatedDriver(SUB), keys=ActorKeys.given(KEY, KEY))
    now = T0
    begin, end = now + MIN, now + 60 * MIN
    (s,) = sm.allocate("urn:publicid:IDN+t.org+slice+a", "o", parse_request(request_rspec([vm("a")])), end, now,
                       start=begin)
    assert s.details["geni_start_time"] == "2030-01-01T00:01:00Z" and store.all_claims() == {}
    with pytest.raises(Refused, match="2030-01-01T00:01:00Z"):
        sm.provision([s.urn], end, [], now)
    assert rs.awaiting_start(sm._load(s.urn).r, now)
    for t in (begin, begin + timedelta(seconds=1)):  # the broker's clock claims, then the reaper sees it
        sm.reap(t)
    assert sm.sliver(s.urn, begin).details.get("started") and set(s.details) <= set(sm.sliver(s.urn, begin).details)
    assert store.all_claims()  # claimed in the store now
    (p,) = sm.provision([s.urn], end, [], begin + timedelta(seconds=2))
    assert p.allocation_state == "geni_provisioned"


def test_an_advance_ticket_whose_unit_is_held_at_its_start_fails_the_reservation_saying_why(tmp_path):
    store = SqliteStore(str(tmp_path / "s.db"))
    sm = embedded_slice_manager(store, SUB, EmulatedDriver(SUB), keys=ActorKeys.given(KEY, KEY))
    now = T0
    begin = now + MIN
    (s,) = sm.allocate("urn:publicid:IDN+t.org+slice+a", "o",
                       parse_request(request_rspec([{"client_id": "b", "sliver_type": "raw-pc"}])), now + 60 * MIN,
                       now, start=begin)
    node = f"node:{s.component_id}"
    assert store.claim(node, "someone-else")  # another broker process on the store took it meanwhile
    for t in (begin, begin + timedelta(seconds=1), begin + timedelta(seconds=2)):
        sm.reap(t)
    rec = sm._load(s.urn)  # a failure stays visible until its term would have ended
    assert rec is not None and rec.r.state == rs.FAILED
    assert "advance term" in rec.r.reason and node in rec.r.reason
    failed = sm.sliver(s.urn, begin + timedelta(seconds=2))
    assert failed.operational_state == "geni_failed" and node in failed.error
    assert store.owner_of(node) == "someone-else"  # and its ticket was given back: the broker holds nothing


def test_on_term_start_keeps_a_claimed_reservation_and_fails_a_lost_one():
    r = rs.Reservation("x", rs.TICKETED, start=T0, end=T0 + MIN, sequence=1, resource="node a")
    assert rs.on_term_start(r, True, "", T0) == (r, [])
    failed, msgs = rs.on_term_start(r, False, "its unit was held", T0)
    assert failed.state == rs.FAILED and "advance term (2030-01-01T00:00:00Z) its unit was held" in failed.reason
    assert [m.kind for m in msgs] == ["relinquish"]
    assert rs.awaiting_start(r, T0 - MIN) and not rs.awaiting_start(r, T0)
