"""Find a slot: the earliest start at which a whole request fits the broker's calendar for a whole duration
(pure: no store, no clock; the broker's `find_slot` hands it its calendar and what the store says is held).

"When can I have 4 nodes for 6 hours?" A start `t` fits when the placement policy (broker/placement.py
`plan`, the one `place` runs) places every node and link of the request around what is unavailable over
[t, t + duration): the units promised at some time in it, and what is held whatever the time (claims the
calendar does not explain, inventory the authority reclaimed). Over [t, t + d) a reservation stops taking
its units away exactly when `t` reaches its end, and starts taking them away as soon as `t + d` passes its
start: more becomes free only at the instants reservations end. So the earliest start is the window's start
or the end of a reservation inside the window, and those are the only start times weighed (not a grid).
They are rounded up to whole seconds, as RFC 3339 times on the wire carry them: an Allocate with that
`geni_start_time` asks for exactly the term weighed here."""

from __future__ import annotations

from collections.abc import Mapping, Set
from datetime import datetime, timedelta
from typing import Any

from broker.calendar import Calendar, Unavailable
from broker.placement import Shortfall, plan, report
from protocol.messages import SlotAnswer, SlotQuery
from resources import STANDARD, Kinds
from resources.kind import Placement
from rspec.request import Request
from rspec.substrate import Substrate
from slicex.clock import rfc3339
from slicex.errors import BadArgs, OutOfRange
from slicex.term import Term

MAX_STARTS = 1000
"""Start times weighed per question at most (each is a placement over the calendar): a busy calendar's far
window is searched in parts, the answer saying where the search stopped, so one question cannot take the
broker's CPU for long."""


def whole_second(t: datetime) -> datetime:
    """`t` rounded up to a whole second (what an RFC 3339 time on the wire can name without starting early)."""
    return t if not t.microsecond else t.replace(microsecond=0) + timedelta(seconds=1)


def hours(d: timedelta) -> str:
    """A duration as people say it: 6 h, 90 min, 45 s."""
    s = int(d.total_seconds())
    if s % 3600 == 0:
        return f"{s // 3600} h"
    return f"{s // 60} min" if s % 60 == 0 else f"{s} s"


def search_window(query: SlotQuery, now: datetime) -> Term:
    """The starts' window the query allows, [first start, last end], within the aggregate's limits; BADARGS
    for a query that cannot be answered as asked (no duration, a window in the past or shorter than the
    duration), OUTOFRANGE for one past the limits."""
    if query.duration <= timedelta(0):
        raise BadArgs(f"the duration must be positive, not {query.duration}")
    if query.max_duration is not None and query.duration > query.max_duration:
        raise OutOfRange(f"a reservation of {hours(query.duration)} is longer than this aggregate grants "
                         f"({hours(query.max_duration)}, am.max_lease)")
    if query.latest <= now:
        raise BadArgs(f"the search window ends at {rfc3339(query.latest)}, in the past (now {rfc3339(now)})")
    first = whole_second(max(query.earliest, now))
    latest = query.latest if query.horizon is None else min(query.latest, query.horizon)
    if query.horizon is not None and first + query.duration > query.horizon:
        raise OutOfRange(f"a reservation of {hours(query.duration)} from {rfc3339(first)} would end after "
                         f"{rfc3339(query.horizon)}, this aggregate's booking horizon (am.max_lease from now)")
    if first + query.duration > latest:
        raise BadArgs(f"the search window {rfc3339(first)}..{rfc3339(latest)} is shorter than the "
                      f"{hours(query.duration)} asked for")
    return Term(first, latest)


def candidate_starts(calendar: Calendar, window: Term, duration: timedelta) -> list[datetime]:
    """The start times worth weighing, in order: the window's start and every end of a booking that leaves
    room for `duration` before the window ends."""
    last = window.end - duration
    ends = {whole_second(e) for e in calendar.ends_within(window.start - timedelta(seconds=1), last)}
    return sorted({window.start} | {e for e in ends if window.start < e <= last})


def unavailable(calendar: Calendar, term: Term, now: datetime, held: Set[str] = frozenset(),
                held_now: Set[str] = frozenset()) -> Set[str]:
    """What the placement must not choose over `term`, as `Broker.place` reckons it: promised during it, held
    whatever the time, and (a term starting now) everything claimed in the store now. Asked unit by unit
    (broker/calendar.py `Unavailable`): each start weighed reads only the bookings of the units it tries."""
    return Unavailable(calendar, term, (held, held_now) if term.start <= now else (held,))


def find_slot(substrate: Substrate, request: Request, calendar: Calendar, query: SlotQuery, now: datetime,
              held: Set[str] = frozenset(), held_now: Set[str] = frozenset(), image_policy: str = "reject",
              bitstream_parts: Mapping[str, str] | None = None, policy: Any = None,
              kinds: Kinds = STANDARD, max_starts: int = MAX_STARTS) -> SlotAnswer:
    """The earliest start at which the whole `request` fits for `query.duration` within the query's window,
    with where it would go; or why there is none (what is short, and at which start the least was). `held`:
    units unavailable at every time (claims the calendar does not know of, inventory reclaimed); `held_now`:
    units claimed in the store now (they count for a start at `now`). Request errors raise (BADARGS)."""
    window = search_window(query, now)

    def attempt(used: Set[str]) -> tuple[list[Placement], list[Shortfall]]:
        shortfalls: list[Shortfall] = []
        placed = plan(substrate, request, used, image_policy, bitstream_parts, policy, shortfalls, kinds)
        return placed, shortfalls

    empty, never = attempt(held)
    if never:  # short even with nothing else reserved: no window helps
        said = report(substrate, request, empty, never, kinds)
        return SlotAnswer(False, summary=f"no slot: this request never fits here, even with nothing else reserved "
                          f"({said['summary']})", report=said, error=_error_of(never))
    starts = candidate_starts(calendar, window, query.duration)
    rest = starts[max_starts:]
    starts = starts[:max_starts]
    closest: tuple[int, datetime, list[Placement], list[Shortfall]] | None = None
    for tried, start in enumerate(starts, 1):
        term = Term(start, start + query.duration)
        placed, short = attempt(unavailable(calendar, term, now, held, held_now))
        if not short:
            return SlotAnswer(True, term.start, term.end, f"earliest slot: {rfc3339(term.start)} to "
                              f"{rfc3339(term.end)} ({hours(query.duration)}; {tried} start time"
                              f"{'s' * (tried != 1)} weighed)", tried, report(substrate, request, placed, short,
                                                                             kinds))
        if closest is None or len(short) < closest[0]:
            closest = (len(short), start, placed, short)
    assert closest is not None  # the window's start is always weighed
    _, when, placed, short = closest
    said = report(substrate, request, placed, short, kinds)
    reasons = "; ".join(s["reason"] for s in said["short"])
    searched = (f"between {rfc3339(window.start)} and {rfc3339(window.end)}" if not rest else
                f"starting between {rfc3339(window.start)} and {rfc3339(starts[-1])} (the first {len(starts)} "
                f"start times of the window; ask again from {rfc3339(rest[0])} for the rest)")
    return SlotAnswer(False, summary=f"no slot of {hours(query.duration)} for this request {searched}: none of the "
                      f"{len(starts)} start time{'s' * (len(starts) != 1)} weighed (the window's start and each end "
                      f"of a reservation in it) fits; the least was short from {rfc3339(when)}: {reasons}",
                      tried=len(starts), report=said, closest=when, error=_error_of(short))


def _error_of(short: list[Shortfall]) -> str:
    """The GENI error type to answer for a search that found nothing: the first element's that was short."""
    return next((type(s.error).__name__ for s in short if s.error is not None), "InsufficientNodes")
