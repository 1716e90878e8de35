"""Kill the slice manager at every boundary of an Update's staging, commit and revert, bring it back from the
store, and check that the Update either completes (a commit that began) or reverts (anything else: by its
expiry, or a revert that began) and that nothing leaks: no unit, tag, ticket or lease held by nobody. On
SQLite and on a real Redis (the actors of tests/integration/test_reservation_crash.py)."""

from __future__ import annotations

import uuid
from collections import Counter
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


@pytest.mark.parametrize("boundary,cancel", CASES)
def test_a_crash_during_an_update_completes_or_reverts(tmp_path, boundary, cancel):
    run(SqliteStore(str(tmp_path / "s.db")), boundary, cancel)


@pytest.mark.parametrize("boundary,cancel", CASES)
def test_a_crash_during_an_update_completes_or_reverts_on_real_redis(boundary, cancel):
    from slicex.store.redis_store import RedisStore

    store = RedisStore(REDIS_URL, prefix=f"upd-crash-{uuid.uuid4().hex[:8]}")
    try:
        run(store, boundary, cancel)
    finally:
        store.flush()


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
