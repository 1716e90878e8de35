"""A store written by the slicex before the time index (today's main: no `due` column in SQLite, no sorted sets
beside the tables in Redis, no layout marks) is migrated when the slice manager and the authority start: every
live sliver is still listed, and reaped when its term ends, on SQLite and on a real Redis."""

from __future__ import annotations

import json
import os
import sqlite3
import uuid
from datetime import timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from authority.actor import LAYOUT as AUTHORITY_LAYOUT
from authority.actor import LEASES, Authority
from authority.substrate.emulated import EmulatedDriver
from broker.broker import TICKETS, Broker
from resources import export_substrate
from rspec.request import parse_request
from rspec.substrate import default_substrate
from slice_manager.actor import ActorSliceManager
from slice_manager.records import LAYOUT, RESERVATIONS, SLIVERS_OF
from slicex.clock import ManualClock
from slicex.store.sqlite_store import SqliteStore
from tests.factories import request_rspec, vm
from tests.store_indexes import assert_indexes_match

SUB = default_substrate("t.org")
AUTH = "urn:publicid:IDN+t.org+authority+am"
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
REDIS_URL = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/15")
SLICES = [f"urn:publicid:IDN+t.org+slice+m{i}" for i in range(3)]
NEW_MARKS = {LAYOUT, AUTHORITY_LAYOUT}
MAIN_SCHEMA = """
CREATE TABLE docs (tbl TEXT NOT NULL, key TEXT NOT NULL, doc TEXT NOT NULL, PRIMARY KEY (tbl, key));
CREATE TABLE claims (key TEXT PRIMARY KEY, owner TEXT NOT NULL);
CREATE INDEX claims_owner ON claims (owner);
"""


def actors(store, first: bool = False) -> tuple[Broker, Authority, ActorSliceManager]:
    broker = Broker("broker", store, KEY, authority=AUTH)
    authority = Authority(AUTH, EmulatedDriver(SUB), {"broker": KEY.public_key()}, store=store, key=KEY,
                          inventory=export_substrate(SUB, AUTH, "broker"))
    if first:
        authority.delegate(broker)
    return broker, authority, ActorSliceManager(store, SUB, broker, authority, name="sm")


def live_slices(clock: ManualClock) -> tuple[SqliteStore, dict[str, list[str]]]:
    """Three slices: one only allocated (10 min), one provisioned for 1 h, one for 3 h; the last one's index
    entries dropped, as a store older still (before the per-slice index) holds it."""
    store = SqliteStore(":memory:")
    _, _, sm = actors(store, first=True)
    now = clock.now()
    made = {}
    for n, (slice_urn, hours) in enumerate(zip(SLICES, (0, 1, 3), strict=True)):
        req = parse_request(request_rspec([vm(f"a{n}"), vm(f"b{n}")]))
        urns = [s.urn for s in sm.allocate(slice_urn, "o", req, now + timedelta(minutes=10), now)]
        if hours:
            sm.provision(urns, now + timedelta(hours=hours), [], now)
        made[slice_urn] = sorted(urns)
    for doc in store.scan(SLIVERS_OF, f"{SLICES[2]}#"):
        store.delete(SLIVERS_OF, f"{SLICES[2]}#{doc['id']}")
    return store, made


def rows(store: SqliteStore) -> list[tuple[str, str, str]]:
    """Every document as main's code wrote it: table, key, JSON (no time, no layout marks)."""
    got = store._read(lambda db: db.execute("SELECT tbl, key, doc FROM docs").fetchall())
    return [(t, k, d) for t, k, d in got if t not in NEW_MARKS]


def main_sqlite(source: SqliteStore, path) -> SqliteStore:
    db = sqlite3.connect(path)
    db.executescript(MAIN_SCHEMA)
    db.executemany("INSERT INTO docs (tbl, key, doc) VALUES (?, ?, ?)", rows(source))
    db.executemany("INSERT INTO claims (key, owner) VALUES (?, ?)", sorted(source.all_claims().items()))
    db.commit()
    db.close()
    return SqliteStore(str(path))


def main_redis(source: SqliteStore):
    """Documents in one hash per table only, as main's RedisStore.put wrote them (claims are laid out as
    main's scripts lay them out: `claim_all` is unchanged)."""
    from slicex.store.redis_store import RedisStore

    store = RedisStore(REDIS_URL, prefix=f"migrate-{uuid.uuid4().hex[:8]}")
    for table, key, doc in rows(source):
        store._r.hset(store._t(table), key, json.dumps(json.loads(doc), sort_keys=True))
    owners: dict[str, list[str]] = {}
    for key, owner in source.all_claims().items():
        owners.setdefault(owner, []).append(key)
    for owner, keys in owners.items():
        assert store.claim_all(keys, owner)
    return store


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_store_of_mains_layout_is_migrated_and_its_slivers_listed_and_reaped(kind, tmp_path):
    clock = ManualClock()
    start = clock.now()
    source, made = live_slices(clock)
    store = main_sqlite(source, tmp_path / "main.db") if kind == "sqlite" else main_redis(source)
    try:
        assert store.due(RESERVATIONS, 1e12) == [] and store.due(LEASES, 1e12) == []  # nothing filed yet
        _, authority, sm = actors(store)  # a deployment's start
        assert store.get(LAYOUT, "records") and store.get(AUTHORITY_LAYOUT, "leases")
        assert_indexes_match(store)
        assert len(store.due(LEASES, 1e12)) == 4  # the provisioned slices' nodes
        for slice_urn, urns in made.items():
            assert sorted(s.urn for s in sm.slivers(slice_urn, clock.now())) == urns
        steps = [(timedelta(minutes=15), {SLICES[1], SLICES[2]}), (timedelta(hours=2), {SLICES[2]}),
                 (timedelta(hours=4), set())]
        for later, left in steps:
            now = clock.advance(start + later - clock.now())
            ended = sm.reap(now)
            assert {s for s in SLICES if sm.records(s)} == left, (later, ended)
            assert_indexes_match(store)
        assert store.all_claims() == {} and store.scan(LEASES) == [] and store.scan(TICKETS) == []
        assert actors(store)[2].migrate(clock.now()) == 0  # once per store: a later start reads no record
    finally:
        if kind == "redis":
            store.flush()
        store.close()
        source.close()
