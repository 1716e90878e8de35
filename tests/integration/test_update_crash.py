"""Kill the slice manager at every boundary of an Update's staging, commit and revert, bring it back from the
store, and check that the Update either completes (a commit that began) or reverts (anything else: by its
expiry, or a revert that began) and that nothing leaks: no unit, tag, ticket or lease held by nobody. On
SQLite and on a real Redis (the actors of tests/integration/test_reservation_crash.py)."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest

from rspec.request import parse_request
from slice_manager.actor import Crash
from slicex.clock import ManualClock
from slicex.store.sqlite_store import SqliteStore
from tests.factories import request_rspec, vm
from tests.integration.test_reservation_crash import REDIS_URL, SLICE, World, converged

PAIR = request_rspec([vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0"])],
                     [{"client_id": "l1", "ifaces": ["n1:if0", "n2:if0"]}])
TRIPLE = request_rspec([vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0", "n2:if1"]),
                        vm("n3", ifaces=["n3:if0"])],
                       [{"client_id": "l1", "ifaces": ["n1:if0", "n2:if0"]},
                        {"client_id": "l2", "ifaces": ["n2:if1", "n3:if0"]}])
COMMIT = ["update:staging", "update:staged", "update:committing", "update:provisioned"]
CANCEL = ["update:reverting"]
COMPLETES = {"update:committing", "update:provisioned"}  # a commit that began is completed after a restart


def scenario(w: World, clock: ManualClock, cancel: bool) -> None:
    """A provisioned pair; an Update adding n3 and l2; Provision commits it (or Cancel reverts it)."""
    now = clock.now()
    slivers = w.sm.allocate(SLICE, "o", parse_request(PAIR), now + timedelta(minutes=10), now)
    w.sm.provision([s.urn for s in slivers], now + timedelta(hours=2), [], now)
    w.sm.update(SLICE, [], parse_request(TRIPLE), now + timedelta(minutes=10), now + timedelta(minutes=10), now)
    if cancel:
        w.sm.cancel(SLICE, [], now)
    else:
        w.sm.provision([s.urn for s in w.sm.slivers(SLICE, now)], now + timedelta(hours=2), [], now)


def topology(w: World, clock: ManualClock) -> set[str]:
    return {s.client_id for s in w.sm.slivers(SLICE, clock.now())}


def run(store, boundary: str, cancel: bool) -> None:
    seen: Counter = Counter()

    def hook(b: str) -> None:
        seen[b] += 1
        if b == boundary:
            raise Crash(b)

    clock = ManualClock()
    w = World(store, hook)
    w.clock = clock
    with pytest.raises(Crash):
        scenario(w, clock, cancel)
    w.restart({"sm"})
    w.sm.recover(clock.now())
    if boundary in COMPLETES:
        assert topology(w, clock) == {"n1", "n2", "n3", "l1", "l2"}
        assert w.sm.pending_update(SLICE) is None
        assert {s.allocation_state for s in w.sm.slivers(SLICE, clock.now())} == {"geni_provisioned"}
    clock.advance(timedelta(minutes=11))  # past the update's expiry: anything uncommitted reverts
    w.sm.reap(clock.now())
    converged(w, store)
    assert w.sm.pending_update(SLICE) is None
    expected = {"n1", "n2", "n3", "l1", "l2"} if boundary in COMPLETES else {"n1", "n2", "l1"}
    assert topology(w, clock) == expected
    assert {s.allocation_state for s in w.sm.slivers(SLICE, clock.now())} == {"geni_provisioned"}
    n2 = next(s for s in w.sm.slivers(SLICE, clock.now()) if s.client_id == "n2")
    assert set(n2.details["interfaces"]) == ({"n2:if0", "n2:if1"} if boundary in COMPLETES else {"n2:if0"})


CASES = [(b, False) for b in COMMIT] + [(b, True) for b in CANCEL]


@contextmanager
def redis_store(name: str) -> Iterator[object]:
    """A store on the real Redis under a prefix of its own, flushed afterwards."""
    from slicex.store.redis_store import RedisStore

    store = RedisStore(REDIS_URL, prefix=f"{name}-{uuid.uuid4().hex[:8]}")
    try:
        yield store
    finally:
        store.flush()


@pytest.mark.parametrize("boundary,cancel", CASES)
def test_a_crash_during_an_update_completes_or_reverts(tmp_path, boundary, cancel):
    run(SqliteStore(str(tmp_path / "s.db")), boundary, cancel)


@pytest.mark.parametrize("boundary,cancel", CASES)
def test_a_crash_during_an_update_completes_or_reverts_on_real_redis(boundary, cancel):
    with redis_store("upd-crash") as store:
        run(store, boundary, cancel)


def provisioned_pair(store) -> tuple[World, ManualClock, list]:
    """The actors over `store` (no crashes) and a provisioned pair in SLICE."""
    w = World(store, lambda b: None)
    clock = w.clock = ManualClock()
    now = clock.now()
    slivers = w.sm.allocate(SLICE, "o", parse_request(PAIR), now + timedelta(minutes=10), now)
    w.sm.provision([s.urn for s in slivers], now + timedelta(hours=2), [], now)
    return w, clock, slivers


def test_a_commit_that_fails_half_way_puts_the_rewired_nodes_back(tmp_path):
    """l1's capacity changes (a new l1, both nodes rewired onto it); the authority refuses to rewire the second
    node: the Update is reverted whole, and the first node is put back on the old l1 at the authority too."""
    from protocol.messages import REWIRE
    from slicex.errors import ServerError

    store = SqliteStore(str(tmp_path / "s.db"))
    w, clock, slivers = provisioned_pair(store)
    now = clock.now()
    old_l1 = next(s for s in w.sm.slivers(SLICE, now) if s.client_id == "l1")
    faster = request_rspec([vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0"])],
                           [{"client_id": "l1", "ifaces": ["n1:if0", "n2:if0"], "capacity": 50000}])
    w.sm.update(SLICE, [], parse_request(faster), now + timedelta(minutes=10), now + timedelta(minutes=10), now)
    real = w.authority.modify
    rewired: list[str] = []

    def modify(lease_id, action, when, properties=None):
        if action == REWIRE:
            rewired.append(lease_id)
            if len(rewired) == 2:
                raise ServerError("the driver could not add the port")
        return real(lease_id, action, when, properties=properties)

    w.authority.modify = modify
    with pytest.raises(ServerError, match="so it was reverted"):
        w.sm.provision([s.urn for s in w.sm.slivers(SLICE, now)], now + timedelta(hours=2), [], now)
    assert len(rewired) == 3  # the first node, the second (refused), the first put back
    first = w.authority.lease_doc(rewired[0])["spec"]["details"]["interfaces"]
    assert [i["vlan_tag"] for i in first.values()] == [old_l1.details["vlan_tag"]]
    assert w.sm.pending_update(SLICE) is None
    assert {s.client_id: s.urn for s in w.sm.slivers(SLICE, now) if s.client_id == "l1"} == {"l1": old_l1.urn}
    converged(w, store)


def test_a_provision_that_waited_while_another_worker_reverted_the_update_commits_nothing(tmp_path):
    """Provision read the staged Update, then waited for its slivers while another AM worker's reaper reverted
    it at its expiry: it answers EXPIRED instead of committing what is gone."""
    from slicex.errors import Expired

    store = SqliteStore(str(tmp_path / "s.db"))
    w, clock, slivers = provisioned_pair(store)
    now = clock.now()
    w.sm.update(SLICE, [], parse_request(TRIPLE), now + timedelta(minutes=10), now + timedelta(minutes=10), now)
    seen = w.sm.pending_update(SLICE)
    clock.advance(timedelta(minutes=11))
    w.sm.reap(clock.now())  # the other worker's reaper: reverted
    assert w.sm.pending_update(SLICE) is None
    with pytest.raises(Expired, match="reverted before it could be committed"):
        w.sm._provision_update(seen, [s.urn for s in slivers], now + timedelta(hours=2), [], now)
    assert topology(w, clock) == {"n1", "n2", "l1"} and w.sm.pending_update(SLICE) is None
    converged(w, store)


# ---- the usage ledger across a crash -----------------------------------------------------------------------
WIDER = request_rspec([vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0", "n2:if1"]),
                       vm("n3", ifaces=["n3:if0"])],
                      [{"client_id": "l1", "ifaces": ["n1:if0", "n2:if0"], "capacity": 5000},
                       {"client_id": "l2", "ifaces": ["n2:if1", "n3:if0"], "capacity": 2000}])
LEDGER_COMMIT = ["update:staging", "update:charged", *COMMIT[1:], "update:applied", "update:discharged"]
LEDGER_COMPLETES = COMPLETES | {"update:applied", "update:discharged"}


def ledger_whole(w: World, ledger, clock: ManualClock) -> None:
    """Every live sliver of the slice has one open usage record and no other is open; what the quota check
    counts is what the live slivers hold."""
    from operations.accounting import held_now, sliver_amounts, total

    live = w.sm.slivers(SLICE, clock.now())
    assert {r.sliver_urn for r in ledger.open_records()} == {s.urn for s in live}
    assert held_now(ledger.open_records(), "o", None)[0] == total(sliver_amounts(s.kind, s.details) for s in live)


def run_with_ledger(store, boundary: str, cancel: bool) -> None:
    """A provisioned pair (l1 at 1,000 kbps) recorded in the ledger; an Update through the ledger that adds n3
    and l2 and replaces l1 by one of 5,000 kbps; Provision (or Cancel) killed at `boundary`."""
    from operations.ledger import Ledger

    def hook(b: str) -> None:
        if b == boundary:
            raise Crash(b)

    clock = ManualClock()
    w = World(store, hook)
    w.clock = clock
    ledger = Ledger(store, w.sm.substrate)
    w.sm.ledger = ledger
    now = clock.now()
    pair = parse_request(request_rspec([vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0"])],
                                       [{"client_id": "l1", "ifaces": ["n1:if0", "n2:if0"], "capacity": 1000}]))
    slivers = ledger.allocate("o", SLICE, pair, now, now + timedelta(minutes=10), True,
                              lambda end: w.sm.allocate(SLICE, "o", pair, end, now))
    ledger.extended(w.sm.provision([s.urn for s in slivers], now + timedelta(hours=2), [], now))
    with pytest.raises(Crash):
        ledger.update("o", SLICE, parse_request(WIDER), w.sm.slivers(SLICE, now), now, now + timedelta(minutes=10),
                      lambda: w.sm.update(SLICE, [], parse_request(WIDER), now + timedelta(minutes=10),
                                          now + timedelta(minutes=10), now, requester="o"))
        if cancel:
            w.sm.cancel(SLICE, [], now)
        else:
            ledger.extended(w.sm.provision([s.urn for s in w.sm.slivers(SLICE, now)], now + timedelta(hours=2), [],
                                           now))
    w.restart({"sm"})
    w.sm.ledger = ledger
    w.sm.recover(clock.now())
    clock.advance(timedelta(minutes=11))  # past the update's expiry: anything uncommitted reverts
    w.sm.reap(clock.now())
    converged(w, store)
    assert w.sm.pending_update(SLICE) is None
    live = {s.client_id: s for s in w.sm.slivers(SLICE, clock.now())}
    if boundary in LEDGER_COMPLETES:
        assert set(live) == {"n1", "n2", "n3", "l1", "l2"} and live["l1"].details["capacity_kbps"] == 5000
    else:
        assert set(live) == {"n1", "n2", "l1"} and live["l1"].details["capacity_kbps"] == 1000
    ledger_whole(w, ledger, clock)


@pytest.mark.parametrize("boundary,cancel", [(b, False) for b in LEDGER_COMMIT] + [(b, True) for b in CANCEL])
def test_a_crash_during_an_update_leaves_the_ledger_whole(tmp_path, boundary, cancel):
    run_with_ledger(SqliteStore(str(tmp_path / "s.db")), boundary, cancel)


@pytest.mark.parametrize("boundary,cancel", [(b, False) for b in LEDGER_COMMIT] + [(b, True) for b in CANCEL])
def test_a_crash_during_an_update_leaves_the_ledger_whole_on_real_redis(boundary, cancel):
    with redis_store("upd-ledger") as store:
        run_with_ledger(store, boundary, cancel)
