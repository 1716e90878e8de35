"""ListResources option `slicex_find_slot`: "when can I have this request for that long?", answered by the
broker's calendar (broker/slots.py) through the slice manager.

The option is a struct (omni passes it from `--optionsfile`, geni-lib in its options dict):

    {"slicex_find_slot": {"rspec": "<rspec type='request' ...>", "duration_seconds": 21600,
                          "earliest_start": "2030-01-01T08:00:00Z", "latest_end": "2030-01-03T08:00:00Z"}}

`rspec` and `duration_seconds` are required; the window defaults to [now, now + am.max_lease]. Both are bounded
here, before anything is computed from them: the duration is a finite number of seconds of at most am.max_lease
(the longest reservation), a reservation from `earliest_start` must end by the booking horizon (now +
am.max_lease), and a
`latest_end` past the horizon is read as the horizon; anything else is BADARGS naming the bound. The answer is
an advertisement RSpec naming the slot (rspec/slot.py) and, in `output`, one line; Allocate with that
`geni_start_time` and `geni_end_time` gets it if nothing is booked in between. No slot in the window is the
GENI error of what is short (INSUFFICIENT_NODES 26, INSUFFICIENT_BANDWIDTH 25, VLAN_UNAVAILABLE 24) with
the reason and from when; a malformed question, or one past the bounds above, is BADARGS 1."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

from protocol.messages import SlotQuery
from slicex.clock import parse_time, rfc3339
from slicex.errors import BadArgs

OPTION = "slicex_find_slot"
FIELDS = ("rspec", "duration_seconds", "earliest_start", "latest_end")


def slot_question(value: Any, now: datetime, max_lease: timedelta) -> tuple[str, SlotQuery]:
    """The request RSpec and the question the option asks, within this aggregate's limits (am.max_lease: the
    longest reservation, and how far ahead one may end); BADARGS naming what is malformed or which bound it
    passes. Nothing else is raised, whatever the option holds (tests/security/test_find_slot_bounds.py)."""
    if not isinstance(value, dict):
        raise BadArgs(f"{OPTION} must be a struct with {', '.join(FIELDS)}, got {type(value).__name__}")
    unknown = sorted(set(map(str, value)) - set(FIELDS))
    if unknown:
        raise BadArgs(f"{OPTION}: unknown field(s) {', '.join(unknown)} (it takes {', '.join(FIELDS)})")
    rspec = value.get("rspec")
    if not isinstance(rspec, str) or not rspec.strip():
        raise BadArgs(f"{OPTION}.rspec must be the request RSpec, a string of XML")
    duration = _duration(value.get("duration_seconds"), max_lease)
    horizon = now + max_lease
    earliest = _time(value, "earliest_start", now)
    if max(earliest, now) + timedelta(seconds=duration) > horizon:
        raise BadArgs(f"{OPTION}: {duration} s from {rfc3339(max(earliest, now))} would end after "
                      f"{rfc3339(horizon)}, this aggregate's booking horizon ({_days(max_lease)} from now, "
                      f"am.max_lease); start earlier or ask for less")
    latest = min(_time(value, "latest_end", horizon), horizon)  # the broker would cut it there too
    return rspec, SlotQuery(duration, earliest, latest, int(max_lease.total_seconds()), horizon)


def _duration(duration: Any, max_lease: timedelta) -> int:
    """Whole seconds of a positive, finite duration no longer than the longest reservation (am.max_lease)."""
    if isinstance(duration, bool) or not isinstance(duration, (int, float)) or not duration > 0:
        raise BadArgs(f"{OPTION}.duration_seconds must be a positive number of seconds (6 hours: 21600), "
                      f"not {duration!r}")
    longest = int(max_lease.total_seconds())
    if not duration <= longest:  # also NaN and infinity, before any arithmetic on them
        raise BadArgs(f"{OPTION}.duration_seconds {duration!r} is longer than the longest reservation here: "
                      f"{longest} s ({_days(max_lease)}, am.max_lease)")
    return math.ceil(duration)


def _days(span: timedelta) -> str:
    return f"{span.total_seconds() / 86400:g} days"


def _time(value: dict[str, Any], key: str, default: datetime) -> datetime:
    if key not in value:
        return default
    try:
        return parse_time(value[key])
    except (BadArgs, TypeError, ValueError, AttributeError, OverflowError):
        raise BadArgs(f"{OPTION}.{key} {value[key]!r} is not an RFC 3339 time (e.g. 2030-01-01T12:00:00Z)") from None
