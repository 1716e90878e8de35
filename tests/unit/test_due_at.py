"""The time a record is filed under (`due_at`) says exactly when the clock has work on it: for any record and
any time, `due_at(rec) <= now` holds just when the reaper's transitions would act on it (the test that every
record used to be put through on every pass)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import reservations as states
from slice_manager import reservation as rs
from slice_manager.records import Record, due_at

T0 = datetime(2030, 1, 1, tzinfo=UTC)
times = st.none() | st.integers(-600, 600).map(lambda s: T0 + timedelta(seconds=s))
STATES = [states.NASCENT, states.TICKETED, states.ACTIVE, states.ACTIVE_TICKETED, states.CLOSE_WAIT, states.CLOSED,
          states.FAILED]
PENDING = [states.NONE, states.TICKETING, states.REDEEMING, states.EXTENDING_TICKET, states.EXTENDING_LEASE,
           states.CLOSING, states.PRIMING]


@st.composite
def records(draw) -> Record:
    pending = draw(st.sampled_from(PENDING))
    since = draw(times) if pending != states.NONE else None
    r = rs.Reservation("r1", draw(st.sampled_from(STATES)), pending, since, start=draw(times), end=draw(times),
                       want_end=draw(times), deadline=draw(times) if since else None)
    outbox = [rs.Message("close", "r1")] if draw(st.booleans()) else []
    details = {"started": "yes"} if draw(st.booleans()) else {}
    return Record("r1", "s", "o", "c", "node", "", "g", r, {}, details, outbox=outbox)


def clock_has_work(rec: Record, now: datetime) -> bool:
    """What the reaper acted on, record by record, before the time index: an outbox, an operation pending, a
    transition of the clock, an advance term that started, a failure whose term is over."""
    r = rec.r
    starting = (r.state == rs.TICKETED and r.pending == rs.NONE and r.start is not None and r.start <= now
                and not rec.details.get("started"))
    if rec.outbox or r.pending != rs.NONE or rs.on_tick(r, now)[0] != r or starting:
        return True
    end = r.end or r.want_end
    return r.state == rs.FAILED and (end is None or end <= now)


@settings(max_examples=300)
@given(records(), st.integers(-900, 900))
def test_a_record_is_due_exactly_when_the_clock_has_work_on_it(rec, offset):
    now = T0 + timedelta(seconds=offset)
    due = due_at(rec)
    assert (due is not None and due <= now.timestamp()) == clock_has_work(rec, now)
