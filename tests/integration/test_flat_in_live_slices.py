"""Issue 33, counted not timed: with L live slices, a restart's start-up, the reaper's idle ticks and a
federation peer's usage read the same number of store documents whatever L is (they read unfinished work and
the few index entries they need, never every record). Each test fills the same deployment to N = 10 and to
N = 40 live slices (the default substrate's 48 cores) and compares the documents read, on SQLite and on a real Redis."""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from deployment.service import EmbeddedDeployment
from rspec.request import parse_request
from slice_manager.peer_gate import held_slivers
from slicex.clock import ManualClock
from slicex.peers import Peer, PeerPolicy
from slicex.store import open_store
from tests.factories import request_rspec, vm
from tests.integration.conftest import AUTHORITY, make_home

REDIS_URL = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/12")
OWNER = f"urn:publicid:IDN+{AUTHORITY}+user+alice"
PEER = "peer.test"
PAT = f"urn:publicid:IDN+{PEER}+user+pat"



class Counting:
    """A store that counts the documents (and claims) each read returns, per table, while `on`."""

    def __init__(self, store: Any):
        self._store = store
        self.on = False
        self.read: collections.Counter[str] = collections.Counter()

    def _count(self, what: str, n: int) -> None:
        if self.on and n:
            self.read[what] += n

    def get(self, table: str, key: str) -> Any:
        doc = self._store.get(table, key)
        self._count(table, doc is not None)
        return doc

    def scan(self, table: str, prefix: str = "") -> list:
        docs = self._store.scan(table, prefix)
        self._count(table, len(docs))
        return docs

    def due(self, table: str, until: float, limit: int | None = None) -> list:
        found = self._store.due(table, until, limit)
        self._count(f"due:{table}", len(found))
        return found

    def claims_in(self, namespaces) -> dict:
        found = self._store.claims_in(namespaces)
        self._count("claims:unit" if "core" in set(namespaces) else "claims:other", len(found))
        return found

    def page(self, table: str, cursor: str, limit: int) -> tuple:
        docs, after = self._store.page(table, cursor, limit)
        self._count(table, len(docs))
        return docs, after

    def tallies(self, counter: str) -> dict:
        found = self._store.tallies(counter)
        self._count("tallies", 1)  # one counter document, however many records it sums
        return found

    def claims_under(self, counter: str) -> dict:
        found = self._store.claims_under(counter)
        self._count("claims:pool", len(found))
        return found

    def claim_counts(self, prefix: str = "") -> dict:
        counts = self._store.claim_counts(prefix)
        self._count("claims:counters", 1)  # one per pool in use: bounded by the substrate, not by the slices
        return counts

    def claims_of(self, owner: str) -> list:
        found = self._store.claims_of(owner)
        self._count("claims:of", len(found))
        return found

    def all_claims(self, prefix: str = "") -> dict:
        found = self._store.all_claims(prefix)
        self._count("claims:all", len(found))
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


WRITES = ("put", "delete", "claim", "claim_all", "release", "release_all", "release_owner", "reown")
READS = ("get", "scan", "due", "owner_of", "claims_of", "claims_in", "all_claims", "claim_counts", "claims_under",
         "claim_changes")


class CountingCalls:
    """A store that counts every call a request thread makes, by method and table (documents a scan returns,
    one per other call): the reaper's and clocks' threads, which run on their own time, are not counted."""

    def __init__(self, store: Any):
        self._store = store
        self.on = False
        self.calls: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._store, name)
        if name not in WRITES + READS:
            return found

        def call(*args: Any, **kwargs: Any) -> Any:
            out = found(*args, **kwargs)
            thread = threading.current_thread().name
            if self.on and thread != "reaper" and not thread.endswith("-clock"):
                table = args[0] if name in ("get", "put", "delete", "scan", "due") else ""
                self.calls[f"{name} {table}".strip()] += len(out) if name == "scan" else 1
            return out
        return call


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request, tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """A fresh store per name (a deployment per fill size), flushed after the test on Redis."""
    made: list[Any] = []

    def url(name: str) -> str:
        if request.param == "sqlite":
            return f"sqlite:///{tmp_path / name}.db"
        from slicex.store.redis_store import RedisStore

        store = RedisStore(REDIS_URL, prefix=f"flat-{name}-{os.getpid()}")
        store.flush()
        made.append(store)
        return REDIS_URL
    yield url
    for store in made:
        store.flush()


def _open(url: str, name: str) -> Any:
    if url.startswith("redis"):
        from slicex.store.redis_store import RedisStore

        return RedisStore(url, prefix=f"flat-{name}-{os.getpid()}")
    return open_store(url)


class Filled:
    """An embedded deployment (in-process broker and authority) on its own home and store, filled with `n` live
    slices of one provisioned node each through the slice manager, as the AM API leaves them (usage records
    opened by the ledger)."""

    def __init__(self, root: Path, url: str, name: str, n: int, peers: int = 0):
        """`peers` of the slices are a federation peer's user's (PAT), in a slice of the peer's namespace."""
        self.home = make_home(root / name)
        self.url, self.name = url, name
        self.clock = ManualClock(datetime.now(UTC).replace(microsecond=0))
        self.start()
        for i in range(n):
            self.add(f"urn:publicid:IDN+{AUTHORITY}+slice+s{i}", OWNER, f"n{i}")
        for i in range(peers):
            self.add(f"urn:publicid:IDN+{PEER}+slice+p{i}", PAT, f"p{i}")
        self.deployment.stop()

    def add(self, slice_urn: str, owner: str, node: str) -> list[str]:
        """A slice of one provisioned node."""
        d, now = self.deployment, self.clock.now()
        slivers = d.sm.allocate(slice_urn, owner, parse_request(request_rspec([vm(node)])), now + timedelta(hours=1),
                                now)
        d.ledger.began(owner, slice_urn, slivers, now)
        d.sm.provision([s.urn for s in slivers], now + timedelta(hours=2), [], now)
        return [s.urn for s in slivers]

    def start(self) -> EmbeddedDeployment:
        """`slicex up` on the filled store: the deployment built and started, reads counted from here on."""
        self.store = Counting(_open(self.url, self.name))
        self.store.on = True
        self.deployment = EmbeddedDeployment(self.home, clock=self.clock, store=self.store)
        self.deployment.start()
        return self.deployment

    def idle(self, ticks: int = 5) -> collections.Counter[str]:
        """The documents the reaper's ticks read with nothing asked (a second of the clock each)."""
        self.store.read.clear()
        for _ in range(ticks):
            self.clock.advance(timedelta(seconds=1))
            self.deployment._tick()
        return collections.Counter(self.store.read)


def test_a_restart_and_the_idle_ticks_read_what_is_unfinished_not_every_slice(store_url, tmp_path):
    runs = {}
    for n in (10, 40):
        filled = Filled(tmp_path, store_url(f"n{n}"), f"n{n}", n)
        filled.start()
        try:
            started = collections.Counter(filled.store.read)
            runs[n] = (started, filled.idle())
        finally:
            filled.deployment.stop()
    (start10, idle10), (start40, idle40) = runs[10], runs[40]
    assert start10 == start40, (start10, start40)
    assert idle10 == idle40, (idle10, idle40)


def test_a_peers_usage_reads_the_peers_slivers_not_every_slice(store_url, tmp_path):
    peer = Peer("testbed-b", Path("unused.pem"), (PEER,), PeerPolicy(max_nodes=10))
    runs = {}
    for n in (10, 40):
        filled = Filled(tmp_path, store_url(f"p{n}"), f"p{n}", n, peers=3)
        d = filled.start()
        try:
            held = held_slivers(d.sm)
            filled.store.read.clear()
            mine = held(peer)
            runs[n] = collections.Counter(filled.store.read)
            assert sorted(h.slice_urn for h in mine) == [f"urn:publicid:IDN+{PEER}+slice+p{i}" for i in range(3)]
            assert {h.owner_urn for h in mine} == {PAT} and {h.kind for h in mine} == {"node"}
            gone = [s.urn for s in d.sm.slivers(f"urn:publicid:IDN+{PEER}+slice+p0", filled.clock.now())]
            d.sm.delete(gone, filled.clock.now())  # no longer held: no longer counted
            assert len(held(peer)) == 2
        finally:
            d.stop()
    assert runs[10] == runs[40], runs


def test_the_first_listresources_after_a_change_reads_the_claim_counters_not_every_claim(store_url, tmp_path):
    runs = {}
    for n in (10, 40):
        filled = Filled(tmp_path, store_url(f"l{n}"), f"l{n}", n)
        d = filled.start()
        try:
            d._advertise(True, filled.clock.now())
            filled.add(f"urn:publicid:IDN+{AUTHORITY}+slice+new", OWNER, "new")  # the broker's state changed
            filled.store.read.clear()
            ad = d._advertise(True, filled.clock.now())
            runs[n] = collections.Counter(filled.store.read)
            assert "<rspec" in ad
        finally:
            d.stop()
    assert runs[10] == runs[40], runs


def test_a_step_of_the_ledgers_check_reads_a_page_of_usage_not_every_record(store_url, tmp_path):
    """The ledger's rotating check (`Ledger.sweep`) reads a page of open usage records and each one's sliver
    record, whatever is open; following it page after page checks every open record once."""
    runs = {}
    for n in (10, 40):
        filled = Filled(tmp_path, store_url(f"w{n}"), f"w{n}", n)
        d = filled.start()
        try:
            now = filled.clock.now()
            filled.store.read.clear()
            assert d.ledger.sweep(d.sm.holds, now, page=5) == [] and not d.ledger.swept
            runs[n] = collections.Counter(filled.store.read)
            steps = 1
            while not d.ledger.swept:
                assert d.ledger.sweep(d.sm.holds, now, page=5) == []
                steps += 1
            assert -(-n // 5) <= steps <= n // 5 + 1  # a pass: every open record once (a last page may be empty)
        finally:
            d.stop()
    assert runs[10] == runs[40], runs


def test_a_quota_check_reads_the_users_and_projects_counters_not_every_open_usage_record(store_url, tmp_path):
    """An Allocate under a user's and a project's limits counts what they hold from their usage counters (two
    reads), not from every open usage record; and the counters say what the records hold."""
    from operations.accounting import user_key
    from operations.quotas import policy_from_config

    runs = {}
    for n in (10, 40):
        filled = Filled(tmp_path, store_url(f"q{n}"), f"q{n}", n)
        d = filled.start()
        try:
            d.ledger.policy = policy_from_config({"users": {"default": {"cores": 1000}},
                                                  "projects": {"default": {"cores": 1000}}})
            now = filled.clock.now()
            request = parse_request(request_rspec([vm("extra")]))
            slice_urn = f"urn:publicid:IDN+{AUTHORITY}+slice+extra"
            filled.store.read.clear()
            d.ledger.allocate(OWNER, slice_urn, request, now, now + timedelta(hours=1), True,
                              lambda end, d=d, s=slice_urn, r=request, t=now: d.sm.allocate(s, OWNER, r, end, t))
            runs[n] = {t: c for t, c in filled.store.read.items() if t in ("usage-open", "usage", "tallies")}
            mine, _ = d.ledger.held(user_key(OWNER), None)
            assert mine.nodes == n + 1, (mine, n)
        finally:
            d.stop()
    assert runs[10] == runs[40], runs


def test_a_lifecycle_reads_and_writes_as_much_with_40_live_slices_as_with_10(store_url, tmp_path):
    """Issue 33: a 1-node Allocate, Provision, Status and Delete through the AM API make the same store calls
    (by method and table, documents read included) whatever the number of live slices, and as few writes as
    listed here: each write is a transaction (a commit on SQLite, a script on Redis). Requests only: the
    reaper's ticks run on their own time."""
    from tests.integration.conftest import Running

    runs = {}
    for n in (10, 40):
        filled = Filled(tmp_path, store_url(f"c{n}"), f"c{n}", n)
        store = CountingCalls(_open(filled.url, filled.name))
        d = EmbeddedDeployment(filled.home, clock=filled.clock, store=store)
        d.start()
        try:
            alice = Running(filled.home, d, filled.clock, None).user("alice")
            per_call: dict[str, collections.Counter[str]] = {}
            for i in range(3):
                urn, creds = alice.slice_credential(f"cycle{i}")
                for method, args in (("Allocate", (urn, creds, request_rspec([vm("a")]), {})),
                                     ("Provision", ([urn], creds, {})), ("Status", ([urn], creds, {})),
                                     ("Delete", ([urn], creds, {}))):
                    store.calls.clear()
                    store.on = True
                    reply = getattr(alice.am, method)(*args)
                    store.on = False
                    assert reply["code"]["geni_code"] == 0, reply
                    if i:  # the first cycle warms the broker's copy of the claims
                        assert per_call.setdefault(method, store.calls.copy()) == store.calls, (method, i)
            runs[n] = per_call
        finally:
            d.stop()
    assert runs[10] == runs[40], (runs[10], runs[40])
    writes = {m: sum(v for k, v in c.items() if k.split()[0] in WRITES) for m, c in runs[40].items()}
    assert writes == {"Allocate": 14, "Provision": 20, "Status": 0, "Delete": 20}, (writes, runs[40])
