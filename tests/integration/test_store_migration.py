"""A store made by today's main (commit 8a6e8e1: tests/data/store-main-8a6e8e1.json, made by
tests/data/make_main_store.py running that commit's code) is brought to this slicex's layout by the store's
migration steps (slicex/store/migration.py, deployment/migrations.py), on SQLite and on a real Redis: every live
sliver is still listed, described, renewable, deletable and reaped at its end, the claim counters equal their
recomputation, the leases' signatures still verify; a migration killed with SIGKILL part-way through any step
is finished by the next run."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from authority.actor import LEASES, Authority, lease_document, lease_owner
from authority.substrate.emulated import EmulatedDriver
from broker.broker import TICKETS, Broker
from deployment.migrations import STEPS
from operations.ledger import OPEN, USAGE, Ledger
from resources import export_substrate
from rspec.manifest import SliverView, build_manifest
from rspec.substrate import default_substrate
from slice_manager.actor import ActorSliceManager
from slice_manager.records import RESERVATIONS, Record
from slicex.clock import ManualClock
from slicex.codec import decode
from slicex.errors import Refused
from slicex.store.migration import check, layout_of, migrate, pending
from slicex.store.sqlite_store import SqliteStore
from slicex.ticket import Lease, verify_lease
from tests.store_indexes import assert_indexes_match

ROOT = Path(__file__).resolve().parents[2]
MAIN = json.loads((ROOT / "tests" / "data" / "store-main-8a6e8e1.json").read_text())
KEY = serialization.load_pem_private_key(MAIN["key"].encode(), None)
SUB = default_substrate("t.org")
AUTH = "urn:publicid:IDN+t.org+authority+am"
SLICES = [f"urn:publicid:IDN+t.org+slice+m{i}" for i in range(3)]  # allocated 10 min; provisioned 1 h; 3 h
REDIS_URL = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/15")


def sqlite_of_main(path: Path) -> SqliteStore:
    """The SQLite file main wrote: its schema (from its own sqlite_master) and its rows."""
    dump = MAIN["sqlite"]
    db = sqlite3.connect(path)
    for sql in dump["schema"]:
        db.execute(sql)
    db.execute("DROP TRIGGER claim_counted")  # the rows are main's as written, counters included
    db.execute("DROP TRIGGER claim_uncounted")
    for table, rows in dump["tables"].items():
        if rows:
            db.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows)
    db.commit()
    db.close()
    return SqliteStore(str(path))  # opening recreates the triggers, as with main's own file


def redis_of_main(prefix: str):
    """The Redis keys main wrote, under `prefix` instead of main's "slicex"."""
    from slicex.store.redis_store import RedisStore

    store = RedisStore(REDIS_URL, prefix=prefix)
    r = store._r

    def moved(name: str) -> str:
        return prefix + name[len("slicex"):] if name.startswith("slicex:") else name

    for key, (kind, value) in MAIN["redis"]["keys"].items():
        key = moved(key)
        if kind == "string":
            r.set(key, value)
        elif kind == "hash":
            r.hset(key, mapping=value)
        elif kind == "set":
            r.sadd(key, *map(moved, value))
        else:
            r.zadd(key, dict(value))
    return store


def made(kind: str) -> dict[str, list[str]]:
    return MAIN[kind]["made"]


@pytest.fixture(params=["sqlite", "redis"])
def main_store(request, tmp_path):
    if request.param == "sqlite":
        store = sqlite_of_main(tmp_path / "main.db")
        yield request.param, store, f"sqlite://{tmp_path / 'main.db'}", ""
        store.close()
    else:
        prefix = f"migrate-{uuid.uuid4().hex[:8]}"
        store = redis_of_main(prefix)
        yield request.param, store, REDIS_URL, prefix
        store.flush()
        store.close()


def actors(store) -> tuple[Broker, Authority, ActorSliceManager]:
    broker = Broker("broker", store, KEY, authority=AUTH)
    authority = Authority(AUTH, EmulatedDriver(SUB), {"broker": KEY.public_key()}, store=store, key=KEY,
                          inventory=export_substrate(SUB, AUTH, "broker"))
    return broker, authority, ActorSliceManager(store, SUB, broker, authority, name="sm")


def assert_migrated(store, kind: str) -> None:
    """The store is on this layout: marked, lean, indexed, counted, its leases' signatures intact."""
    assert pending(store, STEPS) == [] and layout_of(store) == STEPS[-1].number
    check(store, STEPS, "the store")
    assert_indexes_match(store)
    assert store.claim_counts() == store.recount_claims(), "claim counters"
    recs = [Record.from_doc(d) for d in store.scan(RESERVATIONS)]
    assert sorted(r.id for r in recs) == sorted(u for urns in made(kind).values() for u in urns)
    for r in recs:
        assert Record.from_doc(r.to_doc()) == r and r.to_doc() in store.scan(RESERVATIONS)  # lean as stored
        if r.lease is not None:
            verify_lease(r.lease, KEY.public_key())
    for d in store.scan(LEASES):
        assert d["lease"].get("from_ticket") and "units" not in d["spec"]
        lease = decode(lease_document(d)["lease"], Lease, "lease")
        verify_lease(lease, KEY.public_key())
        assert store.claims_of(lease.id) == [] and \
            store.claims_of(lease_owner(lease.id)) == sorted(f"leased:{u}" for u in lease.units)
    assert all("booked" not in d and "claimed" not in d for d in store.scan(TICKETS))
    assert {d["sliver_urn"] for d in store.scan(USAGE)} & {d["sliver_urn"] for d in store.scan(OPEN)} == set()
    redis = getattr(store, "_r", None)
    if redis is not None:  # a claim is a field of its namespace hash, no longer a key of its own
        assert list(redis.scan_iter(match=store._c("") + "*")) == []
        assert all(":claim:" not in m for o in store.all_claims().values() for m in redis.smembers(store._o(o)))


def test_a_store_made_by_main_is_migrated_and_every_live_sliver_lives_on(main_store):
    kind, store, _url, _prefix = main_store
    assert layout_of(store) == 0 and len(pending(store, STEPS)) == len(STEPS)
    with pytest.raises(Refused, match="slicex up"):
        check(store, STEPS, "the store")  # every process but `slicex up` refuses it
    assert [name for name, _n in migrate(store, STEPS)] == [s.name for s in STEPS]
    assert migrate(store, STEPS) == []  # done: a later `slicex up` runs nothing
    assert_migrated(store, kind)

    clock = ManualClock()
    start = clock.now()
    _, _, sm = actors(store)
    ledger = Ledger(store, SUB)
    for slice_urn, urns in made(kind).items():  # listed and described
        slivers = sm.slivers(slice_urn, clock.now())
        assert sorted(s.urn for s in slivers) == urns
        views = [SliverView(s.client_id, s.urn, s.kind, s.component_id, s.details, s.operational_state)
                 for s in slivers]
        manifest = build_manifest([r.xml for r in sm.request_of(slice_urn)], views, "cm", clock.now())
        assert all(f'client_id="{s.client_id}"' in manifest for s in slivers)
    allocated, short, long = (made(kind)[s] for s in SLICES)
    renewed = sm.renew(short, start + timedelta(hours=2), clock.now(), False)  # renewable
    assert {s.expires for s in renewed} == {start + timedelta(hours=2)}
    ledger.extended(renewed)
    assert {s.urn for s in sm.delete(allocated, clock.now())} == set(allocated)  # deletable
    ledger.ended(allocated, clock.now(), "deleted")
    assert sm.slivers(SLICES[0], clock.now()) == []
    assert store.claim_counts() == store.recount_claims()
    for later, left in ((timedelta(hours=1, minutes=30), {SLICES[1], SLICES[2]}), (timedelta(hours=2, minutes=30),
                                                                                     {SLICES[2]}),
                        (timedelta(hours=4), set())):  # reaped at their ends
        now = clock.advance(start + later - clock.now())
        sm.reap(now)
        ledger.settle([], sm.holds, now)
        assert {s for s in SLICES if sm.records(s)} == left, later
        assert_indexes_match(store)
        assert store.claim_counts() == store.recount_claims()
    assert store.all_claims() == {} and store.scan(LEASES) == [] and store.scan(TICKETS) == []
    assert store.scan(OPEN) == [] and len(store.scan(USAGE)) == sum(map(len, made(kind).values()))


KILLER = """
import os, signal, sys
from deployment.migrations import STEPS
from slicex.store.migration import migrate

url, prefix, after = sys.argv[1], sys.argv[2], int(sys.argv[3])
if prefix:
    from slicex.store.redis_store import RedisStore
    store = RedisStore(url, prefix=prefix)
else:
    from slicex.store import open_store
    store = open_store(url)
writes = 0
for name in ("put", "delete", "reown"):
    real = getattr(store, name)
    def counted(*args, real=real, **kw):
        global writes
        writes += 1
        if writes > after:
            os.kill(os.getpid(), signal.SIGKILL)  # kill -9, between two writes of a step
        return real(*args, **kw)
    setattr(store, name, counted)
migrate(store, STEPS)
"""


@pytest.mark.parametrize("after", [0, 10, 19, 20, 21, 35, 49, 50, 52, 54])  # of its 55 writes: in each step, at each mark
def test_a_migration_killed_part_way_is_finished_by_the_next(main_store, after):
    kind, store, url, prefix = main_store
    done = subprocess.run([sys.executable, "-c", KILLER, url, prefix, str(after)], cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == -signal.SIGKILL, "the migration was to be killed part-way"
    assert pending(store, STEPS), "killed before its last step was marked"
    migrate(store, STEPS)  # the next `slicex up`
    assert_migrated(store, kind)
    _, _, sm = actors(store)
    for slice_urn, urns in made(kind).items():
        assert sorted(s.urn for s in sm.slivers(slice_urn, ManualClock().now())) == urns
