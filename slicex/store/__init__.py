"""The store every actor keeps its state in: JSON documents by (table, key) plus atomic claims.

Claims are how units, VLAN tags and addresses are taken without a read-then-write race: a claim on a key
succeeds for exactly one owner. `claim_all` is all-or-nothing. `scan` with a prefix reads only the documents
whose keys start with it (so a table keyed by slice is read one slice at a time). A claim's namespace is its key
before the first ":"; `claims_in` lists the claims of some namespaces only (on Redis a hash per namespace, not
a SCAN of the keyspace), so an actor reads its own claims without touching the others' (slicex.store.ownership
says who owns which; `all_claims` lists every claim, for tests and diagnostics). Embedded deployments use SQLite; scaled-out
ones use Redis (slicex.store.redis_store) with the same behaviour.

The time index: `put` with `due` (seconds since the epoch) files the document under that time in its table's
index, atomically with the document (a put without `due`, or a delete, takes it out); `due(table, until)` lists
the keys filed at or before `until`, earliest first, reading only those. It is how clocks find what fell due
(expiries, deadlines, undelivered messages) without reading every document.

Tallies: `put` with `tally` ({counter: {field: amount}}) adds the amounts to those counters atomically with the
document, taking out what the document's previous version added (a put without `tally`, or a delete, takes
it all out); `tallies(counter)` reads one counter's fields (zero ones left out). It is how a sum over many
documents (what a user holds now, for quotas) is one read (SQLite: a `tally` column and triggers in the
document's statement; Redis: the same script as the document).

Pages: `page(table, cursor, limit)` reads about `limit` documents of a table from where `cursor` left off ("" for
the start) and answers the cursor to go on from ("" once the table is done): a sweep over a whole table a
page at a time (SQLite: a range of the primary key after the last key; Redis: HSCAN's cursor, which may answer
a small hash whole). A pass sees every document present from its start to its end at least once.

Claim changes: every claim, release or new owner of a claim marks its counter (its pool) with a new claims
generation, atomically with the change; `claim_changes(since)` answers the store's generation now and the
counters marked after generation `since`, reading only those (an index on SQLite, a sorted set on
Redis). A process keeping a copy of the claims reads again only the pools that changed since it last asked.
Generations only order changes: a store may skip numbers (SQLite takes one per claim changed, Redis one per
write), so a reader compares them, never counts them. A store made before has generation 0 and nothing marked. A
generation lower than one a reader saw means the store went back (restored from a copy, or a Redis failover
that lost its last writes): the reader reads every claim again.

`release_all(keys, owner)` releases the keys of `owner` among `keys` in one write (one statement, one
script: a ticket's or a lease's units given back at once, not one write per unit) and answers how many it
released; `release(key, owner)` is the same for one key.

`reown(owner, new_owner)` gives every claim of one owner to another atomically (a migration step renames
owners; deployment/migrations.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol


def counter_of(key: str) -> str:
    """The free-capacity counter a claim of `key` counts in: its text before the last ":" (the pool of a unit
    `<pool>:<index>`: `core:<host>:3` counts in `core:<host>`, `vlan:<switch>:100` in `vlan:<switch>`); ""
    for a key without one (not counted). Every store keeps, per counter, how many claims it holds, updated
    atomically with the claims themselves, so a broker reads a pool's use without reading its claims."""
    head, sep, _last = key.rpartition(":")
    return head if sep else ""


def namespace_of(key: str) -> str:
    """The claim namespace of `key`: its text before the first ":" ("" when it has none)."""
    kind, sep, _rest = key.partition(":")
    return kind if sep else ""


class Store(Protocol):
    def get(self, table: str, key: str) -> dict[str, Any] | None: ...
    def put(self, table: str, key: str, doc: dict[str, Any], due: float | None = None,
            tally: Mapping[str, Mapping[str, int]] | None = None) -> None: ...
    def delete(self, table: str, key: str) -> bool: ...
    def scan(self, table: str, prefix: str = "") -> list[dict[str, Any]]: ...
    def due(self, table: str, until: float, limit: int | None = None) -> list[tuple[str, float]]: ...
    def page(self, table: str, cursor: str, limit: int) -> tuple[list[dict[str, Any]], str]: ...
    def tallies(self, counter: str) -> dict[str, int]: ...
    def claim(self, key: str, owner: str) -> bool: ...
    def claim_all(self, keys: list[str], owner: str) -> bool: ...
    def release(self, key: str, owner: str) -> bool: ...
    def release_all(self, keys: list[str], owner: str) -> int: ...
    def release_owner(self, owner: str) -> int: ...
    def reown(self, owner: str, new_owner: str) -> int: ...
    def owner_of(self, key: str) -> str | None: ...
    def claims_of(self, owner: str) -> list[str]: ...
    def claims_in(self, namespaces: Iterable[str]) -> dict[str, str]: ...
    def all_claims(self, prefix: str = "") -> dict[str, str]: ...
    def claim_counts(self, prefix: str = "") -> dict[str, int]: ...
    def claims_under(self, counter: str) -> dict[str, str]: ...
    def claim_changes(self, since: int) -> tuple[int, list[str]]: ...
    def recount_claims(self, repair: bool = False) -> dict[str, int]: ...
    def close(self) -> None: ...


REDIS_SCHEMES = ("redis://", "rediss://", "redis+sentinel://")
"""The URLs of a store every process of a distributed deployment shares: one Redis, or one Sentinel manages."""


def is_shared(url: str) -> bool:
    """Whether `url` names a Redis store (plain or through Sentinel), which processes on several hosts share."""
    return url.startswith(REDIS_SCHEMES)


def open_store(url: str) -> Store:
    """Open a store by URL: `sqlite:///path/to.db`, `sqlite://:memory:`, `redis://host:port/db`, or
    `redis+sentinel://host:port[,host:port...]/master[/db]` (slicex.store.urls)."""
    if url.startswith("sqlite://"):
        from slicex.store.sqlite_store import SqliteStore

        path = url[len("sqlite://"):]
        return SqliteStore(":memory:" if path in ("", ":memory:", "/:memory:") else path)
    if is_shared(url):
        from slicex.store.redis_store import RedisStore

        return RedisStore(url)
    raise ValueError(f"unknown store URL {url!r}; use sqlite:///PATH, redis://HOST:PORT/DB or "
                     f"redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB]")
