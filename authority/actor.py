"""The authority actor: owns a substrate, delegates its inventory to brokers, redeems broker tickets into
leases by calling its substrate driver, extends, modifies and closes leases, and reaps expired ones on its
own clock.

A redeem or extension checks the ticket without calling the broker back: the signature with the public key
of the broker's certificate (brokers it trusts, by name), the term against the authority's *own* clock
(never a time the caller sends), and the units against what this authority delegated to that broker
(recorded in its own table when it delegates: units it never delegated, or more than a pool holds, are
refused). Each lease is kept in the store with the driver's record of the unit, and its units
are claimed as `leased:<unit>` (owner: `lease_owner` of the lease's id), so even two brokers promising one unit can never get it
leased twice. Redeem, extend and close are idempotent: a slice manager that lost an answer asks again and
gets the same lease. Leases are signed with the authority's key (its own, not the broker's or the AM's), so
the slice manager can check what it is given.

The authority delegates its own inventory: each delegation is a document signed with its key
(slicex/ticket.py `SignedDelegation`), which the broker verifies with the authority certificate's public key
before claiming anything. A deployment's authority delegates at its start (`Delegator`: retried with backoff
until the broker answers, so actors may start in any order) and on change (a host reclaimed for maintenance or
returned; parts added to the substrate are in the next start's delegation). An authority built without a
key sends its delegation unsigned, which only a broker of tests or tools accepts. One built without a
driver only delegates and reclaims (the operator's `slicex maintenance` command); redeeming needs a driver and
the store."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from authority.substrate.images import image_urn
from protocol.api import BrokerApi
from protocol.messages import Maintenance, SliverSpec
from slicex.clock import Clock
from slicex.codec import decode, encode
from slicex.errors import (
    BadArgs,
    CredentialInvalid,
    Expired,
    GeniError,
    Refused,
    SearchFailed,
    ServerError,
    TooBig,
    Unavailable,
    Unsupported,
)
from slicex.keyed_locks import KeyedLocks
from slicex.store import Store
from slicex.store.ownership import Actor, scoped
from slicex.ticket import (
    Lease,
    SignedDelegation,
    SignedReclaim,
    Ticket,
    lease_beside,
    lease_from,
    sign_delegation,
    sign_lease,
    sign_reclaim,
    verify_ticket,
)
from slicex.urn import parse_urn

if TYPE_CHECKING:
    from protocol.delegation import Delegation  # its inventory, as the broker is given it

log = logging.getLogger("slicex.authority")

LEASES = "authority-leases"
LEASE_VERSION = "authority-version"
DELEGATED = "authority-delegations"
"""What each authority delegated to each broker (key "<authority>|<broker>", names of pools and label sets):
the authority's own record, so a ticket is checked against what it gave, not what a broker says it has."""
NUMBERED = "authority-message-numbers"
"""The last number each authority gave a message (delegation or reclaim order) to each broker (same key)."""
DELEGATION_STATUS = "authority-delegation-status"
"""Whether each authority's delegation at its start reached its broker (same key): "delegated", "retrying"
with the last error, or "refused" with why it is not retried (`Delegator`; `slicex status` shows it)."""
LAYOUT = "authority-layout"  # the layout mark of a store made before deployment/migrations.py (which removes it)
NUMBER_EPOCH = 1_577_836_800  # 2020-01-01T00:00:00Z; a message's number is at least the seconds since then


# ---- the substrate driver seam -----------------------------------------------------------------------------------
class SubstrateDriver(Protocol):
    """The four things an authority asks of a substrate. `status` records are the driver's own JSON-able
    data about a unit; the authority stores them and hands them back. `create` and `destroy` may be asked
    twice for the same `spec.id` (an authority that crashed between the driver's answer and its own record
    asks again): doing it twice must leave one unit, or none. Calls for different slivers may run at the same
    time (one sliver's never overlap): a driver guards whatever it shares between slivers."""

    description: str

    def create(self, spec: SliverSpec, now: datetime) -> dict[str, Any]: ...

    def modify(self, spec: SliverSpec, status: dict[str, Any], action: str, now: datetime) -> dict[str, Any]: ...

    def destroy(self, spec: SliverSpec, status: dict[str, Any], now: datetime) -> None: ...

    def status(self, spec: SliverSpec, status: dict[str, Any], now: datetime) -> tuple[str, str]: ...


class EmulatedAdapter:
    """The emulated driver (authority/substrate/emulated.py) behind the SubstrateDriver protocol."""

    changes_on_its_own = False
    """A sliver's state moves only by the timed transition its lease record holds (booting, stopping): nothing
    a snapshot of the leases would miss between lease writes once those settle (operations/snapshot.py)."""

    def __init__(self, driver: Any):
        self.driver = driver
        self.description = driver.description

    def create(self, spec: SliverSpec, now: datetime) -> dict[str, Any]:
        no_storage(spec, self.description)
        return self.driver.provisioned(spec.kind, now)

    def modify(self, spec: SliverSpec, status: dict[str, Any], action: str, now: datetime) -> dict[str, Any]:
        return self.driver.act(status, spec.kind, spec.client_id, action, now, spec.details.get("boot_seconds"))

    def destroy(self, spec: SliverSpec, status: dict[str, Any], now: datetime) -> None:
        return None  # nothing was created

    def status(self, spec: SliverSpec, status: dict[str, Any], now: datetime) -> tuple[str, str]:
        return self.driver.current(status, now)


def no_storage(spec: SliverSpec, description: str) -> None:
    """For a driver without persistent datasets: a node asking for one is refused, never given none."""
    if spec.details.get("blockstores"):
        raise Unsupported(f"node {spec.client_id}: this aggregate's substrate has no persistent datasets "
                          f"(emulab:blockstore needs the netns substrate): {description}")


def as_driver(driver: Any) -> SubstrateDriver:
    return driver if hasattr(driver, "create") else EmulatedAdapter(driver)




# ---- the actor ----------------------------------------------------------------------------------------------------
def lease_owner(lease_id: str) -> str:
    """The owner of a lease's `leased:` claims: a short name of the lease id (the id, ~90 characters, was stored
    with each of its claims and in the owner index: issue 33). 96 bits of BLAKE2b: two leases never share one."""
    return "lease-" + hashlib.blake2b(lease_id.encode(), digest_size=12).hexdigest()  # no ":": not a claim key


_SPEC_DEFAULTS: dict[str, Any] = {"client_id": ""}


def packed(doc: dict[str, Any]) -> dict[str, Any]:
    """A lease's document as stored (issue 33: units once): the ticket whole (signed), the lease beside it
    (slicex/ticket.py `lease_beside`: only what differs), the spec without the units, labels and id the lease
    already holds. `lease_document` reads this and the whole form stored before."""
    ticket = decode(doc["ticket"], Ticket, "ticket")
    lease = decode(doc["lease"], Lease, "lease")
    spec = {k: v for k, v in doc["spec"].items() if k not in _SPEC_DEFAULTS or v != _SPEC_DEFAULTS[k]}
    if spec.get("units") == list(lease.units):
        del spec["units"]
    if spec.get("labels") == [list(lb) for lb in lease.labels]:
        del spec["labels"]
    if spec.get("id") == lease.reservation:
        del spec["id"]
    return {**doc, "lease": lease_beside(lease, ticket), "spec": {"packed": True, **spec}}


def lease_document(doc: dict[str, Any]) -> dict[str, Any]:
    spec = doc.get("spec") or {}
    if not spec.get("packed"):
        return doc
    lease = lease_from(doc["lease"], decode(doc["ticket"], Ticket, "ticket"))
    full = {"id": lease.reservation, "client_id": "", "units": list(lease.units), "labels": [list(lb) for lb in lease.labels],
            **{k: v for k, v in spec.items() if k != "packed"}}
    return {**doc, "lease": encode(lease), "spec": full}


class Authority:
    def __init__(self, name: str, driver: Any, broker_keys: dict[str, Any], store: Store | None = None,
                 key: Any = None, inventory: Delegation | None = None, clock: Clock | None = None,
                 broker: BrokerApi | None = None):
        self.name = name
        self.broker = broker  # its broker: what it delegated to at its start (`export_to`) or was wired with
        self.substrate = as_driver(driver) if driver is not None else None  # None: delegates only
        self.broker_keys = broker_keys  # broker name → public key of its certificate (tickets are checked with it)
        self.store = scoped(store, Actor.AUTHORITY)
        self.key = key  # signs leases when set
        self.inventory = inventory  # protocol.delegation.Delegation of everything it owns
        # Its own time: tickets are checked against it, never against a caller's `now`. Without one (pure
        # tests of the core) the `now` argument is the time.
        self.clock = clock
        self._unit_pool = {u: p.name for p in (inventory.pools if inventory else ()) for u in p.units}
        # One lease's redeem, extend, modify and close never overlap; different leases' run in parallel, driver
        # calls included (a driver guards its own shared state); units are taken with one atomic claim_all.
        self._leases = KeyedLocks()  # one lock per lease: never shared with another lease
        self._numbering = threading.Lock()  # the numbers of its messages to brokers
        self._last_number = 0  # without a store
        self.fault = lambda boundary: None  # fault injection (tests): called at internal boundaries

    # ---- delegation ------------------------------------------------------------------------------------------
    def delegate(self, broker: BrokerApi, names: list[str] | None = None) -> None:
        """Export inventory (all, or the named pools/label sets) to a broker, which claims it."""
        if self.inventory is None:
            raise BadArgs(f"authority {self.name} has no inventory to delegate")
        part = self.inventory if names is None else self.inventory.only(names)
        to = self._broker_name(broker)
        broker.accept(self._grant(part, to))
        self._record(to, set(self._delegated(to) or ()) | set(part.names()))

    def export_to(self, broker: BrokerApi) -> None:
        """Delegate everything this authority owns to `broker`, except what the operator reclaimed (a host in
        maintenance), which stays out across restarts; parts added to the substrate are delegated too."""
        if self.inventory is None:
            raise BadArgs(f"authority {self.name} has no inventory to delegate")
        self.broker = broker
        parked = set(broker.reclaimed(self.name))
        names = [n for n in self.inventory.names() if n not in parked]
        to = self._broker_name(broker)
        broker.accept(self._grant(self.inventory.only(names), to))
        self._record(to, set(names))  # exactly this: names parked since the last record are no longer delegated

    def reclaim(self, broker: BrokerApi, names: list[str], now: datetime) -> tuple[list[str], list[str]]:
        """Take inventory back from a broker (maintenance): (reclaimed now, still promised and draining)."""
        to = self._broker_name(broker)
        free, busy = broker.reclaim(self._order(names, to), now)
        held = self._delegated(to)
        if held is not None:
            self._record(to, set(held) - set(free))  # draining ones stay: their tickets are still good
        return free, busy

    def maintenance(self, host: str, back: bool, now: datetime) -> Maintenance:
        """The operator's order for one host (its component id): its pools leave the broker's inventory (what
        is promised drains as its tickets end) or come back; refused when the host has no pools here."""
        if self.broker is None:
            raise Unavailable(f"authority {self.name} has not delegated to a broker yet; try again once it has")
        pools = self.inventory.on(host) if self.inventory is not None else []
        if not pools:
            raise BadArgs(f"authority {self.name} owns no host {host}")
        if back:
            self.delegate(self.broker, pools)
            return Maintenance(host, True)
        free, busy = self.reclaim(self.broker, pools, self._now(now))
        return Maintenance(host, False, tuple(free), tuple(busy))

    def _grant(self, part: Delegation, to: str) -> SignedDelegation | Delegation:
        """The delegation message for `part` of the inventory: a SignedDelegation signed with this authority's
        key (what every deployment's broker requires), or the bare Delegation when it has no key."""
        part = replace(part, broker=to)
        if self.key is None:
            return part
        return sign_delegation(SignedDelegation(self.name, to, self._issued(), part.to_doc(), self._number(to)),
                               self.key)

    def _order(self, names: list[str], to: str) -> SignedReclaim:
        """The reclaim message: signed with this authority's key and numbered like its delegations (unsigned
        without a key: a broker that knows this authority's key refuses that)."""
        order = SignedReclaim(self.name, to, self._issued(), tuple(names), self._number(to))
        return sign_reclaim(order, self.key) if self.key is not None else order

    def _issued(self) -> datetime:
        return self.clock.now() if self.clock is not None else datetime.now(UTC).replace(microsecond=0)

    def _number(self, broker: str) -> int:
        """The next number of a message to `broker`: above every number this authority gave before (kept in
        its record, so across restarts and with the operator's `slicex maintenance` on the same store) and at
        least the wall clock's seconds since 2020 (an XML-RPC integer until 2088), so an authority whose store
        was lost still numbers above what the broker applied."""
        with self._numbering:
            key = f"{self.name}|{broker}"
            doc = self.store.get(NUMBERED, key) if self.store is not None else None
            number = max(int(time.time()) - NUMBER_EPOCH, self._last_number + 1,
                         int((doc or {}).get("sequence", 0)) + 1)
            self._last_number = number
            if self.store is not None:
                self.store.put(NUMBERED, key, {"authority": self.name, "broker": broker, "sequence": number})
            return number

    def _broker_name(self, broker: BrokerApi) -> str:
        """The name tickets from `broker` carry (a proxy to a remote broker: the inventory's broker)."""
        return getattr(broker, "name", None) or (self.inventory.broker if self.inventory else "")

    def _delegated(self, broker: str) -> list[str] | None:
        """Names this authority delegated to `broker`; None: no record of any."""
        if self.store is None:
            return None
        doc = self.store.get(DELEGATED, f"{self.name}|{broker}")
        return None if doc is None else list(doc["names"])

    def _record(self, broker: str, names: set[str]) -> None:
        if self.store is None:
            return  # an authority without a store keeps no record (it cannot redeem either)
        self.store.put(DELEGATED, f"{self.name}|{broker}", {"authority": self.name, "broker": broker,
                                                            "names": sorted(names)})

    # ---- checks ----------------------------------------------------------------------------------------------
    def _now(self, now: datetime | None) -> datetime:
        """The authority's time: its own clock when it has one (a deployment), else the caller's (pure tests)."""
        if self.clock is not None:
            return self.clock.now()
        if now is None:
            raise BadArgs(f"authority {self.name} has no clock and was given no time")
        return now

    def _verify(self, ticket: Ticket, now: datetime) -> None:
        """Refuse a ticket the trusted broker did not sign, that is not for this authority, outside its term
        by this authority's clock, or naming what this authority never delegated to that broker."""
        key = self.broker_keys.get(ticket.broker)
        if key is None:
            raise CredentialInvalid(f"authority {self.name} does not trust broker {ticket.broker}")
        verify_ticket(ticket, key)
        if ticket.authority and ticket.authority != self.name:
            raise Refused(f"ticket {ticket.id} is for authority {ticket.authority}, not {self.name}")
        if now >= ticket.end:
            raise Expired(f"ticket {ticket.id} expired at {ticket.end:%Y-%m-%dT%H:%M:%SZ} (authority {self.name}'s "
                          f"clock says {now:%Y-%m-%dT%H:%M:%SZ}); allocate again")
        if now < ticket.start:
            raise Refused(f"ticket {ticket.id} starts at {ticket.start:%Y-%m-%dT%H:%M:%SZ}; redeem it then")
        self._check_delegated(ticket)

    def _check_delegated(self, ticket: Ticket) -> None:
        """The ticket promises at least one unit, only units this authority delegated to its broker, each at
        most once."""
        names = set(self._delegated(ticket.broker) or ())
        never = f"which authority {self.name} never delegated to broker {ticket.broker}"
        if not names:
            raise Refused(f"ticket {ticket.id}: authority {self.name} has delegated nothing to broker {ticket.broker}")
        if not ticket.units:
            raise Refused(f"ticket {ticket.id} names no unit")
        if len(set(ticket.units)) != len(ticket.units):
            raise Refused(f"ticket {ticket.id} names a unit more than once")
        for u in ticket.units:
            where = self._unit_pool.get(u)
            if where is None and self.inventory is not None:  # a label: vlan:<switch>:<tag>
                prefix, _, value = u.rpartition(":")
                ls = next((x for x in self.inventory.label_sets if x.name == prefix), None)
                where = prefix if ls is not None and value.isdigit() and int(value) in ls else None
            if where is None or where not in names:
                raise Refused(f"ticket {ticket.id} names {u}, {never}")

    def _lease_lock(self, lease_id: str) -> AbstractContextManager[None]:
        return self._leases.one(lease_id)

    def _doc(self, lease_id: str) -> dict[str, Any] | None:
        doc = self.store.get(LEASES, lease_id) if self.store is not None else None
        return lease_document(doc) if doc is not None else None

    def _scan(self) -> list[dict[str, Any]]:
        return [lease_document(d) for d in self.store.scan(LEASES)]

    def _put(self, lease_id: str, doc: dict[str, Any]) -> None:
        """Store a lease filed in the time index under its end, in one write: the reaper finds it there."""
        self.store.put(LEASES, lease_id, packed(doc), due=decode(doc["lease"], Lease, "lease").end.timestamp())
        self._changed()

    def _changed(self) -> None:
        """Replace the leases' version (in the store: every process of this authority sees it)."""
        self.store.put(LEASE_VERSION, self.name, {"version": uuid.uuid4().hex})

    def version(self) -> str:
        """A token that changes whenever a lease is written or removed: the dashboard's snapshot of the
        leases is built again only when it changed."""
        doc = self.store.get(LEASE_VERSION, self.name) if self.store is not None else None
        return str(doc["version"]) if doc else ""

    # ---- redeem ----------------------------------------------------------------------------------------------
    def redeem(self, ticket: Ticket, spec: SliverSpec, now: datetime) -> tuple[Lease, dict[str, Any]]:
        """Turn a ticket into a lease: verify, take its units, ask the driver.
        Returns the lease and the driver's record."""
        now = self._now(now)
        if self.store is None or self.substrate is None:
            raise BadArgs(f"authority {self.name} keeps no leases (it was built to delegate only)")
        self._verify(ticket, now)
        with self._lease_lock(ticket.id):
            doc = self._doc(ticket.id)
            if doc is not None and doc["state"] == "active":
                return decode(doc["lease"], Lease, "lease"), doc["status"]  # asked again after a lost answer
            units, keys = self._take(ticket)
            lease = self._signed(Lease(ticket.id, self.name, ticket.id, ticket.holder, ticket.reservation, units,
                                       now, ticket.end, ticket.sequence, labels=ticket.labels))
            spec = msgspec.structs.replace(spec, units=units, labels=spec.labels or ticket.labels)
            self._put(lease.id, {"lease": encode(lease), "ticket": encode(ticket), "spec": encode(spec),
                                 "status": {}, "state": "creating"})
            self.fault("authority:leased")
            try:
                status = self.substrate.create(spec, now)
            except GeniError:
                self._forget(lease.id, keys)
                raise
            except Exception as exc:  # noqa: BLE001 - a driver failure becomes a reason, never a crash
                self._forget(lease.id, keys)
                raise ServerError(f"authority {self.name}: the substrate could not set up {spec.kind} "
                                  f"{spec.client_id or spec.id}: {exc}") from None
            self.fault("authority:created")
            self._put(lease.id, {"lease": encode(lease), "ticket": encode(ticket), "spec": encode(spec),
                                 "status": status, "state": "active"})
            return lease, status

    def _take(self, ticket: Ticket) -> tuple[tuple[str, ...], list[str]]:
        """Claim the units a ticket promises as leased: (units, claim keys); Refused if one is leased to
        someone else."""
        units = ticket.units
        keys = [f"leased:{u}" for u in units]
        mine = lease_owner(ticket.id)
        if not self.store.claim_all(keys, mine):
            other = next((o for k in keys if (o := self.store.owner_of(k)) not in (None, mine)), "?")
            raise Refused(f"authority {self.name}: a unit of ticket {ticket.id} is already leased to {other} "
                          f"(two promises of one unit: check the brokers this authority trusts)")
        return units, keys

    def _signed(self, lease: Lease) -> Lease:
        return sign_lease(lease, self.key) if self.key is not None else lease

    def _forget(self, lease_id: str, keys: list[str]) -> None:
        self.store.release_all(keys, lease_owner(lease_id))
        self.store.delete(LEASES, lease_id)
        self._changed()

    # ---- extend, modify, close ---------------------------------------------------------------------------------
    def extend_lease(self, lease: Lease | None, ticket: Ticket, now: datetime | None = None) -> Lease:
        """Move a lease's end to its extended ticket's end (the ticket must be newer than the lease and
        promise what the redeemed one promised)."""
        self._verify(ticket, self._now(now))
        with self._lease_lock(ticket.id):
            doc = self._doc(ticket.id)
            if doc is None:
                raise SearchFailed(f"authority {self.name}: no lease for ticket {ticket.id} (closed, reaped or "
                                   f"never redeemed); provision again")
            if doc["state"] != "active":
                raise SearchFailed(f"authority {self.name}: lease {ticket.id} is still being set up; retry")
            redeemed = decode(doc["ticket"], Ticket, "ticket")
            if (ticket.units, ticket.reservation) != (redeemed.units, redeemed.reservation):
                raise Refused(f"authority {self.name}: ticket {ticket.id} promises other units than the one redeemed "
                              f"into lease {ticket.id}; refused")
            current = decode(doc["lease"], Lease, "lease")
            if ticket.sequence < current.sequence:
                return current  # an older extension arriving late
            longer = self._signed(msgspec.structs.replace(current, end=ticket.end, sequence=ticket.sequence, signature=""))
            doc.update(lease=encode(longer), ticket=encode(ticket))
            self._put(longer.id, doc)
            return longer

    def modify(self, lease_id: str, action: str, now: datetime,
               properties: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """An operational action on a leased unit (ORCA modifyLease): the driver's new record. `properties`
        (ORCA's modify properties; e.g. the new `logins` of geni_update_users) replace those keys of the
        lease's details before the driver acts, and stay with the lease (a restart adopts them)."""
        with self._lease_lock(lease_id):
            doc = self._doc(lease_id)
            if doc is None or doc["state"] != "active":
                raise SearchFailed(f"authority {self.name}: no active lease {lease_id}")
            if properties:
                doc["spec"] = {**doc["spec"], "details": {**doc["spec"].get("details", {}), **properties}}
            status = self.substrate.modify(decode(doc["spec"], SliverSpec, "spec"), doc["status"], action, now)
            doc["status"] = status
            self._put(lease_id, doc)
            return status

    def view(self, lease_id: str) -> dict[str, Any]:
        """What the driver adds to the manifest of a leased unit (login endpoints, service results); empty
        for drivers that add nothing (without reading the lease: every Status asks)."""
        view = getattr(self.substrate, "view", None)
        doc = self._doc(lease_id) if view is not None else None
        if doc is None or doc["state"] != "active":
            return {}
        return view(decode(doc["spec"], SliverSpec, "spec"), doc["status"])

    def status(self, lease_id: str, now: datetime) -> tuple[str, str]:
        """(GENI operational state, error) of a leased unit, as of `now`."""
        doc = self._doc(lease_id)
        if doc is None or doc["state"] != "active":
            raise SearchFailed(f"authority {self.name}: no active lease {lease_id}")
        return self.substrate.status(decode(doc["spec"], SliverSpec, "spec"), doc["status"], now)

    def snapshot(self, lease_id: str, name: str, owner: str, public: bool, now: datetime) -> dict[str, Any]:
        """CreateImage of a leased node: its driver makes the image (one with no disks to copy answers
        UNSUPPORTED saying so); the answer is the image's catalogue record with its URN."""
        with self._lease_lock(lease_id):
            doc = self._doc(lease_id)
            if doc is None or doc["state"] != "active":
                raise SearchFailed(f"authority {self.name}: no active lease {lease_id}; provision the node first")
            snapshot = getattr(self.substrate, "snapshot", None)
            if snapshot is None:
                raise Unsupported(f"this aggregate's substrate cannot make images of its nodes: "
                                  f"{self.substrate.description}")
            image = snapshot(decode(doc["spec"], SliverSpec, "spec"), doc["status"], name, owner, public, self._now(now))
        return {**image.to_record(), "urn": image_urn(parse_urn(self.name).authority, image.name)}

    def lease_doc(self, lease_id: str) -> dict[str, Any] | None:
        return self._doc(lease_id)

    def close(self, lease_id: str, now: datetime) -> bool:
        """Tear a lease down and free its units; closing what is not (or no longer) leased is fine."""
        if self.store is None:
            return False
        with self._lease_lock(lease_id):
            doc = self._doc(lease_id)
            if doc is None:
                # a redeem that crashed before recording
                self.store.release_all(self.store.claims_of(lease_owner(lease_id)), lease_owner(lease_id))
                return False
            spec = decode(doc["spec"], SliverSpec, "spec")
            try:
                self.substrate.destroy(spec, doc["status"], now)
            except GeniError:
                raise
            except Exception as exc:  # noqa: BLE001
                raise ServerError(f"authority {self.name}: the substrate could not tear down {spec.kind} "
                                  f"{spec.client_id or spec.id}: {exc}; the close will be retried") from None
            self.fault("authority:destroyed")
            self._forget(lease_id, [f"leased:{u}" for u in spec.units])
            return True

    def live_slivers(self) -> list[tuple[SliverSpec, dict[str, Any]]]:
        """The spec and driver record of every active lease: what a driver that owns real objects reconciles
        the host against when it starts (remove what no lease holds, adopt the rest)."""
        if self.store is None:
            return []
        return [(decode(d["spec"], SliverSpec, "spec"), d["status"]) for d in self._scan()
                if d.get("state") == "active" and d["lease"]["authority"] == self.name]

    def leases(self) -> list[Lease]:
        if self.store is None:
            return []
        # each lease read beside its ticket (`lease_from`), not its whole document rebuilt: the dashboard's
        # snapshot reads every lease when one changes
        leases = (lease_from(d["lease"], decode(d["ticket"], Ticket, "ticket") if d["lease"].get("from_ticket") else None)
                  for d in self.store.scan(LEASES) if d.get("state") == "active")
        return [lease for lease in leases if lease.authority == self.name]

    def reap(self, now: datetime) -> list[str]:
        """Close every lease whose term has ended (the authority's clock; a slice manager that vanished
        does not keep units forever): the leases the time index files at or before `now` (active ones, and
        set-ups a crash interrupted), not every lease."""
        gone: list[str] = []
        if self.store is None:
            return gone
        for lease_id, _end in self.store.due(LEASES, now.timestamp()):
            d = self._doc(lease_id)
            if d is None:
                continue
            lease = decode(d["lease"], Lease, "lease")
            if lease.authority == self.name and lease.end <= now:
                self.close(lease.id, now)
                gone.append(lease.id)
        return gone

    def expired(self, lease_end: datetime, now: datetime) -> bool:
        return now >= lease_end


class Delegator:
    """Delegates an authority's inventory to its broker when the authority starts (`export_to`), retrying
    with backoff until the broker answers: in the distributed deployment the authority may start before its
    broker, or the broker may be restarting. One attempt runs at once (`start` returns after it), the rest in
    a background thread until one succeeds or `stop` is called. A delegation too large for one request
    (TooBig) is never retried: sending it again cannot succeed, so it is logged as an error and recorded
    (DELEGATION_STATUS, which `slicex status` shows) with its size and the limit."""

    def __init__(self, authority: Authority, broker: BrokerApi, first_delay: float = 0.5, max_delay: float = 30.0):
        self.authority = authority
        self.broker = broker
        self.first_delay = first_delay
        self.max_delay = max_delay
        self.done = threading.Event()  # set once the broker accepted
        self.last_error = ""
        self.refused = ""  # why the delegation can never be sent as it is (no more attempts); "" otherwise
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def attempt(self) -> bool:
        """Delegate once; False (with `last_error`, and `refused` when retrying cannot help) when the broker
        did not take it."""
        try:
            self.authority.export_to(self.broker)
        except TooBig as exc:
            self.last_error = self.refused = exc.message
            log.error("authority %s cannot delegate its inventory to broker %s: %s. It will not retry: split the "
                      "substrate over more aggregates (each its own authority) so each delegation fits",
                      self.authority.name, self._to(), exc.message)
            self._note("refused", exc.message)
            return False
        except (GeniError, OSError) as exc:
            self.last_error = getattr(exc, "message", None) or str(exc)
            self._note("retrying", self.last_error)
            return False
        self.last_error = ""
        self.done.set()
        self._note("delegated", "")
        log.info("authority %s delegated its inventory to broker %s", self.authority.name, self._to())
        return True

    def start(self) -> bool:
        """Delegate now; when that fails, keep trying in the background (unless it was refused for good). True
        if the first attempt succeeded."""
        if self.attempt():
            return True
        if self.refused:
            return False
        log.warning("authority %s could not delegate to its broker yet (%s); retrying", self.authority.name,
                    self.last_error)
        self._thread = threading.Thread(target=self._retry, name="authority-delegation", daemon=True)
        self._thread.start()
        return False

    def _retry(self) -> None:
        delay = self.first_delay
        while not self._stop.wait(delay):
            if self.attempt() or self.refused:
                return
            log.warning("authority %s: delegation to its broker failed (%s); next try in %.1f s",
                        self.authority.name, self.last_error, min(delay * 2, self.max_delay))
            delay = min(delay * 2, self.max_delay)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _to(self) -> str:
        return self.authority._broker_name(self.broker)

    def _note(self, state: str, error: str) -> None:
        """Record the delegation's state for the operator (a store outage must not stop the attempts)."""
        store = self.authority.store
        if store is None:
            return
        key = f"{self.authority.name}|{self._to()}"
        try:
            old = store.get(DELEGATION_STATUS, key)
            if old is not None and (old.get("state"), old.get("error")) == (state, error):
                return  # each retry failing alike writes nothing
            store.put(DELEGATION_STATUS, key, {"authority": self.authority.name, "broker": self._to(),
                                               "state": state, "error": error,
                                               "at": self.authority._issued().strftime("%Y-%m-%dT%H:%M:%SZ")})
        except (GeniError, OSError) as exc:
            log.warning("authority %s: could not record its delegation's state (%s)", self.authority.name, exc)
