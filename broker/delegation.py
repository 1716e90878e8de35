"""The broker's side of a delegation: claiming a delegated inventory into its calendar and reclaiming what is
not promised (ORCA: claim / reclaim). The document itself is protocol/delegation.py."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from broker.calendar import Calendar
from protocol.delegation import Delegation


def claim(calendar: Calendar, delegation: Delegation) -> None:
    """The broker takes delegated inventory into its calendar (ORCA claim)."""
    for p in delegation.pools:
        calendar.add_pool(p)
    for ls in delegation.label_sets:
        calendar.add_label_set(ls)


def reclaim(calendar: Calendar, names: Iterable[str], now: datetime) -> tuple[list[str], list[str]]:
    """The authority takes back pools/label sets. Those nothing promises after `now` leave the calendar at
    once; the others are *draining* (no new promises) until their promises end. Returns (reclaimed,
    still promised)."""
    done, busy = [], []
    for name in names:
        if name not in calendar.pools and name not in calendar.label_sets:
            done.append(name)  # already gone: reclaiming twice is fine
            continue
        if calendar.promised(name, now):
            calendar.draining.add(name)
            busy.append(name)
            continue
        for holder in {h for u in calendar.units_of(name) for h in calendar.holders_ever(u)}:
            calendar.release(holder)  # bookings that ended before `now` and were not swept yet
        calendar.remove(name)
        done.append(name)
    return done, busy
