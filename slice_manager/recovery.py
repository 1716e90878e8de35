"""Who works on which reservation, recovery and the clock (a mixin of ActorSliceManager).

Several slice managers (AM workers) may share a store: each works on a reservation only while it holds the
reservation's lock (a store claim `sm-lock:<reservation>` owned by its name); a restarted one with the same
name picks its own work up at once, others take over after LIVENESS. `recover` finishes what a previous
slice manager left: undelivered or unanswered messages are delivered again (the actors answer repeats with
the same result), and anything pending past its deadline fails, giving back what it may hold."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from contextlib import contextmanager
from datetime import datetime, timedelta

from protocol.api import BrokerApi
from slice_manager import reservation as rs
from slice_manager.records import INSTANCES, Record, due_at
from slicex.clock import parse_time, rfc3339
from slicex.errors import (
    Busy,
    GeniError,
)

log = logging.getLogger("slicex.sm")
LIVENESS = timedelta(minutes=2)
"""A slice manager that has not been heard of for this long is presumed dead: others take over its work."""
SLICE_WAIT = 120.0
"""Seconds a call waits for another call on the same slice in this process (actor calls time out sooner)."""
REAP_BATCH = 2000
"""Records one reaper pass takes from the time index at most (earliest first); the next tick takes the rest."""
WORKER_WAIT = 3.0
"""Seconds a call waits for a sliver another AM worker holds before it is Busy: another worker's reaper takes
a sliver's lock for a moment, which is no reason to refuse a call."""


class Recovery:
    """Reservation locks, settling a call's own reservations with the clock, recovery and the reaper."""

    broker: BrokerApi  # asked where reservations stand (set by ActorSliceManager)

    # ---- who works on which reservation ---------------------------------------------------------------------
    def _heartbeat(self, now: datetime) -> None:
        with self._guard:
            self._beat_at = now
        self.store.put(INSTANCES, self.name, {"name": self.name, "at": rfc3339(now)})

    def _beat(self, now: datetime) -> None:
        """The heartbeat of a call that takes reservation locks, at most once a tick (the reaper beats on its
        own ticks): other workers leave this one's reservations alone while it is heard of."""
        with self._guard:
            due = self._beat_at is None or now - self._beat_at >= self.tick or now < self._beat_at
        if due:
            self._heartbeat(now)

    def _dead(self, owner: str, now: datetime) -> bool:
        doc = self.store.get(INSTANCES, owner)
        return doc is None or parse_time(doc["at"]) + LIVENESS < now

    def _take(self, rid: str, now: datetime) -> str | None:
        """Lock a reservation for this slice manager; None, or the live slice manager that holds it."""
        with self._guard:  # noted before the claim, so recover never drops a lock a call is taking
            self._claimed_here.add(rid)
        other = self._claim(rid, now)
        if other is not None:
            with self._guard:
                self._claimed_here.discard(rid)
        return other

    def _claim(self, rid: str, now: datetime) -> str | None:
        key = f"sm-lock:{rid}"
        if self.store.claim(key, self.name):
            return None
        owner = self.store.owner_of(key)
        if owner is None or self._dead(owner, now):
            if owner is not None:
                self.store.release(key, owner)  # its slice manager is gone: take over its work
            if self.store.claim(key, self.name):
                return None
            owner = self.store.owner_of(key)
        return owner or "another slice manager"

    @contextmanager
    def _holding(self, rids: Iterable[str], now: datetime, strict: bool = True):
        """Hold the locks of `rids` for the duration; strict: all or Busy, else yield the ones taken."""
        taken: list[str] = []
        self._beat(now)
        try:
            for rid in dict.fromkeys(rids):
                other = self._take(rid, now)
                if other is not None and strict:
                    other = self._wait_for(rid, now)
                if other is None:
                    taken.append(rid)
                elif strict:
                    raise Busy(f"sliver {rid} is being changed by {other} (another AM worker); try again")
            yield set(taken)
        except Exception:
            self._release_locks(taken)
            raise
        self._release_locks(taken)  # not on a crash (BaseException): a killed process holds its locks

    def _wait_for(self, rid: str, now: datetime) -> str | None:
        """Try to lock `rid` for up to WORKER_WAIT seconds; None, or who still holds it."""
        deadline = time.monotonic() + WORKER_WAIT
        pause = 0.005
        other: str | None = "another slice manager"
        while time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
            other = self._take(rid, now)
            if other is None:
                return None
        return other

    def _release_locks(self, rids: Iterable[str]) -> None:
        """Locks a store outage keeps stay with this slice manager, which takes them back on its next call;
        the caller hears what the call did (or its first failure), not this."""
        rids = list(rids)
        try:
            self.store.release_all([f"sm-lock:{rid}" for rid in rids], self.name)
        except GeniError as exc:
            log.warning("could not release sliver locks %s: %s", rids, exc.message)
        finally:
            with self._guard:
                self._claimed_here.difference_update(rids)

    def _drop_leftover_locks(self) -> None:
        """Release reservation locks an earlier life of this slice manager (same name) left in the store, or
        a store outage kept; never one a thread of this process holds now."""
        for key in self.store.claims_of(self.name):
            if not key.startswith("sm-lock:"):
                continue
            rid = key[len("sm-lock:"):]
            with self._guard:
                if rid in self._claimed_here:
                    continue
            rec = self._load(rid)
            if rec is None:  # its record is gone; a lock being taken for a new one is in _claimed_here
                self.store.release(key, self.name)
            elif self._slices.acquire(rec.slice_urn):  # callers claim only while holding their slice
                try:
                    with self._guard:
                        busy = rid in self._claimed_here
                    if not busy:
                        self.store.release(key, self.name)
                finally:
                    self._slices.release(rec.slice_urn)

    @contextmanager
    def _on_slices(self, slice_urns: Iterable[str]):
        """Hold the in-process locks of these slices for a call (calls on other slices go on meanwhile)."""
        with self._slices.hold(slice_urns, SLICE_WAIT):
            yield

    def _slices_of(self, sliver_urns: Iterable[str]) -> set[str]:
        """The slices these slivers belong to (unknown ones: none; the call says SEARCHFAILED for them)."""
        return {rec.slice_urn for u in dict.fromkeys(sliver_urns) if (rec := self._load(u)) is not None}

    def _settle_slice(self, slice_urn: str, now: datetime) -> list[Record]:
        """Apply the clock to the records of one slice whose in-process lock the caller holds (those another
        AM worker holds are its to settle), and return the slice's records as they are then."""
        recs = self.records(slice_urn)
        due = [rec.id for rec in recs if self._needs_work(rec, now)]
        if not due:
            return recs
        with self._holding(due, now, strict=False) as mine:
            self._settle(mine, now)
        return self.records(slice_urn)

    def _settle(self, rids: Iterable[str], now: datetime) -> None:
        """Apply the clock to a call's own reservations (whose locks it holds) before it acts: the reaper
        skips a slice while a call on it runs, and a call must not act on what the clock already ended."""
        recs = {rid: rec for rid in dict.fromkeys(rids) if (rec := self._load(rid)) is not None}
        due = {rid for rid, rec in recs.items() if self._needs_work(rec, now)}
        if due and self._recover(due, now):
            self._forget_requests({recs[rid].slice_urn for rid in due})

    # ---- recovery and the clock ----------------------------------------------------------------------------
    def recover(self, now: datetime) -> list[str]:
        """Finish what a previous slice manager over this store left: deliver every outbox message again
        (actors answer repeats with the same result), then end whatever is still pending past its deadline,
        giving back what it may hold, and whatever the clock ended. Returns the slivers that ended. Only the
        records the time index says are due are read (`due_records`): at start-up, unfinished work and what
        expired meanwhile; on a tick, what fell due since.

        A slice that a call of this process is working on is skipped (the call settles its own reservations,
        the next tick gets the rest): the reaper never waits for a call, and no call waits for the reaper's
        actor calls on other slices."""
        self._heartbeat(now)
        self._drop_leftover_locks()
        due: dict[str, list[str]] = {}
        for rec in self.due_records(now, REAP_BATCH):
            due.setdefault(rec.slice_urn, []).append(rec.id)
        ended: list[str] = []
        for slice_urn, rids in due.items():
            if not self._slices.acquire(slice_urn):
                continue
            try:
                with self._holding(rids, now, strict=False) as mine:
                    gone = self._recover(mine, now)
                if gone:
                    self._forget_requests({slice_urn})
                ended += gone
            finally:
                self._slices.release(slice_urn)
        self._settle_updates(now)  # expired Updates revert; half-done commits complete (slice_manager/updater.py)
        return ended

    @staticmethod
    def _starting(rec: Record, now: datetime) -> bool:
        """An advance reservation whose term has started and whose start the broker has not confirmed yet."""
        return (rec.r.state == rs.TICKETED and rec.r.pending == rs.NONE and rec.r.start is not None
                and rec.r.start <= now and not rec.details.get("started"))

    def _start_terms(self, recs: dict[str, Record], now: datetime) -> None:
        """Advance reservations whose term started become allocations like any other once the broker says it
        claimed their units (its clock does that at the start); one it could not (a unit held by someone
        else) fails with the broker's reason. Noted in the record, so a restarted slice manager goes on."""
        starting = [rec for rec in recs.values() if self._starting(rec, now)]
        for group in sorted({rec.group for rec in starting}):
            batch = [rec for rec in starting if rec.group == group]
            try:
                answers = self.broker.query(group, [rec.id for rec in batch])
            except GeniError as exc:  # the broker is down: ask again on the next tick
                log.warning("could not ask the broker about advance reservations of %s: %s", group, exc.message)
                continue
            for rec in batch:
                a = answers.get(rec.id) or {}
                if a.get("status") == "active" and a.get("claimed", True):
                    rec.details = {**rec.details, "started": rfc3339(now)}  # a new dict: saved as changed
                elif a.get("status") == "active":
                    continue  # the broker's clock has not reached the start yet
                else:
                    why = a.get("reason") or f"the broker no longer holds its ticket ({a.get('status', 'unknown')})"
                    rec.r, msgs = rs.on_term_start(rec.r, False, why, now)
                    rec.outbox += [m for m in msgs if m not in rec.outbox]

    @staticmethod
    def _needs_work(rec: Record, now: datetime) -> bool:
        """Whether the clock has work on `rec` at `now` (records.py `due_at`, the time it is filed under)."""
        due = due_at(rec)
        return due is not None and due <= now.timestamp()

    def _recover(self, rids: set[str], now: datetime) -> list[str]:
        recs = {rid: rec for rid in rids if (rec := self._load(rid)) is not None}
        before = {rid: rec.r.state for rid, rec in recs.items()}
        stored = {rid: rec.to_doc() for rid, rec in recs.items()}
        self._drive({rid: rec for rid, rec in recs.items() if rec.outbox or rec.r.pending == rs.PRIMING}, now)
        self._start_terms(recs, now)
        for rec in recs.values():
            rec.r, msgs = rs.on_tick(rec.r, now)
            rec.outbox += [m for m in msgs if m not in rec.outbox]
            end = rec.r.end or rec.r.want_end
            if rec.r.state == rs.FAILED and (end is None or end <= now):
                rec.discard = True  # a failure stays visible until its term would have ended
        self._drive({rid: rec for rid, rec in recs.items() if rec.outbox}, now)
        for rid, rec in recs.items():
            if rec.to_doc() != stored[rid] or (rec.discard and not rec.outbox):
                self._save(rec)
        return [rid for rid, rec in recs.items() if rec.r.terminal and before[rid] != rec.r.state]

    def reap(self, now: datetime) -> list[str]:
        """The slice manager's clock: deliver what is still in outboxes, time out pending operations, close
        reservations whose term ended, forget closed ones; in-process actors run their clocks too. Returns
        the slivers that ended on this tick. Only the deployment's clock thread calls it: no request runs a
        reaper (a call settles its own slice's reservations: `_settle`, `_settle_slice`)."""
        with self._reaping:
            return self._reap(now)

    def _reap(self, now: datetime) -> list[str]:
        ended = self.recover(now)
        if self.run_actor_clocks:
            for clock in (getattr(self.broker, "tick", None), getattr(self.authority, "reap", None)):
                try:
                    if clock is not None:
                        clock(now)
                except GeniError as exc:  # an actor that is down runs its clock when it is back
                    log.warning("actor clock: %s", exc.message)
        return ended

