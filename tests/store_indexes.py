"""Every index the store keeps beside the slice manager's records and the authority's leases, recomputed from
the documents: what the property, crash and migration tests compare the indexes with."""

from __future__ import annotations

import math
from typing import Any

from authority.actor import LEASES, lease_document
from slice_manager.records import RESERVATIONS, SLIVERS_OF, Record, due_at
from slicex.ticket import Lease


def inner(store: Any) -> Any:
    """The store under an actor's view (slicex.store.ownership) or a guard."""
    while hasattr(store, "inner"):
        store = store.inner
    return store


def assert_indexes_match(store: Any) -> None:
    """The time index of records and leases, the per-slice index, and (Redis) the key index of every table
    equal what the documents say: no record that needs work missing, none filed at another time."""
    store = inner(store)
    recs = [Record.from_doc(d) for d in store.scan(RESERVATIONS)]
    filed = dict(store.due(RESERVATIONS, math.inf))
    assert filed == {r.id: due_at(r) for r in recs if due_at(r) is not None}, "records' time index"
    leases = [Lease.from_doc(lease_document(d)["lease"]) for d in store.scan(LEASES)]
    assert dict(store.due(LEASES, math.inf)) == {x.id: x.end.timestamp() for x in leases}, "leases' time index"
    named = {(d["slice_urn"], d["id"]) for d in store.scan(SLIVERS_OF)}
    assert {(r.slice_urn, r.id) for r in recs} <= named, "a record its slice's index does not name"
    for r in recs:  # what a call reads: its slice's records through the index, found by key prefix
        assert r.id in {d["id"] for d in store.scan(SLIVERS_OF, f"{r.slice_urn}#")}
    redis = getattr(store, "_r", None)
    if redis is not None:
        keys = set(redis.zrange(store._k(SLIVERS_OF), 0, -1))
        assert keys == set(redis.hkeys(store._t(SLIVERS_OF))), f"key index of {SLIVERS_OF}"
        for table in (RESERVATIONS, LEASES):  # not read by prefix (slicex/store/ownership.py KEY_INDEXED)
            assert redis.zcard(store._k(table)) == 0, f"a key index of {table}"
