"""Terms: the interval a ticket or lease is valid for (ORCA's Term)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime


class TermError(ValueError):
    pass


@dataclass(frozen=True)
class Term:
    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        if self.end <= self.start:
            raise TermError(f"term end {self.end:%Y-%m-%dT%H:%M:%SZ} is not after start {self.start:%Y-%m-%dT%H:%M:%SZ}")

    def extend_to(self, end: datetime) -> Term:
        if end <= self.end:
            raise TermError(f"new end {end:%Y-%m-%dT%H:%M:%SZ} is not after {self.end:%Y-%m-%dT%H:%M:%SZ}")
        return replace(self, end=end)

    def contains(self, when: datetime) -> bool:
        return self.start <= when < self.end

    def overlaps(self, other: Term) -> bool:
        return self.start < other.end and other.start < self.end

    def expired(self, now: datetime) -> bool:
        return now >= self.end
