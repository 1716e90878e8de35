"""One contract, every store: SQLite (memory and file) and a real Redis server (started by `make test`)."""

from __future__ import annotations

import multiprocessing
import os
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slicex.errors import Unavailable
from slicex.store.sqlite_store import SqliteStore

REDIS_URL = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/15")


def redis_store(prefix: str | None = None):
    from slicex.store.redis_store import RedisStore

    s = RedisStore(REDIS_URL, prefix=prefix or f"test-{uuid.uuid4().hex[:8]}")
    try:
        s.owner_of("ping")
    except Unavailable as exc:
        pytest.fail(f"Redis is required for these tests and is not answering ({exc}); run `make redis`")
    return s


@pytest.fixture(params=["sqlite-memory", "sqlite-file", "redis"])
def store(request, tmp_path):
    if request.param == "sqlite-memory":
        s = SqliteStore(":memory:")
    elif request.param == "sqlite-file":
        s = SqliteStore(str(tmp_path / "s.db"))
    else:
        s = redis_store()
    yield s
    if request.param == "redis":
        s.flush()
    s.close()


def test_documents(store):
    store.put("t", "a", {"x": 1})
    store.put("t", "b", {"x": 2})
    assert store.get("t", "a") == {"x": 1}
    assert [d["x"] for d in store.scan("t")] == [1, 2]
    assert store.delete("t", "a") and not store.delete("t", "a")
    assert store.get("t", "a") is None


def test_claims_are_exclusive_and_all_or_nothing(store):
    assert store.claim_all(["k1", "k2"], "alice")
    assert store.claim_all(["k1"], "alice")  # re-claiming your own is fine
    assert not store.claim_all(["k3", "k2"], "bob")  # k2 is alice's: bob gets nothing
    assert store.owner_of("k3") is None
    assert store.claims_of("alice") == ["k1", "k2"]
    assert not store.release("k1", "bob")
    assert store.release("k1", "alice")
    assert store.all_claims() == {"k2": "alice"}
    assert store.release_owner("alice") == 1
    assert store.all_claims() == {}


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.integers(0, 15), min_size=1, max_size=4), min_size=1, max_size=12))
def test_sequential_claims_never_share_a_key(batches):
    s = SqliteStore(":memory:")
    owners: dict[str, str] = {}
    for i, batch in enumerate(batches):
        keys = [f"k{k}" for k in batch]
        if s.claim_all(keys, f"o{i}"):
            for k in keys:
                assert owners.setdefault(k, f"o{i}") == f"o{i}"
    assert s.all_claims() == owners


def _contend(args):
    url, prefix, worker, rounds = args
    from slicex.store.redis_store import RedisStore

    s = RedisStore(url, prefix=prefix)
    won = []
    for i in range(rounds):
        keys = [f"vlan:{(worker * 7 + i * 3 + j) % 40}" for j in range(3)]
        if s.claim_all(keys, f"w{worker}-{i}"):
            won.append((f"w{worker}-{i}", keys))
    return won


def test_concurrent_workers_never_double_allocate_against_real_redis():
    """Several processes (as several AM API workers would) race for 40 VLAN tags in one Redis."""
    prefix = f"race-{uuid.uuid4().hex[:8]}"
    redis_store(prefix)
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        results = pool.map(_contend, [(REDIS_URL, prefix, w, 30) for w in range(4)])
    granted: dict[str, str] = {}
    for won in results:
        for owner, keys in won:
            for k in keys:
                assert k not in granted, f"{k} granted to {granted[k]} and {owner}"
                granted[k] = owner
    s = redis_store(prefix)
    assert s.all_claims() == granted
    s.flush()


def test_redis_down_is_unavailable_not_a_crash():
    from slicex.store.redis_store import RedisStore

    s = RedisStore("redis://127.0.0.1:1/0", timeout=0.5)
    with pytest.raises(Unavailable, match="not answering"):
        s.claim_all(["k"], "o")
