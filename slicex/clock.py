"""Actor clocks. Time is an argument to the pure core; these supply it at the edges."""

from __future__ import annotations

import functools
import threading
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime: ...


class SystemClock:
    """Wall-clock time in UTC, truncated to whole seconds (GENI times carry no fractions)."""

    def now(self) -> datetime:
        return datetime.now(UTC).replace(microsecond=0)


class ManualClock:
    """A clock tests move by hand, so expiry is deterministic."""

    def __init__(self, start: datetime | None = None):
        self._now = (start or datetime(2030, 1, 1, tzinfo=UTC))
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, delta: timedelta) -> datetime:
        with self._lock:
            self._now += delta
            return self._now

    def set(self, when: datetime) -> None:
        with self._lock:
            self._now = when


@functools.lru_cache(maxsize=4096)
def rfc3339(when: datetime) -> str:
    """GENI time format: RFC 3339 with an explicit UTC zone. Cached: the same few terms are written into
    every record, ticket and lease a call saves."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> datetime:
    """Parse the times clients send (RFC 3339, ISO 8601 with or without zone; naive means UTC)."""
    if isinstance(text, str):
        return _parse_text(text)  # cached: records read back the same few times on every call
    return _parse(text)


@functools.lru_cache(maxsize=4096)
def _parse_text(text: str) -> datetime:
    return _parse(text)


def _parse(text: object) -> datetime:
    from slicex.errors import BadArgs

    if isinstance(text, datetime):
        when = text
    else:
        if not isinstance(text, str) or not text.strip():
            raise BadArgs(f"expected a time string, got {text!r}")
        s = text.strip().replace(" ", "T", 1) if "T" not in text else text.strip()
        if s.endswith("Z") or s.endswith("z"):
            s = s[:-1] + "+00:00"
        try:
            when = datetime.fromisoformat(s)
        except ValueError:
            raise BadArgs(f"{text!r} is not an RFC 3339 time (e.g. 2030-01-01T12:00:00Z)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    try:
        return when.astimezone(UTC).replace(microsecond=0)
    except OverflowError:  # 0001-01-01T00:00:00+01:00 is before the first time a datetime holds
        raise BadArgs(f"{text!r} is outside the years 1-9999 in UTC") from None
