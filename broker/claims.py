"""The broker's copy of the store's unit claims, kept in step by the store's claim changes.

Every broker process on a store must not promise a unit another one claimed. Reading every claim at every
placement made each placement cost as much as the whole aggregate's use; so did reading every pool's claim
counter (issue 33: Allocate 6.2 → 11.5 ms from 0 to 6,318 live slices). Instead the broker keeps the claims
in memory (read once at start), applies its own claims and releases to the copy, and before a placement asks
the store only which pools changed since the generation it last saw (slicex.store `claim_changes`: each
claim, release or new owner marks its pool with a new generation, atomically with the change). Each changed
pool is read again, that pool alone (`claims_under`), so a placement reads as much as changed since the last
one, not as much as is in use. Should the store refuse a claim all the same (a race between the question and
the claim), the store's atomic `claim_all` refuses it; the broker then reads every claim again (`reload`)
and places again.

Plain data over a store; the broker holds its lock around every call."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from slicex.store import counter_of

log = logging.getLogger("slicex.broker")


class ClaimCopy:
    """Unit → ticket group, by pool counter and by owner, as the store holds them (`kinds`: the unit
    namespaces, resources' UNIT_KINDS)."""

    def __init__(self, store, kinds: Iterable[str]):
        self.store = store
        self.kinds = frozenset(kinds)
        self.owner: dict[str, str] = {}
        self.by_counter: dict[str, set[str]] = {}
        self.by_owner: dict[str, set[str]] = {}
        self.seen = 0  # the store's claims generation the copy is complete to (slicex.store `claim_changes`)
        self._leading: dict[tuple[int, int, int], LeadingFull] = {}  # first-fit's full leading hosts, per host list

    # ---- the copy --------------------------------------------------------------------------------------------
    def _add(self, key: str, owner: str) -> None:
        old = self.owner.get(key)
        if old == owner:
            return
        if old is not None:
            self._remove(key)
        self.owner[key] = owner
        self.by_counter.setdefault(counter_of(key), set()).add(key)
        self.by_owner.setdefault(owner, set()).add(key)

    def _remove(self, key: str) -> None:
        owner = self.owner.pop(key, None)
        if owner is None:
            return
        counter = counter_of(key)
        for leading in self._leading.values():  # a leading host losing a claim may fit again
            i = leading.position.get(counter)
            if i is not None and i < leading.n:
                leading.n = i
        for index, name in ((self.by_counter, counter), (self.by_owner, owner)):
            keys = index.get(name)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del index[name]

    def claimed(self, keys: Iterable[str], owner: str) -> None:
        """The store granted `owner` these keys."""
        for k in keys:
            self._add(k, owner)

    def released(self, keys: Iterable[str], owner: str) -> None:
        """The store released these keys of `owner`."""
        for k in keys:
            if self.owner.get(k) == owner:
                self._remove(k)

    def released_owner(self, owner: str) -> None:
        for k in list(self.by_owner.get(owner, ())):
            self._remove(k)

    # ---- in step with the store ------------------------------------------------------------------------------
    def reload(self) -> None:
        """Every unit claim read again (start-up, and after a lost claim race)."""
        seen, _changed = self.store.claim_changes(self.seen)  # before the read: a change during it is read again
        claims = self.store.claims_in(self.kinds)
        self.seen = seen
        self.owner, self.by_counter, self.by_owner = {}, {}, {}
        self._leading = {}
        for k, o in claims.items():
            self._add(k, o)

    def counts(self) -> dict[str, int]:
        return {c: len(keys) for c, keys in self.by_counter.items() if c.partition(":")[0] in self.kinds}

    def stored_counts(self) -> dict[str, int]:
        return {c: n for c, n in self.store.claim_counts().items() if c.partition(":")[0] in self.kinds}

    def sync(self) -> list[str]:
        """Read again the pools the store marked changed since the copy's generation (one read of the changes;
        each changed pool's claims, this process's own changes included). Returns the pools read."""
        seen, changed = self.store.claim_changes(self.seen)
        if seen < self.seen:  # the store went back (a restored copy, a failover that lost writes)
            log.warning("the store's claims generation went back (%d after %d); every claim read again",
                        seen, self.seen)
            self.reload()
            return sorted(self.by_counter)
        stale = sorted({c for c in changed if c.partition(":")[0] in self.kinds})
        for c in stale:  # only what differs is applied: most changes are this process's own, applied already
            now = self.store.claims_under(c)
            owner = self.owner
            for k in [k for k in self.by_counter.get(c, ()) if now.get(k) != owner[k]]:
                self._remove(k)
            for k, o in now.items():
                if owner.get(k) != o:
                    self._add(k, o)
        self.seen = seen
        return stale

    def verify(self) -> dict[str, tuple[int, int]]:
        """Start-up: the store's counters against the claims themselves (just read by `reload`); counters
        that disagree (a store whose counters were lost or never kept) are rebuilt from the claims. Returns
        counter → (kept, counted) of those that disagreed."""
        kept, counted = self.stored_counts(), self.counts()
        wrong = {c: (kept.get(c, 0), counted.get(c, 0)) for c in kept.keys() | counted.keys()
                 if kept.get(c, 0) != counted.get(c, 0)}
        if wrong:
            log.warning("claim counters disagreed with the claims for %d pools (e.g. %s); recounted from the "
                        "claims", len(wrong), next(iter(sorted(wrong))))
            self.store.recount_claims(repair=True)
        return wrong

    # ---- questions -------------------------------------------------------------------------------------------
    def leading_full(self, hosts: Sequence[Any], counters: Callable[[Any], tuple[str, int]]) -> LeadingFull:
        """The run of leading hosts of `hosts` (inventory order) whose pools `counters(host)` (its core pool
        and the pool's size) are wholly claimed, kept between placements over the same host list (the same
        first and last host objects, the same length; a few lists at most)."""
        key = (id(hosts[0]), id(hosts[-1]), len(hosts))
        leading = self._leading.get(key)
        if leading is None or leading.first is not hosts[0] or leading.last is not hosts[-1]:
            if len(self._leading) >= 4:
                self._leading = {}
            leading = self._leading[key] = LeadingFull(self, hosts, [counters(h) for h in hosts])
        return leading

    def held_by_others(self, counter: str, group: str) -> int:
        """Claims of a pool held by anyone but `group`."""
        keys = self.by_counter.get(counter, ())
        mine = self.by_owner.get(group, ())
        return len(keys) - (sum(1 for k in mine if counter_of(k) == counter) if mine else 0)


class LeadingFull:
    """How many leading hosts of one host list hold a claim on every unit of their core pool, as the claim copy
    has them: first-fit starts its walk after them, so a placement does not weigh again every host the slices
    filled before it (issue 33: the walk grew with the live slices). The copy lowers `n` when one of them loses
    a claim, and forgets it when it reads every claim again; the walk (under the broker's lock) raises it."""

    def __init__(self, copy: ClaimCopy, hosts: Sequence[Any], pools: list[tuple[str, int]]):
        self.copy = copy
        self.first, self.last = hosts[0], hosts[-1]  # held: the key's ids stay theirs
        self.pools = pools
        self.position = {counter: i for i, (counter, _size) in enumerate(pools)}
        self.n = 0

    def passed(self, i: int) -> None:
        """The walk found host `i` full: the run grows when `i` is next after it and its pool is wholly claimed
        (by anyone: a pool full only for the placement asking, its own units aside, does not count)."""
        if i == self.n:
            counter, size = self.pools[i]
            if len(self.copy.by_counter.get(counter, ())) >= size:
                self.n = i + 1


class ClaimedByOthers(AbstractSet[str]):
    """The units the copy says are claimed by anyone but `group`, asked one at a time; with `explained`,
    a claim is left out when its unit's booking by the same group ends before a future term (the claim
    ends with it)."""

    def __init__(self, copy: ClaimCopy, group: str, ends_before=None):
        self.copy = copy
        self.group = group
        self.ends_before = ends_before  # (unit, owner) -> True when that claim cannot hold during the term

    def __contains__(self, unit: object) -> bool:
        owner = self.copy.owner.get(unit) if isinstance(unit, str) else None
        if owner is None or owner == self.group:
            return False
        return not (self.ends_before is not None and self.ends_before(unit, owner))

    def __iter__(self) -> Iterator[str]:
        return (k for k in list(self.copy.owner) if k in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __bool__(self) -> bool:
        return bool(self.copy.owner)


def counts_of(claims: Mapping[str, str]) -> dict[str, int]:
    """Counter → claims, recomputed from a claims mapping (start-up checks, tests)."""
    out: dict[str, int] = {}
    for k in claims:
        c = counter_of(k)
        if c:
            out[c] = out.get(c, 0) + 1
    return out
