"""In-process exclusion for the slice manager, so that AM calls on different slices run in parallel.

The store's reservation locks (claims `sm-lock:<reservation>`, owned by a slice manager's *name*) keep AM
workers in different processes apart, but every thread of one process has that same name. Within a process
the slice is the unit of work instead: a call holds its slice's lock for its whole length (actor calls
included, so a second call on the same slice waits rather than seeing half a change), and nothing
process-wide is held across an actor call or a store round trip. `PlannedUnits` keeps concurrent
allocations of this process from choosing the same units before the broker has claimed them."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from slicex.errors import Busy


class SliceLocks:
    """One re-entrant lock per slice, made on first use and dropped when nobody holds or waits for it (the
    table does not grow with the slices ever served)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, tuple[threading.RLock, list[int]]] = {}  # slice -> (lock, [users])

    def _use(self, key: str) -> threading.RLock:
        with self._guard:
            lock, users = self._locks.setdefault(key, (threading.RLock(), [0]))
            users[0] += 1
            return lock

    def _unuse(self, key: str) -> None:
        with self._guard:
            _lock, users = self._locks[key]
            users[0] -= 1
            if users[0] == 0:
                del self._locks[key]

    def acquire(self, key: str, timeout: float | None = None) -> bool:
        """Take `key`'s lock; without a timeout only if it is free now (the reaper: never wait for a call)."""
        lock = self._use(key)
        got = lock.acquire(timeout=timeout) if timeout is not None else lock.acquire(blocking=False)
        if not got:
            self._unuse(key)
        return got

    def release(self, key: str) -> None:
        with self._guard:
            lock, _users = self._locks[key]
        lock.release()
        self._unuse(key)

    @contextmanager
    def hold(self, keys: Iterable[str], timeout: float) -> Iterator[None]:
        """Hold every one of `keys` (taken in sorted order, so two calls never wait for each other in a
        circle); Busy if one is not free within `timeout` seconds."""
        taken: list[str] = []
        try:
            for key in sorted(set(keys)):
                if not self.acquire(key, timeout):
                    raise Busy(f"another call on {key} has been running for over {timeout:.0f} s; try again")
                taken.append(key)
            yield
        finally:
            for key in reversed(taken):
                self.release(key)

    def held(self) -> list[str]:
        """Slices some thread holds or waits for (tests, diagnostics)."""
        with self._guard:
            return sorted(self._locks)


class PlannedUnits:
    """Units that this process's allocations chose and the broker has not yet granted or refused.

    A planner asks the broker what is unavailable, then plans; two planners in one process would both choose
    the first free units and all but one would lose at the broker (Busy) and plan again. A planner therefore
    also avoids the units of allocations still in flight, and of those that finished after it asked the
    broker (its answer may predate their claims). Only in-memory bookkeeping happens under the guard."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._choosing = threading.Lock()
        self._epoch = 0
        self._groups: dict[str, tuple[frozenset[str], int | None]] = {}  # group -> (units, finished at)
        self._planners: Counter[int] = Counter()  # epoch each active planner started at

    def begin(self) -> int:
        """Call before asking the broker what is unavailable; pass the token to `choose` and `end`."""
        with self._guard:
            self._planners[self._epoch] += 1
            return self._epoch

    @contextmanager
    def choosing(self, token: int) -> Iterator[tuple[set[str], Callable[[str, Iterable[str]], None]]]:
        """Plan inside this (pure computation only): yields what to avoid and `add(group, units)` to record
        the choice, so no other planner of this process chooses between the two."""
        with self._choosing:
            yield self.avoid(token), self.add

    def avoid(self, token: int) -> set[str]:
        """What a planner that began at `token` must not choose besides what the broker said."""
        with self._guard:
            return {u for units, done in self._groups.values() if done is None or done > token for u in units}

    def add(self, group: str, units: Iterable[str]) -> None:
        with self._guard:
            self._groups[group] = (frozenset(units), None)

    def end(self, token: int) -> None:
        with self._guard:
            self._planners[token] -= 1
            if self._planners[token] <= 0:
                del self._planners[token]
            self._prune()

    def finish(self, group: str) -> None:
        """The broker granted or refused `group`: its answer (claims) is what later planners will see."""
        with self._guard:
            if group in self._groups:
                self._epoch += 1
                self._groups[group] = (self._groups[group][0], self._epoch)
            self._prune()

    def _prune(self) -> None:
        oldest = min(self._planners, default=None)
        for group, (_units, done) in list(self._groups.items()):
            if done is not None and (oldest is None or done <= oldest):
                del self._groups[group]

    def __len__(self) -> int:
        with self._guard:
            return len(self._groups)
