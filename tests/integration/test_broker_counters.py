"""The broker counts instead of scanning: the store's claim counters, the broker's copy of the unit claims and
its calendar's indexes (by end, by group, the advance tickets waiting to start) always equal a full
recomputation from the claims and bookings, on SQLite and on a real Redis, through random bookings, releases,
extensions, advance reservations, claims released behind the broker's back and restarts. A store made before
counters existed gets them when opened."""

from __future__ import annotations

import os
import sqlite3
import uuid
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.broker import Broker
from broker.calendar import Unavailable
from broker.claims import counts_of
from protocol.messages import demands_of
from resources import export_substrate
from rspec.request import parse_request
from rspec.substrate import default_substrate
from slicex.clock import ManualClock
from slicex.errors import GeniError
from slicex.errors import Unavailable as StoreUnavailable
from slicex.inventory import UNIT_KINDS
from slicex.store import counter_of
from slicex.store.sqlite_store import SqliteStore
from slicex.term import Term
from tests.factories import request_rspec, vm

REDIS_URL = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/15")
AUTH = "urn:publicid:IDN+t.org+authority+am"
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
MIN = timedelta(minutes=1)
BASE = default_substrate("t.org")
SUB = replace(BASE, hosts=tuple(replace(h, cores=4, memory_mb=4096) if not h.exclusive else h for h in BASE.hosts),
              switches=tuple(replace(sw, vlan_range=((1000, 1005),)) for sw in BASE.switches))


def open_kind(kind: str, tmp: Path) -> Any:
    if kind == "sqlite":
        return SqliteStore(str(tmp / f"s-{uuid.uuid4().hex[:6]}.db"))
    from slicex.store.redis_store import RedisStore

    store = RedisStore(REDIS_URL, prefix=f"test-{uuid.uuid4().hex[:8]}")
    try:
        store.ping()
    except StoreUnavailable as exc:
        pytest.fail(f"Redis is required for these tests and is not answering ({exc}); run `make redis`")
    return store


def close(store: Any) -> None:
    if hasattr(store, "flush"):
        store.flush()
    store.close()


def request_of(i: int, nodes: int, lan: bool) -> tuple[Any, dict[str, str]]:
    names = [f"q{i}n{k}" for k in range(nodes)]
    rspec = request_rspec([vm(n, ifaces=[f"{n}:if0"] if lan else []) for n in names],
                          [{"client_id": f"q{i}lan", "ifaces": [f"{n}:if0" for n in names]}] if lan and nodes > 1
                          else [])
    request = parse_request(rspec)
    return request, {e.client_id: f"q{i}-{e.client_id}" for e in (*request.nodes, *request.links)}


def check(broker: Broker, store: Any, now) -> None:
    """Every counter and index equals a recomputation from the claims and bookings."""
    claims = store.all_claims()
    assert store.claim_counts() == counts_of(claims), "the store's counters differ from its claims"
    assert store.recount_claims() == counts_of(claims)
    units = {k: o for k, o in claims.items() if k.partition(":")[0] in UNIT_KINDS}
    for c in counts_of(units):
        assert store.claims_under(c) == {k: o for k, o in units.items() if counter_of(k) == c}
    broker._copy.sync()
    copy = broker._copy
    read = {k: o for k, o in units.items() if copy.complete or counter_of(k) in copy.loaded}
    assert copy.owner == read, "the broker's copy of the claims differs from the store's in the pools it read"
    assert copy.counts() == counts_of(units)
    assert all(copy.owner_of(k) == o for k, o in units.items())  # each pool read when asked about
    for owner, keys in broker._copy.by_owner.items():
        assert keys == {k for k, o in units.items() if o == owner}
    for leading in broker._copy._leading.values():  # first-fit's run: every host in it is wholly claimed
        for counter, size in leading.pools[:leading.n]:
            assert counts_of(units).get(counter, 0) >= size, f"{counter} is in first-fit's full run, not full"
    cal = broker.calendar
    assert cal._ends == sorted((b.term.end, h) for h, b in cal.bookings.items()), "the index by end is stale"
    groups: dict[str, set[str]] = {}
    for h in cal.bookings:
        groups.setdefault(h.rsplit("/", 1)[0], set()).add(h)
    assert cal._groups == groups
    assert broker._claimed.waiting == {t for t, claimed in broker._claimed.items() if not claimed}
    for term in (Term(now, now + MIN), Term(now + 30 * MIN, now + 90 * MIN)):
        brute = {u for u, spans in cal._by_unit.items() if any(s < term.end and term.start < e for s, e, _ in spans)}
        assert cal.unavailable(term) == brute
        asked = Unavailable(cal, term)
        assert {u for u in (*units, *brute) if u in asked} == brute
        assert cal.ends_within(term.start, term.end) == sorted(
            b.term.end for b in cal.bookings.values() if term.start < b.term.end <= term.end)


STEP = st.one_of(
    st.tuples(st.just("place"), st.integers(1, 3), st.booleans(), st.sampled_from([0, 0, 20, 60]),
              st.sampled_from([10, 30, 120])),
    st.tuples(st.just("relinquish"), st.integers(0, 50)),
    st.tuples(st.just("extend"), st.integers(0, 50), st.sampled_from([-5, 20, 200])),
    st.tuples(st.just("time"), st.sampled_from([1, 15, 45, 200])),
    st.tuples(st.just("released-behind"), st.integers(0, 50)),
    st.tuples(st.just("restart"),),
)


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_counters_and_indexes_equal_a_recomputation_after_every_step(kind, tmp_path):
    @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(STEP, min_size=1, max_size=14))
    def run(steps):
        store = open_kind(kind, tmp_path)
        try:
            clock = ManualClock()
            broker = Broker("broker", store, KEY, authority=AUTH)
            broker.accept(export_substrate(SUB, AUTH, "broker"))
            held: list[Any] = []
            for i, step in enumerate(steps):
                now = clock.now()
                if step[0] == "place":
                    _, nodes, lan, later, minutes = step
                    request, rids = request_of(i, nodes, lan)
                    start = now + later * MIN
                    try:
                        answer = broker.place(f"h{i}", demands_of(request, rids), Term(start, start + minutes * MIN),
                                              now)
                        held.extend(answer.tickets.values())
                    except GeniError:
                        pass  # full: nothing booked
                elif step[0] == "relinquish" and held:
                    broker.relinquish(held.pop(step[1] % len(held)), now)
                elif step[0] == "extend" and held:
                    k = step[1] % len(held)
                    try:
                        held[k] = broker.extend_ticket(held[k], held[k].end + step[2] * MIN, now=now)
                    except GeniError:
                        pass  # ended, or another promise starts before the new end
                elif step[0] == "time":
                    clock.advance(timedelta(minutes=step[1]))
                    broker.tick(clock.now())
                elif step[0] == "released-behind" and held:  # a slice manager released units in the store itself
                    store.release_owner(held[step[1] % len(held)].id.rsplit("/", 1)[0])
                elif step[0] == "restart":
                    broker = Broker("broker", store, KEY, authority=AUTH)
                check(broker, store, clock.now())
        finally:
            close(store)

    run()


def old_layout_store(path: Path, claims: dict[str, str]) -> None:
    """A SQLite store as slicex wrote it before claim counters: documents and claims only."""
    db = sqlite3.connect(path)
    db.executescript("""
CREATE TABLE docs (tbl TEXT NOT NULL, key TEXT NOT NULL, doc TEXT NOT NULL, PRIMARY KEY (tbl, key));
CREATE TABLE claims (key TEXT PRIMARY KEY, owner TEXT NOT NULL);
CREATE INDEX claims_owner ON claims (owner);""")
    db.executemany("INSERT INTO claims (key, owner) VALUES (?, ?)", claims.items())
    db.commit()
    db.close()


CLAIMS = {"core:urn:publicid:IDN+t.org+node+pc1:0": "g1", "core:urn:publicid:IDN+t.org+node+pc1:1": "g1",
          "mem:urn:publicid:IDN+t.org+node+pc1:0": "g2", "vlan:sw1:1000": "g2", "sm-lock:r1": "sm"}


def test_a_sqlite_store_made_before_counters_gets_them_counted_from_its_claims(tmp_path):
    path = tmp_path / "old.db"
    old_layout_store(path, CLAIMS)
    store = SqliteStore(str(path))
    want = {"core:urn:publicid:IDN+t.org+node+pc1": 2, "mem:urn:publicid:IDN+t.org+node+pc1": 1, "vlan:sw1": 1,
            "sm-lock": 1}
    assert store.claim_counts() == want
    assert store.claim_all(["core:urn:publicid:IDN+t.org+node+pc1:2"], "g3")  # and kept from then on
    assert store.release("vlan:sw1:1000", "g2")
    del want["vlan:sw1"]
    want["core:urn:publicid:IDN+t.org+node+pc1"] = 3
    assert store.claim_counts() == want
    store.close()
    again = SqliteStore(str(path))
    assert again.claim_counts() == want == again.recount_claims()  # opened again: not counted twice
    again.close()


def test_a_redis_store_made_before_counters_gets_them_counted_from_its_claims(tmp_path):
    store = open_kind("redis", tmp_path)
    try:
        for key, owner in CLAIMS.items():  # claims as the scripts before counters left them
            store._r.set(store._c(key), owner)
            store._r.sadd(store._o(owner), store._c(key))
        fresh = type(store)(REDIS_URL, prefix=store.prefix)
        fresh.reindex()  # the migration step `redis indexes` (deployment/migrations.py)
        assert fresh.claim_counts() == counts_of(CLAIMS)
        assert fresh.claims_under("vlan:sw1") == {"vlan:sw1:1000": "g2"}
        assert fresh.release("vlan:sw1:1000", "g2") and "vlan:sw1" not in fresh.claim_counts()
        fresh.close()
    finally:
        close(store)


def test_a_broker_repairs_counters_that_disagree_with_the_claims_when_it_reads_a_pool(tmp_path):
    store = SqliteStore(str(tmp_path / "s.db"))
    broker = Broker("broker", store, KEY, authority=AUTH)
    broker.accept(export_substrate(SUB, AUTH, "broker"))
    now = ManualClock().now()
    request, rids = request_of(0, 2, True)
    broker.place("h", demands_of(request, rids), Term(now, now + 10 * MIN), now)
    right = store.claim_counts()
    store._run(lambda db: db.execute("UPDATE claim_counts SET n = n + 7"))  # counters lost their way
    assert store.claim_counts() != right
    again = Broker("broker", store, KEY, authority=AUTH)  # a start reads the counters, not the claims
    request, rids = request_of(1, 1, False)
    again.place("h", demands_of(request, rids), Term(now, now + 10 * MIN), now)  # reads the pools it asks about
    assert store.claim_counts() == counts_of(store.all_claims())
    check(again, store, now)
    store.close()


def test_first_fit_starts_after_the_hosts_the_claims_fill_and_goes_back_to_a_freed_one(tmp_path):
    """Issue 33: first-fit weighed, at every placement, each host the live slices had filled before the one
    that fits (the lifecycle's cost grew with L). The broker's claim copy keeps the run of leading full hosts:
    a placement weighs as many hosts with 40 filled as with 10, and a host that loses a claim is first again."""
    vm_host = next(h for h in BASE.hosts if not h.exclusive)
    hosts = tuple(replace(vm_host, name=f"vm{i}", component_id=f"urn:publicid:IDN+t.org+node+vm{i}", cores=1,
                          memory_mb=4096, interfaces=()) for i in range(50))
    sub = replace(BASE, hosts=hosts, switches=(), trunks=())
    store = SqliteStore(str(tmp_path / "ff.db"))
    clock = ManualClock()
    broker = Broker("broker", store, KEY, authority=AUTH)
    broker.accept(export_substrate(sub, AUTH, "broker"))
    weighed: list[str] = []
    held_by_others = broker._copy.held_by_others
    broker._copy.held_by_others = lambda counter, group: weighed.append(counter) or held_by_others(counter, group)

    def place(i: int) -> Any:
        request, rids = request_of(i, 1, False)
        now = clock.now()
        answer = broker.place(f"h{i}", demands_of(request, rids), Term(now, now + 60 * MIN), now)
        return next(iter(answer.tickets.values()))

    tickets, cost = [], {}
    for i in range(41):
        weighed.clear()
        tickets.append(place(i))
        cost[i] = len(weighed)
        assert tickets[-1].units[0].startswith(f"core:urn:publicid:IDN+t.org+node+vm{i}:"), "not first-fit"
    assert cost[40] == cost[10] <= 2, cost
    broker.relinquish(tickets[3], clock.now())  # a host the run passed gets a free core: first-fit takes it
    assert place(100).units[0].startswith("core:urn:publicid:IDN+t.org+node+vm3:")
    assert place(101).units[0].startswith("core:urn:publicid:IDN+t.org+node+vm41:")
    store.close()
