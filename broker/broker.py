"""The broker actor: claims delegated inventory into its calendar and grants signed tickets under a policy.

A slice manager sends what each node and link *needs* (`place`, ORCA's broker policy: protocol.messages
Demands); the broker's policy picks hosts, units and labels from its own calendar over the substrate its
authority delegated, books them all or nothing and returns signed tickets with the placement (host,
interfaces, chosen tag). A request for several reservations is granted all or nothing.

Three layers keep promises exclusive:
  * the calendar (broker/calendar.py) never lets two bookings of a unit overlap in time, so advance
    reservations are possible;
  * for tickets that have started, the units are claimed in the store with one atomic `claim_all` (owner =
    the ticket group), so several broker processes or AM workers on one store never promise a unit twice;
    a lost claim race reloads the calendar from the store and chooses again;
  * tickets are persisted, so a restarted broker rebuilds its calendar from the store.

Tickets are signed, so an authority verifies them without calling back. Every refusal says which broker, what
was asked, over which term, and what is free.

`availability` answers what is in use now, with a version that changes whenever the broker's inventory or
promises change, so callers cache the answer."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
from cryptography import x509

from broker.calendar import Calendar, CalendarError, Unavailable, common_free_labels
from broker.claims import ClaimCopy, ClaimedByOthers, LeadingFull
from broker.delegation import claim, reclaim
from broker.placement import SHORT, Shortfall, plan, report
from broker.policy import FirstFit, Policy, choose_label
from broker.slots import find_slot
from protocol.delegation import Delegation, export_prefixes
from protocol.messages import Demands, PlaceAnswer, SlotAnswer, SlotQuery
from resources import STANDARD, units_under
from resources.compute import core
from resources.kind import Placement
from rspec.substrate import Host, Image, Substrate
from slicex.clock import Clock, parse_time, rfc3339
from slicex.codec import decode, encode
from slicex.errors import (
    BadArgs,
    Busy,
    CredentialInvalid,
    InsufficientNodes,
    OutOfRange,
    Refused,
    SearchFailed,
    VlanUnavailable,
)
from slicex.inventory import UNIT_KINDS, from_doc, to_doc
from slicex.store import Store, counter_of
from slicex.store.ownership import Actor, scoped
from slicex.term import Term
from slicex.ticket import (
    SignedDelegation,
    SignedReclaim,
    Ticket,
    load_signing_key,
    sign_ticket,
    verify_delegation,
    verify_reclaim,
)

DELEGATIONS = "delegations"
OUT_OF_SERVICE = "broker-out-of-service"
"""Per broker and authority: the pools and label sets of its delegation that are reclaimed or draining, a copy of
the delegation record's two lists small enough to read at every placement (the record itself carries the whole
substrate description and the signed documents: 150 KB for the default substrate, and more with every host)."""
TICKETS = "broker-tickets"
"""Tickets by id (`<group>/<reservation>`), each active one filed in the time index under its end plus
EXPIRY_GRACE (`tick` drops the ones that fell due) and read by key prefix per group (`_ensure_group`)."""
ADVANCE = "broker-advance"
"""Ticket id → its broker, for the tickets not claimed yet (advance reservations): the unfinished work a start
books into its calendar. Written before its ticket, removed after the ticket is claimed, failed or dropped."""


def lean_ticket(doc: dict[str, Any]) -> dict[str, Any]:
    """A ticket record as stored (issue 33): `booked` only when it is not the ticket's units, `claimed` only
    when False, `reason` only when set; every reader defaults them so."""
    out = {k: v for k, v in doc.items() if k not in ("booked", "claimed", "reason")}
    if list(doc.get("booked", doc["ticket"]["units"])) != list(doc["ticket"]["units"]):
        out["booked"] = list(doc["booked"])
    if not doc.get("claimed", True):
        out["claimed"] = False
    if doc.get("reason"):
        out["reason"] = doc["reason"]
    return out
RELINQUISHED = "broker-relinquished"
RELINQUISHED_KEPT = timedelta(hours=1)
"""How long the broker remembers a relinquished ticket, so a request that arrives after its holder gave up
(its answer timed out, and the holder relinquished) is refused instead of granting units nobody will use."""
RELINQUISHED_SWEEP = RELINQUISHED_KEPT / 12
"""How often the broker's clock looks for relinquished tickets remembered long enough (each is forgotten at most
this much later). Every tick read every one, under the broker's lock: an hour of tickets at the lifecycle rate
one process serves is over 100,000 documents a second."""
EXPIRY_GRACE = timedelta(minutes=5)
"""How long after a ticket's end the broker keeps its units for a slice manager that has not relinquished."""
VERSIONS = "broker-version"
PLACE_ATTEMPTS = 8
"""Placements per `place`: each lost claim race (another broker process on the store won a unit) reloads the
calendar and places again."""


@dataclass(frozen=True)
class _ExactDemand:
    """What one reservation's placement books: exactly these units, and one label free on every one of some
    label sets (a VLAN tag across switches): `label` when the placement chose it."""

    units: tuple[str, ...] = ()
    label_sets: tuple[str, ...] = ()
    label: int | None = None
    what: str = ""  # in words, for reasons: "node n1 (XOSmall VM)"


@dataclass
class _Choice:
    units: list[str] = field(default_factory=list)  # what the calendar books, the store claims, the ticket names
    labels: tuple[tuple[str, int], ...] = ()


def _span(term: Term) -> str:
    return f"{term.start:%Y-%m-%dT%H:%M:%SZ}..{term.end:%Y-%m-%dT%H:%M:%SZ}"


def ticket_due(doc: Mapping[str, Any]) -> float:
    """When `tick` drops an active ticket nobody relinquished: EXPIRY_GRACE after its end."""
    return (parse_time(doc["ticket"]["end"]) + EXPIRY_GRACE).timestamp()


def _utcnow() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


NAMED = ("node", "vlan")
"""Unit kinds an availability answer names one by one (an advertisement says which bare-metal node or VLAN
tag is taken; both are bounded by the substrate); every other kind is counted per pool."""


class _Flags(dict[str, bool]):
    """Ticket id → whether its units are claimed in the store, with the set of those not claimed yet (advance
    tickets: `tick` looks at them alone, not at every ticket)."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting: set[str] = set()

    def __setitem__(self, tid: str, claimed: bool) -> None:
        super().__setitem__(tid, claimed)
        (self.waiting.discard if claimed else self.waiting.add)(tid)

    def setdefault(self, tid: str, claimed: bool = True) -> bool:  # type: ignore[override]
        if tid not in self:
            self[tid] = claimed
        return self[tid]

    def pop(self, tid: str, default: bool | None = None) -> bool | None:  # type: ignore[override]
        self.waiting.discard(tid)
        return super().pop(tid, default)


class _Unpromisable(Unavailable):
    """What a placement may not choose (the calendar's promises, others' claims, reclaimed inventory), asked
    unit by unit, with the claim counters for the policy's ranking (`free_in`)."""

    def __init__(self, calendar: Calendar, term: Term, also, copy: ClaimCopy, group: str):
        super().__init__(calendar, term, also)
        self.copy = copy
        self.group = group

    def free_in(self, counter: str, total: int) -> int:
        """Units of a pool not claimed by others, from the counters (a ranking's estimate: the planner still
        asks each unit it takes)."""
        return total - self.copy.held_by_others(counter, self.group)

    def leading_full(self, hosts: Sequence[Host]) -> LeadingFull | None:
        """First-fit's run of leading hosts whose cores are all claimed (broker/claims.py); None when this
        placement's group holds claims already (a retry after a crash), for which a host full of its own units
        is not full."""
        if not hosts or self.copy.by_owner.get(self.group):
            return None
        return self.copy.leading_full(hosts, lambda h: (counter_of(core(h.component_id, 0)), h.cores))


def _out_of_service(delegation_doc: Mapping[str, Any]) -> set[str]:
    """The pools and label sets of a broker's record of one authority that are reclaimed or draining."""
    return set(delegation_doc.get("reclaimed", [])) | set(delegation_doc.get("draining", []))


class Broker:
    def __init__(self, name: str, store: Store, key_pem: Any, cert: x509.Certificate | None = None,
                 policy: Policy | None = None, authority: str = "",
                 authority_keys: Mapping[str, Any] | None = None, clock: Clock | None = None):
        self.name = name
        # Its own time, when it has a clock (every deployment): promises start, end and are evicted by it, never
        # by a caller's `now` (a caller a day ahead would otherwise end everyone's promises). Without one (pure
        # tests of the core) the `now` argument is the time.
        self.clock = clock
        # authority name → public key of its certificate: delegations must be signed with it. Every deployment
        # sets it; None only for a broker of pure tests and one-command tools over a throw-away store, which
        # take the inventory their caller hands them.
        self.authority_keys = dict(authority_keys) if authority_keys is not None else None
        self.store = scoped(store, Actor.BROKER)
        self.key = load_signing_key(key_pem) if isinstance(key_pem, bytes) else key_pem  # PEM or a loaded key
        self.cert = cert
        self.policy: Policy = policy or FirstFit()
        self.authority = authority  # whose inventory its tickets name (when there is one)
        self._lock = threading.RLock()
        self.calendar = Calendar()
        self._claimed = _Flags()  # ticket id -> its units are claimed in the store
        self._copy = ClaimCopy(self.store, UNIT_KINDS)  # the store's unit claims, kept in step by its claim changes
        self._out_units: dict[tuple[str, frozenset[str]], frozenset[str]] = {}  # reclaimed pools -> their units
        self._delegation_cache: tuple[tuple[tuple[str, str], ...], list[dict[str, Any]]] | None = None
        self._substrates: dict[str, Substrate] = {}  # authority -> the substrate description it delegated
        # bookings made under the lock whose signed tickets are written to the store after it (signing and
        # writing outside the lock keep the other callers' placements moving): `_load` keeps them
        self._unpublished: dict[str, tuple[frozenset[str], Term]] = {}
        self._swept: datetime | None = None  # when `tick` last forgot relinquished tickets
        self.fault = lambda boundary: None  # fault injection (tests): called at internal boundaries
        self._all_loaded = False  # the calendar holds every active ticket (`_load(every=True)`)
        self._groups_loaded: set[str] = set()  # claim groups whose tickets the calendar holds (`_ensure_group`)
        self._load(every=False)

    def _now(self, now: datetime | None) -> datetime:
        if self.clock is not None:
            return self.clock.now()
        return now or _utcnow()

    # ---- state from the store --------------------------------------------------------------------------------
    def _load(self, every: bool = True) -> None:
        """Rebuild calendar, claim flags and the copy of the store's unit claims from the store. A start (not
        `every`) books only the tickets not claimed yet (advance reservations, `ADVANCE`): a started ticket is
        in the store's claims, which placements ask, and in its time index, which expires it; its booking is
        read with its group's (`_ensure_group`) when a call touches the group. So a start reads the
        delegations, the unfinished work and the claim counters, however many tickets are live. `every`
        (before an advance placement or a find-slot question, which ask when every promise ends) reads every
        ticket."""
        cal = Calendar()
        docs = [d for d in self.store.scan(DELEGATIONS) if d.get("broker") == self.name]
        substrates: dict[str, Substrate] = {}
        for d in docs:
            full = Delegation.from_doc(d["delegation"]) if d.get("delegation") else None
            named = set(full.names()) if full else set()
            if full:
                claim(cal, full)
                if full.substrate:
                    substrates[full.authority] = from_doc(Substrate, full.substrate)
            claim(cal, export_prefixes(d["authority"], self.name, [p for p in d.get("prefixes", []) if p not in named]))
            cal.draining |= set(d.get("draining", []))
        cal.open_inventory = not docs
        claimed = _Flags()
        if every:
            docs = self.store.scan(TICKETS)
        else:
            advance = [d["id"] for d in self.store.scan(ADVANCE) if d.get("broker") == self.name]
            docs = [d for tid in advance if (d := self.store.get(TICKETS, tid)) is not None
                    and not d.get("claimed", True)]
        for td in docs:
            if td.get("broker") != self.name or td.get("state") != "active":
                continue
            t = decode(td["ticket"], Ticket, "ticket")
            try:
                cal.book(t.id, td.get("booked", list(t.units)), t.term)
            except CalendarError:
                continue  # a stale copy overlapping a newer promise: the store's claims decide
            claimed[t.id] = bool(td.get("claimed", True))
        for tid, (booked, term) in self._unpublished.items():  # granted, its ticket not written yet
            cal.release(tid)
            try:
                cal.book(tid, booked, term)
            except CalendarError:
                continue
            claimed.setdefault(tid, self._claimed.get(tid, True))
        self.calendar, self._claimed, self._substrates = cal, claimed, substrates
        self._all_loaded, self._groups_loaded = every, set()
        self._copy.reload()

    def _ensure_group(self, group: str) -> None:
        """Book a claim group's active tickets into the calendar, if a start left them out (one key-prefix read
        of the group's tickets, once per group)."""
        if self._all_loaded or group in self._groups_loaded:
            return
        for td in self.store.scan(TICKETS, f"{group}/"):
            t = decode(td["ticket"], Ticket, "stored ticket")
            if (td.get("broker") != self.name or td.get("state") != "active" or t.group != group
                    or t.id in self.calendar.bookings):
                continue
            try:
                self.calendar.book(t.id, td.get("booked", list(t.units)), t.term)
            except CalendarError:
                continue  # a stale copy overlapping a newer promise: the store's claims decide
            self._claimed.setdefault(t.id, bool(td.get("claimed", True)))
        self._groups_loaded.add(group)

    def _put_ticket(self, t: Ticket, booked: Sequence[str], claimed: bool, state: str = "active",
                    reason: str = "", placement: Mapping[str, Any] | None = None) -> None:
        doc: dict[str, Any] = {"broker": self.name, "ticket": encode(t), "booked": list(booked), "claimed": claimed,
                               "state": state, "reason": reason}
        if placement:
            doc["placement"] = dict(placement)  # what `place` answers again for a repeated request
        if not claimed:  # before the ticket: a start finds every advance ticket
            self.store.put(ADVANCE, t.id, {"id": t.id, "broker": self.name})
        self._store_ticket(t.id, lean_ticket(doc))

    def _store_ticket(self, tid: str, doc: dict[str, Any]) -> None:
        """Write a ticket record, an active one filed in the time index under when `tick` drops it."""
        active = doc.get("state") == "active"
        self.store.put(TICKETS, tid, doc, due=ticket_due(doc) if active else None)

    # ---- delegation ----------------------------------------------------------------------------------------
    def _delegation_doc(self, authority: str) -> dict[str, Any]:
        return self.store.get(DELEGATIONS, f"{self.name}|{authority}") or {
            "broker": self.name, "authority": authority, "prefixes": [], "reclaimed": []}

    def _verified(self, delegation: Delegation | SignedDelegation) -> tuple[Delegation, SignedDelegation | None]:
        """The delegation to claim, after checking it is the named authority's own signed grant to this
        broker (when this broker knows its authorities' keys). Raises before anything changes."""
        if self.authority_keys is None:  # a broker of tests and tools: trusts its caller
            if isinstance(delegation, SignedDelegation):
                return Delegation.from_doc(delegation.body), delegation
            return delegation, None
        if not isinstance(delegation, SignedDelegation):
            raise CredentialInvalid(f"broker {self.name} refuses an unsigned delegation from "
                                    f"{delegation.authority}: an authority delegates a document signed with its key")
        self._check_signed(delegation, "delegation", verify_delegation)
        try:
            return Delegation.from_doc(delegation.body), delegation
        except (KeyError, TypeError, ValueError) as exc:
            raise BadArgs(f"delegation from {delegation.authority} is signed but malformed: {exc!r}") from None

    def accept(self, delegation: Delegation | SignedDelegation) -> None:
        """Claim inventory an authority exports (ORCA claim): pools and label sets join the calendar. A broker
        that knows its authorities' keys accepts only a SignedDelegation verified with the named authority's
        key and addressed to it (CredentialInvalid, Refused otherwise, and nothing changes); it keeps the
        signed documents it accepted (`delegations`)."""
        delegation, signed = self._verified(delegation)
        with self._lock:
            doc = self._delegation_doc(delegation.authority)
            if not self._in_order(doc, signed, "delegation", self._delegation_changes_nothing(doc, delegation)):
                self._repair_out_of_service(delegation.authority, doc)
                return  # a resend of what is already in force
            if signed is not None:  # what it was given, each document once; ones every name of which a later
                # document granted again say nothing more and go
                later = set(delegation.names())
                kept = [d for d in doc.get("signed", [])
                        if set(Delegation.from_doc(d["body"]).names()) - later]
                doc["signed"] = kept + [encode(signed)]
            old = Delegation.from_doc(doc["delegation"]) if doc.get("delegation") else None
            new_names = set(delegation.names())
            merged = Delegation(delegation.authority, self.name,
                                (old.without(new_names).pools if old else ()) + delegation.pools,
                                (old.without(new_names).label_sets if old else ()) + delegation.label_sets,
                                delegation.substrate or (old.substrate if old else None))
            doc["delegation"] = merged.to_doc()
            doc["prefixes"] = sorted(set(doc.get("prefixes", [])) | new_names)
            doc["reclaimed"] = [p for p in doc.get("reclaimed", []) if p not in new_names]
            doc["draining"] = [p for p in doc.get("draining", []) if p not in new_names]
            self._write_delegation(delegation.authority, doc, taking_out=False)
            claim(self.calendar, delegation)
            self.calendar.open_inventory = False
            if merged.substrate:
                self._substrates[merged.authority] = from_doc(Substrate, merged.substrate)
            self._bump()

    def _in_order(self, doc: dict[str, Any], message: SignedDelegation | SignedReclaim | None, what: str,
                  changes_nothing: bool) -> bool:
        """An authority numbers its messages to this broker; they are applied in that order. A message numbered
        at or below the last one applied is refused unless it would change nothing (the same grant or order
        sent again); False then: nothing to apply. Without the authority's keys (a broker of pure tests) every
        message is applied. Records the number in `doc` (the caller writes it)."""
        if message is None or self.authority_keys is None:
            return True
        last = int(doc.get("sequence", 0))
        if message.sequence > last or message.sequence == last == 0:
            doc["sequence"] = message.sequence
            return True
        if changes_nothing:
            return False
        raise Refused(f"broker {self.name}: {what} number {message.sequence} from {message.authority} is older "
                      f"than its number {last}, already applied: an old message cannot undo a newer one (the "
                      f"authority sends a new one)")

    @staticmethod
    def _delegation_changes_nothing(doc: dict[str, Any], delegation: Delegation) -> bool:
        if not doc.get("delegation"):
            return False
        held = Delegation.from_doc(doc["delegation"])
        return (set(delegation.pools) <= set(held.pools) and set(delegation.label_sets) <= set(held.label_sets)
                and not _out_of_service(doc) & set(delegation.names())
                and delegation.substrate in (None, held.substrate))

    def delegations(self, authority: str = "") -> list[dict[str, Any]]:
        """The signed delegation documents this broker accepted (from `authority`, or from every one), oldest
        first: what it was given, with the signature that shows who gave it."""
        return [s for d in self._delegation_records() if not authority or d.get("authority") == authority
                for s in d.get("signed", [])]

    def delegated(self) -> list[str]:
        return sorted(p for d in self._delegation_records() for p in d["prefixes"])

    def _delegation_records(self) -> list[dict[str, Any]]:
        """This broker's delegation records (each carries the whole substrate and the signed documents: 150 KB
        and more), decoded once per change: the small out-of-service copies carry the serial of the record
        they were written with, so an unchanged record costs a read of its copy. A record read while its
        copy was being rewritten is kept under its own serial and read again at the next question."""
        copies = self.store.scan(OUT_OF_SERVICE, f"{self.name}|")
        serials = tuple(sorted((c["authority"], str(c.get("serial", ""))) for c in copies))
        cached = self._delegation_cache
        if cached is not None and cached[0] == serials and all(serial for _a, serial in serials):
            return cached[1]
        docs = [d for d in self.store.scan(DELEGATIONS, f"{self.name}|") if d.get("broker") == self.name]
        self._delegation_cache = (tuple(sorted((d["authority"], str(d.get("serial", ""))) for d in docs)), docs)
        return docs

    def reclaim(self, order: SignedReclaim, now: datetime | None = None) -> tuple[list[str], list[str]]:
        """The authority takes back delegated inventory (e.g. a host going into maintenance), by an order signed
        with its key when this broker knows its authorities' keys (CredentialInvalid, Refused otherwise, and
        nothing changes). What nothing promises leaves at once; what is promised stops taking new promises and
        is returned as still promised. Returns (reclaimed, still promised)."""
        self._verified_reclaim(order)
        authority, prefixes = order.authority, list(order.names)
        now = self._now(now)
        with self._lock:
            doc = self._delegation_doc(authority)
            if not self._in_order(doc, order, "reclaim order", set(prefixes) <= _out_of_service(doc)):
                self._repair_out_of_service(authority, doc)
                reclaimed = set(doc.get("reclaimed", []))
                return [p for p in prefixes if p in reclaimed], [p for p in prefixes if p not in reclaimed]
            self._forget_released(u for p in prefixes for u in self.calendar.units_of(p)
                                  if self.calendar.holders_ever(u))
            claims = self._unit_claims()
            busy_by_claim = {p for p in prefixes if any(k == p or k.startswith(p + ":") for k in claims)}
            self.calendar.draining |= busy_by_claim & (set(self.calendar.pools) | set(self.calendar.label_sets))
            free, busy = reclaim(self.calendar, [p for p in prefixes if p not in busy_by_claim], now)
            busy = sorted(set(busy) | busy_by_claim, key=list(prefixes).index)
            if doc.get("delegation"):
                doc["delegation"] = Delegation.from_doc(doc["delegation"]).without(free).to_doc()
            doc["prefixes"] = [p for p in doc["prefixes"] if p not in free]
            doc["reclaimed"] = sorted(set(doc.get("reclaimed", [])) | set(free))
            doc["draining"] = sorted(set(doc.get("draining", [])) | set(busy))
            self._write_delegation(authority, doc, taking_out=True)
            self._bump()
            return free, busy

    def _verified_reclaim(self, order: SignedReclaim) -> None:
        if self.authority_keys is not None:  # None: a broker of tests and tools, which trusts its caller
            self._check_signed(order, "reclaim order", verify_reclaim)

    def _check_signed(self, message: SignedDelegation | SignedReclaim, what: str,
                      verify: Callable[[Any, Any], None]) -> None:
        """Raise unless the authority `message` names is one this broker knows, its key signed exactly this
        message, and the message is addressed to this broker."""
        assert self.authority_keys is not None
        key = self.authority_keys.get(message.authority)
        if key is None:
            raise CredentialInvalid(f"broker {self.name} does not know authority {message.authority} (it "
                                    f"accepts {what}s from {', '.join(sorted(self.authority_keys)) or 'none'})")
        verify(message, key)
        if message.broker != self.name:
            raise Refused(f"{what} from {message.authority} is for broker {message.broker}, not {self.name}")

    def _taken_out(self, authority: str) -> set[str]:
        """Pools and label sets reclaimed or draining, as the store has them: another broker process on the store
        (another AM worker's, or `slicex maintenance` over an embedded deployment's store) may have taken them
        out after this one loaded its calendar. Read from the small copy (`OUT_OF_SERVICE`); a store written
        before the copy existed has only the delegation record."""
        key = f"{self.name}|{authority}"
        doc = self.store.get(OUT_OF_SERVICE, key)
        return _out_of_service(doc if doc is not None else self.store.get(DELEGATIONS, key) or {})

    @staticmethod
    def _out_of_service_doc(doc: Mapping[str, Any]) -> dict[str, Any]:
        return {"broker": doc["broker"], "authority": doc["authority"], "reclaimed": list(doc.get("reclaimed", [])),
                "draining": list(doc.get("draining", [])), "serial": doc.get("serial", "")}

    def _write_delegation(self, authority: str, doc: dict[str, Any], taking_out: bool) -> None:
        """Write the delegation record and its out-of-service copy in the order that errs on the safe side if
        the process dies between the two writes: names leave service in the copy first (`taking_out`, a
        reclaim) and come back to it last (a delegation)."""
        key = f"{self.name}|{authority}"
        doc["serial"] = uuid.uuid4().hex  # the record's version: what readers' caches are keyed by
        if taking_out:
            self.store.put(OUT_OF_SERVICE, key, self._out_of_service_doc(doc))
        self.store.put(DELEGATIONS, key, doc)
        if not taking_out:
            self.store.put(OUT_OF_SERVICE, key, self._out_of_service_doc(doc))

    def _repair_out_of_service(self, authority: str, doc: dict[str, Any]) -> None:
        """A message sent again after the process died between the two writes finds the record already
        written and changes nothing: bring the copy in line with the record (it can only have been too
        cautious: names out of service that came back)."""
        key = f"{self.name}|{authority}"
        if doc.get("delegation") and not doc.get("serial"):  # written before records had serials
            self._write_delegation(authority, doc, taking_out=False)
            return
        copy = self.store.get(OUT_OF_SERVICE, key)  # none: placement reads the record itself
        if copy is not None and copy != self._out_of_service_doc(doc):
            self.store.put(OUT_OF_SERVICE, key, self._out_of_service_doc(doc))

    def reclaimed(self, authority: str) -> list[str]:
        doc = self.store.get(DELEGATIONS, f"{self.name}|{authority}") or {}
        return list(doc.get("reclaimed", []))

    def unavailable(self, term: Term) -> set[str]:
        """Units the broker cannot promise for `term`: promised during it, being reclaimed, or claimed in the
        store by any broker process on it. The broker's own view, for its policy (not a message)."""
        with self._lock:
            return self.calendar.unavailable(term) | set(self._unit_claims())

    # ---- availability (a query message) ------------------------------------------------------------------------
    def _bump(self) -> None:
        """Note that inventory or promises changed: callers' cached availability answers are stale now. Kept
        in the store, so the brokers of several AM workers on one store invalidate each other's answers."""
        self.store.put(VERSIONS, self.name, {"broker": self.name, "version": uuid.uuid4().hex})

    def version(self) -> str:
        doc = self.store.get(VERSIONS, self.name)
        return doc["version"] if doc else ""

    def availability(self, known: str = "", now: datetime | None = None,
                     term: Term | None = None) -> dict[str, Any]:
        """What is in use now, with the version of the broker's state it was read at: `counts`, the claims
        per pool (the store's claim counters, for every kind but NAMED) and `units`, the units named one by
        one (NAMED kinds' claims; units of tickets whose term started but whose units are not claimed yet;
        draining ones), so an answer costs what the substrate has, not what is in use. When the caller
        already holds the answer for version `known` and nothing changed, only the version comes back
        (`unchanged`). Advertisements (ListResources geni_available) are built from this answer. With a
        future `term` (ListResources with a time window) the answer is what cannot be promised over that
        term: advance bookings included, and today's claims only if their tickets may still run then."""
        now = self._now(now)
        with self._lock:
            version = self.version()
            if term is not None and term.start > now:
                self._load()  # advance bookings other broker processes on this store made are in the store only
                return {"version": version, "unchanged": False,
                        "units": sorted(self.calendar.unavailable(term) | self._claimed_during(term, ""))}
            if known and version == known:
                return {"version": version, "unchanged": True}
            counts = {c: n for c, n in self.store.claim_counts().items()
                      if (kind := c.partition(":")[0]) in UNIT_KINDS and kind not in NAMED}
            named = set(self.store.claims_in(NAMED))
            for u in self.calendar.booked_by(self._claimed.waiting, Term(now, now + timedelta(seconds=1))):
                if u.partition(":")[0] in NAMED or self._copy.owner_of(u) is None:  # a claimed one is counted
                    named.add(u)
            return {"version": version, "unchanged": False, "counts": counts, "units": sorted(named)}

    def _unit_claims(self) -> dict[str, str]:
        """Unit → ticket group, as every broker process on the store claimed them: the broker's own claim
        namespaces only (on Redis a hash per namespace, one round trip), never the other actors' claims."""
        return self.store.claims_in(UNIT_KINDS)

    def _claimed_during(self, term: Term, group: str) -> set[str]:
        """Units claimed in the store (by anyone but `group`) that may still be held during a future `term`:
        a claim whose ticket this broker knows to end before the term starts is left out; any other claim
        (another broker's, or an ended ticket not yet relinquished) counts."""
        out: set[str] = set()
        claims = self._copy.everything()  # every claim: asked on request (a time window's advertisement)
        for key in (k for k, o in list(claims.items()) if o != group):
            owner = claims[key]
            mine = [h for h in self.calendar.holders_ever(key) if h.rsplit("/", 1)[0] == owner]
            if not mine or any(self.calendar.bookings[h].term.end > term.start for h in mine):
                out.add(key)
        return out

    # ---- placement: the broker's policy decides --------------------------------------------------------------
    def substrate_of(self, authority: str = "") -> Substrate:
        """The substrate description `authority` (default: the one this broker tickets for) delegated."""
        name = authority or self.authority or next(iter(self._substrates), "")
        sub = self._substrates.get(name)
        if sub is None:
            raise Refused(f"broker {self.name}: authority {name or '(none)'} has delegated no substrate description "
                          f"to it; nothing can be placed (the authority delegates at start)")
        return sub

    def _used(self, term: Term, authority: str, substrate: Substrate, group: str = "",
              future: bool = False) -> Unavailable:
        """What the policy must not choose: promised over the term, claimed in the store by anyone but `group`
        (claims of an earlier attempt of this very request, cut short by a crash, are its own to take again),
        and inventory the authority reclaimed or is reclaiming. For a `future` term (an advance reservation) a
        claim whose ticket ends before the term starts does not count. A view asked unit by unit: the store's
        claim changes since the last placement are read (only pools that changed are read again), not every
        claim or counter, and the calendar answers from each unit's own bookings."""
        self._copy.sync()
        ends_before = None
        if future:
            def ends_before(unit: str, owner: str) -> bool:
                mine = [h for h in self.calendar.holders_ever(unit) if h.rsplit("/", 1)[0] == owner]
                return bool(mine) and all(self.calendar.bookings[h].term.end <= term.start for h in mine)
        also: list[Any] = [ClaimedByOthers(self._copy, group, ends_before)]
        taken_out = self._taken_out(authority or self.authority)
        if taken_out:
            also.append(self._out_of_service_units(authority or self.authority, taken_out))
        return _Unpromisable(self.calendar, term, also, self._copy, group)

    def _out_of_service_units(self, authority: str, taken_out: set[str]) -> frozenset[str]:
        """Every unit of the pools taken out (built once per set of names: no substrate document to build)."""
        key = (authority, frozenset(taken_out))
        units = self._out_units.get(key)
        if units is None:
            units = frozenset(units_under(STANDARD.pools(self.substrate_of(authority)), taken_out))
            self._out_units = {key: units}
        return units

    def place(self, holder: str, demands: Demands, term: Term, now: datetime, group: str | None = None,
              dry_run: bool = False, authority: str = "") -> PlaceAnswer:
        """Choose where every demanded node and link goes (the policy over this broker's calendar), book it
        all or nothing and answer the signed tickets and where each reservation went. Asking again with the
        same `group` answers the tickets already granted. With `dry_run`, nothing is booked or written: the
        answer is only a report (broker/placement.py `report`: what fits where, and for what does not, asked
        vs available)."""
        request, rids = demands.request, demands.reservations
        image_policy, parts = demands.image_policy, demands.bitstream_parts
        substrate = with_images(self.substrate_of(authority), demands.images)
        now = self._now(now)
        future = term.start > now  # an advance reservation: booked now, claimed by `tick` when it starts
        if dry_run:
            with self._lock:  # the view of what is unavailable reads the live calendar and claims
                used = self._used(term, authority, substrate, future=future)
                shortfalls: list[Shortfall] = []
                placed = plan(substrate, request, used, image_policy, parts, self.policy, shortfalls=shortfalls,
                              kept=demands.kept, subnets=demands.subnets)
            return PlaceAnswer(report=report(substrate, request, placed, shortfalls))
        explicit_group = group is not None
        group = group or f"ticket:{uuid.uuid4().hex}"
        pending: list[_Unpublished] = []
        with self._lock:
            if explicit_group:
                if any(t.rsplit("/", 1)[0] == group for t in self._unpublished):
                    raise Busy(f"broker {self.name}: tickets of {group} are being granted right now; ask again")
                if self._granted(group, list(rids.values())):
                    return self._placed(group, list(rids.values()))
                self._refuse_relinquished(group, list(rids.values()))
                self._ensure_group(group)
                for tid in self.calendar.holders_of(group):
                    self.calendar.release(tid)  # part of an earlier attempt cut short: placed again as a whole
            if future:
                # advance bookings are not claimed in the store: see other processes' ones, and every claim (no
                # claim race at booking time would catch a claim the counters hid, as it does for a term
                # starting now: one released and another taken in the same pool)
                self._load()
            for _attempt in range(PLACE_ATTEMPTS):
                try:
                    placed = plan(substrate, request, self._used(term, authority, substrate, group, future),
                                  image_policy, parts, self.policy, kept=demands.kept, subnets=demands.subnets)
                except SHORT as exc:
                    if not future:
                        raise
                    raise type(exc)(f"{exc.message} (over the advance term {_span(term)}, which other "
                                    f"reservations already hold)") from None
                exact = {rids[p.client_id]: _exact(p) for p in placed}
                where = {rids[p.client_id]: {"kind": p.kind, "component_id": p.component_id,
                                             "details": to_doc(dict(p.details))} for p in placed}
                try:
                    pending = self._grant(holder, exact, term, now, group, where)
                except Busy:  # another broker process on the store won a unit: see its promises, again
                    self._load(every=future)
                    continue
                break
            else:
                raise Busy(f"broker {self.name}: the units chosen for this request were promised to others "
                           f"{PLACE_ATTEMPTS} times in a row (other brokers on this store); ask again")
        tickets = self._publish(pending)
        booked = {u for p in pending for u in p.booked}
        stale = [k for k in self.store.claims_of(group) if k not in booked]  # an earlier, crashed attempt's
        if stale and self.store.release_all(stale, group):
            with self._lock:
                self._copy.released(stale, group)
        return PlaceAnswer(tickets, {rid: dict(where.get(rid) or {}) for rid in rids.values()})

    def find_slot(self, holder: str, demands: Demands, query: SlotQuery, now: datetime | None = None,
                  authority: str = "") -> SlotAnswer:
        """The earliest start at which every demanded node and link fits for the query's duration, as `place`
        would place them then (broker/slots.py), or why none does in the query's window. Nothing is booked."""
        substrate = self.substrate_of(authority)
        now = self._now(now)
        with self._lock:
            self._load()  # advance bookings other broker processes on this store made are in the store only
            claims = dict(self._copy.everything())
            # a claim the calendar explains ends with its booking; any other holds its unit whatever the time
            held = {k for k, owner in claims.items()
                    if not any(h.rsplit("/", 1)[0] == owner for h in self.calendar.holders_ever(k))}
            taken_out = self._taken_out(authority or self.authority)
            if taken_out:
                held |= units_under(STANDARD.pools(substrate), taken_out)
            calendar = self.calendar.copy()  # searched without the lock: placements go on meanwhile
        return find_slot(substrate, demands.request, calendar, query, now, held, set(claims),
                         demands.image_policy, demands.bitstream_parts, self.policy)

    def _publish(self, pending: Sequence[_Unpublished]) -> dict[str, Ticket]:
        """Sign the tickets granted under the lock and write them (after it), then note the change."""
        tickets: dict[str, Ticket] = {}
        for p in pending:
            tickets[p.rid] = sign_ticket(p.ticket, self.key)
            self._put_ticket(tickets[p.rid], p.booked, p.claimed, placement=p.placement)
        with self._lock:
            for p in pending:
                self._unpublished.pop(p.ticket.id, None)
        if pending:
            self._bump()
        return tickets

    def _placed(self, group: str, rids: Sequence[str]) -> PlaceAnswer:
        tickets, placements = {}, {}
        for rid in rids:
            doc = self.store.get(TICKETS, f"{group}/{rid}") or {}
            tickets[rid] = decode(doc["ticket"], Ticket, "ticket")
            placements[rid] = doc.get("placement") or {}
        return PlaceAnswer(tickets, placements)

    # ---- tickets ---------------------------------------------------------------------------------------------
    def _refuse_relinquished(self, group: str, rids: Sequence[str]) -> None:
        for tid in [f"{group}/*", *(f"{group}/{rid}" for rid in rids)]:
            if self.store.get(RELINQUISHED, tid) is not None:
                raise Refused(f"broker {self.name}: ticket {tid} was relinquished by its holder before this request "
                              f"arrived (a late or repeated request); nothing granted, ask again")

    def _remember_relinquished(self, tid: str, now: datetime) -> None:
        self.store.put(RELINQUISHED, tid, {"id": tid, "broker": self.name,
                                           "until": rfc3339(now + RELINQUISHED_KEPT)})

    def _granted(self, group: str, rids: Sequence[str]) -> bool:
        """Every reservation of `group` holds an active ticket (asked again after a lost answer)."""
        docs = [self.store.get(TICKETS, f"{group}/{rid}") for rid in rids]
        return all(doc is not None and doc.get("state") == "active" for doc in docs)

    def _grant(self, holder: str, demands: Mapping[str, _ExactDemand], term: Term, now: datetime, group: str,
               placements: Mapping[str, Any]) -> list[_Unpublished]:
        """Book and claim every demand, all or none (Busy when another broker process on the store won a unit
        meanwhile: the caller reloads and places again), and issue its tickets unsigned, for the caller to
        `_publish` once it has let go of the lock."""
        taken: set[str] = set()
        choices: dict[str, _Choice] = {}
        for rid, d in demands.items():
            choices[rid] = self._choose(f"{group}/{rid}", d, term, taken)
            taken.update(choices[rid].units)
        started = term.start <= now
        keys = [u for c in choices.values() for u in c.units]
        if started and not self.store.claim_all(keys, group):
            lost = [k for k in keys if self.store.owner_of(k) not in (None, group)]
            if not (self._evict_ended(lost, now) and self.store.claim_all(keys, group)):
                raise Busy(f"broker {self.name}: {len(lost)} of {len(keys)} units were promised to someone "
                           f"else meanwhile (e.g. {lost[0] if lost else '?'}); ask again")
        if started:
            self._copy.claimed(keys, group)
            self.fault("broker:claimed")
        pending = []
        for rid, c in choices.items():
            tid = f"{group}/{rid}"
            booking = self.calendar.book(tid, c.units, term)
            self._claimed[tid] = started
            self._unpublished[tid] = (booking.units, term)
            t = Ticket(tid, self.name, holder, rid, tuple(c.units), term.start, term.end, 1, labels=c.labels,
                       authority=self.authority)
            pending.append(_Unpublished(rid, t, list(c.units), started, placements.get(rid)))
        return pending

    def _choose(self, tid: str, d: _ExactDemand, term: Term, taken: set[str]) -> _Choice:
        what = f"{d.what}: " if d.what else ""
        c = _Choice(units=list(d.units))
        dup = [u for u in d.units if u in taken]
        if dup:
            raise Busy(f"broker {self.name}: {what}unit {dup[0]} is asked for twice in one request")
        if d.label_sets:
            tag = self._choose_label(d, term, taken | set(c.units))
            c.units += [self.calendar.label_sets[s].key(tag) for s in d.label_sets]
            c.labels = (("vlan", tag),)
        try:
            self.calendar.check(tid, c.units, term)
        except CalendarError as exc:
            if "not in the inventory" in str(exc) or "reclaimed" in str(exc):
                raise Refused(f"broker {self.name}: {what}{exc} (reclaimed by its authority, e.g. for "
                              f"maintenance, or never delegated to it)") from None
            held = [u for u in c.units if not self.calendar.is_free(u, term, ignore=tid)]
            if self._forget_released(held):
                return self._choose(tid, d, term, taken)
            raise Busy(f"broker {self.name}: {what}{exc}; ask again") from None
        return c

    def _forget_released(self, units) -> bool:
        """Drop bookings of started tickets whose claims someone released behind the calendar's back (a slice
        manager that released units in the store directly); True if any was dropped."""
        dropped = False
        for u in set(units):
            for holder in self.calendar.holders_ever(u):
                if self._claimed.get(holder) and self.store.owner_of(u) != holder.rsplit("/", 1)[0]:
                    self.calendar.release(holder)
                    self._claimed.pop(holder, None)
                    self.store.delete(TICKETS, holder)
                    dropped = True
        return dropped

    def _evict_ended(self, keys: Sequence[str], now: datetime) -> bool:
        """Claims held by tickets whose term is over are not promises any more: when someone needs those
        units, drop the ended tickets (their slice manager is late to relinquish). True if any was dropped."""
        dropped = False
        for k in keys:
            owner = self.store.owner_of(k)
            if owner is None:
                continue
            self._ensure_group(owner)
            mine = [h for h in self.calendar.holders_ever(k) if h.rsplit("/", 1)[0] == owner]
            if mine and all(self.calendar.bookings[h].term.end <= now for h in mine):
                for h in mine:
                    self._drop(h, ())
                dropped = True
        return dropped

    def _choose_label(self, d: _ExactDemand, term: Term, taken: set[str]) -> int:
        what = f"{d.what}: " if d.what else ""
        unknown = [s for s in d.label_sets if s not in self.calendar.label_sets]
        if unknown:
            raise Refused(f"broker {self.name}: {what}label set {unknown[0]} is not delegated to it")
        sets = [self.calendar.label_sets[s] for s in d.label_sets]
        free = [v for v in common_free_labels(self.calendar, list(d.label_sets), term)
                if not any(ls.key(v) in taken for ls in sets)]
        where = " and ".join(f"{ls.name} ({_ranges(ls.ranges)})" for ls in sets)
        if d.label is not None:
            if d.label not in free:
                why = ("outside the delegated range" if not all(d.label in ls for ls in sets) else
                       "promised to another reservation")
                raise VlanUnavailable(f"broker {self.name}: {what}asked for VLAN {d.label} across {where} "
                                      f"over {_span(term)}; it is {why} ({len(free)} others free)")
            return d.label
        tag = choose_label(free)
        if tag is None:
            raise VlanUnavailable(f"broker {self.name}: {what}asked for a VLAN tag free across {where} "
                                  f"over {_span(term)}; none is free on all of them")
        return tag

    def query(self, group: str, reservations: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Where each reservation's ticket stands (ORCA query): active (with the ticket), failed (with the
        reason), or unknown."""
        with self._lock:
            out: dict[str, dict[str, Any]] = {}
            for rid in reservations:
                doc = self.store.get(TICKETS, f"{group}/{rid}")
                if doc is not None:  # claimed: the units are taken in the store (an advance ticket: once started)
                    out[rid] = {"status": doc["state"], "ticket": doc["ticket"], "reason": doc.get("reason", ""),
                                "claimed": bool(doc.get("claimed", True))}
                else:
                    out[rid] = {"status": "unknown"}
            return out

    def tickets(self) -> dict[str, Any]:
        """Every ticket this broker holds (the signed ticket, its state, the reason it failed, whether its units
        are claimed in the store), for an operator's view (the dashboard snapshot): the broker's own answer, so
        nothing else reads its tables."""
        with self._lock:
            tickets = [{"ticket": d["ticket"], "state": d.get("state", ""), "reason": d.get("reason", ""),
                        "claimed": bool(d.get("claimed", True))}
                       for d in self.store.scan(TICKETS) if d.get("broker") == self.name]
        return {"tickets": tickets}

    # ---- extend, relinquish, expiry --------------------------------------------------------------------------
    def extend_ticket(self, ticket: Ticket, end: datetime, limit: datetime | None = None,
                      now: datetime | None = None) -> Ticket:
        """A new ticket for the same units ending at `end` (later, or earlier: a renew may ask for less);
        sequence + 1. Refused if another promise starts before `end`."""
        if end <= ticket.start:
            raise BadArgs(f"broker {self.name}: ticket {ticket.id} cannot end at {end:%Y-%m-%dT%H:%M:%SZ}, before "
                          f"it starts ({ticket.start:%Y-%m-%dT%H:%M:%SZ})")
        if limit is not None and end > limit:
            raise OutOfRange(f"broker {self.name}: cannot extend ticket {ticket.id} past {limit:%Y-%m-%dT%H:%M:%SZ}")
        with self._lock:
            self._ensure_group(ticket.group)
            doc = self.store.get(TICKETS, ticket.id)
            if doc is not None and doc.get("state") == "active":
                current = decode(doc["ticket"], Ticket, "ticket")
                if current.sequence > ticket.sequence and current.end == end:
                    return current  # asked again after a lost answer: the same extension
                booked = doc.get("booked", list(current.units))
            elif self.store.claims_of(ticket.group):
                current, booked = ticket, list(ticket.units)  # issued before this broker kept ticket records
            else:
                raise SearchFailed(f"broker {self.name}: ticket {ticket.id} is not held any more (relinquished or "
                                   f"expired); allocate again")
            if current.id not in self.calendar.bookings:
                try:
                    self.calendar.book(current.id, booked, current.term)
                except CalendarError:
                    self._forget_released(booked)
                    self.calendar.book(current.id, booked, current.term)
                self._claimed.setdefault(current.id, bool(doc.get("claimed", True)) if doc else True)
            try:
                self.calendar.extend(current.id, end)
            except CalendarError as exc:
                if self._forget_released(booked):
                    return self.extend_ticket(ticket, end, limit, now)
                raise InsufficientNodes(f"broker {self.name}: cannot extend ticket {ticket.id} to "
                                        f"{end:%Y-%m-%dT%H:%M:%SZ}: {exc}") from None
            extended = self.calendar.bookings[current.id]
            self._unpublished[current.id] = (extended.units, extended.term)
            claimed = self._claimed.get(current.id, True)
        longer = sign_ticket(msgspec.structs.replace(current, end=end, sequence=max(current.sequence, ticket.sequence) + 1,
                                     signature=""), self.key)
        self.fault("broker:extended")
        self._put_ticket(longer, booked, claimed, placement=doc.get("placement") if doc else None)
        with self._lock:
            self._unpublished.pop(current.id, None)
        self._bump()
        return longer

    def relinquish(self, ticket: Ticket, now: datetime | None = None) -> int:
        """Give a ticket's units back (on close, failure or expiry; idempotent). Returns how many claims were
        released."""
        now = self._now(now)
        self._remember_relinquished(ticket.id, now)
        return self._drop(ticket.id, ticket.units)

    def relinquish_group(self, group: str, now: datetime | None = None) -> int:
        """Give back everything a ticket group holds, tickets or not (a request whose answer was lost)."""
        now = self._now(now)
        with self._lock:
            released = 0
            self._remember_relinquished(f"{group}/*", now)
            self._ensure_group(group)
            for tid in self.calendar.holders_of(group):
                released += self._drop(tid, ())
            released += self._release_owner(group)
            self._bump()
            return released

    def _drop(self, tid: str, units: Sequence[str]) -> int:
        """Forget a ticket and give its units back: the store's claims first, then the calendar (so this
        process never promises a unit whose claim is still held). The lock is held only for the calendar."""
        group = tid.rsplit("/", 1)[0]
        doc = self.store.get(TICKETS, tid)
        with self._lock:
            self._ensure_group(group)
            booking = self.calendar.bookings.get(tid)
        self.store.delete(TICKETS, tid)
        self.store.delete(ADVANCE, tid)
        self.fault("broker:relinquishing")
        keys = sorted(set(units) | (booking.units if booking else set())
                      | set(doc.get("booked", doc["ticket"]["units"]) if doc else []))
        released = self.store.release_all(keys, group)  # one write; the copy drops only what `group` held
        with self._lock:
            self._copy.released(keys, group)
            self.calendar.release(tid)
            self._claimed.pop(tid, None)
            self._unpublished.pop(tid, None)
            # claims of the group no live ticket of it books (a crashed attempt chose other units)
            live = bool(self.calendar.holders_of(group))
        self._bump()
        if not live:
            released += self._release_owner(group)
        return released

    def _release_owner(self, group: str) -> int:
        """Release every claim of a group left (a crashed attempt's), and tell the copy which."""
        keys = self.store.claims_of(group)
        if not keys:
            return 0
        released = self.store.release_owner(group)
        with self._lock:
            self._copy.released(keys, group)
        return released

    def tick(self, now: datetime) -> dict[str, list[str]]:
        """The broker's clock: claim the units of advance tickets whose term has started, drop tickets ended
        more than EXPIRY_GRACE ago (a slice manager that vanished) and forget relinquished tickets remembered
        long enough. Returns what happened, for logs."""
        now = self._now(now)
        with self._lock:
            started, failed = [], []
            for tid in sorted(self._claimed.waiting):  # advance tickets only, not every ticket
                b = self.calendar.bookings.get(tid)
                if b is not None and b.term.start <= now:
                    group = tid.rsplit("/", 1)[0]
                    doc = self.store.get(TICKETS, tid)
                    held = [k for k in sorted(b.units) if self.store.owner_of(k) not in (None, group)]
                    self._evict_ended(held, now)
                    if self.store.claim_all(sorted(b.units), group):
                        self._copy.claimed(b.units, group)
                        self._claimed[tid] = True
                        if doc:
                            doc.pop("claimed", None)  # claimed: the default
                            self._store_ticket(tid, doc)
                        self.store.delete(ADVANCE, tid)
                        started.append(tid)
                    else:
                        lost = [k for k in sorted(b.units) if self.store.owner_of(k) not in (None, group)]
                        self.calendar.release(tid)
                        self._claimed.pop(tid, None)
                        if doc:
                            doc.update(state="failed", reason=f"broker {self.name}: at the start of advance ticket "
                                       f"{tid} its unit {lost[0] if lost else '?'} was held by someone else")
                            self._store_ticket(tid, doc)
                        self.store.delete(ADVANCE, tid)
                        failed.append(tid)
            expired = self._expired(now)
            for tid in expired:
                self._drop(tid, ())
            if started or failed:
                self._bump()
        self._forget_relinquished(now)  # the store's only: no calendar under the lock meanwhile
        return {"started": started, "failed": failed, "expired": expired}

    def _expired(self, now: datetime) -> list[str]:
        """Tickets ended more than EXPIRY_GRACE ago: the calendar's interval index (tickets not written yet
        included) and the store's time index (the started tickets a start left out of the calendar), each
        read up to `now` only. A ticket of the time index is checked against its record (another broker process
        on the store may have extended it since)."""
        out = dict.fromkeys(self.calendar.ending_by(now - EXPIRY_GRACE))
        for tid, _at in self.store.due(TICKETS, now.timestamp()):
            if tid in out:
                continue
            doc = self.store.get(TICKETS, tid)
            if doc is not None and doc.get("broker") == self.name and ticket_due(doc) <= now.timestamp():
                out[tid] = None
        return list(out)

    def _forget_relinquished(self, now: datetime) -> None:
        """Forget the relinquished tickets remembered long enough, once per RELINQUISHED_SWEEP (and at the
        first tick, or when the clock went back)."""
        if self._swept is not None and self._swept <= now < self._swept + RELINQUISHED_SWEEP:
            return
        self._swept = now
        for doc in self.store.scan(RELINQUISHED):
            if doc.get("broker") == self.name and parse_time(doc["until"]) <= now:
                self.store.delete(RELINQUISHED, doc["id"])


@dataclass(frozen=True)
class _Unpublished:
    """A ticket granted under the broker's lock, to be signed and written after it."""

    rid: str
    ticket: Ticket
    booked: list[str]
    claimed: bool
    placement: Mapping[str, Any] | None


def _exact(p: Placement) -> _ExactDemand:
    """The exact demand for what the policy chose: a link's VLAN keys as the tag on its switches' label sets
    (the ticket then carries the tag), every other unit by name."""
    label_keys = {f"{name}:{value}" for name, value in p.labels.items()}
    sets = tuple(p.labels)
    tag = next(iter(p.labels.values()), None)
    d = p.details
    what = f"link {p.client_id}" if p.kind == "link" else \
        f"node {p.client_id} ({d.get('vm_size') or d.get('sliver_type', 'node')}" \
        f"{' on ' + d['host'] if d.get('host') else ''})"
    return _ExactDemand(units=tuple(k for k in p.keys if k not in label_keys), label_sets=sets, label=tag, what=what)


def _ranges(ranges) -> str:
    return ",".join(f"{lo}-{hi}" if lo != hi else str(lo) for lo, hi in ranges)


def with_images(substrate: Substrate, images: Mapping[str, str]) -> Substrate:
    """The substrate with the images the slice manager vouches for in one request (a user's own snapshots,
    others' public ones: the catalogue changes between delegations), as the request spells them."""
    if not images:
        return substrate
    return replace(substrate, images=(*substrate.images, *(Image(spelled, urn) for spelled, urn in images.items())))
