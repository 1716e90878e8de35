"""Kill an actor at every message boundary of ticket, redeem, extend and close (and inside the broker and the
authority between their store writes), bring it back from the store, and check that everything converges:
nothing pending, no leaked units, tags, tickets or leases, what survives is exactly what is held, and it
can all be closed cleanly. On SQLite and on a real Redis.

A crash is a BaseException raised at the boundary: the actor object is dropped mid-call with whatever it had
persisted, and a new one is built over the same store (as a restarted process would be)."""

from __future__ import annotations

import os
import uuid
from collections import Counter
from datetime import timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from authority.actor import LEASES, Authority, lease_owner
from authority.substrate.emulated import EmulatedDriver
from broker.broker import TICKETS, Broker
from resources import export_substrate
from rspec.request import parse_request
from rspec.substrate import default_substrate
from slice_manager import reservation as rs
from slice_manager.actor import ActorSliceManager, Crash
from slicex.clock import ManualClock
from slicex.store.sqlite_store import SqliteStore
from tests.factories import three_node_lan
from tests.store_indexes import assert_indexes_match

SLICE = "urn:publicid:IDN+t.org+slice+crash"
SUB = default_substrate("t.org")
AUTH = "urn:publicid:IDN+t.org+authority+am"
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
REDIS_URL = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/15")

SM_BOUNDARIES = [f"{kind}:{when}" for kind in ("ticket", "extendTicket", "redeem", "extendLease", "relinquish", "close")
                 for when in ("pending", "answered")]
ACTOR_BOUNDARIES = ["broker:claimed", "broker:extended", "broker:relinquishing", "authority:leased",
                    "authority:created", "authority:destroyed"]


class World:
    """The three actors over one store; `restart` rebuilds the named ones from it."""

    def __init__(self, store, hook):
        self.store = store
        self.hook = hook
        self.broker = self.authority = self.sm = None
        self.restart({"broker", "authority", "sm"}, first=True)

    def restart(self, victims: set[str], first: bool = False) -> None:
        if "broker" in victims:
            self.broker = Broker("broker", self.store, KEY, authority=AUTH)
        if "authority" in victims:
            self.authority = Authority(AUTH, EmulatedDriver(SUB), {"broker": KEY.public_key()}, store=self.store,
                                       key=KEY, inventory=export_substrate(SUB, AUTH, "broker"))
        if first:
            self.authority.delegate(self.broker)
        self.broker.fault = self.authority.fault = self.hook
        self.sm = ActorSliceManager(self.store, SUB, self.broker, self.authority, name="sm", fault=self.hook)
        if not first:
            self.broker.fault = self.authority.fault = lambda b: None
            self.sm.fault = lambda b: None


def scenario(w: World, clock: ManualClock) -> None:
    """ticket → extend (provision) → redeem → extend ticket + lease (renew) → relinquish + close (delete)."""
    now = clock.now()
    slivers = w.sm.allocate(SLICE, "o", parse_request(three_node_lan()), now + timedelta(minutes=10), now)
    urns = [s.urn for s in slivers]
    w.sm.provision(urns, now + timedelta(hours=2), [], now)
    w.sm.renew(urns, now + timedelta(hours=3), now, False)
    w.sm.delete(urns, now)


def converged(w: World, store) -> None:
    records = w.sm.records()
    assert [(r.id, r.r.pending) for r in records if r.r.pending != rs.NONE] == [], "stuck pending"
    assert [r.id for r in records if r.outbox] == [], "undelivered messages"
    held = [r for r in records if r.r.state in rs.HOLDS_TICKET]
    assert {r.r.state for r in records} <= {rs.TICKETED, rs.ACTIVE, rs.FAILED}
    claims = store.all_claims()
    units = {k: g for k, g in claims.items() if not k.startswith("leased:")}
    leased = {k[len("leased:"):]: g for k, g in claims.items() if k.startswith("leased:")}
    assert units == {u: r.ticket.group for r in held for u in r.ticket.units}, "units held by nobody, or lost"
    active = [r for r in records if r.r.state in rs.HOLDS_LEASE]
    assert leased == {u: lease_owner(r.lease.id) for r in active for u in r.lease.units}, "leases held by nobody, or lost"
    assert {d["lease"]["id"] for d in store.scan(LEASES)} == {r.lease.id for r in active}
    assert {d["ticket"]["id"] for d in store.scan(TICKETS)} == {r.ticket.id for r in held}
    assert set(w.broker.calendar.bookings) <= {r.ticket.id for r in held}, "broker promises nobody holds"
    # a restarted broker books a started ticket when a call touches its group (the store's claims hold it)
    assert {r.ticket.id for r in held if w.broker._all_loaded or r.ticket.group in w.broker._groups_loaded} \
        <= set(w.broker.calendar.bookings), "broker forgot promises"
    for r in records:
        if r.r.state == rs.FAILED:
            assert r.r.reason, "a failure without a reason"
    assert_indexes_match(store, w.broker)  # a kill at any boundary leaves every index and counter with the documents
    for s in w.sm.slivers(SLICE, w.clock.now()):  # what users see is what is held
        rec = next(r for r in records if r.id == s.urn)
        assert (s.allocation_state == "geni_provisioned") == (rec.r.state in rs.HOLDS_LEASE or rec.provisioned)


def run(store, boundary: str, occurrence: int, victims: set[str] | None) -> None:
    counts: Counter = Counter()

    def hook(b: str) -> None:
        counts[b] += 1
        if b == boundary and counts[b] == occurrence:
            raise Crash(b)

    clock = ManualClock()
    w = World(store, hook)
    w.clock = clock
    try:
        scenario(w, clock)
    except Crash:
        pass
    else:
        pytest.fail(f"{boundary} #{occurrence} never happened ({dict(counts)})")
    if victims is None:  # the actor whose boundary it was
        victims = {"sm"} | ({boundary.split(":")[0]} if boundary in ACTOR_BOUNDARIES else set())
    w.restart(victims)
    w.sm.recover(clock.now())
    converged(w, store)
    clock.advance(timedelta(minutes=10))  # past every pending deadline
    w.sm.reap(clock.now())
    converged(w, store)
    w.sm.delete([r.id for r in w.sm.records() if not r.discard], clock.now()) if w.sm.slivers(SLICE, clock.now()) \
        else None
    clock.advance(timedelta(minutes=10))
    w.sm.reap(clock.now())
    assert store.all_claims() == {} and store.scan(LEASES) == [] and store.scan(TICKETS) == []
    assert w.sm.records() == [] and w.broker.calendar.bookings == {}


def occurrences() -> dict[str, int]:
    """How often each boundary happens in one clean run of the scenario."""
    counts: Counter = Counter()
    w = World(SqliteStore(":memory:"), lambda b: counts.update([b]))
    w.clock = ManualClock()
    scenario(w, w.clock)
    return dict(counts)


COUNTS = occurrences()
CASES = [(b, k) for b in SM_BOUNDARIES + ACTOR_BOUNDARIES for k in sorted({1, COUNTS.get(b, 0)}) if k]


def test_every_boundary_happens_in_the_scenario():
    assert set(COUNTS) == set(SM_BOUNDARIES + ACTOR_BOUNDARIES)


@pytest.mark.parametrize("boundary,occurrence", CASES)
def test_crash_at_a_boundary_converges(tmp_path, boundary, occurrence):
    run(SqliteStore(str(tmp_path / "s.db")), boundary, occurrence, None)


@pytest.mark.parametrize("boundary", SM_BOUNDARIES + ACTOR_BOUNDARIES)
def test_the_whole_process_killed_at_a_boundary_converges(tmp_path, boundary):
    """The embedded deployment: all actors are one process and die together."""
    run(SqliteStore(str(tmp_path / "s.db")), boundary, COUNTS[boundary], {"broker", "authority", "sm"})


@pytest.mark.parametrize("boundary,occurrence", [(b, COUNTS[b]) for b in SM_BOUNDARIES + ACTOR_BOUNDARIES])
def test_crash_at_a_boundary_converges_on_real_redis(boundary, occurrence):
    from slicex.store.redis_store import RedisStore

    store = RedisStore(REDIS_URL, prefix=f"crash-{uuid.uuid4().hex[:8]}")
    try:
        run(store, boundary, occurrence, None)
    finally:
        store.flush()
