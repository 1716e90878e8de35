"""Snapshots the actors publish for the dashboard: each actor (slice manager, broker, authority) writes a
document of its OWN state into the store's `snapshots` table (key: the actor's name) on its periodic tick
when that state changed, and at least every `heartbeat` seconds otherwise, so the time it was published is
also the actor's heartbeat. The dashboard (operations/dashboard.py) reads only these documents: a page load takes no
slice manager lock and makes no actor call, however many slivers there are.

A deployment's publishers work on demand (`publishers_for(..., on_demand=True)`): a snapshot lists every
slice, so building one costs in proportion to the live slices, and nobody may be looking. A dashboard view
writes the `wanted` document (`want_snapshots`); publishers build and heartbeat only for WANTED_SECONDS after
it, so an aggregate nobody watches spends nothing on its views, at start or on a tick.

Each document: `{"name", "role", "version", "published_at", "state": {...}}`. What `state` holds per role is
built here from the actor's public methods (`slice_manager_state`, `broker_state`, `authority_state`); the
slice manager's also carries `history`, a short series of units and VLAN tags in use for the utilisation
charts, which survives a restart because it is read back from the last published document."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from operations.metrics import unit_bin
from protocol import reservations as rs
from protocol.api import AuthorityApi, BrokerApi
from resources import usage_counts
from slicex.clock import parse_time, rfc3339
from slicex.store import Store
from slicex.store.ownership import Actor, scoped

if TYPE_CHECKING:
    from slicex.ticket import Lease

log = logging.getLogger("slicex.snapshot")


class PublishedSliceManager(Protocol):
    """An in-process slice manager as its snapshot reads it: its reservation records (read-only), the units
    claimed in its store, and which slices are shut down."""

    name: str

    def records(self, slice_urn: str | None = None) -> list[Any]: ...

    def usage_keys(self) -> set[str]: ...

    def is_shut_down(self, slice_urn: str) -> bool: ...

    def version(self) -> str: ...

    def usage_version(self) -> str: ...


class PublishedBroker(BrokerApi, Protocol):
    """An in-process broker as its snapshot reads it: its messages plus what only its own process sees."""

    name: str
    policy: Any

    def delegated(self) -> list[str]: ...

    def version(self) -> str: ...


class PublishedAuthority(AuthorityApi, Protocol):
    """An in-process authority as its snapshot reads it: its messages plus its leases and its driver."""

    name: str
    substrate: Any

    def leases(self) -> list[Lease]: ...

    def version(self) -> str: ...

SNAPSHOTS = "snapshots"
BEAT = "#heartbeat"
"""Key suffix of an actor's heartbeat document (`{"heartbeat_of", "published_at"}`), written when its state is
unchanged: `read_snapshots` gives each snapshot the later of its own time and its heartbeat's."""
VERSION = 1
HEARTBEAT_SECONDS = 5.0
"""A snapshot is published at least this often even when nothing changed: its time is the actor's heartbeat."""
HISTORY_POINTS = 240
"""Samples of units and tags in use kept for the charts (at HISTORY_STEP_SECONDS: one hour)."""
HISTORY_STEP_SECONDS = 15.0
STATUS_SECONDS = 5.0
"""How often the authority asks its driver for a leased sliver's state (a host driver checks the host each
time: namespaces, interfaces, sshd) while its snapshot is being built; a new lease is asked at once."""
DRIVER_REFRESH_SECONDS = 60.0
"""The authority's snapshot is built again at least this often when no lease changed, for a driver of real
hosts (`changes_on_its_own`, true unless the driver says otherwise): what it sees (a VM that stopped on its
own) is written nowhere that a version would announce. Slivers in a state that moves
on its own (MOVING) are asked about on every tick until they settle."""
MOVING = frozenset({"geni_configuring", "geni_stopping", "geni_ready_busy", "geni_pending_allocation"})
MAX_ITEMS = 2000
"""Tickets or leases listed per snapshot at most (the newest by end); counts are always complete."""
WANTED = "wanted"
"""Key of the document a dashboard view writes (`{"at"}`): publishers on demand build while it is recent."""
WANTED_SECONDS = 300.0
"""How long after a dashboard view publishers on demand keep publishing (on change, and their heartbeat)."""
WANTED_WRITE_SECONDS = 10.0
"""A dashboard writes `wanted` at most this often, however many pages it serves."""


def want_snapshots(store: Store, now: datetime) -> None:
    """A dashboard view: publishers on demand build (and heartbeat) for the next WANTED_SECONDS."""
    scoped(store, Actor.OPERATIONS).put(SNAPSHOTS, WANTED, {"at": rfc3339(now)})


class Demand:
    """Whether a dashboard asked for snapshots in the last `seconds` (one read of `wanted`)."""

    def __init__(self, store: Store, seconds: float = WANTED_SECONDS):
        self.store = scoped(store, Actor.OPERATIONS)
        self.seconds = seconds

    def __call__(self, now: datetime) -> bool:
        doc = self.store.get(SNAPSHOTS, WANTED)
        return doc is not None and (now - parse_time(doc["at"])).total_seconds() <= self.seconds


# ---- usage from claim keys (shared with the topology picture) -------------------------------------------------
@dataclass(frozen=True)
class Use:
    """Units in use, per thing drawn: cores and MB per host, bare-metal nodes taken, VLAN tags per switch or
    external link, FPGAs held whole and router slots in use per board."""

    cores: Mapping[str, int] = field(default_factory=dict)
    memory_mb: Mapping[str, int] = field(default_factory=dict)
    taken: frozenset[str] = frozenset()
    vlans: Mapping[str, frozenset[int]] = field(default_factory=dict)
    fpgas: Mapping[str, frozenset[str]] = field(default_factory=dict)
    router_slots: Mapping[str, int] = field(default_factory=dict)

    def to_doc(self) -> dict[str, Any]:
        return {"cores": dict(self.cores), "memory_mb": dict(self.memory_mb), "taken": sorted(self.taken),
                "vlans": {k: sorted(v) for k, v in self.vlans.items()},
                "fpgas": {k: sorted(v) for k, v in self.fpgas.items()}, "router_slots": dict(self.router_slots)}

    @staticmethod
    def from_doc(d: Mapping[str, Any]) -> Use:
        return Use({k: int(v) for k, v in d.get("cores", {}).items()},
                   {k: int(v) for k, v in d.get("memory_mb", {}).items()}, frozenset(d.get("taken", ())),
                   {k: frozenset(int(t) for t in v) for k, v in d.get("vlans", {}).items()},
                   {k: frozenset(v) for k, v in d.get("fpgas", {}).items()},
                   {k: int(v) for k, v in d.get("router_slots", {}).items()})


def use_of(keys: Iterable[str]) -> Use:
    """Use from claim keys (`core:…`, `vlan:…`, `fpga:<board>/fpgaN`, `router:<board>:k`)."""
    keys = set(keys)
    cores, mem, taken, vlans = usage_counts(keys)
    fpgas: dict[str, set[str]] = {}
    planes: Counter[str] = Counter()
    for key in keys:
        kind, _, rest = key.partition(":")
        if kind == "fpga":
            fpgas.setdefault(rest.split("/", 1)[0], set()).add(rest)
        elif kind == "router":
            planes[rest.rsplit(":", 1)[0]] += 1
    return Use(cores, mem, taken, vlans, {b: frozenset(f) for b, f in fpgas.items()}, dict(planes))


def usage_point(keys: Iterable[str], at: datetime) -> dict[str, Any]:
    """One sample for the charts: units in use by kind (core, mem, node, bw, vlan, ...) and tags per switch."""
    kinds: Counter[str] = Counter()
    tags: Counter[str] = Counter()
    for key in keys:
        kind, where = unit_bin(key)
        kinds[kind] += 1
        if kind == "vlan":
            tags[where] += 1
    return {"at": rfc3339(at), "units": dict(kinds), "vlans": dict(tags)}


# ---- what each actor publishes (from its public methods) --------------------------------------------------------
def _t(when: datetime | None) -> str:
    return rfc3339(when) if when else ""


def sliver_states(rec: Any) -> tuple[str, str]:
    """(allocation state, what the slice manager knows of the operational state) of a record without asking
    the authority: the authority's own snapshot says how a leased sliver really is."""
    r = rec.r
    if r.state in (rs.CLOSE_WAIT, rs.CLOSED):
        return "geni_unallocated", "geni_pending_allocation"
    if r.state == rs.FAILED:
        return ("geni_provisioned" if rec.provisioned else "geni_allocated"), "geni_failed"
    if rec.update:  # a sliver of a staged Update (slice_manager/update.py)
        return "geni_updating", ("geni_notready" if r.state in rs.HOLDS_LEASE else "geni_pending_allocation")
    if rec.provisioned or r.state in rs.HOLDS_LEASE or r.pending == rs.REDEEMING:
        return "geni_provisioned", "geni_notready"
    return "geni_allocated", "geni_pending_allocation"


def _sliver_doc(rec: Any) -> dict[str, Any]:
    alloc, op = sliver_states(rec)
    r = rec.r
    details = {k: v for k, v in rec.details.items() if k not in ("logins", "reservation")}  # no user keys
    return {"urn": rec.id, "client_id": rec.client_id, "kind": rec.kind, "component_id": rec.component_id,
            "owner": rec.owner_urn, "allocation_state": alloc, "operational_state": op,
            "state": r.state, "pending": r.pending, "pending_since": _t(r.pending_since), "reason": r.reason,
            "start": _t(r.start or (rec.ticket.start if rec.ticket else None)), "end": _t(r.end), "shutdown": rec.shutdown, "details": details,
            "ticket": {"id": rec.ticket.id, "broker": rec.ticket.broker, "start": _t(rec.ticket.start),
                       "end": _t(rec.ticket.end), "sequence": rec.ticket.sequence, "units": len(rec.ticket.units),
                       "labels": [list(x) for x in rec.ticket.labels]} if rec.ticket else None,
            "lease": {"id": rec.lease.id, "authority": rec.lease.authority, "start": _t(rec.lease.start),
                      "end": _t(rec.lease.end), "sequence": rec.lease.sequence} if rec.lease else None,
            "lease_id": rec.ticket_id}


def pending_summary(records: Iterable[Any], now: datetime) -> list[dict[str, Any]]:
    """Reservations with an operation in flight, by (state, operation): how many and the oldest's age."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for rec in records:
        r = rec.r
        if r.pending == rs.NONE:
            continue
        age = max(0.0, (now - (r.pending_since or now)).total_seconds())
        row = out.setdefault((r.state, r.pending), {"state": r.state, "pending": r.pending, "count": 0,
                                                    "oldest_seconds": 0.0})
        row["count"] += 1
        row["oldest_seconds"] = max(row["oldest_seconds"], age)
    return sorted(out.values(), key=lambda row: -row["oldest_seconds"])


def slice_manager_state(sm: PublishedSliceManager, now: datetime) -> dict[str, Any]:
    """The slice manager's reservations (`records()`), grouped by slice, and the store's claims (`usage_keys()`)."""
    records = [rec for rec in sm.records() if not rec.discard]
    keys = sm.usage_keys()
    slices: dict[str, dict[str, Any]] = {}
    for rec in sorted(records, key=lambda rec: (rec.slice_urn, rec.client_id)):
        if rec.r.state == rs.CLOSED:
            continue
        s = slices.setdefault(rec.slice_urn, {"urn": rec.slice_urn, "owner": rec.owner_urn, "slivers": []})
        s["slivers"].append(_sliver_doc(rec))
    for urn, s in slices.items():
        s["shut_down"] = bool(sm.is_shut_down(urn))
    states = Counter(rec.r.state for rec in records)
    return {"slices": slices, "reservations": {state: states.get(state, 0) for state in rs.STATES},
            "pending": pending_summary(records, now),
            "tickets_held": sum(rec.r.state in rs.HOLDS_TICKET for rec in records),
            "leases_held": sum(rec.r.state in rs.HOLDS_LEASE for rec in records),
            "use": use_of(keys).to_doc(), "point": usage_point(keys, now)}


def units_on(units: Iterable[str]) -> dict[str, dict[str, int]]:
    """How many units of each kind a ticket holds on each host, switch, port or board (unit_bin)."""
    out: dict[str, Counter[str]] = {}
    for key in units:
        kind, where = unit_bin(key)
        out.setdefault(where, Counter())[kind] += 1
    return {where: dict(kinds) for where, kinds in out.items()}


def broker_state(broker: PublishedBroker, now: datetime) -> dict[str, Any]:
    """The broker's tickets (its `tickets` answer) and what was delegated to it (the signed delegations it
    accepted: who, when, how much)."""
    held = broker.tickets()
    tickets = []
    states: Counter[str] = Counter()
    for d in held["tickets"]:
        t = d["ticket"]
        states[d.get("state", "")] += 1
        tickets.append({"id": t["id"], "holder": t.get("holder", ""), "reservation": t.get("reservation", ""),
                        "start": t.get("start", ""), "end": t.get("end", ""), "sequence": t.get("sequence", 0),
                        "units": len(t.get("units", ())) or int(t.get("count", 0)),
                        "labels": t.get("labels", []), "state": d.get("state", ""), "reason": d.get("reason", ""),
                        "on": units_on(t.get("units", ()))})  # the dashboard's calendar: what it holds where
    tickets.sort(key=lambda t: t["end"], reverse=True)
    given = [{"authority": d["authority"], "issued": d["issued"], "pools": len(d["body"].get("pools", ())),
              "label_sets": len(d["body"].get("label_sets", ()))} for d in broker.delegations()]
    return {"tickets": tickets[:MAX_ITEMS], "ticket_states": dict(states),
            "delegated": broker.delegated(), "delegations": given, "policy": type(broker.policy).__name__}


class StatusCache:
    """A leased sliver's (operational state, error) from the authority's driver, asked at most every
    `seconds` per lease; leases that are gone are forgotten."""

    def __init__(self, authority: AuthorityApi, seconds: float = STATUS_SECONDS,
                 monotonic: Callable[[], float] = time.monotonic):
        self.authority = authority
        self.seconds = seconds
        self.monotonic = monotonic
        self._known: dict[str, tuple[float, tuple[str, str]]] = {}

    def __call__(self, lease_id: str, now: datetime) -> tuple[str, str]:
        mono = self.monotonic()
        hit = self._known.get(lease_id)
        if hit is None or mono - hit[0] >= self.seconds:
            try:
                answer = tuple(self.authority.status(lease_id, now))
            except Exception as exc:  # noqa: BLE001 - one lease's driver failing is its state, not a lost snapshot
                answer = ("geni_failed", getattr(exc, "message", str(exc)))
            hit = (mono, (str(answer[0]), str(answer[1])))
            self._known[lease_id] = hit
        return hit[1]

    def keep(self, lease_ids: set[str]) -> None:
        self._known = {k: v for k, v in self._known.items() if k in lease_ids}


def authority_state(authority: PublishedAuthority, now: datetime, status: Callable[[str, datetime], tuple[str, str]] | None = None
                    ) -> dict[str, Any]:
    """The authority's active leases (`leases()`) with each leased sliver's operational state from its own
    driver (`status`, through a StatusCache in a publisher): what the dashboard shows as a sliver's state."""
    status = status or StatusCache(authority, 0.0)
    leases = []
    for lease in sorted(authority.leases(), key=lambda lease: lease.end, reverse=True)[:MAX_ITEMS]:
        op, error = status(lease.id, now)
        leases.append({"id": lease.id, "holder": lease.holder, "reservation": lease.reservation,
                       "start": _t(lease.start), "end": _t(lease.end), "sequence": lease.sequence,
                       "units": len(lease.units), "labels": [list(x) for x in lease.labels],
                       "operational_state": op, "error": error})
    return {"leases": leases, "driver": str(getattr(authority.substrate, "description", "") or "")}


def settled_leases(state: Mapping[str, Any]) -> bool:
    """Whether no leased sliver of an authority's state is in a state that moves on its own (booting)."""
    return not any(lease["operational_state"] in MOVING for lease in state["leases"])


# ---- publishing ---------------------------------------------------------------------------------------------------
class Publisher:
    """Publishes one actor's snapshot: on a tick when its state changed, and at least every `heartbeat` seconds
    (monotonic time, so a test's manual clock does not stop heartbeats). The slice manager's keeps a history."""

    def __init__(self, store: Store, name: str, role: str, build: Callable[[datetime], dict[str, Any]],
                 heartbeat: float = HEARTBEAT_SECONDS, history_step: float = HISTORY_STEP_SECONDS,
                 monotonic: Callable[[], float] = time.monotonic, token: Callable[[], Any] | None = None,
                 settled: Callable[[dict[str, Any]], bool] | None = None, refresh: float | None = None,
                 wanted: Callable[[datetime], bool] | None = None):
        """`token`: a cheap answer that changes whenever the state `build` reads changes (the broker's,
        the slice manager's or the authority's version); while it is unchanged the state is not built again,
        and a heartbeat republishes the last state. Two exceptions: a state `settled` says moves with time on
        its own (ages of pending operations, slivers booting) is built again on every tick until it is
        settled, and with `refresh` it is built again at least that often (what a driver sees, which no
        write to the store announces). `wanted` (a `Demand`): nothing is built or written while it says no
        dashboard asked."""
        self.store = scoped(store, Actor.OPERATIONS)
        self.name = name
        self.role = role
        self.build = build
        self.heartbeat = heartbeat
        self.history_step = history_step
        self.monotonic = monotonic
        self._digest = ""
        self._published = float("-inf")
        self._sampled = float("-inf")
        self._history: list[dict[str, Any]] | None = None  # read back from the store on first use
        self.token = token
        self._token: Any = None  # the token the last published state was built at
        self._last_settled: bool | None = None  # whether the last state published was settled (None: none yet)
        self.settled = settled
        self.refresh = refresh
        self.wanted = wanted
        self._built = float("-inf")  # when the state was last built (monotonic)
        self._lock = threading.Lock()  # a dashboard view in the same process may publish beside the tick

    def publish(self, now: datetime) -> bool:
        """Build the state and write it if it changed or the heartbeat is due; True if written. Errors
        propagate (the caller's tick logs them and tries again). Only the last state's digest and whether it
        was settled are kept, not the state: a snapshot holds every slice."""
        if self.wanted is not None and not self.wanted(now):
            return False
        with self._lock:
            return self._publish(now)

    def _publish(self, now: datetime) -> bool:
        token = self.token() if self.token is not None else None
        if token is not None and token == self._token and self._last_settled is not None and self._still():
            if self.monotonic() - self._published < self.heartbeat:
                return False  # unchanged: nothing built, nothing written
            # the heartbeat alone, a small document beside the state: the state is not encoded again
            self.store.put(SNAPSHOTS, self.name + BEAT, {"heartbeat_of": self.name, "published_at": rfc3339(now)})
            self._published = self.monotonic()
            return True
        state = self.build(now)
        self._built = self.monotonic()
        point = state.pop("point", None)
        digest = hashlib.sha256(json.dumps(state, sort_keys=True, default=str).encode()).hexdigest()
        mono = self.monotonic()
        if digest == self._digest and mono - self._published < self.heartbeat:
            if self._last_settled is not None:
                self._token = token  # the state published is the one this token names
            return False
        if point is not None:
            if self._history is None:
                old = self.store.get(SNAPSHOTS, self.name) or {}
                self._history = list(old.get("history", []))[-HISTORY_POINTS:]
            last = self._history[-1] if self._history else None
            changed = last is None or (last["units"], last["vlans"]) != (point["units"], point["vlans"])
            if changed or mono - self._sampled >= self.history_step:
                self._history = [*self._history, point][-HISTORY_POINTS:]
                self._sampled = mono
        doc = {"name": self.name, "role": self.role, "version": VERSION, "published_at": rfc3339(now),
               "state": state}
        if self._history is not None:
            doc["history"] = self._history
        self.store.put(SNAPSHOTS, self.name, doc)
        self._digest, self._published = digest, mono
        self._token, self._last_settled = token, self.settled is None or self.settled(state)
        return True

    def _still(self) -> bool:
        """Whether the last state stands while the token is unchanged: it is settled, and not due a refresh."""
        if self.refresh is not None and self.monotonic() - self._built >= self.refresh:
            return False
        return bool(self._last_settled)

    def tick(self, now: datetime) -> None:
        """publish() for a periodic loop: a failure is a log line, the next tick tries again."""
        try:
            self.publish(now)
        except Exception:  # noqa: BLE001 - the actor's loop must keep running
            log.exception("%s %s: snapshot not published; will retry next tick", self.role, self.name)


def publishers_for(store: Store, sm: PublishedSliceManager | None = None, broker: PublishedBroker | None = None,
                   authority: PublishedAuthority | None = None,
                   heartbeat: float = HEARTBEAT_SECONDS, on_demand: bool = False) -> list[Publisher]:
    """Publishers for the actors this process runs (pass only in-process actors, never remote proxies);
    `on_demand` (a deployment's): they publish only while a dashboard view asked (`want_snapshots`)."""
    demand = Demand(store) if on_demand else None
    out = []
    if sm is not None:  # built when its records or the units in use change (the broker's version when in process)
        usage = broker.version if broker is not None else sm.usage_version
        out.append(Publisher(store, sm.name, "slice-manager", lambda now: slice_manager_state(sm, now), heartbeat,
                             token=lambda: (sm.version(), usage()), settled=lambda state: not state["pending"],
                             wanted=demand))
    if broker is not None:
        out.append(Publisher(store, f"broker:{broker.name}", "broker", lambda now: broker_state(broker, now),
                             heartbeat, token=broker.version, wanted=demand))
    if authority is not None:
        cache = StatusCache(authority)

        def build(now: datetime) -> dict[str, Any]:
            state = authority_state(authority, now, cache)
            cache.keep({lease["id"] for lease in state["leases"]})
            return state
        # a driver whose slivers change only by their records' timed transitions needs no refresh
        refresh = DRIVER_REFRESH_SECONDS if getattr(authority.substrate, "changes_on_its_own", True) else None
        out.append(Publisher(store, f"authority:{authority.name}", "authority", build, heartbeat,
                             token=authority.version, settled=settled_leases, refresh=refresh, wanted=demand))
    return out


def read_snapshots(store: Store) -> list[dict[str, Any]]:
    """Every published snapshot of this store (the dashboard's only input), newest first; each published at
the later of its own time and its last heartbeat's."""
    found = scoped(store, Actor.OPERATIONS).scan(SNAPSHOTS)
    beats = {d["heartbeat_of"]: parse_time(d["published_at"]) for d in found if "heartbeat_of" in d}
    docs = []
    for d in found:
        if d.get("version") != VERSION:
            continue
        beat = beats.get(d.get("name", ""))
        if beat is not None and beat > parse_time(d["published_at"]):
            d = {**d, "published_at": rfc3339(beat)}
        docs.append(d)
    return sorted(docs, key=lambda d: parse_time(d["published_at"]), reverse=True)
