"""The slice manager's own records (slice_manager/actor.py): each sliver's reservation, its demand, what the
actors gave it (ticket, lease, placement) and its *outbox* of messages not yet answered, persisted in the slice
manager's tables of the store. Only the slice manager reads or writes these tables; the broker and the
authority keep their own."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from msgspec.structs import replace

from protocol.messages import Demand, LinkDemand, NodeDemand, SliverDetails
from slice_manager import held
from slice_manager import reservation as rs
from slice_manager.held import HELD
from slicex import errors
from slicex.clock import rfc3339
from slicex.codec import decode, encode
from slicex.errors import (
    GeniError,
)
from slicex.store import Store
from slicex.ticket import Lease, Ticket, lease_beside, lease_from

RESERVATIONS = "sm-reservations"
REQUESTS = "sm-requests"
SLICES = "sm-slices"
INSTANCES = "sm-instances"
SLIVERS_OF = "sm-slice-slivers"  # "<slice>#<sliver>" → the sliver: one slice's records, read without the others'
ENDED = "sm-ended"  # slice → why its last slivers ended on their own (expiry, failure): for a clear Status
ENDED_KEPT = timedelta(days=1)
UPDATES = "sm-updates"  # slice → its pending Update (slice_manager/update.py PendingUpdate)
VERSION = "sm-version"  # "records" → a token replaced on every write to the records (`Records.version`)
LAYOUT = "sm-layout"  # the layout mark of a store made before deployment/migrations.py (which removes it)
AT_ONCE = 0.0
"""The time index's place for work due at once (an outbox to deliver, an operation pending): before any time."""


log = logging.getLogger("slicex.sm")


class Crash(BaseException):
    """Raised by a fault-injection hook to stop the slice manager dead at a message boundary (tests)."""


# ---- persistence of reservations and messages -------------------------------------------------------------------
def _demand_from(d: dict[str, Any], kind: str, rid: str) -> Demand:
    """A record's demand: its element typed by the record's kind, and its reservation left out when it is the
    record's id (records written before issue 33 spelled it)."""
    demand = decode(d, Demand[NodeDemand] if kind == "node" else Demand[LinkDemand], "demand")
    if demand.element.reservation == rid:
        demand = replace(demand, element=replace(demand.element, reservation=""))
    return demand


def _ticket_doc(ticket: Ticket, rec_id: str, group: str) -> dict[str, Any]:
    """A record's ticket as stored: its id and reservation left out when they are the record's own."""
    doc = encode(ticket)
    if doc["id"] == f"{group}/{rec_id}":
        del doc["id"]
    if doc["reservation"] == rec_id:
        del doc["reservation"]
    return doc


def _ticket_from(d: dict[str, Any], rec_id: str, group: str) -> Ticket:
    return decode({"id": f"{group}/{rec_id}", "reservation": rec_id, **d}, Ticket, "ticket")


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
    demand: Demand  # what it needs (its node or link of the request's Demands, and the constraints)
    details: SliverDetails = field(default_factory=lambda: SliverDetails())  # what the manifest shows, and the driver gets
    ticket: Ticket | None = None
    lease: Lease | None = None
    outbox: list[rs.Message] = field(default_factory=list)
    error_type: str = ""  # GeniError class of the last refusal (so the AM result carries its code)
    provisioned: bool = False
    shutdown: bool = False
    discard: bool = False  # forget it once its releases are delivered (a deleted or abandoned sliver)
    slice_uuid: str = ""  # the UUID of the slice it was allocated for (slicex/slice_identity.py)
    update: str = ""  # its part in the slice's pending Update: added | removed | rewired | kept (slice_manager/update.py)
    indexed: bool = field(default=False, compare=False)  # its slice's index names it (not stored: true once loaded)
    removed: bool = field(default=False, compare=False)  # deleted from the store by this copy (not stored)
    held_as: dict[str, Any] | None = field(default=None, compare=False)  # its held index entry as filed (not stored)

    def to_doc(self) -> dict[str, Any]:
        """The record as stored, lean (issue 33): defaults left out, the ticket's id and the lease's fields
        that repeat the ticket's not spelled twice (slicex/ticket.py `lease_beside`); `from_doc` reads this and the full form written before."""
        doc: dict[str, Any] = {
            "id": self.id, "slice_urn": self.slice_urn, "owner_urn": self.owner_urn, "client_id": self.client_id,
            "kind": self.kind, "component_id": self.component_id, "group": self.group,
            "r": {k: v for k, v in encode(self.r).items() if k != "id" or v != self.id},
            "demand": encode(self.demand), "details": self.details}
        if self.ticket:
            doc["ticket"] = _ticket_doc(self.ticket, self.id, self.group)
        if self.lease:
            doc["lease"] = lease_beside(self.lease, self.ticket)
        if self.outbox:
            doc["outbox"] = encode(self.outbox)
        for name in ("error_type", "provisioned", "shutdown", "discard", "slice_uuid", "update"):
            if getattr(self, name):
                doc[name] = getattr(self, name)
        return doc

    @staticmethod
    def from_doc(d: dict[str, Any]) -> Record:
        rid, group = d["id"], d["group"]
        ticket = _ticket_from(d["ticket"], rid, group) if d.get("ticket") else None
        r = decode({"id": rid, **d["r"]}, rs.Reservation, "reservation")
        return Record(rid, d["slice_urn"], d["owner_urn"], d["client_id"], d["kind"], d["component_id"],
                      group, r, _demand_from(d["demand"], d["kind"], rid),
                      SliverDetails(**d.get("details", {})), ticket,
                      lease_from(d["lease"], ticket) if d.get("lease") else None,
                      decode(d.get("outbox", []), list[rs.Message], "outbox"), d.get("error_type", ""),
                      bool(d.get("provisioned")), bool(d.get("shutdown")), bool(d.get("discard")),
                      d.get("slice_uuid", ""), d.get("update", ""), indexed=True)

    @property
    def ticket_id(self) -> str:
        return self.ticket.id if self.ticket else f"{self.group}/{self.id}"


def due_at(rec: Record) -> float | None:
    """When the clock next has work on `rec` (seconds since the epoch, AT_ONCE for now), None for never: the
    time it is filed under in the store's time index, so the reaper reads only what fell due. `_needs_work` is
    exactly `due_at(rec) <= now`: messages to deliver and pending operations at once (a live call holds them;
    the reaper takes the rest), a held ticket or lease at its end, an advance reservation at its start, a
    failure at the end of its term."""
    r = rec.r
    if rec.outbox or r.pending != rs.NONE:
        return AT_ONCE
    times: list[float] = []
    if r.end is not None and r.state in rs.HOLDS_TICKET:
        times.append(r.end.timestamp())
    if r.state == rs.TICKETED and r.start is not None and not rec.details.get("started"):
        times.append(r.start.timestamp())
    if r.state == rs.FAILED:
        end = r.end or r.want_end
        times.append(end.timestamp() if end is not None else AT_ONCE)
    return min(times, default=None)


def _error(type_name: str, message: str) -> GeniError:
    return errors.error_named(type_name, message)


class Records:
    """Loading and saving records (a mixin of ActorSliceManager: `self.store`)."""

    store: Store
    _holding: Any  # Recovery's reservation locks (a mixin of ActorSliceManager)

    def _load(self, rid: str) -> Record | None:
        d = self.store.get(RESERVATIONS, rid)
        return self._loaded(d) if d else None

    @staticmethod
    def _loaded(d: dict[str, Any]) -> Record:
        """A stored record, with the held index entry its save filed (slice_manager/held.py)."""
        rec = Record.from_doc(d)
        rec.held_as = held.filed(rec)
        return rec

    def _file_held(self, rec: Record, entry: dict[str, Any] | None) -> None:
        """Make the held index say `entry` for `rec` (nothing written when it already does)."""
        if entry == rec.held_as:
            return
        old = held.keys(rec.held_as) if rec.held_as else []
        new = held.keys(entry) if entry else []
        for key in new:
            self.store.put(HELD, key, entry)
        for key in old:
            if key not in new:
                self.store.delete(HELD, key)
        rec.held_as = entry

    def held_in(self, namespaces: list[str], covers) -> list[dict[str, Any]]:
        """The held index entries of the live slivers whose owner or slice `covers` says is in one of
        `namespaces`: only those entries and their records are read (an entry whose record is gone or no
        longer live, left by a crash, is not counted; it is never removed here, as a record being made files
        its entry first)."""
        found: dict[str, dict[str, Any]] = {}
        for ns in namespaces:
            for prefix in held.prefixes(ns):
                for doc in self.store.scan(HELD, prefix):
                    if covers(doc["owner_urn"]) or covers(doc["slice_urn"]):
                        found[doc["id"]] = doc
        recs = (self._load(rid) for rid in found)
        return [e for rec in recs if rec is not None and (e := held.entry(rec)) is not None]

    def _save(self, rec: Record) -> None:
        if (rec.r.state == rs.CLOSED or rec.discard) and not rec.outbox:
            if not rec.discard and rec.r.reason:  # ended by itself, not deleted by its owner: remember why
                self.store.put(ENDED, rec.slice_urn, {"slice_urn": rec.slice_urn, "reason": rec.r.reason,
                                                      "end": rfc3339(rec.r.end) if rec.r.end else ""})
            if not rec.removed:  # saved again once gone (Delete saves after its messages, and at its end)
                self.store.delete(RESERVATIONS, rec.id)
                self.store.delete(SLIVERS_OF, index_key(rec.slice_urn, rec.id))
                rec.removed, rec.indexed = True, False
                self._changed()
            self._file_held(rec, None)  # after the record: a crash between counts it once more, never less
        else:
            entry = held.filed(rec)
            if entry is not None:  # live: filed before the record
                self._file_held(rec, entry)
            rec.removed = False
            if not rec.indexed:  # written before the record: a stored record is always found by its slice
                self._index(rec.slice_urn, rec.id)
                rec.indexed = True
            self.store.put(RESERVATIONS, rec.id, rec.to_doc(), due=due_at(rec))
            if entry is None:  # no longer live: taken out after the record
                self._file_held(rec, None)
            self._changed()

    def _changed(self) -> None:
        """Replace the records' version after a write (in the store, so every AM worker's publisher sees a
        change any of them made): the dashboard's snapshot is built again only when it changed."""
        self.store.put(VERSION, "records", {"version": uuid.uuid4().hex})

    def version(self) -> str:
        """The token `_changed` last wrote ("" before any write)."""
        doc = self.store.get(VERSION, "records")
        return str(doc["version"]) if doc else ""

    def _index(self, slice_urn: str, rid: str) -> None:
        self.store.put(SLIVERS_OF, index_key(slice_urn, rid), {"slice_urn": slice_urn, "id": rid})

    def holds(self, rid: str) -> bool:
        """Whether the slice manager still holds this sliver (its record neither ended, failed nor being
        discarded): one read, for the ledger's `settle`."""
        rec = self._load(rid)
        return rec is not None and rec.r.state not in (rs.CLOSE_WAIT, rs.CLOSED, rs.FAILED) and not rec.discard

    def due_records(self, now: datetime, limit: int | None = None) -> list[Record]:
        """The records the clock has work on at `now`, earliest first, read through the time index (an entry
        whose record changed since it was read is checked again against the record)."""
        until = now.timestamp()
        recs = (self._load(rid) for rid, _at in self.store.due(RESERVATIONS, until, limit))
        return [rec for rec in recs if rec is not None and (d := due_at(rec)) is not None and d <= until]

    def records(self, slice_urn: str | None = None) -> list[Record]:
        """Every record, or one slice's: through its index, so a call costs the same however many slivers
        other slices hold (an index entry whose record is gone, left by a crash between the two deletes,
        is skipped)."""
        if slice_urn is None:
            return [self._loaded(d) for d in self.store.scan(RESERVATIONS)]
        recs = (self._load(d["id"]) for d in self.store.scan(SLIVERS_OF, f"{slice_urn}#"))
        return [rec for rec in recs if rec is not None and rec.slice_urn == slice_urn]

    def reservations(self) -> list[rs.Reservation]:
        return [rec.r for rec in self.records()]

    def _forget_requests(self, slice_urns: set[str]) -> None:
        """Drop the stored requests of these slices (whose locks the caller holds) that no live sliver is
        from any more; another slice's request may belong to an allocation still being made."""
        for slice_urn in slice_urns:
            live = {rec.client_id for rec in self.records(slice_urn)}
            for doc in self.store.scan(REQUESTS, f"{slice_urn}#"):
                if doc["slice_urn"] == slice_urn and not any(c in live for c in doc["client_ids"]):
                    self.store.delete(REQUESTS, doc["key"])


def index_key(slice_urn: str, rid: str) -> str:
    return f"{slice_urn}#{rid}"

