"""In-process exclusion by key: one lock per slice in the slice manager, one per lease in the authority, so
that work on different keys runs in parallel and work on one key never overlaps.

In the slice manager, the store's reservation locks (claims `sm-lock:<reservation>`, owned by a slice manager's *name*) keep AM
workers in different processes apart, but every thread of one process has that same name. Within a process
the slice is the unit of work instead: a call holds its slice's lock for its whole length (actor calls
included, so a second call on the same slice waits rather than seeing half a change), and nothing
process-wide is held across an actor call or a store round trip. Concurrent allocations never fight over
units here: the broker chooses them (broker/broker.py `Broker.place`) under its own lock and store claims."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from slicex.errors import Busy


class KeyedLocks:
    """One re-entrant lock per key, made on first use and dropped when nobody holds or waits for it (the
    table does not grow with the keys ever used). Two keys never share a lock, so a slow holder of one never
    holds up another (a fixed set of striped locks would, whenever two keys hash alike)."""

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
    def one(self, key: str) -> Iterator[None]:
        """Hold `key`'s lock for the block, waiting as long as another holder takes."""
        lock = self._use(key)
        lock.acquire()
        try:
            yield
        finally:
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
        """Keys some thread holds or waits for (tests, diagnostics)."""
        with self._guard:
            return sorted(self._locks)
