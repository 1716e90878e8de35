"""The reservation state machine: every pending state times out; stale updates are dropped."""

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from am import reservation as rs

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def test_ticket_redeem_extend_close():
    r = rs.Reservation("r1")
    r, msgs = rs.demand(r, NOW)
    assert (r.pending, [m.kind for m in msgs]) == (rs.TICKETING, ["ticket"])
    r, _ = rs.on_update(r, "ticket", True, 1, NOW)
    assert (r.state, r.pending) == (rs.TICKETED, rs.NONE)
    r, msgs = rs.redeem(r, NOW)
    r, _ = rs.on_update(r, "lease", True, 2, NOW)
    assert r.state == rs.ACTIVE
    r, msgs = rs.extend(r, NOW)
    r, msgs = rs.on_update(r, "ticket", True, 3, NOW)
    assert (r.state, r.pending, [m.kind for m in msgs]) == (rs.ACTIVE_TICKETED, rs.EXTENDING_LEASE, ["extendLease"])
    r, _ = rs.on_update(r, "lease", True, 4, NOW)
    assert r.state == rs.ACTIVE
    r, msgs = rs.close(r, NOW)
    assert [m.kind for m in msgs] == ["relinquish", "close"]
    r, _ = rs.on_update(r, "closed", True, 5, NOW)
    assert r.state == rs.CLOSED


def test_stale_updates_are_dropped():
    r, _ = rs.demand(rs.Reservation("r", sequence=5), NOW)
    same, msgs = rs.on_update(r, "ticket", True, 4, NOW)
    assert same == r and msgs == []


def test_failure_carries_reason_and_releases():
    r, _ = rs.demand(rs.Reservation("r"), NOW)
    r, msgs = rs.on_update(r, "ticket", False, 1, NOW, "broker: 0 of 3 cores free on pc1")
    assert r.state == rs.FAILED and "cores" in r.reason
    assert {m.kind for m in msgs} == {"relinquish", "close"}


def test_busy_reservation_refuses_a_second_operation():
    r, _ = rs.demand(rs.Reservation("r"), NOW)
    r, _ = rs.on_update(r, "ticket", True, 1, NOW)
    r, _ = rs.redeem(r, NOW)
    with pytest.raises(rs.TransitionError, match="busy"):
        rs.extend(replace_state(r), NOW)


def replace_state(r):
    from dataclasses import replace

    return replace(r, state=rs.ACTIVE)


@pytest.mark.parametrize("pending", sorted(rs.PENDING_TIMEOUT))
def test_every_pending_state_times_out(pending):
    r = rs.Reservation("r", state=rs.TICKETED, pending=pending, pending_since=NOW)
    same, _ = rs.on_tick(r, NOW + rs.PENDING_TIMEOUT[pending])
    assert same.pending == pending
    later, msgs = rs.on_tick(r, NOW + rs.PENDING_TIMEOUT[pending] + timedelta(seconds=1))
    assert later.pending == rs.NONE and later.terminal
    if later.state == rs.FAILED:
        assert "did not answer" in later.reason and {m.kind for m in msgs} == {"relinquish", "close"}


events = st.lists(st.sampled_from(["demand", "redeem", "extend", "close", "ok", "fail", "tick"]), max_size=30)


@given(events)
def test_no_sequence_of_events_leaves_a_reservation_pending_forever(seq):
    r = rs.Reservation("r")
    t = NOW
    n = 0
    for e in seq:
        n += 1
        try:
            if e in ("demand", "redeem", "extend", "close"):
                r, _ = getattr(rs, e)(r, t)
            elif e in ("ok", "fail"):
                kind = {rs.TICKETING: "ticket", rs.EXTENDING_TICKET: "ticket", rs.REDEEMING: "lease",
                        rs.EXTENDING_LEASE: "lease", rs.CLOSING: "closed"}.get(r.pending, "ticket")
                r, _ = rs.on_update(r, kind, e == "ok", n, t, "test")
            else:
                t += timedelta(seconds=10)
                r, _ = rs.on_tick(r, t)
        except rs.TransitionError:
            pass
    r, _ = rs.on_tick(r, t + timedelta(hours=1))
    assert r.pending == rs.NONE
