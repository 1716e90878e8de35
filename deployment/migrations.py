"""The store's layout steps, in order (the mechanism: slicex/store/migration.py). `slicex up` runs the steps a
store has not done before it starts any actor; every other process refuses a store that is behind.

1 time index: every slice manager record named by its slice's index and filed in the time index under
  `due_at`, every authority lease under its end, every open usage record under its expiry (what the
  `sm-layout`, `authority-layout` and `usage-layout` marks did, each actor at its own start; the marks go).
2 redis indexes: a Redis store's claims in their namespace hashes, its document keys in their tables' key
  indexes, its claim counters recounted (what the Redis store's once-scripts did, per client, on first use).
3 lean records (issue 33): slice manager records, authority leases, broker tickets and usage records
  rewritten without their defaults and without what they repeat (a lease's fields its ticket holds, a
  spec's units its lease holds, an open usage record's copy in `usage`). Signed documents keep their
  signed bytes: a lease read back is the same value, its signature still verifies.
4 lease claim owners (issue 33): each lease's `leased:` claims given from the lease id to its short owner
  name (authority/actor.py `lease_owner`), one atomic `reown` per lease.
5 held index (issue 33): every live slice manager record filed in `sm-held` under its owner's and its slice's
  authority (slice_manager/held.py), so a federation peer's usage limit reads only the peer's namespaces.
6 broker ticket index (issue 33): every active broker ticket filed in the time index under its end plus the
  expiry grace (and, on Redis, in its table's key index: tickets are read by claim group), every active ticket
  not claimed yet named in `broker-advance`, so a broker's start reads the advance tickets only.
7 usage counters (issue 33): every open usage record rewritten with its tally (what it counts against its
  user's and project's limits, `operations/accounting.py` `tally_of`; a replaced link names the one replacing
  it), so a quota check reads two counters instead of every open record; on Redis also in its table's key
  index, so the ledger's rotating check (`Ledger.sweep`) reads a page of them by key range.

Each step reads every document of its tables once and may run again (kill -9 mid-step: the next `slicex up`
runs it from its start); the readers of this slicex read the forms before and after it."""

from __future__ import annotations

from typing import Any

from msgspec.structs import replace

from authority.actor import LAYOUT as AUTHORITY_LAYOUT
from authority.actor import LEASES, lease_document, lease_owner, packed
from broker.broker import ADVANCE, TICKETS, lean_ticket, ticket_due
from operations.accounting import UsageRecord, tally_of
from operations.ledger import LAYOUT as USAGE_LAYOUT
from operations.ledger import OPEN, USAGE
from slice_manager import held
from slice_manager.held import HELD
from slice_manager.records import LAYOUT as SM_LAYOUT
from slice_manager.records import RESERVATIONS, SLIVERS_OF, Record, due_at, index_key
from slicex.codec import decode, encode
from slicex.store.migration import Step
from slicex.ticket import Lease


def _lease_end(doc: dict[str, Any]) -> float:
    return decode(lease_document(doc)["lease"], Lease, "lease").end.timestamp()


def _usage_due(rec: UsageRecord) -> float | None:
    return rec.expires.timestamp() if rec.expires else None


def time_index(store: Any) -> int:
    n = 0
    indexed = {(d["slice_urn"], d["id"]) for d in store.scan(SLIVERS_OF)}
    for d in store.scan(RESERVATIONS):
        rec = Record.from_doc(d)
        if (rec.slice_urn, rec.id) not in indexed:
            store.put(SLIVERS_OF, index_key(rec.slice_urn, rec.id), {"slice_urn": rec.slice_urn, "id": rec.id})
        store.put(RESERVATIONS, rec.id, d, due=due_at(rec))
        n += 1
    for d in store.scan(LEASES):
        store.put(LEASES, lease_document(d)["lease"]["id"], d, due=_lease_end(d))
        n += 1
    for d in store.scan(OPEN):
        rec = decode(d, UsageRecord, "usage record")
        store.put(OPEN, rec.sliver_urn, d, due=_usage_due(rec))
        n += 1
    store.delete(SM_LAYOUT, "records")
    store.delete(AUTHORITY_LAYOUT, "leases")
    store.delete(USAGE_LAYOUT, "open")
    return n


def redis_indexes(store: Any) -> int:
    reindex = getattr(store, "reindex", None)  # a Redis store; SQLite keeps its indexes in its schema
    return int(reindex()) if reindex is not None else 0


def lean_records(store: Any) -> int:
    n = 0
    for d in store.scan(RESERVATIONS):
        rec = Record.from_doc(d)
        lean = rec.to_doc()
        if lean != d:
            store.put(RESERVATIONS, rec.id, lean, due=due_at(rec))
            n += 1
    for d in store.scan(LEASES):
        lean = packed(lease_document(d))
        if lean != d:
            store.put(LEASES, d["lease"]["id"], lean, due=_lease_end(d))
            n += 1
    for d in store.scan(TICKETS):
        lean = lean_ticket(d)
        if lean != d:
            store.put(TICKETS, d["ticket"]["id"], lean)
            n += 1
    opened = set()
    for d in store.scan(OPEN):
        rec = decode(d, UsageRecord, "usage record")
        opened.add(rec.sliver_urn)
        if encode(rec) != d:
            store.put(OPEN, rec.sliver_urn, encode(rec), due=_usage_due(rec))
            n += 1
    for d in store.scan(USAGE):
        rec = decode(d, UsageRecord, "usage record")
        if rec.sliver_urn in opened:  # a copy of an open record: `usage` holds ended ones only
            store.delete(USAGE, rec.sliver_urn)
            n += 1
        elif encode(rec) != d:
            store.put(USAGE, rec.sliver_urn, encode(rec))
            n += 1
    return n


def lease_claim_owners(store: Any) -> int:
    n = 0
    for d in store.scan(LEASES):
        lease_id = d["lease"]["id"]
        n += store.reown(lease_id, lease_owner(lease_id))
    return n


def held_index(store: Any) -> int:
    n = 0
    for d in store.scan(RESERVATIONS):
        entry = held.filed(Record.from_doc(d))
        if entry is not None:
            for key in held.keys(entry):
                store.put(HELD, key, entry)
            n += 1
    return n


def broker_ticket_index(store: Any) -> int:
    n = 0
    for d in store.scan(TICKETS):
        tid = d["ticket"]["id"]
        active = d.get("state") == "active"
        if active and not d.get("claimed", True):
            store.put(ADVANCE, tid, {"id": tid, "broker": d["broker"]})
        store.put(TICKETS, tid, d, due=ticket_due(d) if active else None)
        n += 1
    return n


def usage_counters(store: Any) -> int:
    opened = {rec.sliver_urn: rec for rec in (decode(d, UsageRecord, "usage record") for d in store.scan(OPEN))}
    by = {rec.replaces: urn for urn, rec in opened.items() if rec.replaces in opened}
    for urn, rec in opened.items():
        rec = replace(rec, replaced_by=by.get(urn, rec.replaced_by))
        store.put(OPEN, urn, encode(rec), due=_usage_due(rec),
                  tally=tally_of(OPEN, rec, opened.get(rec.replaces) if rec.replaces else None))
    return len(opened)


STEPS = (Step(1, "time index", time_index), Step(2, "redis indexes", redis_indexes),
         Step(3, "lean records", lean_records), Step(4, "lease claim owners", lease_claim_owners),
         Step(5, "held index", held_index), Step(6, "broker ticket index", broker_ticket_index),
         Step(7, "usage counters", usage_counters))
