"""A placement reads from the store what changed since the last one, not every pool in use (issue 33): the
store marks each pool a claim, release or new owner touches with a new claims generation, atomically with the
change (the store contract: tests/integration/test_store_contract.py), and the broker's copy of the claims
reads again only the pools marked since it last asked. On SQLite and on a real Redis, the copy still follows what another broker process on the store did,
including a change the pool counters cannot show (a unit released and another owner's claimed in its pool)."""

from __future__ import annotations

from typing import Any

import pytest

from broker.broker import Broker
from protocol.messages import demands_of
from resources import export_substrate
from slicex.clock import ManualClock
from slicex.inventory import UNIT_KINDS
from slicex.store import namespace_of
from slicex.term import Term
from tests.integration.test_broker_counters import AUTH, KEY, MIN, SUB, close, open_kind, request_of

KINDS = ["sqlite", "redis"]


class Counting:
    """A store that counts the claim rows and counters a caller reads (the broker's copy's reads)."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.rows = 0

    def claim_counts(self, prefix: str = "") -> dict:
        found = self.inner.claim_counts(prefix)
        self.rows += len(found)
        return found

    def claim_changes(self, since: int) -> tuple[int, list[str]]:
        gen, changed = self.inner.claim_changes(since)
        self.rows += len(changed)
        return gen, changed

    def claims_under(self, counter: str) -> dict:
        found = self.inner.claims_under(counter)
        self.rows += 1  # one pool read
        return found

    def claims_in(self, namespaces) -> dict:
        found = self.inner.claims_in(namespaces)
        self.rows += len(found)
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize("kind", KINDS)
def test_a_placement_reads_as_much_with_many_pools_claimed_as_with_few(kind, tmp_path):
    inner = open_kind(kind, tmp_path)
    try:
        store = Counting(inner)
        clock = ManualClock()
        broker = Broker("broker", store, KEY, authority=AUTH)
        broker.accept(export_substrate(SUB, AUTH, "broker"))

        def reads_of_a_placement(i: int) -> int:
            now = clock.now()
            request, rids = request_of(i, 1, False)
            store.rows = 0
            broker.place(f"h{i}", demands_of(request, rids), Term(now, now + 10 * MIN), now)
            return store.rows

        reads_of_a_placement(0)
        few = reads_of_a_placement(1)
        # another process claims units in 400 more pools (hosts this broker does not place on)
        for n in range(400):
            assert inner.claim_all([f"core:urn:publicid:IDN+t.org+node+far{n}:0"], f"other{n}")
        reads_of_a_placement(2)  # reads those 400 pools again, once
        many = reads_of_a_placement(3)
        assert len(broker._copy.by_counter) > 400
        assert many == few, f"a placement read {few} claim rows with few pools claimed and {many} with many"
    finally:
        close(inner)


def unit_claims(store: Any) -> dict[str, str]:
    return {k: o for k, o in store.all_claims().items() if namespace_of(k) in UNIT_KINDS}


@pytest.mark.parametrize("kind", KINDS)
def test_the_copy_follows_another_broker_process_on_the_store(kind, tmp_path):
    store = open_kind(kind, tmp_path)
    try:
        clock = ManualClock()
        now = clock.now()
        term = Term(now, now + 10 * MIN)
        a = Broker("broker", store, KEY, authority=AUTH)
        a.accept(export_substrate(SUB, AUTH, "broker"))
        b = Broker("broker", store, KEY, authority=AUTH)  # another process over the same store

        def place(broker: Broker, i: int) -> Any:
            request, rids = request_of(i, 1, False)
            return broker.place(f"h{i}", demands_of(request, rids), term, now, group=f"g{i}")

        place(a, 0)
        first = place(b, 1)
        a._copy.sync()
        assert a._copy.owner == unit_claims(store)
        # b releases its units and claims as many in the same pools for another group: the pools' counts are
        # unchanged, their owners are not
        for t in first.tickets.values():
            b.relinquish(t, now)
        place(b, 2)
        a._copy.sync()
        assert a._copy.owner == unit_claims(store), "the copy missed a change another process made"
        third = place(a, 3)  # and a places around what b holds
        units = unit_claims(store)
        assert len({o for o in units.values()}) == 3
        assert all(t.id.rsplit("/", 1)[0] == "g3" for t in third.tickets.values())
        a._copy.sync()
        assert a._copy.owner == units
    finally:
        close(store)


@pytest.mark.parametrize("kind", KINDS)
def test_the_copy_reads_every_claim_again_when_the_store_went_back(kind, tmp_path):
    """A store restored from a copy, or a Redis failover that lost its last writes, answers a generation lower
    than the one the copy saw; changes marked at generations the copy thinks it has read are read all the same."""
    from broker.claims import ClaimCopy, counts_of

    store = open_kind(kind, tmp_path)
    try:
        assert store.claim_all(["core:h1:0", "core:h1:1", "core:h2:0"], "g1")
        copy = ClaimCopy(store, UNIT_KINDS)
        copy.reload()
        assert store.release("core:h1:0", "g1") and store.claim_all(["core:h1:0"], "g2")
        if kind == "sqlite":
            store._run(lambda db: db.execute("UPDATE claim_changes SET gen = 0"))
        else:
            store._r.set(store._counts() + "-gen", 0)
            store._r.zadd(store._counts() + "-changed", {"core:h1": 0, "core:h2": 0})
        copy.sync()
        assert copy.seen == 0
        assert {k: copy.owner_of(k) for k in unit_claims(store)} == unit_claims(store)
        assert copy.owner_of("core:h1:0") == "g2" and copy.counts() == counts_of(unit_claims(store))
    finally:
        close(store)
