"""One contract, every store: SQLite (memory and file) and a real Redis server (`make redis` starts one).

Each Redis test uses a prefix of its own and flushes only that prefix, in the database named by
SLICEX_REDIS_URL (default db 15, so a developer's db 0 is never touched)."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import socket
import threading
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slicex.errors import DbError, TimedOut, Unavailable
from slicex.store import open_store
from slicex.store.sqlite_store import SqliteStore

REDIS_URL = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/15")
KINDS = ["sqlite-memory", "sqlite-file", "redis", "sentinel"]


def redis_store(prefix: str | None = None):
    from slicex.store.redis_store import RedisStore

    s = RedisStore(REDIS_URL, prefix=prefix or f"test-{uuid.uuid4().hex[:8]}")
    try:
        s.ping()
    except Unavailable as exc:
        pytest.fail(f"Redis is required for these tests and is not answering ({exc}); run `make redis`")
    return s


@pytest.fixture(scope="module")
def sentinel_url(tmp_path_factory):
    """A primary, a replica and three sentinels (tests/integration/test_sentinel_store.py), for the module:
    the contract holds through Sentinel, with every write waiting for the replica."""
    if shutil.which("redis-server") is None:
        pytest.skip("needs redis-server")
    from tests.integration.test_sentinel_store import redis_ha

    ha = redis_ha(tmp_path_factory.mktemp("sentinel"))
    ha.start()
    yield ha.url()
    ha.stop()


class Stores:
    """Makes stores of one kind that share state (several connections, as several workers would have)."""

    def __init__(self, kind: str, tmp_path, sentinel: str | None = None):
        self.kind = kind
        self.sentinel = sentinel
        self.path = str(tmp_path / f"s-{uuid.uuid4().hex[:6]}.db")
        self.prefix = f"test-{uuid.uuid4().hex[:8]}"
        self.opened: list = []
        self._memory = SqliteStore(":memory:") if kind == "sqlite-memory" else None

    def open(self):
        if self.kind == "sqlite-memory":
            return self._memory  # one in-memory database is one connection, shared by threads
        if self.kind == "sentinel":
            from slicex.store.redis_store import RedisStore

            s = RedisStore(self.sentinel, prefix=self.prefix)
        else:
            s = SqliteStore(self.path) if self.kind == "sqlite-file" else redis_store(self.prefix)
        self.opened.append(s)
        return s

    def close(self) -> None:
        if self.kind in ("redis", "sentinel") and self.opened:
            self.opened[0].flush()
        for s in self.opened + ([self._memory] if self._memory else []):
            s.close()


@pytest.fixture(params=KINDS)
def stores(request, tmp_path):
    sentinel = request.getfixturevalue("sentinel_url") if request.param == "sentinel" else None
    made = Stores(request.param, tmp_path, sentinel)
    yield made
    made.close()


@pytest.fixture
def store(stores):
    return stores.open()


def test_documents_round_trip_and_are_kept_per_table(store):
    store.put("t", "b", {"x": 2, "nested": {"list": [1, "ü"]}})
    store.put("t", "a", {"x": 1})
    store.put("u", "a", {"y": 1})
    assert store.get("t", "a") == {"x": 1} and store.get("u", "a") == {"y": 1}
    assert [d["x"] for d in store.scan("t")] == [1, 2]  # ordered by key
    assert store.get("t", "b")["nested"] == {"list": [1, "ü"]}
    store.put("t", "a", {"x": 3})  # replace
    assert store.get("t", "a") == {"x": 3}
    assert store.delete("t", "a") and not store.delete("t", "a")
    assert store.get("t", "a") is None and store.scan("empty") == []


def test_claims_are_exclusive_and_all_or_nothing(store):
    assert store.claim_all(["k1", "k2"], "alice")
    assert store.claim_all(["k1"], "alice")  # re-claiming your own is fine
    assert not store.claim_all(["k3", "k2"], "bob")  # k2 is alice's: bob gets nothing
    assert store.owner_of("k3") is None
    assert store.claims_of("alice") == ["k1", "k2"] and store.claims_of("bob") == []
    assert not store.release("k1", "bob")
    assert store.release("k1", "alice") and not store.release("k1", "alice")
    assert store.all_claims() == {"k2": "alice"}
    assert store.release_owner("alice") == 1
    assert store.all_claims() == {} and store.claims_of("alice") == []


def test_claim_all_of_nothing_succeeds_and_duplicates_are_one_claim(store):
    assert store.claim_all([], "alice") and store.all_claims() == {}
    assert store.claim_all(["k", "k"], "alice")
    assert store.claims_of("alice") == ["k"]
    assert store.claim("k", "alice") and not store.claim("k", "bob")


def test_all_claims_filters_by_prefix(store):
    store.claim_all(["vlan:sw1:100", "vlan:sw1:101", "vlan:sw2:100", "core:pc1:0"], "a")
    store.claim("vlan:sw1:102", "b")
    assert store.all_claims("vlan:sw1:") == {"vlan:sw1:100": "a", "vlan:sw1:101": "a", "vlan:sw1:102": "b"}
    assert store.all_claims("core:") == {"core:pc1:0": "a"}
    assert store.all_claims("nothing:") == {}


def test_all_claims_prefix_is_literal_and_case_sensitive(store):
    """A prefix is text, not a pattern: SQLite's LIKE read "_" as any character and ignored ASCII case."""
    store.claim_all(["ab:1", "AB:2", "a_:3", "a%:4"], "a")
    assert store.all_claims("a_") == {"a_:3": "a"}
    assert store.all_claims("a%") == {"a%:4": "a"}
    assert store.all_claims("ab") == {"ab:1": "a"}


def test_scan_with_a_prefix_reads_only_keys_starting_with_it(store):
    for key in ["s1#a", "s1#b", "s10#a", "s2#a", "s1*#c", "S1#d"]:
        store.put("t", key, {"k": key})
    store.put("other", "s1#z", {"k": "other"})
    assert [d["k"] for d in store.scan("t", "s1#")] == ["s1#a", "s1#b"]
    assert [d["k"] for d in store.scan("t", "s1*")] == ["s1*#c"]  # "*" is a character, not a glob
    assert [d["k"] for d in store.scan("t", "s1")] == ["s1#a", "s1#b", "s1*#c", "s10#a"]  # ordered by key
    assert store.scan("t", "nothing") == []
    assert len(store.scan("t")) == 6


def test_reads_see_every_write_committed_before_them_from_any_thread(store):
    """File stores read on pooled connections: a write on the writer is visible to the next read anywhere."""
    errors: list[str] = []

    def worker(n: int) -> None:
        for i in range(40):
            key = f"w{n}-{i}"
            store.put("t", key, {"i": i})
            if store.get("t", key) != {"i": i}:
                errors.append(f"{key}: own write not read back")
            assert store.claim(f"c{n}-{i}", f"o{n}")
            if store.owner_of(f"c{n}-{i}") != f"o{n}":
                errors.append(f"c{n}-{i}: own claim not read back")
            store.delete("t", key)
            if store.get("t", key) is not None:
                errors.append(f"{key}: deleted but still read")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(store.all_claims()) == 240


def test_release_owner_leaves_other_owners_alone(store):
    store.claim_all(["a1", "a2", "a3"], "alice")
    store.claim_all(["b1"], "bob")
    assert store.release_owner("alice") == 3 and store.release_owner("alice") == 0
    assert store.all_claims() == {"b1": "bob"}
    assert store.claim_all(["a1", "a2"], "carol")  # what alice gave back is free again


def test_release_all_gives_back_the_owners_keys_among_them_in_one_write(store):
    store.claim_all(["core:h1:0", "core:h1:1", "mem:h1:0"], "alice")
    store.claim("core:h1:2", "bob")
    gen, _ = store.claim_changes(0)
    assert store.release_all(["core:h1:0", "core:h1:1", "core:h1:2", "core:h1:9", "core:h1:0"], "alice") == 2
    assert store.all_claims() == {"mem:h1:0": "alice", "core:h1:2": "bob"}
    assert store.claim_counts() == {"core:h1": 1, "mem:h1": 1}
    assert store.claim_changes(gen)[1] == ["core:h1"]  # only the pool that lost claims, once
    assert store.claims_of("alice") == ["mem:h1:0"]
    assert store.release_all([], "alice") == 0 and store.release_all(["core:h1:2"], "alice") == 0
    assert store.owner_of("core:h1:2") == "bob"


def test_claims_survive_reopening(stores):
    if stores.kind == "sqlite-memory":
        pytest.skip("an in-memory database lives as long as its connection")
    first = stores.open()
    first.claim_all(["k1", "k2"], "alice")
    first.put("t", "a", {"x": 1})
    second = stores.open()
    assert second.all_claims() == {"k1": "alice", "k2": "alice"} and second.get("t", "a") == {"x": 1}
    assert not second.claim("k1", "bob")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(st.lists(st.integers(0, 11), min_size=1, max_size=4), min_size=1, max_size=8),
                        min_size=2, max_size=4))
def test_concurrent_claim_all_never_gives_a_key_to_two_owners(stores, batches):
    """Several threads, each with its own connection (one shared connection for in-memory SQLite), race
    claim_all over a few keys; whatever interleaving happens, every key has at most one owner and each
    winner holds all of its keys."""
    run = uuid.uuid4().hex[:6]
    won: list[tuple[str, list[str]]] = []
    lock = threading.Lock()
    start = threading.Barrier(len(batches))

    def worker(w: int, mine: list[list[int]]) -> None:
        s = stores.open()
        start.wait()
        for i, batch in enumerate(mine):
            keys = [f"{run}:k{k}" for k in batch]
            if s.claim_all(keys, f"w{w}-{i}"):
                with lock:
                    won.append((f"w{w}-{i}", keys))

    threads = [threading.Thread(target=worker, args=(w, b)) for w, b in enumerate(batches)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    granted: dict[str, str] = {}
    for owner, keys in won:
        for k in set(keys):
            assert k not in granted, f"{k} granted to {granted[k]} and {owner}"
            granted[k] = owner
    assert stores.open().all_claims(f"{run}:") == granted


def _contend(args):
    kind, where, prefix, worker, rounds = args
    if kind == "redis":
        from slicex.store.redis_store import RedisStore

        s = RedisStore(where, prefix=prefix)
    else:
        s = SqliteStore(where)
    won = []
    for i in range(rounds):
        keys = [f"vlan:{(worker * 7 + i * 3 + j) % 40}" for j in range(3)]
        if s.claim_all(keys, f"w{worker}-{i}"):
            won.append((f"w{worker}-{i}", keys))
    s.close()
    return won


@pytest.mark.parametrize("kind", ["sqlite-file", "redis"])
def test_concurrent_processes_never_double_allocate(kind, tmp_path):
    """Several processes (as several AM API workers would) race for 40 VLAN tags in one store."""
    prefix = f"race-{uuid.uuid4().hex[:8]}"
    where = REDIS_URL if kind == "redis" else str(tmp_path / "race.db")
    check = redis_store(prefix) if kind == "redis" else SqliteStore(where)
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        results = pool.map(_contend, [(kind, where, prefix, w, 30) for w in range(4)])
    granted: dict[str, str] = {}
    for won in results:
        for owner, keys in won:
            for k in keys:
                assert k not in granted, f"{k} granted to {granted[k]} and {owner}"
                granted[k] = owner
    assert granted and check.all_claims() == granted
    if kind == "redis":
        check.flush()
    check.close()


def test_redis_down_is_unavailable_not_a_crash():
    from slicex.store.redis_store import RedisStore

    s = RedisStore("redis://127.0.0.1:1/0", timeout=0.5)
    with pytest.raises(Unavailable, match=r"Redis at redis://127.0.0.1:1/0 is not answering"):
        s.claim_all(["k"], "o")
    with pytest.raises(Unavailable):
        s.get("t", "k")


def test_redis_that_accepts_but_never_answers_is_timed_out():
    from slicex.store.redis_store import RedisStore

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    port = silent.getsockname()[1]
    try:
        s = RedisStore(f"redis://127.0.0.1:{port}/0", timeout=0.3)
        with pytest.raises(TimedOut, match="did not answer in time"):
            s.owner_of("k")
    finally:
        silent.close()


def test_redis_messages_never_show_the_password():
    from slicex.store.redis_store import RedisStore

    s = RedisStore("redis://user:s3cret@127.0.0.1:1/0", timeout=0.3)
    with pytest.raises(Unavailable) as err:
        s.ping()
    assert "s3cret" not in err.value.message and "user:***@127.0.0.1:1" in err.value.message


def test_bad_redis_url_is_a_db_error():
    from slicex.store.redis_store import RedisStore

    with pytest.raises(DbError, match="bad Redis URL"):
        RedisStore("redis://127.0.0.1:notaport/0")


def test_flush_removes_only_its_own_prefix():
    mine, other = redis_store(), redis_store()
    mine.claim("k", "a")
    mine.put("t", "a", {"x": 1})
    other.claim("k", "b")
    assert mine.flush() >= 2
    assert mine.all_claims() == {} and mine.get("t", "a") is None
    assert other.all_claims() == {"k": "b"}
    other.flush()


def test_open_store_by_url(tmp_path):
    s = open_store(f"sqlite:///{tmp_path}/x.db")
    assert isinstance(s, SqliteStore)
    s.close()
    r = open_store(REDIS_URL)
    assert type(r).__name__ == "RedisStore"
    r.close()


def test_claims_in_lists_the_named_namespaces_only(store):
    """An actor reads its own claims without the others': `core:…` is in namespace core, `leased:core:…` in
    leased, a key with no ":" in ""."""
    store.claim_all(["core:pc1:0", "vlan:sw1:100", "leased:core:pc1:0", "sm-lock:r1", "bare"], "a")
    store.claim("core:pc1:1", "b")
    assert store.claims_in(["core", "vlan"]) == {"core:pc1:0": "a", "core:pc1:1": "b", "vlan:sw1:100": "a"}
    assert store.claims_in(["leased"]) == {"leased:core:pc1:0": "a"} and store.claims_in([""]) == {"bare": "a"}
    assert store.claims_in(["co"]) == {} and store.claims_in([]) == {}
    store.release("core:pc1:1", "b")
    assert store.release_owner("a") == 5
    assert store.claims_in(["core", "vlan", "leased", "sm-lock", ""]) == {}


def test_claims_written_before_namespace_indexes_are_found():
    """A Redis store written by slicex before claims had namespace hashes: the migration step `redis indexes`
    (deployment/migrations.py) indexes them."""
    old = redis_store()
    try:
        old._r.set(old._c("core:pc1:0"), "g1")
        old._r.sadd(old._o("g1"), old._c("core:pc1:0"))
        fresh = redis_store(old.prefix)
        assert fresh.claims_in(["core"]) == {}  # not indexed: what `slicex up` refuses to start on unmigrated
        assert fresh.reindex() > 0 and fresh.reindex() == 0  # once: a second run finds it done
        assert fresh.claims_in(["core"]) == {"core:pc1:0": "g1"}
        assert fresh.release_owner("g1") == 1 and fresh.claims_in(["core"]) == {}
        fresh.close()
    finally:
        old.flush()
        old.close()


def test_time_index_lists_what_fell_due_earliest_first(store):
    """`put` with `due` files a document in its table's time index; `due(table, until)` reads only those filed
    at or before `until`, earliest first; a put without `due` and a delete take it out."""
    store.put("t", "late", {"k": 1}, due=300.0)
    store.put("t", "early", {"k": 2}, due=100.0)
    store.put("t", "never", {"k": 3})
    store.put("u", "other", {"k": 4}, due=50.0)  # another table's index
    assert store.due("t", 99.0) == []
    assert store.due("t", 100.0) == [("early", 100.0)]
    assert store.due("t", 1e12) == [("early", 100.0), ("late", 300.0)]
    assert store.due("t", 1e12, limit=1) == [("early", 100.0)]
    store.put("t", "late", {"k": 1}, due=50.0)  # filed again: moved, not duplicated
    assert store.due("t", 1e12) == [("late", 50.0), ("early", 100.0)]
    store.put("t", "late", {"k": 1})  # written without a time: out of the index, the document kept
    assert store.due("t", 1e12) == [("early", 100.0)] and store.get("t", "late") == {"k": 1}
    assert store.delete("t", "early") and store.due("t", 1e12) == []
    assert store.due("u", 1e12) == [("other", 50.0)] and store.due("empty", 1e12) == []
    assert [d["k"] for d in store.scan("t")] == [1, 3]


def test_time_index_survives_reopening(stores):
    first = stores.open()
    first.put("t", "a", {"k": 1}, due=10.0)
    second = stores.open()
    assert second.due("t", 10.0) == [("a", 10.0)]


def test_sqlite_store_of_the_layout_before_the_time_index_is_migrated_on_open(tmp_path):
    """A file written by a slicex before the time index (its `docs` table has no `due` column) opens with the
    column and its index added: every document is kept, and the index works."""
    import sqlite3

    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE docs (tbl TEXT NOT NULL, key TEXT NOT NULL, doc TEXT NOT NULL, PRIMARY KEY (tbl, key));
        CREATE TABLE claims (key TEXT PRIMARY KEY, owner TEXT NOT NULL);
        CREATE INDEX claims_owner ON claims (owner);
        INSERT INTO docs VALUES ('t', 'a', '{"k": 1}');
        INSERT INTO claims VALUES ('core:pc1:0', 'g1');""")
    db.commit()
    db.close()
    store = SqliteStore(str(path))
    try:
        assert store.get("t", "a") == {"k": 1} and store.due("t", 1e12) == []
        assert store.all_claims() == {"core:pc1:0": "g1"}
        store.put("t", "a", {"k": 1}, due=5.0)
        assert store.due("t", 5.0) == [("a", 5.0)]
    finally:
        store.close()
    again = SqliteStore(str(path))  # opened again: nothing is added twice
    try:
        assert again.due("t", 5.0) == [("a", 5.0)]
    finally:
        again.close()


def test_documents_written_before_key_indexes_are_found_by_prefix():
    """A Redis store written by slicex before tables had key indexes (documents in the table's hash only): the
    migration step `redis indexes` indexes the tables read by prefix (KEY_INDEXED), and later writes keep the
    index; a table outside them is read by prefix from its hash."""
    old = redis_store()
    try:
        for table in ("sm-requests", "t"):
            old._r.hset(old._t(table), mapping={"s1#a": '{"k": "a"}', "s2#b": '{"k": "b"}'})
        fresh = redis_store(old.prefix)
        assert fresh.scan("sm-requests", "s1#") == [] and [d["k"] for d in fresh.scan("t", "s1#")] == ["a"]
        fresh.reindex()
        for table in ("sm-requests", "t"):
            assert [d["k"] for d in fresh.scan(table, "s1#")] == ["a"]
            fresh.delete(table, "s1#a")
            fresh.put(table, "s1#c", {"k": "c"})
            assert [d["k"] for d in fresh.scan(table, "s1")] == ["c"] and \
                [d["k"] for d in fresh.scan(table, "s2")] == ["b"]
        assert fresh._r.exists(fresh._k("sm-requests")) and not fresh._r.exists(fresh._k("t"))
        fresh.close()
    finally:
        old.flush()
        old.close()


def test_claim_changes_names_the_pools_changed_since_a_generation(stores):
    """Every claim, release and new owner marks its pool changed, atomically, seen from another connection
    (another process); nothing else does. Generations only grow; their steps are the store's own."""
    store, other = stores.open(), stores.open()
    gen0, before = store.claim_changes(0)
    assert (gen0, before) == (0, [])
    assert store.claim_all(["core:h1:0", "core:h1:1", "vlan:sw:7"], "g1")
    gen1, changed = other.claim_changes(gen0)
    assert gen1 > gen0 and sorted(changed) == ["core:h1", "vlan:sw"]
    assert store.claim_changes(gen1) == (gen1, [])  # nothing since

    assert store.claim_all(["core:h1:0"], "g1")  # held already: nothing changes
    assert not store.claim_all(["core:h2:0", "core:h1:1"], "g2")  # refused: nothing changes
    assert not store.release("core:h1:0", "g2")  # not its claim: nothing changes
    assert store.recount_claims(repair=True)  # a repair changes no claim
    assert store.claim_changes(gen1) == (gen1, [])

    assert store.claim_all(["core:h2:0"], "g2")
    gen2, changed = store.claim_changes(gen1)
    assert gen2 > gen1 and changed == ["core:h2"]
    assert store.release("core:h1:0", "g1")
    gen3, changed = store.claim_changes(gen2)
    assert gen3 > gen2 and changed == ["core:h1"]
    assert store.reown("g2", "g3") == 1
    gen4, changed = store.claim_changes(gen3)
    assert gen4 > gen3 and changed == ["core:h2"]
    assert store.release_owner("g1") == 2
    gen5, changed = store.claim_changes(gen4)
    assert gen5 > gen4 and sorted(changed) == ["core:h1", "vlan:sw"]
    assert sorted(store.claim_changes(gen2)[1]) == ["core:h1", "core:h2", "vlan:sw"]  # each pool once
    assert store.claim_changes(gen2)[0] == gen5


def test_reown_gives_every_claim_of_one_owner_to_another_and_keeps_the_counts(store):
    store.claim_all(["leased:core:pc1:0", "leased:mem:pc1:3", "bare"], "long-owner")
    store.claim("leased:core:pc1:1", "other")
    counts = store.claim_counts()
    assert store.reown("long-owner", "short") == 3 and store.reown("long-owner", "short") == 0
    assert store.claims_of("long-owner") == [] and store.claims_of("short") == ["bare", "leased:core:pc1:0",
                                                                               "leased:mem:pc1:3"]
    assert store.claims_in(["leased"]) == {"leased:core:pc1:0": "short", "leased:mem:pc1:3": "short",
                                           "leased:core:pc1:1": "other"}
    assert store.claims_under("leased:core:pc1") == {"leased:core:pc1:0": "short", "leased:core:pc1:1": "other"}
    assert store.claim_counts() == counts == store.recount_claims()
    assert not store.claim("leased:core:pc1:0", "long-owner")  # the new owner holds it
    assert store.release_owner("short") == 3 and store.claim_counts() == {"leased:core:pc1": 1}


@pytest.mark.parametrize("table", ["paged", "usage-open"])  # Redis: HSCAN; a range of the key index (KEY_INDEXED)
def test_pages_sweep_a_whole_table_a_few_documents_at_a_time(store, table):
    """`page` reads about `limit` documents from where its cursor left off; following the cursors until it
    answers "" sees every document of the table once, and none of another table."""
    for i in range(700):  # enough for Redis to keep a hash table (HSCAN answers a listpack, <= 512, whole)
        store.put(table, f"k{i:03d}", {"i": i})
    store.put("other", "x", {"i": -1})
    seen: list[int] = []
    cursor, pages = "", 0
    while True:
        docs, cursor = store.page(table, cursor, 50)
        assert len(docs) <= 120  # about the limit
        seen += [d["i"] for d in docs]
        pages += 1
        if not cursor:
            break
    assert sorted(seen) == list(range(700)) and pages >= 7
    assert store.page("empty", "", 10) == ([], "")
