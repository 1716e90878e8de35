"""The broker's inventory calendar: which units and labels are promised to whom, over which terms.

Inventory comes in *pools* (interchangeable units of one resource type, e.g. the cores of one host: pool
`core:<host>` with units `core:<host>:0..n`) and *label sets* (e.g. the VLAN tags a switch offers: label set
`vlan:<switch>` over ranges; tag t is the unit `vlan:<switch>:t`). Pools belong to a *bin* (the host), so a
VM's cores and memory are taken from one place. A booking holds units over a term; two bookings of one unit
never overlap in time. A booking may start in the future (an advance reservation).

Plain data and plain methods: no clock, no store, no I/O; time comes in as terms. The broker
(broker/broker.py) persists what it books and rebuilds a calendar from the store after a restart."""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from datetime import datetime

from protocol.delegation import LabelSet, Pool
from slicex.term import Term


class CalendarError(ValueError):
    """A booking the calendar refuses; the message says which unit, which term, and who holds it."""


@dataclass(frozen=True)
class Booking:
    holder: str  # the ticket (or its claim group) that holds the units
    units: frozenset[str]
    term: Term


@dataclass
class Calendar:
    pools: dict[str, Pool] = field(default_factory=dict)
    label_sets: dict[str, LabelSet] = field(default_factory=dict)
    bookings: dict[str, Booking] = field(default_factory=dict)
    draining: set[str] = field(default_factory=set)  # pools/label sets being reclaimed: no new bookings
    open_inventory: bool = False  # accept units outside every pool (a broker nobody has delegated to yet)
    _by_unit: dict[str, list[tuple[datetime, datetime, str]]] = field(default_factory=dict, repr=False)
    _idle: dict[str, list[int]] = field(default_factory=dict, repr=False)  # pool -> sorted indices not booked
    _busy: dict[str, set[int]] = field(default_factory=dict, repr=False)  # pool -> indices with bookings
    _index: dict[str, tuple[str, int]] = field(default_factory=dict, repr=False)  # unit -> (pool, index)
    _bins: tuple | None = field(default=None, repr=False)
    # the interval index: every booking by its end, so a question about a term reads the bookings that end
    # after it starts (find-slot's start times, the expiry sweep), never the whole calendar
    _ends: list[tuple[datetime, str]] = field(default_factory=list, repr=False)
    _groups: dict[str, set[str]] = field(default_factory=dict, repr=False)  # claim group -> its holders

    def copy(self) -> Calendar:
        """An independent copy to read while the broker goes on booking (pools, label sets and bookings are
        immutable values and are shared; the indices are copied)."""
        return Calendar(dict(self.pools), dict(self.label_sets), dict(self.bookings), set(self.draining),
                        self.open_inventory, {u: list(spans) for u, spans in self._by_unit.items()},
                        {p: list(idle) for p, idle in self._idle.items()},
                        {p: set(busy) for p, busy in self._busy.items()}, dict(self._index), None,
                        list(self._ends), {g: set(h) for g, h in self._groups.items()})

    # ---- inventory ---------------------------------------------------------------------------------------
    def add_pool(self, pool: Pool) -> None:
        old = self.pools.get(pool.name)
        if old is not None and set(old.units) - set(pool.units):
            gone = sorted(set(old.units) - set(pool.units))
            held = [u for u in gone if self._by_unit.get(u)]
            if held:
                raise CalendarError(f"pool {pool.name}: cannot drop {', '.join(held[:3])}: promised")
        self.pools[pool.name] = pool
        self._bins = None
        self.draining.discard(pool.name)
        for i, u in enumerate(pool.units):
            self._index[u] = (pool.name, i)
        self._idle[pool.name] = [i for i, u in enumerate(pool.units) if not self._by_unit.get(u)]
        self._busy[pool.name] = {i for i, u in enumerate(pool.units) if self._by_unit.get(u)}

    def add_label_set(self, labels: LabelSet) -> None:
        self.label_sets[labels.name] = labels
        self.draining.discard(labels.name)

    def remove(self, name: str) -> None:
        """Drop a pool or label set from the inventory (reclaimed by its authority); refuse while promised."""
        held = [u for u in self.units_of(name) if self._by_unit.get(u)]
        if held:
            raise CalendarError(f"{name}: cannot remove, {len(held)} units still promised (e.g. {held[0]})")
        pool = self.pools.pop(name, None)
        self._bins = None
        if pool is not None:
            for u in pool.units:
                self._index.pop(u, None)
            self._idle.pop(name, None)
            self._busy.pop(name, None)
        self.label_sets.pop(name, None)
        self.draining.discard(name)

    def units_of(self, name: str) -> list[str]:
        """Units of a pool or label set, plus (for open pools) any booked unit under its prefix."""
        if name in self.label_sets:
            ls = self.label_sets[name]
            return [ls.key(v) for v in ls.values()]
        pool = self.pools.get(name)
        named = list(pool.units) if pool else []
        return named + [u for u in self._by_unit if u not in self._index and self.owner_name(u) == name]

    def owner_name(self, unit: str) -> str | None:
        """The pool or label set a unit belongs to: the longest prefix (at ':' boundaries) that names one."""
        hit = self._index.get(unit)
        if hit is not None:
            return hit[0]
        name = unit
        while True:
            if name in self.pools or name in self.label_sets:
                if name in self.label_sets and name != unit:
                    try:
                        value = int(unit[len(name) + 1:])
                    except ValueError:
                        return None
                    return name if value in self.label_sets[name] else None
                return name
            if ":" not in name:
                return None
            name = name.rsplit(":", 1)[0]

    # ---- queries ---------------------------------------------------------------------------------------------
    def holders(self, unit: str, term: Term) -> list[str]:
        """Who holds `unit` at some time in `term`."""
        return [h for s, e, h in self._by_unit.get(unit, ()) if s < term.end and term.start < e]

    def holders_ever(self, unit: str) -> list[str]:
        return [h for _s, _e, h in self._by_unit.get(unit, ())]

    def is_unavailable(self, unit: str, term: Term) -> bool:
        """Whether `unit` cannot be booked over `term` (what `unavailable` holds, for one unit: reads only its
        own bookings)."""
        spans = self._by_unit.get(unit)
        if spans and any(s < term.end and term.start < e for s, e, _ in spans):
            return True
        return bool(self.draining) and self.owner_name(unit) in self.draining

    def holders_of(self, group: str) -> list[str]:
        """The holders of a claim group (`<group>/<reservation>`), from the group index."""
        return sorted(self._groups.get(group, ()))

    def ending_by(self, t: datetime) -> list[str]:
        """Holders whose term ends at or before `t`, earliest first (the interval index, not a sweep)."""
        return [h for _e, h in self._ends[:bisect.bisect_right(self._ends, (t, "\U0010ffff"))]]

    def ends_within(self, after: datetime, until: datetime) -> list[datetime]:
        """The ends of bookings in (after, until], in order."""
        lo = bisect.bisect_right(self._ends, (after, "\U0010ffff"))
        hi = bisect.bisect_right(self._ends, (until, "\U0010ffff"))
        return [e for e, _h in self._ends[lo:hi]]

    def is_free(self, unit: str, term: Term, ignore: str | None = None) -> bool:
        return all(h == ignore for h in self.holders(unit, term))

    def free_units(self, pool_name: str, term: Term, limit: int | None = None) -> list[str]:
        """Free units of a pool over the whole term, in pool order (first fit), at most `limit`."""
        pool = self.pools[pool_name]
        if pool_name in self.draining:
            return []
        # units never booked are free at any time; booked ones only if no booking overlaps the term
        busy = sorted(i for i in self._busy.get(pool_name, ()) if self.is_free(pool.units[i], term))
        merged = heapq.merge(self._idle.get(pool_name, []), busy)
        return [pool.units[i] for i in itertools.islice(merged, limit)]

    def free_count(self, pool_name: str, term: Term) -> int:
        pool = self.pools[pool_name]
        if pool_name in self.draining:
            return 0
        return len(pool.units) - sum(1 for i in self._busy.get(pool_name, ()) if not self.is_free(pool.units[i], term))

    def free_labels(self, set_name: str, term: Term) -> list[int]:
        ls = self.label_sets[set_name]
        if set_name in self.draining:
            return []
        return [v for v in ls.values() if self.is_free(ls.key(v), term)]

    def bins(self) -> dict[str, list[Pool]]:
        """Pools by bin, in inventory order (cached until the inventory changes)."""
        key = (len(self.pools), id(next(reversed(self.pools.values()), None)))
        if self._bins is None or self._bins[0] != key:
            out: dict[str, list[Pool]] = {}
            for p in self.pools.values():
                if p.bin:
                    out.setdefault(p.bin, []).append(p)
            self._bins = (key, out)
        return self._bins[1]

    def promised(self, name: str, after: datetime) -> list[str]:
        """Units of a pool or label set promised at some time after `after` (what a reclaim must leave)."""
        return [u for u in self.units_of(name) if any(e > after for _s, e, _h in self._by_unit.get(u, ()))]

    def unavailable(self, term: Term) -> set[str]:
        """Every unit that cannot be booked over `term`: promised at some time in it, or draining. Reads the
        bookings that end after the term starts (the interval index)."""
        first = bisect.bisect_right(self._ends, (term.start, "\U0010ffff"))
        out: set[str] = set()
        for _e, h in self._ends[first:]:
            b = self.bookings[h]
            if b.term.start < term.end:
                out |= b.units
        for name in self.draining:
            out.update(self.units_of(name))
        return out

    def booked_by(self, holders: Iterable[str], term: Term) -> set[str]:
        """The units of these bookings that overlap `term`, and every draining unit: `unavailable` for a few
        holders (an availability answer names the units of tickets not claimed yet; the rest are counted)."""
        out: set[str] = set()
        for h in holders:
            b = self.bookings.get(h)
            if b is not None and b.term.start < term.end and b.term.end > term.start:
                out |= b.units
        for name in self.draining:
            out.update(self.units_of(name))
        return out

    # ---- changes ---------------------------------------------------------------------------------------------
    def check(self, holder: str, units: Iterable[str], term: Term) -> None:
        """Raise CalendarError unless every unit is in the inventory, not draining, and free over `term`."""
        for u in units:
            name = self.owner_name(u)
            if name is None and not self.open_inventory:
                raise CalendarError(f"unit {u} is not in the inventory delegated to this broker")
            if name in self.draining:
                raise CalendarError(f"unit {u} is being reclaimed by its authority ({name}); no new promises")
            others = [h for h in self.holders(u, term) if h != holder]
            if others:
                raise CalendarError(f"unit {u} is promised to someone else ({others[0]}) during {_span(term)}")

    def book(self, holder: str, units: Iterable[str], term: Term) -> Booking:
        """Promise `units` to `holder` over `term`, all or nothing. Booking again for the same holder adds
        units (with the same term)."""
        units = frozenset(units)
        old = self.bookings.get(holder)
        if old is not None and old.term != term:
            raise CalendarError(f"{holder} already holds a booking over {_span(old.term)}; extend it instead")
        self.check(holder, units - (old.units if old else frozenset()), term)
        booking = Booking(holder, units | (old.units if old else frozenset()), term)
        if old is not None:
            self._unindex(old)
        self.bookings[holder] = booking
        self._reindex(booking)
        return booking

    def extend(self, holder: str, end: datetime) -> Booking:
        """Move the end of a booking; growing needs every unit free for the added time."""
        old = self.bookings.get(holder)
        if old is None:
            raise CalendarError(f"{holder} holds nothing to extend")
        if end <= old.term.start:
            raise CalendarError(f"new end {end:%Y-%m-%dT%H:%M:%SZ} is not after the start of {holder}'s term")
        if end > old.term.end:
            self.check(holder, old.units, Term(old.term.end, end))
        new = replace(old, term=Term(old.term.start, end))
        self._unindex(old)
        self.bookings[holder] = new
        self._reindex(new)
        return new

    def release(self, holder: str) -> Booking | None:
        old = self.bookings.pop(holder, None)
        if old is not None:
            self._unindex(old)
        return old

    def expire(self, now: datetime) -> list[Booking]:
        """Drop bookings whose term has ended; return them."""
        gone = [self.bookings[h] for h in self.ending_by(now)]
        for b in gone:
            self.release(b.holder)
        return gone

    def _reindex(self, b: Booking) -> None:
        bisect.insort(self._ends, (b.term.end, b.holder))
        self._groups.setdefault(b.holder.rsplit("/", 1)[0], set()).add(b.holder)
        for u in b.units:
            self._by_unit.setdefault(u, []).append((b.term.start, b.term.end, b.holder))
            hit = self._index.get(u)
            if hit is not None and hit[1] not in self._busy[hit[0]]:
                self._busy[hit[0]].add(hit[1])
                idle = self._idle[hit[0]]
                idle.pop(bisect.bisect_left(idle, hit[1]))

    def _unindex(self, b: Booking) -> None:
        i = bisect.bisect_left(self._ends, (b.term.end, b.holder))
        if i < len(self._ends) and self._ends[i] == (b.term.end, b.holder):
            del self._ends[i]
        group = b.holder.rsplit("/", 1)[0]
        held = self._groups.get(group)
        if held is not None:
            held.discard(b.holder)
            if not held:
                del self._groups[group]
        for u in b.units:
            spans = [s for s in self._by_unit.get(u, ()) if s[2] != b.holder]
            if spans:
                self._by_unit[u] = spans
                continue
            self._by_unit.pop(u, None)
            hit = self._index.get(u)
            if hit is not None:
                self._busy[hit[0]].discard(hit[1])
                bisect.insort(self._idle[hit[0]], hit[1])


class Unavailable(AbstractSet[str]):
    """What cannot be booked over `term`: the calendar's promises and draining pools, and whatever `also` holds
    (claims in the store, reclaimed inventory), asked one unit at a time. The placement asks a few hundred
    units; building the whole set (reading every booking and claim) happens only if someone iterates it."""

    def __init__(self, calendar: Calendar, term: Term, also: Sequence[AbstractSet[str]] = ()):
        self.calendar = calendar
        self.term = term
        self.also = tuple(a for a in also if a)
        self._all: set[str] | None = None

    def __contains__(self, unit: object) -> bool:
        if not isinstance(unit, str):
            return False
        return self.calendar.is_unavailable(unit, self.term) or any(unit in a for a in self.also)

    def _materialized(self) -> set[str]:
        if self._all is None:
            out = self.calendar.unavailable(self.term)
            for a in self.also:
                out |= set(a)
            self._all = out
        return self._all

    def __iter__(self) -> Iterator[str]:
        return iter(self._materialized())

    def __len__(self) -> int:
        return len(self._materialized())


def _span(term: Term) -> str:
    return f"{term.start:%Y-%m-%dT%H:%M:%SZ}..{term.end:%Y-%m-%dT%H:%M:%SZ}"


def common_free_labels(calendar: Calendar, set_names: Sequence[str], term: Term) -> list[int]:
    """Label values free in every one of `set_names` over `term` (a link across non-translating hops needs
    the same tag everywhere)."""
    if not set_names:
        return []
    common = set(calendar.free_labels(set_names[0], term))
    for name in set_names[1:]:
        common &= set(calendar.free_labels(name, term))
    return sorted(common)
