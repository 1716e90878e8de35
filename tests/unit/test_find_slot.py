"""Find a slot (broker/slots.py, and Broker.find_slot over it): the slot answered really fits (the placement
policy places the request over it, and the broker grants an advance ticket for it), no earlier start time worth
weighing fits, and a window with no slot says what is short and from when. Bad questions get BADARGS or
OUTOFRANGE."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.broker import Broker
from broker.calendar import Calendar
from broker.delegation import claim
from broker.placement import plan
from broker.slots import candidate_starts, find_slot, search_window, whole_second
from protocol.messages import SlotQuery, demands_of
from resources import export_substrate
from rspec.request import parse_request
from rspec.substrate import default_substrate
from slicex.errors import BadArgs, GeniError, InsufficientNodes, OutOfRange
from slicex.store.sqlite_store import SqliteStore
from slicex.term import Term
from tests.factories import request_rspec, vm

T0 = datetime(2030, 1, 1, tzinfo=UTC)
H = timedelta(hours=1)
MIN = timedelta(minutes=1)
SUB = default_substrate("t.org")
AUTH = "urn:publicid:IDN+t.org+authority+am"
KEY = ec.generate_private_key(ec.SECP256R1())


def request_of(kinds: list[str]):
    """A request of one node per entry: raw-pc (a bare-metal host) or a VM size."""
    return parse_request(request_rspec([vm(f"n{i}", sliver_type=k) for i, k in enumerate(kinds)]))


def calendar() -> Calendar:
    cal = Calendar()
    claim(cal, export_substrate(SUB, AUTH, "broker"))
    return cal


def book(cal: Calendar, holder: str, kinds: list[str], term: Term) -> bool:
    """Book a request the way the broker does (the policy over what the calendar says is free); False when it
    does not fit."""
    try:
        placed = plan(SUB, request_of(kinds), cal.unavailable(term))
    except GeniError:
        return False
    cal.book(holder, {k for p in placed for k in p.keys}, term)
    return True


def fits(cal: Calendar, kinds: list[str], term: Term) -> bool:
    try:
        plan(SUB, request_of(kinds), cal.unavailable(term))
    except GeniError:
        return False
    return True


def query(duration: timedelta, earliest: datetime, latest: datetime) -> SlotQuery:
    return SlotQuery(int(duration.total_seconds()), earliest, latest)


sizes = st.sampled_from(["raw-pc", "m1.small", "m1.medium", "m1.large"])
bookings = st.lists(st.tuples(st.lists(sizes, min_size=1, max_size=4), st.integers(0, 48), st.integers(1, 24)),
                    max_size=12)


@settings(max_examples=150, deadline=None)
@given(booked=bookings, asked=st.lists(sizes, min_size=1, max_size=4), duration=st.integers(1, 12),
       after=st.integers(0, 24), within=st.integers(0, 60))
def test_the_slot_answered_fits_and_no_earlier_start_worth_weighing_does(booked, asked, duration, after, within):
    cal = calendar()
    for n, (kinds, start, length) in enumerate(booked):  # reservations in half hours from T0
        book(cal, f"g{n}/r", kinds, Term(T0 + start * MIN * 30, T0 + (start + length) * MIN * 30))
    d = duration * H
    q = query(d, T0 + after * H, T0 + (after + duration + within) * H)
    answer = find_slot(SUB, request_of(asked), cal, q, T0)
    # every start worth weighing, computed here on its own: the window's start and each end of a booking
    first, last = T0 + after * H, T0 + (after + within) * H
    starts = sorted({first} | {b.term.end for b in cal.bookings.values() if first < b.term.end <= last})
    assert answer.tried <= len(starts)
    if answer.found:
        assert answer.start in starts and answer.end == answer.start + d
        assert fits(cal, asked, Term(answer.start, answer.end))  # placing it succeeds
        assert not any(fits(cal, asked, Term(t, t + d)) for t in starts if t < answer.start)
        assert answer.report["fits"] and len(answer.report["nodes"]) == len(asked)
    else:
        assert not any(fits(cal, asked, Term(t, t + d)) for t in starts)
        assert answer.error in ("InsufficientNodes", "InsufficientBandwidth") and answer.summary.startswith("no slot")
        assert answer.report["short"]


@settings(max_examples=60, deadline=None)
@given(booked=st.lists(st.tuples(st.integers(1, 2), st.integers(0, 40), st.integers(1, 20)), max_size=10),
       count=st.integers(1, 2), duration=st.integers(1, 20))
def test_no_earlier_minute_fits_either_for_bare_metal(booked, count, duration):
    """Bare-metal requests take any free hosts, so what fits only grows with what is free: there, the slot is
    the earliest on a minute grid as well, not only among the instants weighed."""
    cal = calendar()
    for n, (k, start, length) in enumerate(booked):
        book(cal, f"g{n}/r", ["raw-pc"] * k, Term(T0 + start * 10 * MIN, T0 + (start + length) * 10 * MIN))
    d = duration * 10 * MIN
    answer = find_slot(SUB, request_of(["raw-pc"] * count), cal, query(d, T0, T0 + 80 * 10 * MIN), T0)
    end_of_search = answer.start if answer.found else T0 + 80 * 10 * MIN - d
    minute = T0
    while minute < end_of_search:
        assert not fits(cal, ["raw-pc"] * count, Term(minute, minute + d)), minute
        minute += MIN


def test_four_nodes_for_six_hours_start_when_enough_reservations_have_ended():
    cal = calendar()
    assert book(cal, "a/r", ["raw-pc", "raw-pc"], Term(T0, T0 + 3 * H))  # both bare-metal hosts now
    assert book(cal, "b/r", ["raw-pc"], Term(T0 + 3 * H, T0 + 5 * H))  # one of them again later
    answer = find_slot(SUB, request_of(["raw-pc", "raw-pc", "m1.large", "m1.large"]), cal,
                       query(6 * H, T0, T0 + 2 * 24 * H), T0)
    assert answer.found and (answer.start, answer.end) == (T0 + 5 * H, T0 + 11 * H)
    assert answer.tried == 3  # now, at 3 h and at 5 h
    assert {n["host"] for n in answer.report["nodes"] if n["sliver_type"] == "raw-pc"} == {"bm1", "bm2"}
    one = find_slot(SUB, request_of(["raw-pc"]), cal, query(6 * H, T0, T0 + 2 * 24 * H), T0)
    assert one.start == T0 + 3 * H  # one host is free from the first reservation's end


def test_a_window_without_room_says_what_is_short_and_from_when():
    cal = calendar()
    assert book(cal, "a/r", ["raw-pc", "raw-pc"], Term(T0, T0 + 10 * H))
    assert book(cal, "b/r", ["raw-pc"], Term(T0 + 10 * H, T0 + 20 * H))
    answer = find_slot(SUB, request_of(["raw-pc", "raw-pc"]), cal, query(2 * H, T0, T0 + 12 * H), T0)
    assert not answer.found and answer.error == "InsufficientNodes" and answer.tried == 2
    assert answer.closest == T0 + 10 * H  # one host is free then: the least short
    assert "2030-01-01T10:00:00Z" in answer.summary and "bare metal" in answer.summary
    assert answer.report["short"][0]["client_id"] == "n1"


def test_a_request_that_never_fits_says_so_whatever_the_window():
    answer = find_slot(SUB, request_of(["raw-pc"] * 3), calendar(), query(H, T0, T0 + 24 * H), T0)
    assert not answer.found and "never fits" in answer.summary and answer.error == "InsufficientNodes"


def test_starts_are_whole_seconds_rounded_up_so_an_allocate_asks_for_no_earlier_term():
    cal = calendar()
    end = T0 + H + timedelta(microseconds=250_000)
    assert book(cal, "a/r", ["raw-pc", "raw-pc"], Term(T0, end))
    answer = find_slot(SUB, request_of(["raw-pc"]), cal, query(H, T0, T0 + 24 * H), T0)
    assert answer.start == T0 + H + timedelta(seconds=1) == whole_second(end)
    assert candidate_starts(cal, Term(T0, T0 + 3 * H), H) == [T0, T0 + H + timedelta(seconds=1)]


@pytest.mark.parametrize("q, error, words", [
    (SlotQuery(0, T0, T0 + H), BadArgs, "must be positive"),
    (SlotQuery(3600, T0 - 3 * H, T0 - H), BadArgs, "in the past"),
    (SlotQuery(3 * 3600, T0, T0 + 2 * H), BadArgs, "shorter than"),
    (SlotQuery(40 * 24 * 3600, T0, T0 + 50 * 24 * H, max_duration_seconds=30 * 24 * 3600), OutOfRange, "max_lease"),
    (SlotQuery(3600, T0 + 40 * 24 * H, T0 + 41 * 24 * H, horizon=T0 + 30 * 24 * H), OutOfRange, "horizon"),
])
def test_questions_that_cannot_be_answered_are_refused_with_a_geni_code(q, error, words):
    with pytest.raises(error, match=words):
        search_window(q, T0)


def test_a_window_starting_in_the_past_starts_now_and_the_horizon_cuts_its_end():
    q = SlotQuery(3600, T0 - 5 * H, T0 + 40 * 24 * H, horizon=T0 + 30 * 24 * H)
    assert search_window(q, T0) == Term(T0, T0 + 30 * 24 * H)


def broker(tmp_path: Path) -> Broker:
    b = Broker("broker", SqliteStore(str(tmp_path / "b.db")), KEY, authority=AUTH)
    b.accept(export_substrate(SUB, AUTH, "broker"))
    return b


def demands(kinds: list[str]):
    req = request_of(kinds)
    return demands_of(req, {n.client_id: n.client_id for n in req.nodes})


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(held=st.lists(st.tuples(st.integers(1, 2), st.integers(0, 30), st.integers(1, 30)), max_size=6),
       count=st.integers(1, 2), duration=st.integers(1, 30))
def test_the_broker_grants_the_slot_it_answers_and_refuses_a_second_before(tmp_path_factory, held, count, duration):
    b = broker(tmp_path_factory.mktemp("slot"))
    now = T0
    for n, (k, start, length) in enumerate(held):  # tickets now (claimed in the store) and ahead (booked only)
        term = Term(now + start * 10 * MIN, now + (start + length) * 10 * MIN)
        try:
            b.place("sm", demands(["raw-pc"] * k), term, now, group=f"held{n}")
        except InsufficientNodes:
            continue
    d = duration * 10 * MIN
    answer = b.find_slot("sm", demands(["raw-pc"] * count), query(d, now, now + 24 * H), now)
    assert answer.found  # a day is long enough for every booking above to end
    if answer.start > now:
        with pytest.raises(InsufficientNodes):
            b.place("sm", demands(["raw-pc"] * count), Term(answer.start - timedelta(seconds=1),
                                                            answer.end - timedelta(seconds=1)), now, group="early")
    granted = b.place("sm", demands(["raw-pc"] * count), Term(answer.start, answer.end), now, group="slot")
    assert {t.start for t in granted.tickets.values()} == {answer.start}


def test_a_claim_the_calendar_does_not_know_holds_its_unit_for_every_start(tmp_path):
    b = broker(tmp_path)
    for host in ("bm1", "bm2"):  # claimed by another broker process on the store, with no ticket here
        assert b.store.claim(f"node:urn:publicid:IDN+t.org+node+{host}", "elsewhere")
    answer = b.find_slot("sm", demands(["raw-pc"]), query(H, T0, T0 + 24 * H), T0)
    assert not answer.found and "bare metal" in answer.summary


def test_the_question_and_the_answer_survive_the_actors_codec():
    from protocol.api import BrokerApi
    from protocol.remote import methods
    from slicex.codec import decode, encode

    sig = methods(BrokerApi)["find_slot"]
    q = SlotQuery(6 * 3600, T0, T0 + 48 * H, 30 * 24 * 3600, T0 + 30 * 24 * H)
    hint = sig.parameters["query"].annotation
    assert decode(encode(q, hint), hint, "query") == q
    cal = calendar()
    assert book(cal, "a/r", ["raw-pc", "raw-pc"], Term(T0, T0 + 3 * H))
    for asked in (["raw-pc"], ["raw-pc"] * 3):  # found, and never
        answer = find_slot(SUB, request_of(asked), cal, query(H, T0, T0 + 24 * H), T0)
        wire = encode(answer, sig.return_annotation)
        assert decode(wire, sig.return_annotation, "answer") == answer
    with pytest.raises(BadArgs, match="query"):
        decode({"duration_seconds": "six hours", "earliest": "2030-01-01T00:00:00Z", "latest": "2030-01-02T00:00:00Z"},
               hint, "query")
