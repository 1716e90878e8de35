"""Random sequences of Allocate, Provision, Renew, Delete, the clock passing (the reaper's tick) and restarts of
every actor, on SQLite and on a real Redis: after each step, every index the store keeps (records and leases by
the time the clock next has work on them, records by slice, Redis's key index) equals a full recomputation from
the documents, and after a reaper pass nothing is left due."""

from __future__ import annotations

import os
import uuid
from datetime import timedelta

from cryptography.hazmat.primitives.asymmetric import rsa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from authority.actor import LEASES, Authority
from authority.substrate.emulated import EmulatedDriver
from broker.broker import Broker
from resources import export_substrate
from rspec.request import parse_request
from rspec.substrate import default_substrate
from slice_manager.actor import ActorSliceManager
from slice_manager.records import RESERVATIONS
from slicex.clock import ManualClock
from slicex.errors import GeniError
from slicex.store.sqlite_store import SqliteStore
from tests.factories import request_rspec, vm
from tests.store_indexes import assert_indexes_match

SUB = default_substrate("t.org")
AUTH = "urn:publicid:IDN+t.org+authority+am"
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
REDIS_URL = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/15")
SLICES = [f"urn:publicid:IDN+t.org+slice+p{i}" for i in range(2)]
MIN = timedelta(minutes=1)


class World:
    def __init__(self, store):
        self.store = store
        self.clock = ManualClock()
        self.start(first=True)

    def start(self, first: bool = False) -> None:
        """Build every actor again over the same store (a restart: nothing but the store carries over)."""
        self.broker = Broker("broker", self.store, KEY, authority=AUTH)
        self.authority = Authority(AUTH, EmulatedDriver(SUB), {"broker": KEY.public_key()}, store=self.store,
                                   key=KEY, inventory=export_substrate(SUB, AUTH, "broker"))
        if first:
            self.authority.delegate(self.broker)
        self.sm = ActorSliceManager(self.store, SUB, self.broker, self.authority, name="sm")
        self.sm.reap(self.clock.now())  # what a deployment's start does before it answers

    def live(self, slice_urn: str) -> list[str]:
        return [s.urn for s in self.sm.slivers(slice_urn, self.clock.now())]


def step(w: World, op: tuple) -> None:
    now = w.clock.now()
    kind, which, minutes = op
    slice_urn = SLICES[which]
    try:
        if kind == "allocate":
            nodes = [vm(f"n{i}") for i in range(1 + minutes % 2)]
            w.sm.allocate(slice_urn, "o", parse_request(request_rspec(nodes)), now + minutes * MIN, now)
        elif kind == "provision" and w.live(slice_urn):
            w.sm.provision(w.live(slice_urn), now + 2 * minutes * MIN, [], now)
        elif kind == "renew" and w.live(slice_urn):
            slivers = w.sm.slivers(slice_urn, now)
            w.sm.renew([s.urn for s in slivers], max(s.expires for s in slivers) + minutes * MIN, now, True)
        elif kind == "delete" and w.live(slice_urn):
            w.sm.delete(w.live(slice_urn), now)
        elif kind == "tick":
            w.clock.advance(minutes * MIN)
            w.sm.reap(w.clock.now())
        elif kind == "restart":
            w.start()
    except GeniError:
        pass  # refused (no room, a term out of range, a sliver not yet allocated): the indexes must still hold


OPS = st.tuples(st.sampled_from(["allocate", "provision", "renew", "delete", "tick", "tick", "restart"]),
                st.integers(0, len(SLICES) - 1), st.integers(1, 40))


def check(w: World, reaped: bool) -> None:
    """The indexes equal their recomputation; after a reaper pass (`reaped`) nothing is left due at or before
    the clock: every expiry, deadline and undelivered message the index filed by then was worked off."""
    assert_indexes_match(w.store)
    if reaped:
        until = w.clock.now().timestamp()
        assert w.store.due(RESERVATIONS, until) == [], "records the reaper left due"
        assert w.store.due(LEASES, until) == [], "expired leases the authority did not reap"


def run(store, ops: list[tuple]) -> None:
    w = World(store)
    check(w, reaped=True)
    for op in ops:
        step(w, op)
        check(w, reaped=op[0] in ("tick", "restart"))


PROPERTY = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@PROPERTY
@given(st.lists(OPS, min_size=1, max_size=10))
def test_indexes_equal_their_recomputation_on_sqlite(ops):
    store = SqliteStore(":memory:")
    try:
        run(store, ops)
    finally:
        store.close()


@PROPERTY
@given(st.lists(OPS, min_size=1, max_size=10))
def test_indexes_equal_their_recomputation_on_redis(ops):
    from slicex.store.redis_store import RedisStore

    store = RedisStore(REDIS_URL, prefix=f"tindex-{uuid.uuid4().hex[:8]}")
    try:
        store.ping()
        run(store, ops)
    finally:
        store.flush()
        store.close()
