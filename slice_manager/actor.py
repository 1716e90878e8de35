"""The slice manager actor (ORCA SM) on broker tickets and authority leases, behind the SliceManager seam.

Every sliver is a reservation (slice_manager/reservation.py). The slice manager never changes one except through the
pure transitions, and it persists the reservation together with its *outbox* (the messages the transition
asked for) before it delivers any of them: that is the message boundary. A slice manager killed anywhere
leaves records another one over the same store finishes (`recover`): undelivered or unanswered messages are
delivered again (brokers and authorities answer a repeated ticket, redeem, extend, relinquish or close with
the same result), and anything still pending past its deadline fails, giving back what it may hold.

AM API ↔ messages: Allocate → ticket (one all-or-nothing request to the broker per allocation; link tags
chosen by the broker from its delegated label sets); Provision → extendTicket to the lease end, then redeem
(links first: a node waits in Priming until the links it attaches to are active, and its spec carries
their tags); Renew → extendTicket (+ extendLease when active); PerformOperationalAction → modify at the
authority; Delete → relinquish + close. Failures carry the actor's reason to `geni_error` and, for the
call that failed, to the result's `output` with its GENI code.

Every lease the authority answers with is verified before it is used: the authority's signature (the key of
its certificate, not the broker's or the AM's) and that it is the lease of the ticket redeemed (reservation,
holder, units, term, labels). A lease that fails is a failed redeem (or a refused extension): the
reservation gives back what it holds, so nothing leaks.

The slice manager's jobs live in modules of their own: its records (slice_manager/records.py), the reservation
driver that delivers messages (slice_manager/delivery.py), locks, recovery and the clock (slice_manager/recovery.py); this
module holds the AM-facing operations; deployment/actors.py builds the actors."""

from __future__ import annotations

import hashlib
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from msgspec.structs import replace

from protocol import slice_manager as sm
from protocol.api import AuthorityApi, BrokerApi
from protocol.messages import Demand, NodeDemand, SlotAnswer, SlotQuery, demands_of
from protocol.slice_manager import ALLOWED_ACTIONS, Sliver
from resources import InUse
from rspec.request import Request
from slice_manager import reservation as rs
from slice_manager import update as up
from slice_manager.delivery import DRIVE_ROUNDS, Delivery  # noqa: F401 - re-exported
from slice_manager.records import (  # noqa: F401 - re-exported
    ENDED,
    ENDED_KEPT,
    INSTANCES,
    REQUESTS,
    RESERVATIONS,
    SLICES,
    Crash,
    Record,
    Records,
    _error,
)
from slice_manager.recovery import LIVENESS, SLICE_WAIT, WORKER_WAIT, Recovery  # noqa: F401 - re-exported
from slice_manager.updater import Updates
from slicex.clock import parse_time, rfc3339
from slicex.errors import (
    BadArgs,
    Busy,
    Expired,
    GeniError,
    OutOfRange,
    Refused,
    SearchFailed,
    TimedOut,
    Unavailable,
    Unsupported,
)
from slicex.inventory import UNIT_KINDS, mac_for
from slicex.keyed_locks import KeyedLocks
from slicex.slice_identity import check_same_slice
from slicex.store import Store
from slicex.store.ownership import Actor, scoped
from slicex.term import Term

log = logging.getLogger("slicex.sm")
# what puts a sliver back after an operational action that must be undone (all-or-nothing without
# geni_best_effort); geni_restart and geni_update_users have none, so a partial change is reported instead
UNDO_ACTIONS = {"geni_start": "geni_stop", "geni_stop": "geni_start"}
PLAN_RETRIES = 8
"""Ticket requests per Allocate: each lost race to another AM worker (Busy at the broker) asks again after a
backoff (the broker itself places again on a lost claim race; this covers races it could not resolve)."""


class ActorSliceManager(Records, Recovery, Delivery, Updates):
    """SliceManager over a broker and an authority (in-process objects or proxies to actor servers)."""

    def __init__(self, store: Store, substrate: Any, broker: BrokerApi, authority: AuthorityApi, name: str | None = None,
                 image_policy: str = "reject", bitstreams: Any = None,
                 images: Callable[[str, str], str | None] | None = None,
                 fault: Callable[[str], None] | None = None, run_actor_clocks: bool = True,
                 tick: timedelta = timedelta(seconds=1), lease_key: Any = None):
        self.store = scoped(store, Actor.SLICE_MANAGER)
        self.substrate = substrate
        self.broker = broker
        self.authority = authority
        # the authority's public key (from its certificate): every lease is checked with it; an in-process
        # authority's own key when none is given, a remote one must be named
        own = getattr(authority, "key", None)
        self.lease_key = lease_key or (own.public_key() if own is not None else None)
        if self.lease_key is None:
            raise BadArgs("a slice manager needs the authority's public key to verify the leases it is given")
        # several slice managers (AM workers) may share a store: each works on a reservation only while it
        # holds the reservation's lock (a claim owned by its name); a restarted one with the same name picks
        # up its own work at once, others take over after LIVENESS
        self.name = name or f"sm-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.image_policy = image_policy
        self.bitstreams = bitstreams
        # (owner, disk_image as a request spells it) -> the URN of a catalogue image the owner may boot that the
        # substrate does not offer everyone (their snapshots, others' public ones), else None
        self.images = images
        self.fault = fault or (lambda boundary: None)
        self.run_actor_clocks = run_actor_clocks  # in-process actors: run their clocks from the reaper
        self.tick = tick  # the period of the deployment's clock, which runs `reap` (no call does)
        # Concurrency: a call holds its slice's in-process lock (sm_locks) and its reservations' store locks;
        # nothing process-wide is held across an actor call or a blocking store round trip. The reaper takes
        # a slice only when no call holds it, and a call settles its own reservations with the clock.
        self._slices = KeyedLocks()
        self._guard = threading.Lock()  # in-memory bookkeeping only: _beat_at, _claimed_here, _available
        self._reaping = threading.RLock()  # one reap at a time
        self._beat_at: datetime | None = None  # when this slice manager last wrote its heartbeat
        self._claimed_here: set[str] = set()  # reservations whose store lock a thread of this process holds
        self._available: tuple[str, InUse] = ("", InUse({}, frozenset()))  # the broker's last availability answer

    # ---- SliceManager: allocate -----------------------------------------------------------------------------
    def allocate(self, slice_urn: str, owner_urn: str, request: Request, end: datetime,
                 now: datetime, start: datetime | None = None, slice_uuid: str = "") -> list[Sliver]:
        """Ask the broker for tickets over [now, end), or with a later `start` over [start, end): an advance
        reservation (geni_start_time), booked in the broker's calendar now and provisionable from `start`.
        The slivers record `slice_uuid`; the slice's live slivers must have been allocated for the same one
        (checked under the slice's lock: slicex/slice_identity.py)."""
        start = start if start and start > now else None
        if start is not None and end <= start:  # e.g. a service level's lease length cut the end (operations/quotas.py)
            raise OutOfRange(f"an advance reservation from {rfc3339(start)} cannot end at {rfc3339(end)}, before it "
                          f"starts (is the lease length your service level allows shorter than the wait?)")
        with self._on_slices([slice_urn]):
            check_same_slice(slice_urn, slice_uuid, (rec.slice_uuid for rec in self._settle_slice(slice_urn, now)
                                                     if not rec.discard and rec.r.state not in (rs.CLOSE_WAIT,
                                                                                                rs.CLOSED)))
            return self._allocate(slice_urn, owner_urn, request, end, now, start, slice_uuid)

    def _allocate(self, slice_urn: str, owner_urn: str, request: Request, end: datetime,
                  now: datetime, start: datetime | None = None, slice_uuid: str = "") -> list[Sliver]:
        self._forget_ended(slice_urn)
        parts = self._bitstream_parts(owner_urn)
        images = self._images(request, owner_urn)
        for attempt in range(PLAN_RETRIES):
            if attempt:  # lost a race to another AM worker: let the winners' claims land before asking again
                time.sleep(random.uniform(0, min(0.1, 0.005 * 2 ** attempt)))
            recs = self._records(request, slice_urn, owner_urn, f"ticket:{uuid.uuid4().hex}", parts, images)
            for rec in recs.values():
                rec.slice_uuid = slice_uuid
                rec.r, rec.outbox = rs.demand(rec.r, now, end, start=start)
                if start is not None:
                    rec.details["geni_start_time"] = rfc3339(start)  # shown in the sliver struct (Status, Describe)
            with self._holding(recs, now):
                self._drive(recs, now)
                failed = [rec for rec in recs.values() if rec.r.state != rs.TICKETED]
                if failed:
                    self._abandon(recs, now)
            if not failed:
                break
            first = next((rec for rec in failed if rec.error_type), failed[0])  # the root cause
            if first.error_type == "Busy":
                continue  # lost a race for a unit: ask again
            raise _error(first.error_type, first.r.reason or f"{first.client_id}: not granted ({first.r.state})")
        else:
            raise Busy(f"resources changed under this request {PLAN_RETRIES} times in a row (other AM workers won "
                       f"the units it was given); try again")
        key = f"{slice_urn}#{rfc3339(now)}-{uuid.uuid4().hex[:8]}"
        self.store.put(REQUESTS, key, {"key": key, "slice_urn": slice_urn, "xml": request.xml,
                                       "client_ids": [rec.client_id for rec in recs.values()]})
        return [self._sliver(rec, now) for rec in recs.values()]

    def _records(self, request: Request, slice_urn: str, owner_urn: str, group: str,
                 parts: dict[str, str], images: dict[str, str] | None = None) -> dict[str, Record]:
        """A reservation per requested node and link, with its demand (what it needs, no unit named): the
        broker chooses where it goes when it grants the ticket."""
        urns = {e.client_id: f"urn:publicid:IDN+{self.substrate.authority}+sliver+{uuid.uuid4().hex[:16]}"
                for e in (*request.nodes, *request.links)}
        demands = demands_of(request, {cid: "" for cid in urns}, self.image_policy, parts, images)
        link_of_iface = {ref: urns[lk.client_id] for lk in request.links for ref in lk.interface_refs}
        recs: dict[str, Record] = {}
        for order, element in enumerate((*demands.nodes, *demands.links)):
            cid = element.client_id
            node = request.node(cid) if isinstance(element, NodeDemand) else None
            kind = "node" if node is not None else "link"
            details: dict[str, Any] = {}
            if node is not None:
                what = f"node {cid} ({node.sliver_type or 'node'})"
                if node.execute:
                    details["execute"] = [{"shell": sh, "command": c} for sh, c in node.execute]
                if node.install:
                    details["install"] = [{"url": u, "install_path": path} for u, path in node.install]
                if node.blockstores:
                    details["blockstores"] = [b.to_doc() for b in node.blockstores]
                deps = tuple(dict.fromkeys(link_of_iface[i.client_id] for i in node.interfaces
                                           if i.client_id in link_of_iface))
                r = rs.Reservation(urns[cid], resource=what, depends_on=deps, gate="redeem")
            else:
                r = rs.Reservation(urns[cid], resource=f"link {cid}")
            demand = Demand(element, order, demands.image_policy, demands.bitstream_parts, demands.images)
            recs[urns[cid]] = Record(urns[cid], slice_urn, owner_urn, cid, kind, (node and node.component_id) or "",
                                     group, r, demand, details)
        return recs

    def _abandon(self, recs: dict[str, Record], now: datetime) -> None:
        """Give back everything an allocation that did not fully succeed holds, and forget it."""
        for rec in recs.values():
            rec.r, msgs = rs.close(rec.r, now)
            rec.outbox += [m for m in msgs if m not in rec.outbox]
            rec.discard = True
        self._drive(recs, now)
        for rec in recs.values():
            self._save(rec)

    # ---- questions to the broker: dry run and availability --------------------------------------------------
    def dry_run(self, request: Request, owner_urn: str, now: datetime, end: datetime) -> dict[str, Any]:
        """Where the broker would place `request` now, and what is short (Allocate with slicex_dry_run,
        `slicex plan`): the same demands as Allocate, sent with `dry_run`; nothing is booked or written."""
        names = {e.client_id: e.client_id for e in (*request.nodes, *request.links)}
        demands = demands_of(request, names, self.image_policy, self._bitstream_parts(owner_urn),
                             self._images(request, owner_urn))
        answer = self.broker.place(self.name, demands, Term(now, end), now, dry_run=True,
                                   authority=getattr(self.authority, "name", "") or "")
        return dict(answer.report or {})

    def find_slot(self, request: Request, owner_urn: str, query: SlotQuery, now: datetime) -> SlotAnswer:
        """When the broker could place `request` for the query's duration (ListResources with
        slicex_find_slot, `slicex find-slot`): the same demands as Allocate, in a `find_slot` message."""
        names = {e.client_id: e.client_id for e in (*request.nodes, *request.links)}
        demands = demands_of(request, names, self.image_policy, self._bitstream_parts(owner_urn))
        return self.broker.find_slot(self.name, demands, query, now,
                                     authority=getattr(self.authority, "name", "") or "")

    def in_use(self, now: datetime, window: Term | None = None) -> InUse:
        """What is in use now, as the broker answers its availability query (claims counted per pool, and the
        units it names); the answer is kept until the broker says its state changed (its version), so an
        unchanged broker costs one short reply. With a future `window` (ListResources geni_start_time/
        geni_end_time): the units the broker cannot promise over it, advance bookings included (not cached)."""
        if window is not None and window.start > now:
            return InUse({}, frozenset(self.broker.availability("", now, window)["units"]))
        with self._guard:
            known, used = self._available
        answer = self.broker.availability(known, now)
        if answer.get("unchanged"):
            return used
        used = InUse(dict(answer.get("counts", {})), frozenset(answer["units"]))
        with self._guard:
            self._available = (answer["version"], used)
        return used

    def _images(self, request: Request, owner_urn: str) -> dict[str, str]:
        """The images the request's nodes name that the owner may boot beyond the substrate's offer."""
        if self.images is None:
            return {}
        found = {n.disk_image: self.images(owner_urn, n.disk_image) for n in request.nodes if n.disk_image}
        return {spelled: urn for spelled, urn in found.items() if urn}

    def _bitstream_parts(self, owner_urn: str) -> dict[str, str]:
        if self.bitstreams is None:
            return {}
        return {b.ref: b.part for b in self.bitstreams.list(owner_urn)}

    # ---- provision -------------------------------------------------------------------------------------------
    def provision(self, sliver_urns: list[str], end: datetime, users: list[dict[str, Any]],
                  now: datetime) -> list[Sliver]:
        with self._on_slices(self._slices_of(sliver_urns)):
            for slice_urn in sorted(self._slices_of(sliver_urns)):
                pending = self.pending_update(slice_urn)
                if pending is not None and pending.phase == up.STAGED:  # Provision commits a staged Update
                    return self._provision_update(pending, sliver_urns, end, users, now)
            deps = [d for u in sliver_urns for d in self._require(u, now).r.depends_on]
            with self._holding(list(sliver_urns) + deps, now):
                self._settle(list(sliver_urns) + deps, now)
                return self._provision(sliver_urns, end, users, now)

    def _provision_update(self, pending: up.PendingUpdate, sliver_urns: list[str], end: datetime,
                          users: list[dict[str, Any]], now: datetime) -> list[Sliver]:
        """Commit the slice's staged Update (slice_manager/updater.py), then provision any other named sliver
        that is only allocated."""
        members = set(pending.members)
        others = [u for u in sliver_urns if u not in members]
        deps = [d for u in others for d in self._require(u, now).r.depends_on]
        with self._holding([*pending.members, *others, *deps], now):
            self._settle([*pending.members, *others], now)
            if self.pending_update(pending.slice_urn) != pending:  # another AM worker's reaper reverted it meanwhile
                raise Expired(f"the Update of {pending.slice_urn} expired and was reverted before it could be "
                              f"committed; Update again")
            committing = up.begin_commit(pending, now, self.name, end, users)
            self._put_update(committing)
            self.fault("update:committing")
            done = self._commit(committing, now)
            return done + (self._provision(others, end, users, now) if others else [])

    def _provision(self, sliver_urns: list[str], end: datetime, users: list[dict[str, Any]],
                   now: datetime) -> list[Sliver]:
        recs = {u: self._require(u, now) for u in sliver_urns}
        early = [rec for rec in recs.values() if rs.awaiting_start(rec.r, now)]
        if early:  # an advance reservation: its ticket (and so a lease) is valid only from its start
            rec = early[0]
            raise Refused(f"cannot provision {rec.client_id} ({rec.id}) yet: it is reserved from "
                          f"{rfc3339(rec.r.start)} until {rfc3339(rec.r.end)} (geni_start_time); Provision at or "
                          f"after its start, {int((rec.r.start - now).total_seconds())} s from now")
        for rec in list(recs.values()):  # a node needs the links it attaches to: provision them too
            for d in rec.r.depends_on:
                if d not in recs and (dep := self._load(d)) is not None and not dep.discard:
                    recs[d] = dep
        todo = {u: rec for u, rec in recs.items() if rec.r.state == rs.TICKETED and rec.r.pending == rs.NONE}
        for rec in todo.values():  # the lease runs to `end`: extend (or shorten) the ticket first
            if rec.r.end != end:
                rec.r, rec.outbox = rs.extend(rec.r, now, end)
        self._drive(todo, now)
        refused = [rec for rec in todo.values() if rec.r.end != end]
        if refused:
            raise _error(refused[0].error_type or "InsufficientNodes",
                         f"cannot provision {refused[0].client_id} until {rfc3339(end)}: {refused[0].r.reason}")
        whole_fpgas = [rec for rec in todo.values() if rec.details.get("sliver_type") == "fpga-bitstream"]
        for rec in whole_fpgas:  # the authority programs them; together they take the time of this many at once
            rec.details.update(owner=rec.owner_urn, programming_batch=len(whole_fpgas))
        for rec in todo.values():  # a driver that runs a login service sets it up with the users' keys
            if rec.kind == "node":
                self._set_users(rec, users)
        producers = self._producers(todo)
        for rec in todo.values():
            rec.r, rec.outbox = rs.redeem(rec.r, now, producers)
        self._drive(todo, now)
        failed = [rec for rec in todo.values() if rec.r.state == rs.FAILED]
        for rec in recs.values():
            if rec.kind == "node" and rec.r.state in rs.HOLDS_LEASE:
                self._set_users(rec, users)
                self._add_interface_details(rec)
            self._save(rec)
        if failed:
            # name the root cause: a sliver that failed because its producer did carries no error type of its own
            failed.sort(key=lambda rec: not rec.error_type)
            raise _error(failed[0].error_type or "GeniError",
                         f"provisioning {failed[0].client_id} failed: {failed[0].r.reason}")
        # a sliver that failed before this call is not provisioned by it: never answer success for it
        earlier = [rec for u, rec in recs.items() if u not in todo and rec.r.state == rs.FAILED]
        if earlier:
            raise GeniError(f"{earlier[0].client_id} failed earlier and cannot be provisioned "
                            f"({earlier[0].r.reason}); Delete its slivers and Allocate again")
        return [self._sliver(recs[u], now) for u in sliver_urns]

    def _producers(self, recs: dict[str, Record]) -> dict[str, rs.Reservation]:
        out = {rec.id: rec.r for rec in recs.values()}
        for rec in recs.values():
            for d in rec.r.depends_on:
                if d not in out:
                    other = self._load(d)
                    if other is not None:
                        out[d] = other.r
        return out

    def _set_users(self, rec: Record, users: list[dict[str, Any]]) -> None:
        host = f"{rec.client_id}.{rec.slice_urn.split('+')[-1]}.{self.substrate.authority}".lower()
        logins = []
        for n, u in enumerate(users):
            name = str(u.get("urn", "")).split("+")[-1] or f"user{n}"
            logins.append({"username": name, "urn": str(u.get("urn", "")), "hostname": host, "port": 22,
                           "keys": list(u.get("keys", []))})
        rec.details["logins"] = logins
        rec.details["hostname"] = host

    def _add_interface_details(self, rec: Record, links: list[Record] | None = None) -> None:
        """Each interface's sliver id, MAC, and the VLAN tag and address of its link (among `links`, by
        default the slice's)."""
        if not rec.details.get("interfaces"):
            return  # no scan of the slice's records for a node without interfaces
        if links is None:
            links = [r for r in self.records(rec.slice_urn) if r.kind == "link" and not r.discard]
        for cid, info in rec.details.get("interfaces", {}).items():
            info["sliver_id"] = f"{rec.id}:{cid}"
            info["mac_address"] = mac_for(rec.id, cid)
            for lk in links:
                refs = lk.details.get("interface_refs", [])
                if cid in refs:
                    info["vlan_tag"] = lk.details.get("vlan_tag")
                    if not info.get("ip"):  # a link an Update replaced names the addresses it kept
                        info["ip"] = ((lk.details.get("addresses") or {}).get(cid)
                                      or f"{lk.details['subnet']}.{refs.index(cid) + 1}")
                        info["netmask"] = "255.255.255.0"

    # ---- renew, perform, delete --------------------------------------------------------------------------------
    def renew(self, sliver_urns: list[str], end: datetime, now: datetime, best_effort: bool) -> list[Sliver]:
        with self._on_slices(self._slices_of(sliver_urns)), self._holding(sliver_urns, now):
            self._settle(sliver_urns, now)
            return self._renew(sliver_urns, end, now, best_effort)

    def _renew(self, sliver_urns: list[str], end: datetime, now: datetime, best_effort: bool) -> list[Sliver]:
        recs = {u: self._require(u, now) for u in sliver_urns}
        before = {u: rec.r.end for u, rec in recs.items()}
        todo = {}
        for u, rec in recs.items():
            if rec.r.state in (rs.TICKETED, rs.ACTIVE) and rec.r.pending == rs.NONE:
                rec.r, rec.outbox = rs.extend(rec.r, now, end)
                todo[u] = rec
            else:
                rec.r = replace(rec.r, reason=f"cannot renew: reservation is {rec.r.state}"
                                              f"{' (' + rec.r.pending + ')' if rec.r.pending != rs.NONE else ''}")
        self._drive(todo, now)
        short = [rec for rec in recs.values() if rec.r.end != end]
        if short and not best_effort:
            for u, rec in todo.items():  # all or nothing: put back the ones that were extended
                if rec.r.end == end and before[u] is not None:
                    rec.r, rec.outbox = rs.extend(rec.r, now, before[u])
            self._drive(todo, now)
            for rec in recs.values():
                self._save(rec)
            raise _error(short[0].error_type or "GeniError",
                         f"cannot renew {short[0].client_id} to {rfc3339(end)}: {short[0].r.reason}")
        for rec in recs.values():
            self._save(rec)
        return [self._sliver(rec, now) for rec in recs.values()]

    def perform(self, sliver_urns: list[str], action: str, now: datetime, best_effort: bool,
                users: list[dict[str, Any]]) -> list[Sliver]:
        if action not in sm.ACTIONS:
            raise Unsupported(f"operational action {action!r} is not supported here; supported: "
                              f"{', '.join(sm.ACTIONS)}")
        with self._on_slices(self._slices_of(sliver_urns)), self._holding(sliver_urns, now):
            self._settle(sliver_urns, now)
            return self._perform(sliver_urns, action, now, best_effort, users)

    def _perform(self, sliver_urns: list[str], action: str, now: datetime, best_effort: bool,
                 users: list[dict[str, Any]]) -> list[Sliver]:
        recs = [self._require(u, now) for u in sliver_urns]
        slivers = {rec.id: self._sliver(rec, now) for rec in recs}
        for rec in recs:  # a running sliver a staged Update concerns is still provisioned for its actions
            if slivers[rec.id].allocation_state == up.UPDATING and rec.r.state in rs.HOLDS_LEASE:
                slivers[rec.id].allocation_state = sm.PROVISIONED
        problems = []
        for rec in recs:
            s = slivers[rec.id]
            if s.allocation_state != sm.PROVISIONED:
                problems.append(f"{s.client_id} ({s.urn}) is {s.allocation_state}; provision it first")
            elif s.operational_state not in ALLOWED_ACTIONS[action]:
                problems.append(f"{s.client_id} is {s.operational_state}; {action} needs one of "
                                f"{', '.join(sorted(ALLOWED_ACTIONS[action]))}")
        if problems and not best_effort:
            raise BadArgs(f"cannot {action}: " + "; ".join(problems))
        out: list[Sliver] = []
        changed: list[Record] = []
        for rec in recs:
            s = slivers[rec.id]
            if s.allocation_state != sm.PROVISIONED or s.operational_state not in ALLOWED_ACTIONS[action]:
                s.error = (f"cannot {action} while {s.operational_state}"
                           if s.allocation_state == sm.PROVISIONED else f"cannot {action}: not provisioned")
                out.append(s)
                continue
            try:
                if action == "geni_update_users" and rec.kind == "node":
                    self._set_users(rec, users)  # the driver gets the new users with the action
                    self.authority.modify(rec.ticket_id, action, now, properties={"logins": rec.details["logins"]})
                else:
                    self.authority.modify(rec.ticket_id, action, now)
                changed.append(rec)
                rec.shutdown = False
                self._save(rec)
                out.append(self._sliver(rec, now))
            except GeniError as exc:
                if not best_effort:
                    raise self._undo_perform(changed, action, rec, exc, now) from None
                s.error = (f"{action} was done but could not be recorded: {exc.message}" if rec in changed
                           else f"{action} failed: {exc.message}")
                out.append(s)
        return out

    def _undo_perform(self, changed: list[Record], action: str, failed: Record, exc: GeniError,
                      now: datetime) -> GeniError:
        """All or nothing: put back the slivers an action already changed before `failed` failed, and say
        which could not be put back (the caller must never see a failure code after a silent partial change)."""
        undo = UNDO_ACTIONS.get(action)
        stuck = []
        for rec in changed:
            try:
                if undo is None:
                    raise Unsupported(f"{action} cannot be undone")
                self.authority.modify(rec.ticket_id, undo, now)
            except GeniError as why:
                stuck.append(f"{rec.client_id} ({rec.id}): {why.message}")
        told = f"{action} failed on {failed.client_id} ({failed.id}): {exc.message}; "
        if not changed:
            told += "no sliver was changed"
        elif not stuck:
            told += f"undone ({undo}) on {', '.join(r.client_id for r in changed)}: no sliver was changed"
        else:
            told += f"these slivers did change and could not be put back: {'; '.join(stuck)}"
        return type(exc)(told)

    def delete(self, sliver_urns: list[str], now: datetime) -> list[Sliver]:
        with self._on_slices(self._slices_of(sliver_urns)), self._holding(sliver_urns, now):
            self._settle(sliver_urns, now)
            return self._delete(sliver_urns, now)

    def _delete(self, sliver_urns: list[str], now: datetime) -> list[Sliver]:
        recs = {u: self._require(u, now) for u in sliver_urns}
        for slice_urn in {rec.slice_urn for rec in recs.values()}:
            self._forget_ended(slice_urn)  # what is gone now went by the owner's hand
        for rec in recs.values():
            rec.r, msgs = rs.close(rec.r, now)
            rec.outbox += [m for m in msgs if m not in rec.outbox]
            rec.discard = True
        self._drive(recs, now)
        out = []
        for rec in recs.values():
            s = self._sliver(rec, now)
            s.allocation_state, s.operational_state = sm.UNALLOCATED, sm.PENDING_ALLOCATION
            out.append(s)
            self._save(rec)
        self._forget_requests({rec.slice_urn for rec in recs.values()})
        for slice_urn in {rec.slice_urn for rec in recs.values()}:
            self._forget_update_of_gone(slice_urn)
        return out

    # ---- views -----------------------------------------------------------------------------------------------
    def _sliver(self, rec: Record, now: datetime) -> Sliver:
        r = rec.r
        if r.state in (rs.CLOSE_WAIT, rs.CLOSED):
            alloc, op = sm.UNALLOCATED, sm.PENDING_ALLOCATION
        elif rec.provisioned or r.state in rs.HOLDS_LEASE or r.pending == rs.REDEEMING:
            alloc, op = sm.PROVISIONED, sm.NOTREADY
        else:
            alloc, op = sm.ALLOCATED, sm.PENDING_ALLOCATION
        if rec.update and r.state not in (rs.CLOSE_WAIT, rs.CLOSED):
            alloc = up.UPDATING  # a sliver of a staged Update (slice_manager/update.py)
        error = ""
        extra: dict[str, Any] = {}
        if r.state == rs.FAILED:
            op, error = sm.FAILED, r.reason
        elif r.state in rs.HOLDS_LEASE:
            try:
                op, error = self.authority.status(rec.ticket_id, now)
            except (Unavailable, TimedOut) as exc:  # its state is unknown for now, not failed: say why
                op, error = sm.NOTREADY, f"operational state unknown: {exc.message}"
            except GeniError as exc:
                op, error = sm.FAILED, exc.message
            view = getattr(self.authority, "view", None) if rec.kind == "node" else None
            if view is not None:  # a driver's own login endpoints and service results (netns sshd)
                try:
                    extra = view(rec.ticket_id)
                except GeniError:
                    extra = {}
            if rec.shutdown:
                error = error or "slice shut down by operator"
            error = error or r.reason  # e.g. a refused renewal: it still runs until its old end
        elif r.reason:
            error = r.reason
        if alloc == up.UPDATING:  # what the staged Update's commit will do to it (slice_manager/update.py ACTIONS)
            extra = {**extra, "update_action": rec.update}
        details = {**rec.details, **extra, "keys": list(rec.ticket.units) if rec.ticket else [],
                   "reservation": {"state": r.state, "pending": r.pending, "sequence": r.sequence,
                                   "request": r.request, "reason": r.reason}}
        return Sliver(rec.id, rec.slice_urn, rec.client_id, rec.kind, alloc, op, r.end or now, error,
                      rec.component_id, rec.owner_urn, details, rec.slice_uuid)

    def slivers(self, slice_urn: str, now: datetime) -> list[Sliver]:
        with self._on_slices([slice_urn]):
            recs = self._settle_slice(slice_urn, now)
            return sorted((self._sliver(rec, now) for rec in recs
                           if rec.r.state not in (rs.CLOSE_WAIT, rs.CLOSED) and not rec.discard),
                          key=lambda s: s.client_id)

    def sliver(self, sliver_urn: str, now: datetime) -> Sliver | None:
        with self._on_slices(self._slices_of([sliver_urn])):
            rec = self._load(sliver_urn)
            if rec is not None and self._needs_work(rec, now):
                with self._holding([sliver_urn], now, strict=False) as mine:
                    self._settle(mine, now)
                rec = self._load(sliver_urn)
            if rec is None or rec.discard or rec.r.state in (rs.CLOSE_WAIT, rs.CLOSED):
                return None
            return self._sliver(rec, now)

    def snapshot(self, sliver_urn: str, name: str, owner: str, public: bool, now: datetime) -> dict[str, Any]:
        """CreateImage: the authority makes an image of the node's lease (the caller was authorised for the
        slice by the AM edge)."""
        with self._on_slices(self._slices_of([sliver_urn])):
            rec = self._require(sliver_urn, now)
            if rec.kind != "node":
                raise BadArgs(f"{sliver_urn} ({rec.client_id}) is a {rec.kind}; an image is made of a node")
            if rec.r.state not in rs.HOLDS_LEASE:
                raise BadArgs(f"node {rec.client_id} is not provisioned ({rec.r.state}); Provision it, write what "
                              f"the image should hold, then make the image")
            return self.authority.snapshot(rec.ticket_id, name, owner, public, now)

    def _require(self, urn: str, now: datetime) -> Record:
        rec = self._load(urn)
        if rec is None or rec.discard or rec.r.state in (rs.CLOSE_WAIT, rs.CLOSED):
            raise SearchFailed(f"no sliver {urn} here (deleted, expired or never allocated)")
        return rec

    def shutdown(self, slice_urn: str, now: datetime) -> None:
        """Operator stop: provisioned slivers are stopped where they can be and shown as shut down."""
        with self._on_slices([slice_urn]):
            self.store.put(SLICES, slice_urn, {"slice_urn": slice_urn, "shutdown": True, "at": rfc3339(now)})
            self._changed()  # the dashboard shows the slice shut down
            ids = [rec.id for rec in self.records(slice_urn)]
            with self._holding(ids, now, strict=False) as mine:
                self._shutdown([rec for rid in mine if (rec := self._load(rid)) is not None], now)

    def _shutdown(self, recs: list[Record], now: datetime) -> None:
        for rec in recs:
            if rec.r.state in rs.HOLDS_LEASE:
                state, _ = self.authority.status(rec.ticket_id, now)
                if state in ALLOWED_ACTIONS["geni_stop"]:
                    self.authority.modify(rec.ticket_id, "geni_stop", now)
                rec.shutdown = True
                self._save(rec)

    def is_shut_down(self, slice_urn: str) -> bool:
        doc = self.store.get(SLICES, slice_urn)
        return bool(doc and doc.get("shutdown"))

    def request_of(self, slice_urn: str) -> list[Request]:
        return [Request((), (), d["xml"]) for d in self.store.scan(REQUESTS, f"{slice_urn}#")
                if d["slice_urn"] == slice_urn]

    def _forget_ended(self, slice_urn: str) -> None:
        """Forget why the slice's last slivers ended, if that was recorded (rarely: a read costs a fifth of a
        write, and Allocate and Delete asked every time)."""
        if self.store.get(ENDED, slice_urn) is not None:
            self.store.delete(ENDED, slice_urn)

    def ended(self, slice_urn: str, now: datetime) -> str | None:
        """Why a slice that has no slivers here lost its last ones by itself (term ended, failure), if that
        happened within the last day; None if it never had any or its owner deleted them."""
        doc = self.store.get(ENDED, slice_urn)
        if doc is None:
            return None
        if doc.get("end") and parse_time(doc["end"]) < now - ENDED_KEPT:
            self.store.delete(ENDED, slice_urn)
            return None
        return doc["reason"]

    def usage_version(self) -> str:
        """A digest of how many units of each pool are claimed (the store's counters, not the claims): it
        changes with the units in use, for a snapshot whose broker runs in another process."""
        counts = sorted((c, n) for c, n in self.store.claim_counts().items() if c.partition(":")[0] in UNIT_KINDS)
        return hashlib.sha256(repr(counts).encode()).hexdigest()

    def usage_keys(self) -> set[str]:
        """Every unit claimed in the store (the broker's claims, which the dashboard and metrics read)."""
        return set(self.store.claims_in(UNIT_KINDS))

    def views(self, slivers: list[Sliver]):
        from rspec.manifest import SliverView

        return [SliverView(s.client_id, s.urn, s.kind, s.component_id, s.details, s.operational_state)
                for s in slivers]
