"""The broker's copy of the store's unit claims, kept in step by the store's claim changes.

Every broker process on a store must not promise a unit another one claimed. Reading every claim at every
placement made each placement cost as much as the whole aggregate's use; so did reading every pool's claim
counter (issue 33: Allocate 6.2 → 11.5 ms from 0 to 6,318 live slices). Instead the broker keeps the claims
in memory, applies its own claims and releases to the copy, and before a placement asks the store only which
pools changed since the generation it last saw (slicex.store `claim_changes`: each claim, release or new owner
marks its pool with a new generation, atomically with the change). Each changed pool is read again, that pool
alone (`claims_under`), so a placement reads as much as changed since the last one, not as much as is in use.

A start reads no claim either (`slicex up` would cost as much as the aggregate's use): only the store's claim
counters, one per pool, bounded by the substrate. A pool's claims are read the first time a placement asks
about one of its units (`load`), which also checks its counter against them. Should the store refuse a claim
all the same (a race between the question and the claim), the store's atomic `claim_all` refuses it; the broker
then starts the copy again from the counters (`reload`) and places again.

Plain data over a store; the broker holds its lock around every call."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from slicex.store import counter_of

log = logging.getLogger("slicex.broker")
LATEST = 2**62
"""A claims generation no store reaches: `claim_changes(LATEST)` answers the generation alone, no counter."""


class ClaimCopy:
    """Unit → ticket group, by pool counter and by owner, as the store holds them (`kinds`: the unit
    namespaces, resources' UNIT_KINDS), read a pool at a time when first asked about (`loaded`); `counted`
    holds every pool's claim count as the store's counters had it at start, for pools not read yet."""

    def __init__(self, store, kinds: Iterable[str]):
        self.store = store
        self.kinds = frozenset(kinds)
        self.owner: dict[str, str] = {}
        self.by_counter: dict[str, set[str]] = {}
        self.by_owner: dict[str, set[str]] = {}
        self.loaded: set[str] = set()  # pools whose claims the copy holds
        self.counted: dict[str, int] = {}  # pool -> claims, from the store's counters (pools not loaded)
        self.complete = False  # every pool read (`everything`): a pool not loaded holds no claim
        self.seen = 0  # the store's claims generation the copy is complete to (slicex.store `claim_changes`)
        self._leading: dict[tuple[int, int, int], LeadingFull] = {}  # first-fit's full leading hosts, per host list

    # ---- the copy --------------------------------------------------------------------------------------------
    def _known(self, counter: str) -> bool:
        return self.complete or counter in self.loaded

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
        self._changed(keys, lambda k: self._add(k, owner))

    def released(self, keys: Iterable[str], owner: str) -> None:
        """The store released these keys of `owner`."""
        self._changed(keys, lambda k: self._remove(k) if self.owner.get(k) == owner else None)

    def _changed(self, keys: Iterable[str], apply) -> None:
        """Apply this process's own change to the pools read; a pool not read yet is read now, with the change
        (so the copy's counts stay the store's without waiting for the next `sync`)."""
        for k in keys:
            c = counter_of(k)
            if self._known(c):
                apply(k)
            elif c.partition(":")[0] in self.kinds:
                self._replace(c, self.store.claims_under(c))

    # ---- in step with the store ------------------------------------------------------------------------------
    def reload(self) -> None:
        """Start again from the store's counters (start-up, after a lost claim race, a store that went back):
        one read of the counters, bounded by the substrate's pools; each pool's claims are read when first
        asked about (`load`), so a start reads no claim."""
        seen, _changed = self.store.claim_changes(LATEST)  # before the read: a change during it is read again
        counted = {c: n for c, n in self.store.claim_counts().items() if c.partition(":")[0] in self.kinds}
        self.seen, self.counted, self.complete = seen, counted, False
        self.owner, self.by_counter, self.by_owner, self.loaded = {}, {}, {}, set()
        self._leading = {}

    def load(self, counter: str) -> None:
        """Read one pool's claims, the first time the copy is asked about it. Its count from the store's
        counters must agree (no change marked it since they were read: `sync` reads changed pools): a store
        whose counters were lost or never kept is recounted from its claims, and the copy starts again."""
        if self._known(counter) or counter.partition(":")[0] not in self.kinds:
            return
        claims = self.store.claims_under(counter)
        kept = self.counted.get(counter, 0)
        if kept != len(claims):
            self.sync()  # changed since the counters were read (another process claimed meanwhile)?
            if self._known(counter):
                return
            log.warning("claim counter %s said %d claims, the pool holds %d; every counter recounted from the "
                        "claims", counter, kept, len(claims))
            self.store.recount_claims(repair=True)
            self.reload()
            claims = self.store.claims_under(counter)
        self._replace(counter, claims)

    def _replace(self, counter: str, claims: Mapping[str, str]) -> None:
        """The pool's claims as `claims` has them; only what differs is applied (most changes a `sync` reads are
        this process's own, applied already, and a removal lowers first-fit's run of full hosts)."""
        owner = self.owner
        for k in [k for k in self.by_counter.get(counter, ()) if claims.get(k) != owner[k]]:
            self._remove(k)
        for k, o in claims.items():
            self._add(k, o)
        self.loaded.add(counter)
        self.counted.pop(counter, None)

    def owner_of(self, key: str) -> str | None:
        """Who holds `key` (its pool read first, if not yet)."""
        self.load(counter_of(key))
        return self.owner.get(key)

    def everything(self) -> dict[str, str]:
        """Every unit claim (one read of the unit namespaces): for the questions about every claim (find-slot,
        availability over a future term), asked on request."""
        if not self.complete:
            seen, _changed = self.store.claim_changes(LATEST)
            claims = self.store.claims_in(self.kinds)
            self.owner, self.by_counter, self.by_owner = {}, {}, {}
            for k, o in claims.items():
                self._add(k, o)
            self.seen, self.counted, self.loaded, self.complete = seen, {}, set(self.by_counter), True
        return self.owner

    def any(self) -> bool:
        return bool(self.owner) or any(self.counted.values())

    def counts(self) -> dict[str, int]:
        """Claims per pool: counted from the copy for pools read, the counters read at start for the others."""
        out = {c: n for c, n in self.counted.items() if n}
        out.update((c, len(keys)) for c, keys in self.by_counter.items() if c.partition(":")[0] in self.kinds)
        return out

    def stored_counts(self) -> dict[str, int]:
        return {c: n for c, n in self.store.claim_counts().items() if c.partition(":")[0] in self.kinds}

    def sync(self) -> list[str]:
        """Read again the pools the store marked changed since the copy's generation (one read of the changes;
        each changed pool's claims, this process's own changes included). Returns the pools read."""
        seen, changed = self.store.claim_changes(self.seen)
        if seen < self.seen:  # the store went back (a restored copy, a failover that lost writes)
            log.warning("the store's claims generation went back (%d after %d); the claims are read again",
                        seen, self.seen)
            self.seen = 0
            self.reload()
            return []
        stale = sorted({c for c in changed if c.partition(":")[0] in self.kinds})
        for c in stale:
            self._replace(c, self.store.claims_under(c))
        self.seen = seen
        return stale

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
        """Claims of a pool held by anyone but `group` (the pool read first, if not yet: a policy weighs the
        hosts it walks, first-fit until one fits, the others every host once)."""
        self.load(counter)
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
            self.copy.load(counter)
            if len(self.copy.by_counter.get(counter, ())) >= size:
                self.n = i + 1


class ClaimedByOthers(AbstractSet[str]):
    """The units the copy says are claimed by anyone but `group`, asked one at a time (each pool's claims read
    when first asked about); with `explained`, a claim is left out when its unit's booking by the same group
    ends before a future term (the claim ends with it)."""

    def __init__(self, copy: ClaimCopy, group: str, ends_before=None):
        self.copy = copy
        self.group = group
        self.ends_before = ends_before  # (unit, owner) -> True when that claim cannot hold during the term

    def __contains__(self, unit: object) -> bool:
        owner = self.copy.owner_of(unit) if isinstance(unit, str) else None
        if owner is None or owner == self.group:
            return False
        return not (self.ends_before is not None and self.ends_before(unit, owner))

    def __iter__(self) -> Iterator[str]:
        return (k for k in list(self.copy.everything()) if k in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __bool__(self) -> bool:
        return self.copy.any()


def counts_of(claims: Mapping[str, str]) -> dict[str, int]:
    """Counter → claims, recomputed from a claims mapping (start-up checks, tests)."""
    out: dict[str, int] = {}
    for k in claims:
        c = counter_of(k)
        if c:
            out[c] = out.get(c, 0) + 1
    return out
