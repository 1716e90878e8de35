"""The slice manager actor (ORCA SM), embedded: turns AM API calls into ticket → redeem → extend → close.

Each sliver is a reservation (am.reservation) persisted in the store before every actor call, so a crash at
any message boundary leaves a record the reaper drives to a final state: pending operations time out, and
a failed or closed reservation gives back everything it held. Allocate asks the broker for signed tickets
(units claimed atomically, all or nothing, under a policy); Provision redeems them at the authority for
leases; Renew extends ticket then lease; Delete closes. Everything a sliver holds is released on delete and
on expiry, by whoever notices first (a call or the reaper)."""

from __future__ import annotations

import threading
import uuid
from datetime import datetime, timedelta
from typing import Any

from am import reservation as rs
from am import slice_manager as sm
from am.authority import Authority
from am.embed import plan
from am.slice_manager import Sliver
from am.substrate.emulated import ALLOWED_ACTIONS, EmulatedDriver
from rspec.manifest import SliverView
from rspec.request import Request
from rspec.substrate import Substrate
from slicex.clock import parse_time, rfc3339
from slicex.errors import Busy, GeniError, SearchFailed, Unsupported
from slicex.store import Store
from slicex.ticket import Ticket

SLIVERS = "slivers"
REQUESTS = "requests"
SLICES = "slices"
PLAN_RETRIES = 5


class Crash(BaseException):
    """Raised by a fault-injection hook to stop an actor dead at a message boundary (tests only)."""


def _res(s: Sliver) -> rs.Reservation:
    d = s.details.get("reservation") or {}
    since = d.get("pending_since")
    return rs.Reservation(s.urn, d.get("state", rs.NASCENT), d.get("pending", rs.NONE),
                          parse_time(since) if since else None, int(d.get("sequence", 0)), d.get("reason", ""))


def _put_res(s: Sliver, r: rs.Reservation) -> None:
    s.details["reservation"] = {"state": r.state, "pending": r.pending, "sequence": r.sequence, "reason": r.reason,
                                "pending_since": rfc3339(r.pending_since) if r.pending_since else None}


def _to_doc(s: Sliver) -> dict[str, Any]:
    return {"urn": s.urn, "slice_urn": s.slice_urn, "client_id": s.client_id, "kind": s.kind,
            "allocation_state": s.allocation_state, "operational_state": s.operational_state,
            "expires": rfc3339(s.expires), "error": s.error, "component_id": s.component_id,
            "owner_urn": s.owner_urn, "details": s.details}


def _from_doc(d: dict[str, Any]) -> Sliver:
    return Sliver(d["urn"], d["slice_urn"], d["client_id"], d["kind"], d["allocation_state"],
                  d["operational_state"], parse_time(d["expires"]), d.get("error", ""), d.get("component_id", ""),
                  d.get("owner_urn", ""), d.get("details", {}))


class EmbeddedSliceManager:
    def __init__(self, store: Store, substrate: Substrate, driver: EmulatedDriver, image_policy: str = "reject",
                 bitstreams: Any = None, fpga_backend: Any = None, broker: Any = None, authority: Any = None,
                 policy: Any = None, fault: Any = None):
        if broker is None:
            broker, authority = _default_actors(store, driver)
        self.broker = broker
        self.authority = authority
        self.policy = policy
        self.fault = fault or (lambda boundary: None)  # fault injection: called at every message boundary
        self.bitstreams = bitstreams  # fpga_aggregate.bitstreams.BitstreamCatalogue, if FPGA boards are offered
        self.fpga_backend = fpga_backend  # fpga_aggregate.backend.FpgaBackend
        self.store = store
        self.substrate = substrate
        self.driver = driver
        self.image_policy = image_policy
        self._lock = threading.RLock()

    # ---- helpers -------------------------------------------------------------------------------------------
    def _sliver_urn(self) -> str:
        return f"urn:publicid:IDN+{self.substrate.authority}+sliver+{uuid.uuid4().hex[:16]}"

    def _save(self, s: Sliver) -> None:
        self.store.put(SLIVERS, s.urn, _to_doc(s))

    def _refresh(self, s: Sliver, now: datetime) -> Sliver:
        """Apply timed operational transitions and expiry as of `now`."""
        if s.allocation_state == sm.PROVISIONED and "op" in s.details:
            state, error = self.driver.current(s.details["op"], now)
            if state != s.operational_state or (error and error != s.error):
                s.operational_state = state
                s.error = error or s.error
                self._save(s)
        return s

    def _load(self, urn: str) -> Sliver | None:
        doc = self.store.get(SLIVERS, urn)
        return _from_doc(doc) if doc else None

    def _release(self, s: Sliver) -> None:
        if self.fpga_backend is not None and s.details.get("sliver_type") == "fpga-bitstream" and \
                s.allocation_state == sm.PROVISIONED:
            from fpga_aggregate.boards import boards_from_config

            fpgas = {f.id: f for b in boards_from_config(self.substrate.fpga_boards) for f in b.fpgas}
            if s.details.get("fpga") in fpgas:
                self.fpga_backend.release(fpgas[s.details["fpga"]])
        self._relinquish(s)
        self.store.delete(SLIVERS, s.urn)

    def _relinquish(self, s: Sliver) -> None:
        """Give back everything the reservation's ticket group holds (idempotent)."""
        owner = s.details.get("claim_owner", s.urn)
        for key in s.details.get("keys", []):
            self.store.release(key, owner)

    # ---- SliceManager --------------------------------------------------------------------------------------
    def allocate(self, slice_urn: str, owner_urn: str, request: Request, end: datetime,
                 now: datetime) -> list[Sliver]:
        with self._lock:
            self.reap(now)
            for _attempt in range(PLAN_RETRIES):
                group = f"ticket:{uuid.uuid4().hex}"
                used = set(self.store.all_claims().keys()) | self._out_of_inventory()
                placements = plan(self.substrate, request, used, self.image_policy, self._bitstream_parts(owner_urn),
                                  self.policy)
                slivers = []
                for p in placements:  # the reservations exist, pending Ticketing, before the broker is asked
                    s = Sliver(self._sliver_urn(), slice_urn, p.client_id, p.kind, sm.ALLOCATED,
                               sm.PENDING_ALLOCATION, end, "", p.component_id, owner_urn,
                               {**p.details, "keys": list(p.keys), "claim_owner": group,
                                "allocated_at": rfc3339(now)})
                    r, _ = rs.demand(rs.Reservation(s.urn), now)
                    _put_res(s, r)
                    self._save(s)
                    slivers.append(s)
                self.fault("ticket:pending")
                try:
                    tickets = self.broker.ticket(slice_urn, {s.urn: s.details["keys"] for s in slivers}, now, end,
                                                 group=group)
                except GeniError as exc:
                    # failedRPC: give back whatever the group may hold (the answer may have been lost) and
                    # forget the reservations; a lost race re-plans, anything else reaches the user
                    for s in slivers:
                        self._relinquish(s)
                        self.store.delete(SLIVERS, s.urn)
                    if isinstance(exc, Busy):
                        continue
                    raise
                self.fault("ticket:granted")
                break
            else:
                raise Busy("resources changed under this request five times in a row; try again")
            key = f"{slice_urn}#{rfc3339(now)}-{uuid.uuid4().hex[:8]}"
            self.store.put(REQUESTS, key, {"key": key, "slice_urn": slice_urn, "xml": request.xml,
                                           "client_ids": [p.client_id for p in placements]})
            for s in slivers:
                t = tickets[s.urn]
                r, _ = rs.on_update(_res(s), "ticket", True, t.sequence, now)
                _put_res(s, r)
                s.details["ticket"] = t.to_doc()
                self._save(s)
            return slivers

    def _out_of_inventory(self) -> set[str]:
        """Units the authority reclaimed from the broker (maintenance): never planned onto."""
        reclaimed = getattr(self.broker, "reclaimed", None)
        if reclaimed is None:
            return set()
        from am.embed import keys_under

        return keys_under(self.substrate, set(reclaimed(getattr(self.authority, "name", ""))))

    def _bitstream_parts(self, owner_urn: str) -> dict[str, str]:
        if self.bitstreams is None:
            return {}
        return {b.ref: b.part for b in self.bitstreams.list(owner_urn)}

    def provision(self, sliver_urns: list[str], end: datetime, users: list[dict[str, Any]],
                  now: datetime) -> list[Sliver]:
        with self._lock:
            out = []
            slivers = [self._require(urn, now) for urn in sliver_urns]
            self._program_fpgas([s for s in slivers if s.allocation_state == sm.ALLOCATED])
            for s in slivers:
                if s.allocation_state == sm.ALLOCATED:
                    r, _ = rs.redeem(_res(s), now)
                    _put_res(s, r)
                    self._save(s)
                    self.fault("redeem:pending")
                    lease, op = self.authority.redeem(Ticket.from_doc(s.details["ticket"]), s.kind, now)
                    self.fault("redeem:granted")
                    r, _ = rs.on_update(r, "lease", True, lease.sequence, now)
                    _put_res(s, r)
                    s.allocation_state = sm.PROVISIONED
                    s.details["op"] = op
                    s.operational_state = op["state"]
                    s.details["provisioned_at"] = rfc3339(now)
                s.expires = end
                if s.kind == "node":
                    self._set_users(s, users)
                    self._add_interface_details(s)
                self._save(s)
                out.append(s)
            return out

    def _program_fpgas(self, slivers: list[Sliver]) -> None:
        """Program the FPGAs of newly provisioned bitstream slivers together; their boot takes that long."""
        wanted = [s for s in slivers if s.details.get("sliver_type") == "fpga-bitstream"]
        if not wanted or self.fpga_backend is None or self.bitstreams is None:
            return
        from fpga_aggregate.boards import boards_from_config

        fpgas = {f.id: f for b in boards_from_config(self.substrate.fpga_boards) for f in b.fpgas}
        jobs = [(fpgas[s.details["fpga"]], self.bitstreams.get(s.owner_urn, s.details["bitstream"]).path)
                for s in wanted]
        seconds = self.fpga_backend.program(jobs)
        for s in wanted:
            s.details["boot_seconds"] = seconds

    def _set_users(self, s: Sliver, users: list[dict[str, Any]]) -> None:
        host = f"{s.client_id}.{s.slice_urn.split('+')[-1]}.{self.substrate.authority}".lower()
        logins = []
        for n, u in enumerate(users):
            name = str(u.get("urn", "")).split("+")[-1] or f"user{n}"
            logins.append({"username": name, "hostname": host, "port": 22, "keys": list(u.get("keys", []))})
        s.details["logins"] = logins
        s.details["hostname"] = host

    def _add_interface_details(self, s: Sliver) -> None:
        from am.embed import mac_for

        links = [_from_doc(d) for d in self.store.scan(SLIVERS) if d["slice_urn"] == s.slice_urn and d["kind"] == "link"]
        for cid, info in s.details.get("interfaces", {}).items():
            info["sliver_id"] = f"{s.urn}:{cid}"
            info["mac_address"] = mac_for(s.urn, cid)
            if not info.get("ip"):
                for lk in links:
                    refs = lk.details.get("interface_refs", [])
                    if cid in refs:
                        info["ip"] = f"{lk.details['subnet']}.{refs.index(cid) + 1}"
                        info["netmask"] = "255.255.255.0"

    def renew(self, sliver_urns: list[str], end: datetime, now: datetime, best_effort: bool) -> list[Sliver]:
        with self._lock:
            out = []
            for urn in sliver_urns:
                s = self._require(urn, now)
                if _res(s).terminal or _res(s).state not in (rs.TICKETED, rs.ACTIVE):
                    s.error = f"cannot renew: reservation is {_res(s).state}"
                    out.append(s)
                    continue
                r, _ = rs.extend(_res(s), now)
                _put_res(s, r)
                self._save(s)
                self.fault("extend:pending")
                ticket = self.broker.extend_ticket(Ticket.from_doc(s.details["ticket"]), end)
                r, msgs = rs.on_update(r, "ticket", True, ticket.sequence, now)
                s.details["ticket"] = ticket.to_doc()
                if any(m.kind == "extendLease" for m in msgs):
                    _put_res(s, r)
                    self._save(s)
                    self.fault("extend:ticketed")
                    lease = self.authority.extend_lease(None, ticket)
                    r, _ = rs.on_update(r, "lease", True, lease.sequence, now)
                _put_res(s, r)
                s.expires = end
                s.error = ""
                self._save(s)
                out.append(s)
            return out

    def perform(self, sliver_urns: list[str], action: str, now: datetime, best_effort: bool,
                users: list[dict[str, Any]]) -> list[Sliver]:
        if action not in sm.ACTIONS:
            raise Unsupported(f"operational action {action!r} is not supported here; supported: "
                              f"{', '.join(sm.ACTIONS)}")
        with self._lock:
            slivers = [self._refresh(self._require(u, now), now) for u in sliver_urns]
            problems = []
            for s in slivers:
                if s.allocation_state != sm.PROVISIONED:
                    problems.append(f"{s.client_id} ({s.urn}) is {s.allocation_state}; provision it first")
                elif s.operational_state not in ALLOWED_ACTIONS[action]:
                    problems.append(f"{s.client_id} is {s.operational_state}; {action} needs one of "
                                    f"{', '.join(sorted(ALLOWED_ACTIONS[action]))}")
            if problems and not best_effort:
                from slicex.errors import BadArgs

                raise BadArgs(f"cannot {action}: " + "; ".join(problems))
            for s in slivers:
                if s.allocation_state != sm.PROVISIONED or s.operational_state not in ALLOWED_ACTIONS[action]:
                    s.error = (f"cannot {action} while {s.operational_state}"
                               if s.allocation_state == sm.PROVISIONED else f"cannot {action}: not provisioned")
                    continue
                s.details["op"] = self.driver.act(s.details.get("op", {}), s.kind, s.client_id, action, now,
                                                  s.details.get("boot_seconds"))
                s.operational_state = self.driver.current(s.details["op"], now)[0]
                s.error = ""
                if action == "geni_update_users" and s.kind == "node":
                    self._set_users(s, users)
                self._save(s)
            return slivers

    def delete(self, sliver_urns: list[str], now: datetime) -> list[Sliver]:
        with self._lock:
            out = []
            for urn in sliver_urns:
                s = self._require(urn, now)
                r, _ = rs.close(_res(s), now)
                _put_res(s, r)
                self._save(s)
                self.fault("close:pending")
                self._release(s)
                s.allocation_state = sm.UNALLOCATED
                s.operational_state = sm.PENDING_ALLOCATION
                out.append(s)
            self._forget_requests()
            return out

    def _forget_requests(self) -> None:
        live = {(d["slice_urn"], d["client_id"]) for d in self.store.scan(SLIVERS)}
        for doc in self.store.scan(REQUESTS):
            if not any((doc["slice_urn"], c) in live for c in doc["client_ids"]):
                self.store.delete(REQUESTS, doc["key"])

    def slivers(self, slice_urn: str, now: datetime) -> list[Sliver]:
        with self._lock:
            self.reap(now)
            out = [self._refresh(_from_doc(d), now) for d in self.store.scan(SLIVERS) if d["slice_urn"] == slice_urn]
            return sorted(out, key=lambda s: s.client_id)

    def sliver(self, sliver_urn: str, now: datetime) -> Sliver | None:
        with self._lock:
            self.reap(now)
            s = self._load(sliver_urn)
            return self._refresh(s, now) if s else None

    def _require(self, urn: str, now: datetime) -> Sliver:
        s = self.sliver(urn, now)
        if s is None:
            raise SearchFailed(f"no sliver {urn} here (deleted, expired or never allocated)")
        return s

    def shutdown(self, slice_urn: str, now: datetime) -> None:
        with self._lock:
            self.store.put(SLICES, slice_urn, {"slice_urn": slice_urn, "shutdown": True, "at": rfc3339(now)})
            for s in self.slivers(slice_urn, now):
                if s.allocation_state == sm.PROVISIONED:
                    s.details["op"] = {"state": "geni_notready", "since": rfc3339(now), "until": None, "then": None}
                    s.operational_state = "geni_notready"
                    s.error = "slice shut down by operator"
                    self._save(s)

    def is_shut_down(self, slice_urn: str) -> bool:
        doc = self.store.get(SLICES, slice_urn)
        return bool(doc and doc.get("shutdown"))

    def request_of(self, slice_urn: str) -> list[Request]:
        docs = [d for d in self.store.scan(REQUESTS) if d["slice_urn"] == slice_urn]
        return [Request((), (), d["xml"]) for d in docs]

    def views(self, slivers: list[Sliver]) -> list[SliverView]:
        return [SliverView(s.client_id, s.urn, s.kind, s.component_id, s.details) for s in slivers]

    def reap(self, now: datetime) -> list[str]:
        """Release every sliver whose expiry has passed, finish interrupted closes, and fail reservations
        stuck pending past their deadline (releasing what they hold); return the URNs released."""
        with self._lock:
            gone = []
            for d in self.store.scan(SLIVERS):
                s = _from_doc(d)
                r = _res(s)
                if parse_time(d["expires"]) <= now or r.pending == rs.CLOSING:
                    self._release(s)
                    gone.append(d["urn"])
                    continue
                after, msgs = rs.on_tick(r, now)
                if after != r:
                    _put_res(s, after)
                    if after.state == rs.FAILED:
                        self._relinquish(s)
                        s.details["keys"] = []
                        s.operational_state = sm.FAILED
                        s.error = after.reason
                    self._save(s)
            if gone:
                self._forget_requests()
            return gone

    def reservations(self) -> list[rs.Reservation]:
        return [_res(_from_doc(d)) for d in self.store.scan(SLIVERS)]

    def usage_keys(self) -> set[str]:
        return set(self.store.all_claims().keys())


def default_allocation_lifetime() -> timedelta:
    return timedelta(minutes=10)


def _default_actors(store: Store, driver: Any) -> tuple[Any, Any]:
    """An in-process broker and authority with a fresh signing key (embedded deployment)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    from broker.broker import Broker

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    broker = Broker("broker", store, pem)
    return broker, Authority("authority", driver, {"broker": key.public_key()})
