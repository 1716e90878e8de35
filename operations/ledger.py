"""The accounting edge: usage records in the store, and service levels enforced around the slice manager's calls.

The AM API endpoint (am/api.py) hands this its Allocate, Provision and Renew (to refuse what passes a limit
before anything is taken) and tells it of Delete and Shutdown; the deployment's reaper (deployment/service.py) calls
`settle` every tick, which ends the records of slivers that expired or that it ended, and `sweep` at a slow
pace: a rotating check, one page of open records at a time (`Store.page`), of each against the slice manager's
record of its sliver, which ends those of slivers that failed inside a call. No tick reads more than a page, so
the check costs the same per tick whatever is open; a pass over every open record takes open / page steps. The
pure parts are operations/accounting.py (records, totals) and operations/quotas.py (limits, checks).

Store tables: `usage` holds the ended records, `usage-open` the open ones (what is held
now), each with what it counts against its user's and project's limits added to their usage counters in the
same write (`Store.put` tally: an Allocate under a limit reads two counters, not every open record), and
filed in the time index under its expiry, so the reaper's
`settle` reads only the records that expired and those of the slivers it ended. A check and the allocation it admits run under
one store claim per user, per project and per federation peer limited (`quota-lock:<urn>`,
`quota-lock:peer:<name>`), so two threads or AM workers cannot both admit requests that together pass a limit:
each counts what is held only after the other's slivers and usage records are in the store."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager
from datetime import datetime

from msgspec.structs import replace

from operations import quotas
from operations.accounting import UsageRecord, ended_at, project_of, sliver_amounts, tally_of, user_key
from protocol.slice_manager import Sliver
from resources.kind import Amounts
from rspec.request import Request
from rspec.substrate import Substrate
from slicex.codec import decode, encode
from slicex.config import SlicexConfig
from slicex.errors import Busy, GeniError
from slicex.peers import PeerGate
from slicex.store import Store
from slicex.store.ownership import Actor, scoped
from slicex.urn import canonical_urn

log = logging.getLogger("slicex.accounting")
USAGE = "usage"
OPEN = "usage-open"
LAYOUT = "usage-layout"  # the layout mark of a store made before deployment/migrations.py (which removes it)
LOCK = "quota-lock:"
LOCK_WAIT = 30.0
"""Seconds an Allocate waits for another one of the same user or project being counted before it is Busy."""
LOCK_STALE = 300.0
"""A count lock older than this was left by a process that died while allocating; it is taken over."""
SWEEP_PAGE = 500
"""Open usage records one `sweep` step reads (about: a Redis page is an HSCAN step)."""


def usage_records(store: Store) -> list[UsageRecord]:
    """Every usage record: the ended ones (`usage`) and the open ones (`usage-open`, which wins over a copy of
    the same sliver in `usage`, as a store made before issue 33 holds)."""
    records = {d["sliver_urn"]: d for d in store.scan(USAGE)}
    records.update((d["sliver_urn"], d) for d in store.scan(OPEN))
    return [decode(d, UsageRecord, "usage record") for d in records.values()]


class Ledger:
    def __init__(self, store: Store, substrate: Substrate, policy: quotas.QuotaPolicy | None = None):
        self.store = scoped(store, Actor.OPERATIONS)
        self.substrate = substrate
        self.policy = policy or quotas.QuotaPolicy()
        self._cursor = ""  # where `sweep` goes on ("": a new pass over the open records)

    # ---- records -------------------------------------------------------------------------------------------
    def records(self) -> list[UsageRecord]:
        return usage_records(self.store)

    def open_records(self) -> list[UsageRecord]:
        return [decode(d, UsageRecord, "usage record") for d in self.store.scan(OPEN)]

    def _open(self, rec: UsageRecord) -> None:
        """Write an open record, filed in the time index under its expiry (`settle` finds it there), with what
        it counts against its user's and project's limits added to their counters (one write). Only there:
        `usage` gets it when it ends (a store made before issue 33 may hold an older copy there too, which
        `usage_records` reads beneath the open one). A link an Update placed to replace another counts beyond
        it while both are open; the replaced one names it (`replaced_by`), so that it counts whole once the
        replaced one ends (`_close`)."""
        replaced = None
        if rec.replaces:
            doc = self.store.get(OPEN, rec.replaces)
            replaced = decode(doc, UsageRecord, "usage record") if doc is not None else None
        self._put_open(rec, replaced)
        if replaced is not None and replaced.replaced_by != rec.sliver_urn:
            self._put_open(replace(replaced, replaced_by=rec.sliver_urn), None)

    def _put_open(self, rec: UsageRecord, replaced: UsageRecord | None) -> None:
        self.store.put(OPEN, rec.sliver_urn, encode(rec), due=rec.expires.timestamp() if rec.expires else None,
                       tally=tally_of(OPEN, rec, replaced))

    def _close(self, rec: UsageRecord, end: datetime, reason: str) -> UsageRecord:
        """End a record: out of `usage-open` (and its counters), into `usage`. The link replacing it, if any,
        counts whole from now: written first, so a crash between the writes over-counts, never under-counts."""
        if rec.replaced_by:
            doc = self.store.get(OPEN, rec.replaced_by)
            if doc is not None and (by := decode(doc, UsageRecord, "usage record")).replaces == rec.sliver_urn:
                self._put_open(by, None)
        done = rec.closed(end, reason)
        self.store.put(USAGE, rec.sliver_urn, encode(done))
        self.store.delete(OPEN, rec.sliver_urn)
        return done

    def held(self, user: str, project: str | None) -> tuple[Amounts, Amounts]:
        """What a user (`user_key`), and the project, hold now: their usage counters, one read each."""
        mine = decode(self.store.tallies(f"{OPEN}|user:{user}"), Amounts, "usage counter")
        theirs = decode(self.store.tallies(f"{OPEN}|project:{project}"), Amounts, "usage counter") if project is not None \
            else Amounts()
        return mine, theirs

    def began(self, user: str, slice_urn: str, slivers: Iterable[Sliver], now: datetime,
              replaces: Mapping[str, str] | None = None) -> None:
        """Open a record per sliver allocated (`replaces`: an Update's new link -> the sliver it replaces at
        commit). A store failure here is logged, not returned: the slivers exist, and the caller must hear
        that they do."""
        project = project_of(slice_urn)
        try:
            for s in slivers:
                self._open(UsageRecord(s.urn, canonical_urn(slice_urn), user_key(user), s.kind, s.client_id,
                                       sliver_amounts(s.kind, s.details), now, s.expires, project=project,
                                       replaces=(replaces or {}).get(s.urn, "")))
        except GeniError as exc:
            log.error("usage of slice %s not recorded: %s", slice_urn, exc.message)

    def extended(self, slivers: Iterable[Sliver]) -> None:
        """Note each sliver's new end (Provision, Renew): when it expires, its record ends then."""
        for s in slivers:
            doc = self.store.get(OPEN, s.urn)
            if doc is not None and (rec := decode(doc, UsageRecord, "usage record")).expires != s.expires:
                self._open(replace(rec, expires=s.expires))

    def ended(self, sliver_urns: Iterable[str], now: datetime, reason: str) -> list[UsageRecord]:
        out = []
        for urn in sliver_urns:
            doc = self.store.get(OPEN, urn)
            if doc is not None:
                out.append(self._close(decode(doc, UsageRecord, "usage record"), now, reason))
        return out

    def shut_down(self, slice_urn: str, now: datetime) -> list[UsageRecord]:
        """An operator's Shutdown ends the accounting of every sliver of the slice: it stops, and stops counting
        against its owner's and project's limits."""
        urn = canonical_urn(slice_urn)
        return self.ended([r.sliver_urn for r in self.open_records() if r.slice_urn == urn], now, "shut down")

    def sweep(self, held: Callable[[str], bool], now: datetime, page: int = SWEEP_PAGE) -> list[UsageRecord]:
        """One step of the rotating check: the next page of open records (about `page`), each ended unless the
        slice manager still holds its sliver (`held`, one record read): at its expiry when it has passed, else
        now. The open record is read first, so a sliver allocated meanwhile is never taken for gone. Returns
        the records it ended; `swept` says whether the step finished a pass."""
        docs, self._cursor = self.store.page(OPEN, self._cursor, page)
        return [self._gone(rec, now) for rec in (decode(d, UsageRecord, "usage record") for d in docs) if not held(rec.sliver_urn)]

    @property
    def swept(self) -> bool:
        """Whether the last `sweep` finished a pass over every open record (the next one starts another)."""
        return not self._cursor

    def settle(self, gone: Iterable[str], held: Callable[[str], bool], now: datetime) -> list[UsageRecord]:
        """End the usage of the slivers the reaper ended on this tick (`gone`) and of the open records whose
        expiry has passed (the time index: slivers another process's reaper ended), each unless the slice
        manager still holds it (`held`, one record read). Reads only those, so a tick costs what it ends,
        however many records are open; `sweep` is the rotating check."""
        urns = dict.fromkeys([*gone, *(urn for urn, _at in self.store.due(OPEN, now.timestamp()))])
        out = []
        for urn in urns:
            doc = self.store.get(OPEN, urn)
            if doc is not None and not held(urn):
                out.append(self._gone(decode(doc, UsageRecord, "usage record"), now))
        return out

    def _gone(self, rec: UsageRecord, now: datetime) -> UsageRecord:
        """End the record of a sliver found gone: at its expiry when that has passed, else now."""
        return self._close(rec, ended_at(rec, now), "expired" if rec.expires is not None and rec.expires <= now
                           else "ended")

    # ---- service levels ------------------------------------------------------------------------------------
    def allocate(self, user: str, slice_urn: str, request: Request, now: datetime, end: datetime, asked_end: bool,
                 allocate: Callable[[datetime], list[Sliver]], peers: PeerGate | None = None) -> list[Sliver]:
        """Allocate through `allocate(end)` if the federation peer's policy (`peers`, for a peer's user or
        slice) and the user's and the project's limits allow the request on top of what they hold (the peer's
        refusal, or FORBIDDEN / OUTOFRANGE naming the limit, nothing taken), and record it. The counts, the
        allocation and its record are one step under the count locks of everyone limited."""
        project = project_of(slice_urn)
        lock = [k for k, limits in ((user_key(user), self.policy.for_user(user)),
                                    (project, self.policy.for_project(project))) if k and limits.limits_amounts]
        peer = peers.counted_as(user, slice_urn) if peers is not None else None
        with self._counting(lock + ([peer] if peer else [])):  # nothing to lock when nobody has a limit on amounts
            if peers is not None:
                end = peers.admit("Allocate", user, slice_urn, now, end, request, asked_end)
            end, _ = quotas.lease_end(user, project, self.policy, now, end, now, cut=not asked_end)
            if lock:
                held_user, held_project = self.held(user_key(user), project)
                quotas.check_amounts(user_key(user), project, self.policy, held_user, held_project,
                                     quotas.request_amounts(self.substrate, request))
            slivers = allocate(end)
            self.began(user, slice_urn, slivers, now)
        return slivers

    def update(self, user: str, slice_urn: str, desired: Request, slivers: Iterable[Sliver], now: datetime,
               end: datetime, update: Callable[[], list[Sliver]], peers: PeerGate | None = None) -> list[Sliver]:
        """Update through `update()` if the federation peer's policy and the user's and the project's limits
        allow what the Update adds to the `slivers` it names (quotas.update_amounts: new nodes, links and
        public ports, and a replaced link's larger capacity),
        under the same count locks as Allocate, so an Update and an Allocate cannot together pass a limit.
        The slice manager opens the records of what it adds and ends those of what a commit removes
        (slice_manager/updater.py), each before the step that makes it final, so a crash leaves them whole."""
        project = project_of(slice_urn)
        lock = [k for k, limits in ((user_key(user), self.policy.for_user(user)),
                                    (project, self.policy.for_project(project))) if k and limits.limits_amounts]
        peer = peers.counted_as(user, slice_urn) if peers is not None else None
        named = {s.client_id: sliver_amounts(s.kind, s.details) for s in slivers}
        new = Request(tuple(n for n in desired.nodes if n.client_id not in named),
                      tuple(lk for lk in desired.links if lk.client_id not in named))
        with self._counting(lock + ([peer] if peer else [])):
            if peers is not None:  # the peer counts slivers, nodes and cores: a replaced link adds none
                peers.admit("Allocate", user, slice_urn, now, end, new, True)
            if lock:
                held_user, held_project = self.held(user_key(user), project)
                quotas.check_amounts(user_key(user), project, self.policy, held_user, held_project,
                                     quotas.update_amounts(self.substrate, desired, named))
            return update()

    def lease_end(self, slivers: Iterable[Sliver], now: datetime, end: datetime, cut: bool) -> tuple[datetime, str]:
        """The end Provision or Renew may give these slivers under their owners' and projects' lease lengths,
        each counted from when the sliver began (its Allocate)."""
        note = ""
        for s in slivers:
            doc = self.store.get(OPEN, s.urn)
            start = decode(doc, UsageRecord, "usage record").start if doc else now
            end, said = quotas.lease_end(user_key(s.owner_urn), project_of(s.slice_urn), self.policy, start, end, now,
                                         cut)
            note = said or note
        return end, note

    @contextmanager
    def _counting(self, names: list[str]):
        """Hold the count locks of these users and projects (sorted, so two callers never wait on each other)."""
        token = f"{uuid.uuid4().hex}|{time.time():.3f}"
        taken: list[str] = []
        try:
            for name in sorted(set(names)):
                self._lock(LOCK + name, token)
                taken.append(LOCK + name)
            yield
        finally:
            for key in taken:
                try:
                    self.store.release(key, token)
                except GeniError as exc:  # taken over after LOCK_STALE
                    log.warning("could not release %s: %s", key, exc.message)

    def _lock(self, key: str, token: str) -> None:
        deadline = time.monotonic() + LOCK_WAIT
        pause = 0.005
        while not self.store.claim(key, token):
            holder = self.store.owner_of(key)
            if holder is not None and _age(holder) > LOCK_STALE:
                self.store.release(key, holder)  # its process died while allocating
                continue
            if time.monotonic() > deadline:
                raise Busy(f"another Allocate for {key[len(LOCK):]} is being counted against its limits; try again")
            time.sleep(pause)
            pause = min(pause * 2, 0.1)


def _age(token: str) -> float:
    try:
        return time.time() - float(token.rsplit("|", 1)[1])
    except (IndexError, ValueError):
        return LOCK_STALE + 1  # not ours: a malformed holder is taken over


def ledger_for(cfg: SlicexConfig, store: Store, substrate: Substrate) -> Ledger:
    """The deployment's ledger, its limits from slicex.yaml's `quotas:` (its URNs checked here: BADARGS naming
    the key; the shape of each limit was checked when the file was read)."""
    return Ledger(store, substrate, quotas.policy_from_config(cfg.quotas.document() if cfg.quotas else None))
