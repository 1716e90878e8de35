"""A store made by an earlier main (commit 8a6e8e1, before lean records: tests/data/store-main-8a6e8e1.json;
commit 400d7c3, lean records written by hand-made encoders, layout 5: store-main-400d7c3.json; each made by
tests/data/make_main_store.py running that commit's code) is brought to this slicex's layout by the store's
migration steps (slicex/store/migration.py, deployment/migrations.py), on SQLite and on a real Redis: every live
sliver is still listed, described, renewable, deletable and reaped at its end, the claim counters equal their
recomputation, the leases' signatures still verify; a migration killed with SIGKILL part-way through any step
is finished by the next run."""

from __future__ import annotations

import base64
import json
import os
import signal
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

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


class Main:
    """A store dump of an earlier main: its rows or keys, the slivers it made, the key that signed them."""

    def __init__(self, commit: str):
        self.commit = commit
        self.dump = json.loads((ROOT / "tests" / "data" / f"store-main-{commit}.json").read_text())
        self.key = serialization.load_pem_private_key(self.dump["key"].encode(), None)

    def made(self, kind: str) -> dict[str, list[str]]:
        return self.dump[kind]["made"]


MAINS = {commit: Main(commit) for commit in ("8a6e8e1", "400d7c3")}
OLDEST = MAINS["8a6e8e1"]
SUB = default_substrate("t.org")
AUTH = "urn:publicid:IDN+t.org+authority+am"
SLICES = [f"urn:publicid:IDN+t.org+slice+m{i}" for i in range(3)]  # allocated 10 min; provisioned 1 h; 3 h
REDIS_URL = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/15")


def _value(value):
    """A dumped value as stored: {"b64": ...} the bytes it stands for."""
    if isinstance(value, dict) and set(value) == {"b64"}:
        return base64.b64decode(value["b64"])
    if isinstance(value, list):
        return [_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _value(v) for k, v in value.items()}
    return value


def sqlite_of_main(path: Path, main: Main) -> SqliteStore:
    """The SQLite file main wrote: its schema (from its own sqlite_master) and its rows."""
    dump = main.dump["sqlite"]
    db = sqlite3.connect(path)
    for sql in dump["schema"]:
        db.execute(sql)
    db.execute("DROP TRIGGER claim_counted")  # the rows are main's as written, counters included
    db.execute("DROP TRIGGER claim_uncounted")
    for table, rows in dump["tables"].items():
        if rows:
            db.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", map(_value, rows))
    db.commit()
    db.close()
    return SqliteStore(str(path))  # opening recreates the triggers, as with main's own file


def redis_of_main(prefix: str, main: Main):
    """The Redis keys main wrote, under `prefix` instead of main's "slicex"."""
    from slicex.store.redis_store import RedisStore

    store = RedisStore(REDIS_URL, prefix=prefix)
    r = store._rb  # binary: deflated documents stay bytes

    def moved(name: str | bytes) -> str:
        name = name.decode() if isinstance(name, bytes) else name  # a member the binary client dumped
        return prefix + name[len("slicex"):] if name.startswith("slicex:") else name

    for key, (kind, value) in main.dump["redis"]["keys"].items():
        key, value = moved(key), _value(value)
        if kind == "string":
            r.set(key, value)
        elif kind == "hash":
            r.hset(key, mapping=value)
        elif kind == "set":
            r.sadd(key, *map(moved, value))
        else:
            r.zadd(key, dict(value))
    return store


@contextmanager
def store_of(main: Main, kind: str, tmp_path: Path) -> Iterator[tuple[str, Any, str, str, Main]]:
    """(kind, the store as `main` left it, its URL, its Redis key prefix, `main`); removed afterwards."""
    if kind == "sqlite":
        store = sqlite_of_main(tmp_path / "main.db", main)
        yield kind, store, f"sqlite://{tmp_path / 'main.db'}", "", main
        store.close()
    else:
        prefix = f"migrate-{uuid.uuid4().hex[:8]}"
        store = redis_of_main(prefix, main)
        yield kind, store, REDIS_URL, prefix, main
        store.flush()
        store.close()


@pytest.fixture(params=[(c, k) for c in MAINS for k in ("sqlite", "redis")], ids=lambda p: f"{p[0]}-{p[1]}")
def main_store(request, tmp_path):
    with store_of(MAINS[request.param[0]], request.param[1], tmp_path) as it:
        yield it


@pytest.fixture(params=["sqlite", "redis"])
def oldest_store(request, tmp_path):
    """The oldest main's store: its migration runs every step (the kill points below are its writes)."""
    with store_of(OLDEST, request.param, tmp_path) as it:
        yield it


def actors(store, key) -> tuple[Broker, Authority, ActorSliceManager]:
    broker = Broker("broker", store, key, authority=AUTH)
    authority = Authority(AUTH, EmulatedDriver(SUB), {"broker": key.public_key()}, store=store, key=key,
                          inventory=export_substrate(SUB, AUTH, "broker"))
    return broker, authority, ActorSliceManager(store, SUB, broker, authority, name="sm")


def assert_migrated(store, kind: str, main: Main) -> None:
    """The store is on this layout: marked, lean, indexed, counted, its leases' signatures intact."""
    assert pending(store, STEPS) == [] and layout_of(store) == STEPS[-1].number
    check(store, STEPS, "the store")
    assert_indexes_match(store)
    assert store.claim_counts() == store.recount_claims(), "claim counters"
    recs = [Record.from_doc(d) for d in store.scan(RESERVATIONS)]
    assert sorted(r.id for r in recs) == sorted(u for urns in main.made(kind).values() for u in urns)
    for r in recs:
        assert Record.from_doc(r.to_doc()) == r and r.to_doc() in store.scan(RESERVATIONS)  # lean as stored
        if r.lease is not None:
            verify_lease(r.lease, main.key.public_key())
    for d in store.scan(LEASES):
        assert d["lease"].get("from_ticket") and "units" not in d["spec"]
        lease = decode(lease_document(d)["lease"], Lease, "lease")
        verify_lease(lease, main.key.public_key())
        assert store.claims_of(lease.id) == [] and \
            store.claims_of(lease_owner(lease.id)) == sorted(f"leased:{u}" for u in lease.units)
    assert all("booked" not in d and "claimed" not in d for d in store.scan(TICKETS))
    assert {d["sliver_urn"] for d in store.scan(USAGE)} & {d["sliver_urn"] for d in store.scan(OPEN)} == set()
    redis = getattr(store, "_r", None)
    if redis is not None:  # a claim is a field of its namespace hash, no longer a key of its own
        assert list(redis.scan_iter(match=store._c("") + "*")) == []
        assert all(":claim:" not in m for o in store.all_claims().values() for m in redis.smembers(store._o(o)))


def test_a_store_made_by_main_is_migrated_and_every_live_sliver_lives_on(main_store):
    kind, store, _url, _prefix, main = main_store
    layout = {"8a6e8e1": 0, "400d7c3": 5}[main.commit]  # 8a6e8e1 predates the mark; 400d7c3's `up` marked it
    assert layout_of(store) == layout and pending(store, STEPS) == [s for s in STEPS if s.number > layout]
    with pytest.raises(Refused, match="slicex up"):
        check(store, STEPS, "the store")  # every process but `slicex up` refuses it
    assert [name for name, _n in migrate(store, STEPS)] == [s.name for s in STEPS if s.number > layout]
    assert migrate(store, STEPS) == []  # done: a later `slicex up` runs nothing
    assert_migrated(store, kind, main)

    clock = ManualClock()
    start = clock.now()
    _, _, sm = actors(store, main.key)
    ledger = Ledger(store, SUB)
    for slice_urn, urns in main.made(kind).items():  # listed and described
        slivers = sm.slivers(slice_urn, clock.now())
        assert sorted(s.urn for s in slivers) == urns
        views = [SliverView(s.client_id, s.urn, s.kind, s.component_id, s.details, s.operational_state)
                 for s in slivers]
        manifest = build_manifest([r.xml for r in sm.request_of(slice_urn)], views, "cm", clock.now())
        assert all(f'client_id="{s.client_id}"' in manifest for s in slivers)
    allocated, short, long = (main.made(kind)[s] for s in SLICES)
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
    assert store.scan(OPEN) == [] and len(store.scan(USAGE)) == sum(map(len, main.made(kind).values()))


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
def test_a_migration_killed_part_way_is_finished_by_the_next(oldest_store, after):
    kind, store, url, prefix, main = oldest_store
    done = subprocess.run([sys.executable, "-c", KILLER, url, prefix, str(after)], cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == -signal.SIGKILL, "the migration was to be killed part-way"
    assert pending(store, STEPS), "killed before its last step was marked"
    migrate(store, STEPS)  # the next `slicex up`
    assert_migrated(store, kind, main)
    _, _, sm = actors(store, main.key)
    for slice_urn, urns in main.made(kind).items():
        assert sorted(s.urn for s in sm.slivers(slice_urn, ManualClock().now())) == urns
