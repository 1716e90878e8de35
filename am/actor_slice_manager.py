"""The slice manager actor (ORCA SM) on broker tickets and authority leases, behind the SliceManager seam.

Every sliver is a reservation (am/reservation.py). The slice manager never changes one except through the
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
reservation gives back what it holds, so nothing leaks."""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from am import reservation as rs
from am import slice_manager as sm
from am.authority import SliverSpec
from am.embed import mac_for
from am.slice_manager import Sliver
from am.sm_locks import SliceLocks
from am.substrate.emulated import ALLOWED_ACTIONS
from broker.placement import demands_of
from rspec.request import Request
from slicex import errors
from slicex.clock import parse_time, rfc3339
from slicex.errors import (
    BadArgs,
    Busy,
    CredentialInvalid,
    GeniError,
    RpcError,
    SearchFailed,
    TimedOut,
    Unavailable,
    Unsupported,
)
from slicex.store import Store
from slicex.term import Term
from slicex.ticket import Lease, Ticket, verify_lease

log = logging.getLogger("slicex.sm")
# what puts a sliver back after an operational action that must be undone (all-or-nothing without
# geni_best_effort); geni_restart and geni_update_users have none, so a partial change is reported instead
UNDO_ACTIONS = {"geni_start": "geni_stop", "geni_stop": "geni_start"}
RESERVATIONS = "sm-reservations"
REQUESTS = "sm-requests"
SLICES = "sm-slices"
INSTANCES = "sm-instances"
ENDED = "sm-ended"  # slice → why its last slivers ended on their own (expiry, failure): for a clear Status
ENDED_KEPT = timedelta(days=1)
LIVENESS = timedelta(minutes=2)
"""A slice manager that has not been heard of for this long is presumed dead: others take over its work."""
PLAN_RETRIES = 8
"""Ticket requests per Allocate: each lost race to another AM worker (Busy at the broker) asks again after a
backoff (the broker itself places again on a lost claim race; this covers races it could not resolve)."""
DRIVE_ROUNDS = 64
SLICE_WAIT = 120.0
"""Seconds a call waits for another call on the same slice in this process (actor calls time out sooner)."""
WORKER_WAIT = 3.0
"""Seconds a call waits for a sliver another AM worker holds before it is Busy: another worker's reaper takes
a sliver's lock for a moment, which is no reason to refuse a call."""


class Crash(BaseException):
    """Raised by a fault-injection hook to stop the slice manager dead at a message boundary (tests)."""


# ---- persistence of reservations and messages -------------------------------------------------------------------
def _t(when: datetime | None) -> str | None:
    return rfc3339(when) if when else None


def _p(text: str | None) -> datetime | None:
    return parse_time(text) if text else None


def reservation_doc(r: rs.Reservation) -> dict[str, Any]:
    return {"id": r.id, "state": r.state, "pending": r.pending, "pending_since": _t(r.pending_since),
            "sequence": r.sequence, "reason": r.reason, "request": r.request, "resource": r.resource,
            "depends_on": list(r.depends_on), "gate": r.gate, "blocked": r.blocked, "labels": [list(x) for x in r.labels],
            "start": _t(r.start), "end": _t(r.end), "want_end": _t(r.want_end), "deadline": _t(r.deadline),
            "awaiting": list(r.awaiting)}


def reservation_from(d: dict[str, Any]) -> rs.Reservation:
    return rs.Reservation(d["id"], d["state"], d["pending"], _p(d["pending_since"]), int(d["sequence"]), d["reason"],
                          int(d["request"]), d.get("resource", ""), tuple(d.get("depends_on", ())),
                          d.get("gate", "ticket"), d.get("blocked", ""), tuple((str(k), int(v)) for k, v in d.get("labels", ())),
                          _p(d.get("start")), _p(d.get("end")), _p(d.get("want_end")), _p(d.get("deadline")),
                          tuple(d.get("awaiting", ())))


def message_doc(m: rs.Message) -> dict[str, Any]:
    return {"kind": m.kind, "reservation": m.reservation, "request": m.request, "start": _t(m.start),
            "end": _t(m.end), "inputs": [list(x) for x in m.inputs]}


def message_from(d: dict[str, Any]) -> rs.Message:
    return rs.Message(d["kind"], d["reservation"], int(d["request"]), _p(d.get("start")), _p(d.get("end")),
                      tuple((str(k), int(v)) for k, v in d.get("inputs", ())))


@dataclass
class Record:
    """One sliver: its reservation, what was planned for it, and what the actors gave it."""

    id: str
    slice_urn: str
    owner_urn: str
    client_id: str
    kind: str
    component_id: str
    group: str  # the broker's claim owner for its ticket
    r: rs.Reservation
    demand: dict[str, Any]  # what it needs (broker/placement.py demands_of: one node or link, and constraints)
    details: dict[str, Any] = field(default_factory=dict)  # what the manifest shows: host, image, tag, logins...
    ticket: Ticket | None = None
    lease: Lease | None = None
    outbox: list[rs.Message] = field(default_factory=list)
    error_type: str = ""  # GeniError class of the last refusal (so the AM result carries its code)
    provisioned: bool = False
    shutdown: bool = False
    discard: bool = False  # forget it once its releases are delivered (a deleted or abandoned sliver)

    def to_doc(self) -> dict[str, Any]:
        return {"id": self.id, "slice_urn": self.slice_urn, "owner_urn": self.owner_urn, "client_id": self.client_id,
                "kind": self.kind, "component_id": self.component_id, "group": self.group,
                "r": reservation_doc(self.r), "demand": self.demand, "details": self.details,
                "ticket": self.ticket.to_doc() if self.ticket else None,
                "lease": self.lease.to_doc() if self.lease else None,
                "outbox": [message_doc(m) for m in self.outbox], "error_type": self.error_type,
                "provisioned": self.provisioned, "shutdown": self.shutdown, "discard": self.discard}

    @staticmethod
    def from_doc(d: dict[str, Any]) -> Record:
        return Record(d["id"], d["slice_urn"], d["owner_urn"], d["client_id"], d["kind"], d["component_id"],
                      d["group"], reservation_from(d["r"]), dict(d["demand"]), d.get("details", {}),
                      Ticket.from_doc(d["ticket"]) if d.get("ticket") else None,
                      Lease.from_doc(d["lease"]) if d.get("lease") else None,
                      [message_from(m) for m in d.get("outbox", [])], d.get("error_type", ""),
                      bool(d.get("provisioned")), bool(d.get("shutdown")), bool(d.get("discard")))

    @property
    def ticket_id(self) -> str:
        return self.ticket.id if self.ticket else f"{self.group}/{self.id}"


def _error(type_name: str, message: str) -> GeniError:
    cls = getattr(errors, type_name, None)
    return cls(message) if isinstance(cls, type) and issubclass(cls, GeniError) else GeniError(message)


class ActorSliceManager:
    """SliceManager over a broker and an authority (in-process objects or proxies to actor servers)."""

    def __init__(self, store: Store, substrate: Any, broker: Any, authority: Any, name: str | None = None,
                 image_policy: str = "reject", bitstreams: Any = None,
                 fault: Callable[[str], None] | None = None, run_actor_clocks: bool = True,
                 tick: timedelta = timedelta(seconds=1), lease_key: Any = None):
        self.store = store
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
        self.fault = fault or (lambda boundary: None)
        self.run_actor_clocks = run_actor_clocks  # in-process actors: run their clocks from the reaper
        self.tick = tick  # the actor clock's tick: calls catch up with the clock at most once per tick
        # Concurrency: a call holds its slice's in-process lock (sm_locks) and its reservations' store locks;
        # nothing process-wide is held across an actor call or a blocking store round trip. The reaper takes
        # a slice only when no call holds it, and a call settles its own reservations with the clock.
        self._slices = SliceLocks()
        self._guard = threading.Lock()  # in-memory bookkeeping only: _reaped_at, _claimed_here, _available
        self._reaping = threading.RLock()  # one reap at a time; calls skip theirs while another runs
        self._reaped_at: datetime | None = None
        self._claimed_here: set[str] = set()  # reservations whose store lock a thread of this process holds
        self._available: tuple[str, frozenset[str]] = ("", frozenset())  # the broker's last availability answer

    # ---- records ---------------------------------------------------------------------------------------------
    def _load(self, rid: str) -> Record | None:
        d = self.store.get(RESERVATIONS, rid)
        return Record.from_doc(d) if d else None

    def _save(self, rec: Record) -> None:
        if (rec.r.state == rs.CLOSED or rec.discard) and not rec.outbox:
            if not rec.discard and rec.r.reason:  # ended by itself, not deleted by its owner: remember why
                self.store.put(ENDED, rec.slice_urn, {"slice_urn": rec.slice_urn, "reason": rec.r.reason,
                                                      "end": rfc3339(rec.r.end) if rec.r.end else ""})
            self.store.delete(RESERVATIONS, rec.id)
        else:
            self.store.put(RESERVATIONS, rec.id, rec.to_doc())

    def records(self, slice_urn: str | None = None) -> list[Record]:
        return [Record.from_doc(d) for d in self.store.scan(RESERVATIONS)
                if slice_urn is None or d["slice_urn"] == slice_urn]

    def reservations(self) -> list[rs.Reservation]:
        return [rec.r for rec in self.records()]

    # ---- who works on which reservation ---------------------------------------------------------------------
    def _heartbeat(self, now: datetime) -> None:
        self.store.put(INSTANCES, self.name, {"name": self.name, "at": rfc3339(now)})

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
            for rid in rids:
                self.store.release(f"sm-lock:{rid}", self.name)
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

    def _settle(self, rids: Iterable[str], now: datetime) -> None:
        """Apply the clock to a call's own reservations (whose locks it holds) before it acts: the reaper
        skips a slice while a call on it runs, and a call must not act on what the clock already ended."""
        recs = {rid: rec for rid in dict.fromkeys(rids) if (rec := self._load(rid)) is not None}
        due = {rid for rid, rec in recs.items() if self._needs_work(rec, now)}
        if due and self._recover(due, now):
            self._forget_requests({recs[rid].slice_urn for rid in due})

    # ---- the message plumbing ----------------------------------------------------------------------------------
    def _drive(self, recs: dict[str, Record], now: datetime) -> None:
        """Deliver every outbox message of `recs` and apply the answers until nothing is left to send (or
        only messages that could not be delivered). Each record is persisted with its outbox before any
        message leaves, and again after the answers are applied."""
        stuck: set[tuple[str, rs.Message]] = set()  # not delivered in this drive: retried by the next reap
        for _ in range(DRIVE_ROUNDS):
            self._resume_dependants(recs, now)
            sending = {rid: [m for m in rec.outbox if (rid, m) not in stuck] for rid, rec in recs.items()}
            sending = {rid: msgs for rid, msgs in sending.items() if msgs}
            if not sending:
                return
            for rid in sending:
                self._save(recs[rid])
            delivered_any = False
            tickets = [(recs[rid], m) for rid, msgs in sending.items() for m in msgs if m.kind == "ticket"]
            for group in sorted({rec.group for rec, _ in tickets}):
                batch = [(rec, m) for rec, m in tickets if rec.group == group]
                self.fault("ticket:pending")
                events = self._deliver_tickets(batch, now)
                self.fault("ticket:answered")
                for (rec, m), ev in zip(batch, events, strict=True):
                    delivered_any |= self._answer(rec, m, ev, now)
                    if ev is None:
                        stuck.add((rec.id, m))
            for rid, msgs in sending.items():
                # a ticket's units go back to the broker only once the authority let go of them: relinquished
                # first, they could be promised and redeemed for another slice while still leased
                for m in sorted(msgs, key=lambda m: m.kind != "close"):
                    if m.kind == "ticket":
                        continue
                    if m.kind == "relinquish" and any(x.kind == "close" for x in recs[rid].outbox):
                        stuck.add((rid, m))  # the close was not delivered: this waits for it
                        continue
                    rec = recs[rid]
                    self.fault(f"{m.kind}:pending")
                    ev = self._deliver(rec, m, now)
                    self.fault(f"{m.kind}:answered")
                    delivered_any |= self._answer(rec, m, ev, now)
                    if ev is None:
                        stuck.add((rid, m))
            for rid in sending:
                self._save(recs[rid])
            if not delivered_any:
                return  # what is left could not be delivered: recover/reap retries it

    def _answer(self, rec: Record, m: rs.Message, event: Any, now: datetime) -> bool:
        """Take `m` out of the outbox and apply the answer; an undeliverable release stays for a retry."""
        if event is None:
            return False
        rec.outbox = [x for x in rec.outbox if x != m]
        rec.r, more = rs.apply(rec.r, event, now)
        rec.outbox += [x for x in more if x not in rec.outbox]
        if rec.r.state in (rs.ACTIVE, rs.ACTIVE_TICKETED):
            rec.provisioned = True
        return True

    def _resume_dependants(self, recs: dict[str, Record], now: datetime) -> None:
        waiting = [rec for rec in recs.values() if rec.r.pending == rs.PRIMING]
        if not waiting:
            return
        known = {rec.id: rec.r for rec in recs.values()}
        for rec in waiting:
            missing = [d for d in rec.r.depends_on if d not in known]
            for d in missing:
                other = self._load(d)
                if other is not None:
                    known[d] = other.r
            rec.r, msgs = rs.on_dependencies(rec.r, known, now)
            rec.outbox += msgs

    def _deliver_tickets(self, batch: list[tuple[Record, rs.Message]], now: datetime) -> list[Any]:
        """One `place` message for a ticket group: the demands of its nodes and links (no unit named); the
        broker's policy chooses, books all or nothing, and answers tickets with the placement of each."""
        batch = sorted(batch, key=lambda rm: int(rm[0].demand.get("order", 0)))
        elements: dict[str, list[dict[str, Any]]] = {"nodes": [], "links": []}
        for rec, m in batch:
            element = dict(rec.demand["element"])
            tag = dict(m.inputs).get("vlan")
            if tag is not None and rec.kind == "link":
                element["vlan_tag"] = tag  # a consumer takes the tag its producer chose
            elements["nodes" if rec.kind == "node" else "links"].append(element)
        rec0, m0 = batch[0]
        demands = {**elements, "image_policy": rec0.demand.get("image_policy", self.image_policy),
                   "bitstream_parts": rec0.demand.get("bitstream_parts", {})}
        term = Term(m0.start or now, m0.end or (now + timedelta(minutes=10)))
        try:
            answer = self.broker.place(self.name, demands, term, now, group=rec0.group,
                                       authority=getattr(self.authority, "name", "") or "")
        except (Unavailable, TimedOut, RpcError) as exc:
            for rec, _ in batch:
                rec.error_type = type(exc).__name__
            return [rs.FailedRpc(m.request, "ticket", f"broker: {exc.message}") for _, m in batch]
        except GeniError as exc:
            for rec, _ in batch:
                rec.error_type = type(exc).__name__
            return [rs.TicketUpdate(m.request, False, reason=exc.message) for _, m in batch]
        out = []
        for rec, m in batch:
            t = answer["tickets"][rec.id]
            where = answer["placements"].get(rec.id) or {}
            rec.ticket = t
            rec.component_id = where.get("component_id", rec.component_id)
            rec.details = {**rec.details, **dict(where.get("details") or {})}
            if t.labels and rec.kind == "link":
                rec.details["vlan_tag"] = dict(t.labels).get("vlan", rec.details.get("vlan_tag"))
            out.append(rs.TicketUpdate(m.request, True, t.sequence, t.end, t.labels))
        return out

    def _deliver(self, rec: Record, m: rs.Message, now: datetime) -> Any:
        """Send one message to its actor; return the answer as a reservation event (None: not delivered)."""
        actor = "broker" if m.kind in ("extendTicket", "relinquish") else "authority"
        try:
            if m.kind == "extendTicket":
                if rec.ticket is None:
                    return rs.TicketUpdate(m.request, False, reason="no ticket to extend")
                t = self.broker.extend_ticket(rec.ticket, m.end, now=now)
                rec.ticket = t
                return rs.TicketUpdate(m.request, True, t.sequence, t.end, t.labels)
            if m.kind == "relinquish":
                stub = rec.ticket or Ticket(rec.ticket_id, "", self.name, rec.id, (), now, now)
                self.broker.relinquish(stub, now)
                return rs.CloseAck(m.request, "relinquish")
            if m.kind == "redeem":
                if rec.ticket is None:
                    return rs.LeaseUpdate(m.request, False, reason="no ticket to redeem")
                lease, _status = self.authority.redeem(rec.ticket, self._spec(rec, m.inputs), now)
                self._check_lease(lease, rec.ticket)
                rec.lease = lease
                return rs.LeaseUpdate(m.request, True, lease.sequence, lease.end)
            if m.kind == "extendLease":
                if rec.ticket is None:
                    return rs.LeaseUpdate(m.request, False, reason="no ticket to extend the lease with")
                lease = self.authority.extend_lease(rec.lease, rec.ticket, now)
                self._check_lease(lease, rec.ticket)
                rec.lease = lease
                return rs.LeaseUpdate(m.request, True, lease.sequence, lease.end)
            if m.kind == "close":
                self.authority.close(rec.ticket_id, now)
                return rs.CloseAck(m.request, "close")
        except (Unavailable, TimedOut, RpcError) as exc:
            if m.kind in ("relinquish", "close"):
                return None  # stays in the outbox; recover/reap delivers it again
            rec.error_type = type(exc).__name__
            return rs.FailedRpc(m.request, m.kind, f"{actor}: {exc.message}")
        except GeniError as exc:
            if m.kind in ("relinquish", "close"):
                return None
            rec.error_type = type(exc).__name__
            if m.kind in ("extendTicket",):
                return rs.TicketUpdate(m.request, False, reason=exc.message)
            return rs.LeaseUpdate(m.request, False, reason=exc.message)
        raise ValueError(f"unknown message kind {m.kind!r}")

    def _check_lease(self, lease: Lease, ticket: Ticket) -> None:
        """Raise CredentialInvalid unless the authority signed `lease` and it is the lease of `ticket`."""
        verify_lease(lease, self.lease_key)
        if ticket.units:
            units_ok = lease.units == ticket.units
        else:
            units_ok = (len(lease.units) == ticket.count == len(set(lease.units))
                        and all(u.startswith(f"{ticket.resource_type}:") for u in lease.units))
        wrong = [what for what, ok in (
            ("ticket", lease.ticket == ticket.id), ("reservation", lease.reservation == ticket.reservation),
            ("holder", lease.holder == ticket.holder), ("units", units_ok),
            ("authority", not ticket.authority or lease.authority == ticket.authority),
            ("end", lease.end == ticket.end), ("start", ticket.start <= lease.start < lease.end),
            ("sequence", lease.sequence == ticket.sequence), ("labels", lease.labels == ticket.labels)) if not ok]
        if wrong:
            raise CredentialInvalid(f"lease {lease.id} from authority {lease.authority} does not match ticket "
                                    f"{ticket.id} ({', '.join(wrong)} differ); refused")

    def _spec(self, rec: Record, inputs: Iterable[tuple[str, int]]) -> SliverSpec:
        details = {k: v for k, v in rec.details.items() if k != "reservation"}  # logins: a driver with sshd needs them
        return SliverSpec(rec.id, rec.kind, rec.client_id, rec.ticket.units if rec.ticket else (),
                          tuple(inputs) or (rec.ticket.labels if rec.ticket else ()), details)

    # ---- recovery and the clock ----------------------------------------------------------------------------
    def recover(self, now: datetime) -> list[str]:
        """Finish what a previous slice manager over this store left: deliver every outbox message again
        (actors answer repeats with the same result), then end whatever is still pending past its deadline,
        giving back what it may hold. Returns the slivers that ended.

        A slice that a call of this process is working on is skipped (the call settles its own reservations,
        the next tick gets the rest): the reaper never waits for a call, and no call waits for the reaper's
        actor calls on other slices."""
        self._heartbeat(now)
        self._drop_leftover_locks()
        due: dict[str, list[str]] = {}
        for rec in self.records():
            if self._needs_work(rec, now):
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
        return ended

    @staticmethod
    def _needs_work(rec: Record, now: datetime) -> bool:
        if rec.outbox or rec.r.pending != rs.NONE or rs.on_tick(rec.r, now)[0] != rec.r:
            return True
        end = rec.r.end or rec.r.want_end
        return rec.r.state == rs.FAILED and (end is None or end <= now)

    def _recover(self, rids: set[str], now: datetime) -> list[str]:
        recs = {rid: rec for rid in rids if (rec := self._load(rid)) is not None}
        before = {rid: rec.r.state for rid, rec in recs.items()}
        stored = {rid: rec.to_doc() for rid, rec in recs.items()}
        self._drive({rid: rec for rid, rec in recs.items() if rec.outbox or rec.r.pending == rs.PRIMING}, now)
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

    # ---- SliceManager: allocate -----------------------------------------------------------------------------
    def allocate(self, slice_urn: str, owner_urn: str, request: Request, end: datetime,
                 now: datetime) -> list[Sliver]:
        self._catch_up(now)
        with self._on_slices([slice_urn]):
            return self._allocate(slice_urn, owner_urn, request, end, now)

    def _allocate(self, slice_urn: str, owner_urn: str, request: Request, end: datetime,
                  now: datetime) -> list[Sliver]:
        self.store.delete(ENDED, slice_urn)
        parts = self._bitstream_parts(owner_urn)
        for attempt in range(PLAN_RETRIES):
            if attempt:  # lost a race to another AM worker: let the winners' claims land before asking again
                time.sleep(random.uniform(0, min(0.1, 0.005 * 2 ** attempt)))
            recs = self._records(request, slice_urn, owner_urn, f"ticket:{uuid.uuid4().hex}", parts)
            for rec in recs.values():
                rec.r, rec.outbox = rs.demand(rec.r, now, end)
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
                 parts: dict[str, str]) -> dict[str, Record]:
        """A reservation per requested node and link, with its demand (what it needs, no unit named): the
        broker chooses where it goes when it grants the ticket."""
        urns = {e.client_id: f"urn:publicid:IDN+{self.substrate.authority}+sliver+{uuid.uuid4().hex[:16]}"
                for e in (*request.nodes, *request.links)}
        demands = demands_of(request, urns, self.image_policy, parts)
        constraints = {"image_policy": demands["image_policy"], "bitstream_parts": demands["bitstream_parts"]}
        link_of_iface = {ref: urns[lk.client_id] for lk in request.links for ref in lk.interface_refs}
        recs: dict[str, Record] = {}
        for order, element in enumerate(demands["nodes"] + demands["links"]):
            cid = element["client_id"]
            node = request.node(cid) if order < len(demands["nodes"]) else None
            kind = "node" if node is not None else "link"
            details: dict[str, Any] = {}
            if node is not None:
                what = f"node {cid} ({node.sliver_type or 'node'})"
                if node.execute:
                    details["execute"] = [{"shell": sh, "command": c} for sh, c in node.execute]
                deps = tuple(dict.fromkeys(link_of_iface[i.client_id] for i in node.interfaces
                                           if i.client_id in link_of_iface))
                r = rs.Reservation(urns[cid], resource=what, depends_on=deps, gate="redeem")
            else:
                r = rs.Reservation(urns[cid], resource=f"link {cid}")
            demand = {"element": element, "order": order, **constraints}
            recs[urns[cid]] = Record(urns[cid], slice_urn, owner_urn, cid, kind, element.get("component_id") or "",
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
        demands = demands_of(request, names, self.image_policy, self._bitstream_parts(owner_urn))
        answer = self.broker.place(self.name, demands, Term(now, end), now, dry_run=True,
                                   authority=getattr(self.authority, "name", "") or "")
        return answer["report"]

    def in_use(self, now: datetime) -> frozenset[str]:
        """The unit keys in use now, as the broker answers its availability query; the answer is kept until
        the broker says its state changed (its version), so an unchanged broker costs one short reply."""
        with self._guard:
            known, units = self._available
        answer = self.broker.availability(known, now)
        if answer.get("unchanged"):
            return units
        units = frozenset(answer["units"])
        with self._guard:
            self._available = (answer["version"], units)
        return units

    def _bitstream_parts(self, owner_urn: str) -> dict[str, str]:
        if self.bitstreams is None:
            return {}
        return {b.ref: b.part for b in self.bitstreams.list(owner_urn)}

    # ---- provision -------------------------------------------------------------------------------------------
    def provision(self, sliver_urns: list[str], end: datetime, users: list[dict[str, Any]],
                  now: datetime) -> list[Sliver]:
        self._catch_up(now)
        with self._on_slices(self._slices_of(sliver_urns)):
            deps = [d for u in sliver_urns for d in self._require(u, now).r.depends_on]
            with self._holding(list(sliver_urns) + deps, now):
                self._settle(list(sliver_urns) + deps, now)
                return self._provision(sliver_urns, end, users, now)

    def _provision(self, sliver_urns: list[str], end: datetime, users: list[dict[str, Any]],
                   now: datetime) -> list[Sliver]:
        recs = {u: self._require(u, now) for u in sliver_urns}
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

    def _add_interface_details(self, rec: Record) -> None:
        if not rec.details.get("interfaces"):
            return  # no scan of the slice's records for a node without interfaces
        links = [r for r in self.records(rec.slice_urn) if r.kind == "link"]
        for cid, info in rec.details.get("interfaces", {}).items():
            info["sliver_id"] = f"{rec.id}:{cid}"
            info["mac_address"] = mac_for(rec.id, cid)
            for lk in links:
                refs = lk.details.get("interface_refs", [])
                if cid in refs:
                    info["vlan_tag"] = lk.details.get("vlan_tag")
                    if not info.get("ip"):
                        info["ip"] = f"{lk.details['subnet']}.{refs.index(cid) + 1}"
                        info["netmask"] = "255.255.255.0"

    # ---- renew, perform, delete --------------------------------------------------------------------------------
    def renew(self, sliver_urns: list[str], end: datetime, now: datetime, best_effort: bool) -> list[Sliver]:
        self._catch_up(now)
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
        self._catch_up(now)
        with self._on_slices(self._slices_of(sliver_urns)), self._holding(sliver_urns, now):
            self._settle(sliver_urns, now)
            return self._perform(sliver_urns, action, now, best_effort, users)

    def _perform(self, sliver_urns: list[str], action: str, now: datetime, best_effort: bool,
                 users: list[dict[str, Any]]) -> list[Sliver]:
        recs = [self._require(u, now) for u in sliver_urns]
        slivers = {rec.id: self._sliver(rec, now) for rec in recs}
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
        self._catch_up(now)
        with self._on_slices(self._slices_of(sliver_urns)), self._holding(sliver_urns, now):
            self._settle(sliver_urns, now)
            return self._delete(sliver_urns, now)

    def _delete(self, sliver_urns: list[str], now: datetime) -> list[Sliver]:
        recs = {u: self._require(u, now) for u in sliver_urns}
        for slice_urn in {rec.slice_urn for rec in recs.values()}:
            self.store.delete(ENDED, slice_urn)  # what is gone now went by the owner's hand
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
        return out

    def _forget_requests(self, slice_urns: set[str]) -> None:
        """Drop the stored requests of these slices (whose locks the caller holds) that no live sliver is
        from any more; another slice's request may belong to an allocation still being made."""
        live = {(d["slice_urn"], d["client_id"]) for d in self.store.scan(RESERVATIONS) if d["slice_urn"] in slice_urns}
        for doc in self.store.scan(REQUESTS):
            if doc["slice_urn"] in slice_urns and not any((doc["slice_urn"], c) in live for c in doc["client_ids"]):
                self.store.delete(REQUESTS, doc["key"])

    # ---- views -----------------------------------------------------------------------------------------------
    def _sliver(self, rec: Record, now: datetime) -> Sliver:
        r = rec.r
        if r.state in (rs.CLOSE_WAIT, rs.CLOSED):
            alloc, op = sm.UNALLOCATED, sm.PENDING_ALLOCATION
        elif rec.provisioned or r.state in rs.HOLDS_LEASE or r.pending == rs.REDEEMING:
            alloc, op = sm.PROVISIONED, sm.NOTREADY
        else:
            alloc, op = sm.ALLOCATED, sm.PENDING_ALLOCATION
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
        details = {**rec.details, **extra, "keys": list(rec.ticket.units) if rec.ticket else [],
                   "reservation": {"state": r.state, "pending": r.pending, "sequence": r.sequence,
                                   "request": r.request, "reason": r.reason}}
        return Sliver(rec.id, rec.slice_urn, rec.client_id, rec.kind, alloc, op, r.end or now, error,
                      rec.component_id, rec.owner_urn, details)

    def slivers(self, slice_urn: str, now: datetime) -> list[Sliver]:
        self._catch_up(now)
        with self._on_slices([slice_urn]):
            recs = self.records(slice_urn)
            due = [rec.id for rec in recs if self._needs_work(rec, now)]
            if due:
                with self._holding(due, now, strict=False) as mine:
                    self._settle(mine, now)
                recs = self.records(slice_urn)
            return sorted((self._sliver(rec, now) for rec in recs
                           if rec.r.state not in (rs.CLOSE_WAIT, rs.CLOSED) and not rec.discard),
                          key=lambda s: s.client_id)

    def sliver(self, sliver_urn: str, now: datetime) -> Sliver | None:
        self._catch_up(now)
        with self._on_slices(self._slices_of([sliver_urn])):
            rec = self._load(sliver_urn)
            if rec is not None and self._needs_work(rec, now):
                with self._holding([sliver_urn], now, strict=False) as mine:
                    self._settle(mine, now)
                rec = self._load(sliver_urn)
            if rec is None or rec.discard or rec.r.state in (rs.CLOSE_WAIT, rs.CLOSED):
                return None
            return self._sliver(rec, now)

    def _require(self, urn: str, now: datetime) -> Record:
        rec = self._load(urn)
        if rec is None or rec.discard or rec.r.state in (rs.CLOSE_WAIT, rs.CLOSED):
            raise SearchFailed(f"no sliver {urn} here (deleted, expired or never allocated)")
        return rec

    def shutdown(self, slice_urn: str, now: datetime) -> None:
        """Operator stop: provisioned slivers are stopped where they can be and shown as shut down."""
        with self._on_slices([slice_urn]):
            self.store.put(SLICES, slice_urn, {"slice_urn": slice_urn, "shutdown": True, "at": rfc3339(now)})
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
        return [Request((), (), d["xml"]) for d in self.store.scan(REQUESTS) if d["slice_urn"] == slice_urn]

    def _catch_up(self, now: datetime) -> None:
        """Before a call acts, apply what the clock did since the last tick (expiry, timeouts, undelivered
        releases). Once per tick is enough: the reaper runs every tick too, and scanning every reservation
        on every call made the AM slower the more slivers it held. A call never waits for a reap another
        thread is running (its actor calls may be for other slices): the call settles its own slivers."""
        with self._guard:
            due = self._reaped_at is None or now - self._reaped_at >= self.tick or now < self._reaped_at
        if due and self._reaping.acquire(blocking=False):
            try:
                self._reap(now)
            finally:
                self._reaping.release()

    def reap(self, now: datetime) -> list[str]:
        """The slice manager's clock: deliver what is still in outboxes, time out pending operations, close
        reservations whose term ended, forget closed ones; in-process actors run their clocks too. Returns
        the slivers that ended on this tick."""
        with self._reaping:
            return self._reap(now)

    def _reap(self, now: datetime) -> list[str]:
        with self._guard:
            self._reaped_at = now
        ended = self.recover(now)
        if self.run_actor_clocks:
            for clock in (getattr(self.broker, "tick", None), getattr(self.authority, "reap", None)):
                try:
                    if clock is not None:
                        clock(now)
                except GeniError as exc:  # an actor that is down runs its clock when it is back
                    log.warning("actor clock: %s", exc.message)
        return ended

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

    def usage_keys(self) -> set[str]:
        # not units: lease markers, reservation locks, and the slice authority's slice-name claims
        return {k for k in self.store.all_claims() if not k.startswith(("leased:", "sm-lock:", "sa_slice:"))}

    def views(self, slivers: list[Sliver]):
        from rspec.manifest import SliverView

        return [SliverView(s.client_id, s.urn, s.kind, s.component_id, s.details) for s in slivers]


def in_process(store: Store, substrate: Any, driver: Any, broker_key: Any = None, authority_key: Any = None,
               policy: Any = None, authority_name: str | None = None, clock: Any = None,
               **kw: Any) -> ActorSliceManager:
    """An embedded deployment's actors on one store: a broker (signing with `broker_key`, a fresh RSA key
    if none), an authority (signing leases with `authority_key`, a fresh one if none; checking tickets on
    `clock` when given) that trusts the broker, owns the substrate and delegates all of it, and a slice
    manager over both. Keys may be PEM bytes or loaded keys."""
    from cryptography.hazmat.primitives.asymmetric import rsa

    from am.authority import Authority
    from broker.broker import Broker
    from broker.delegation import export_substrate
    from slicex.ticket import load_signing_key

    def key(k):
        if k is None:
            return rsa.generate_private_key(public_exponent=65537, key_size=2048)
        return load_signing_key(k) if isinstance(k, bytes) else k

    bkey = key(broker_key)
    akey = key(authority_key)
    name = authority_name or f"urn:publicid:IDN+{substrate.authority}+authority+am"
    broker = Broker("broker", store, bkey, policy=policy, authority=name)
    authority = Authority(name, driver, {"broker": bkey.public_key()}, store=store, key=akey,
                          inventory=export_substrate(substrate, name, "broker"), clock=clock)
    authority.export_to(broker)
    return ActorSliceManager(store, substrate, broker, authority, **kw)
