"""ListResources option `slicex_find_slot`: "when can I have this request for that long?", answered by the
broker's calendar (broker/slots.py) through the slice manager.

The option is a struct (omni passes it from `--optionsfile`, geni-lib in its options dict):

    {"slicex_find_slot": {"rspec": "<rspec type='request' ...>", "duration_seconds": 21600,
                          "earliest_start": "2030-01-01T08:00:00Z", "latest_end": "2030-01-03T08:00:00Z"}}

`rspec` and `duration_seconds` are required; the window defaults to [now, now + am.max_lease]. The answer is
an advertisement RSpec naming the slot (rspec/slot.py) and, in `output`, one line; Allocate with that
`geni_start_time` and `geni_end_time` gets it if nothing is booked in between. No slot in the window is the
GENI error of what is short (INSUFFICIENT_NODES 26, INSUFFICIENT_BANDWIDTH 25, VLAN_UNAVAILABLE 24) with
the reason and from when; a malformed question is BADARGS 1, one past the aggregate's limits OUTOFRANGE 19."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

from protocol.messages import SlotQuery
from slicex.clock import parse_time
from slicex.errors import BadArgs

OPTION = "slicex_find_slot"
FIELDS = ("rspec", "duration_seconds", "earliest_start", "latest_end")


def slot_question(value: Any, now: datetime, max_lease: timedelta) -> tuple[str, SlotQuery]:
    """The request RSpec and the question the option asks, within this aggregate's limits (am.max_lease: the
    longest reservation, and how far ahead one may end); BADARGS naming what is malformed."""
    if not isinstance(value, dict):
        raise BadArgs(f"{OPTION} must be a struct with {', '.join(FIELDS)}, got {type(value).__name__}")
    unknown = sorted(set(value) - set(FIELDS))
    if unknown:
        raise BadArgs(f"{OPTION}: unknown field(s) {', '.join(unknown)} (it takes {', '.join(FIELDS)})")
    rspec = value.get("rspec")
    if not isinstance(rspec, str) or not rspec.strip():
        raise BadArgs(f"{OPTION}.rspec must be the request RSpec, a string of XML")
    duration = value.get("duration_seconds")
    if isinstance(duration, bool) or not isinstance(duration, (int, float)) or duration <= 0:
        raise BadArgs(f"{OPTION}.duration_seconds must be a positive number of seconds (6 hours: 21600), "
                      f"not {duration!r}")
    horizon = now + max_lease
    return rspec, SlotQuery(math.ceil(duration), _time(value, "earliest_start", now),
                            _time(value, "latest_end", horizon), int(max_lease.total_seconds()), horizon)


def _time(value: dict[str, Any], key: str, default: datetime) -> datetime:
    if key not in value:
        return default
    try:
        return parse_time(value[key])
    except (BadArgs, TypeError, ValueError, AttributeError):
        raise BadArgs(f"{OPTION}.{key} {value[key]!r} is not an RFC 3339 time (e.g. 2030-01-01T12:00:00Z)") from None
