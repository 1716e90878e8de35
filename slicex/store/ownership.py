"""Who owns which part of the store: every table and claim namespace, its one writer and its readers.

Every actor shares one store (a SQLite file or a Redis server) but keeps its own state in it: an actor
writes only the tables and claim namespaces it owns, and reads another's only where `OWNERSHIP` says so
(each such read is a documented exception to "learn from others by message"). `scoped(store, actor)` is the
view an actor is given; it raises `OwnershipError` (a programming error, never a GENI error) on any other
access. A claim's namespace is the text of its key before the first ":" (`core:pc1:0` is in `core`,
`leased:core:pc1:0` in `leased`). docs/architecture.md's ownership table is `markdown_table()`
(tests/unit/test_store_ownership.py checks it, and that every table name the code uses is declared here)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from slicex.inventory import UNIT_KINDS
from slicex.store import Store, namespace_of


class Actor(StrEnum):
    SLICE_MANAGER = "slice manager"
    BROKER = "broker"
    AUTHORITY = "authority"
    SLICE_AUTHORITY = "slice authority"  # the clearinghouse: gcf SA, CH API MA/SA
    SEP = "slice exchange point"
    FPGA = "FPGA aggregate"
    OPERATIONS = "operations"  # quotas ledger, dashboard snapshots
    DEPLOYMENT = "deployment"  # the process wiring: the deployment record, health probes, the AM edge's lookups


class OwnershipError(RuntimeError):
    """An actor touched a table or claim namespace the declaration does not give it: a bug in slicex."""


@dataclass(frozen=True)
class Holding:
    """A table (`claims` False) or a claim namespace, its owner, who else reads it and why, and what it holds."""

    name: str
    owner: Actor
    what: str
    claims: bool = False
    readers: tuple[tuple[Actor, str], ...] = ()  # (reader, why it reads instead of asking by message)


KEY_INDEXED = frozenset({"sm-slice-slivers", "sm-requests", "sm-held", "delegations", "broker-out-of-service",
                         "broker-tickets", "usage-open", "bitstreams"})
"""The tables read by key prefix (`Store.scan(table, prefix)`): on Redis only these keep a key index beside
their hash (a sorted set of every key, written with each document); a prefix scan of another table reads its
hash with HSCAN (issue 33: the index cost about 130 bytes per document). tests/unit/test_store_ownership.py
checks that every prefix scan in the code names one of these. A table swept a page at a time (`Store.page`:
`usage-open`) keeps one too, so a page reads its own documents only."""

TALLIED = frozenset({"usage-open"})
"""The tables whose documents carry tallies (`Store.put(..., tally=)`): on Redis a put to one of these reads the
document's previous tally to take it out (a hash beside the table); other tables' puts skip it."""


_UNITS_READ = ((Actor.SLICE_MANAGER, "`usage_keys`: the operator dashboard's and metrics' view of every unit "
                "in use, without an actor call per tick"),)

OWNERSHIP: tuple[Holding, ...] = (
    # ---- slice manager
    Holding("sm-reservations", Actor.SLICE_MANAGER, "reservations with their outboxes, each filed in the time "
            "index when the clock next has work on it (the reaper reads only what fell due)"),
    Holding("sm-slice-slivers", Actor.SLICE_MANAGER, "`<slice>#<sliver>` → the sliver: a call reads its own "
            "slice's reservations with a key-prefix scan; written before the reservation, removed after it"),
    Holding("sm-held", Actor.SLICE_MANAGER, "`o#<owner authority>#<sliver>` and `s#<slice authority>#<sliver>` "
            "→ a live sliver: a federation peer's usage reads its namespaces' slivers with key-prefix scans; "
            "written before the reservation becomes live, removed after it ends"),
    Holding("sm-requests", Actor.SLICE_MANAGER, "requests (for manifests; keyed `<slice>#…`)"),
    Holding("sm-slices", Actor.SLICE_MANAGER, "slices shut down (Shutdown)"),
    Holding("sm-instances", Actor.SLICE_MANAGER, "heartbeats of the slice managers sharing the store"),
    Holding("sm-ended", Actor.SLICE_MANAGER, "why a slice's slivers ended (geni_error after they are gone)"),
    Holding("sm-updates", Actor.SLICE_MANAGER, "a slice's pending Update (staged, committing or reverting)"),
    Holding("sm-version", Actor.SLICE_MANAGER, "a token replaced on every write to its records (the dashboard's "
            "snapshot is built again only when it changes)"),
    Holding("sm-layout", Actor.SLICE_MANAGER, "a layout mark of a store made before its layout steps (removed by step 1, deployment/migrations.py)"),
    Holding("sm-lock", Actor.SLICE_MANAGER, "reservation → the slice manager working on it", claims=True),
    # ---- broker
    Holding("delegations", Actor.BROKER, "per broker and authority: delegated pools and label sets with the "
            "substrate description, reclaimed, draining, and the signed delegation documents accepted"),
    Holding("broker-out-of-service", Actor.BROKER, "per broker and authority: a copy of the delegation record's "
            "reclaimed and draining lists, read at every placement"),
    Holding("broker-tickets", Actor.BROKER, "tickets with their placement, each active one filed in the time "
            "index under its end plus a grace (the broker's clock drops those nobody relinquished); read by key "
            "prefix per claim group into the calendar when a call touches the group"),
    Holding("broker-advance", Actor.BROKER, "ticket id → its broker, for the tickets not claimed yet (advance "
            "reservations): what a start books into the calendar"),
    Holding("broker-relinquished", Actor.BROKER, "tickets and groups given back in the last hour: a late "
            "request for them is refused"),
    Holding("broker-version", Actor.BROKER, "per broker: a token replaced whenever inventory or promises change"),
    *(Holding(kind, Actor.BROKER, "unit → ticket group (the broker's current promises)", claims=True,
              readers=_UNITS_READ) for kind in UNIT_KINDS),
    # ---- authority
    Holding("authority-leases", Actor.AUTHORITY, "leases with the driver's record and the sliver spec, each "
            "filed in the time index under its end (the reaper reads only expired ones)"),
    Holding("authority-version", Actor.AUTHORITY, "per authority: a token replaced whenever a lease is written "
            "or removed (the dashboard's snapshot is built again only when it changes)"),
    Holding("authority-layout", Actor.AUTHORITY, "a layout mark of a store made before its layout steps (removed by step 1, deployment/migrations.py)"),
    Holding("authority-delegations", Actor.AUTHORITY, "per authority and broker: what it delegated (tickets "
            "are checked against it)"),
    Holding("authority-delegation-status", Actor.AUTHORITY, "per authority and broker: whether its delegation "
            "at start was taken, is being retried or was refused for good, and why",
            readers=((Actor.DEPLOYMENT, "`slicex status`"),)),
    Holding("authority-message-numbers", Actor.AUTHORITY, "per authority and broker: the number of its last "
            "signed delegation or reclaim"),
    Holding("leased", Actor.AUTHORITY, "`leased:<unit>` → lease id (the authority's leases)", claims=True),
    # ---- slice authority (clearinghouse)
    Holding("sa_slices", Actor.SLICE_AUTHORITY, "slice records (owner, members, expiry)",
            readers=((Actor.DEPLOYMENT, "the AM edge: whom `geni_users` may name besides the caller"),)),
    Holding("ch_projects", Actor.SLICE_AUTHORITY, "CH API projects and their members"),
    Holding("ch_sliver_info", Actor.SLICE_AUTHORITY, "CH API sliver info records"),
    Holding("ma_keys", Actor.SLICE_AUTHORITY, "CH API member keys"),
    Holding("sa_slice", Actor.SLICE_AUTHORITY, "slice name → the creation that owns it", claims=True),
    Holding("ch_project", Actor.SLICE_AUTHORITY, "project name → the record that took it (one project per name)", claims=True),
    # ---- federation
    Holding("sep_slices", Actor.SEP, "the slice exchange point's slices across peers"),
    # ---- FPGA aggregate
    Holding("bitstreams", Actor.FPGA, "users' bitstream catalogue"),
    Holding("fpga_slivers", Actor.FPGA, "FPGA slivers"),
    Holding("fpga_maintenance", Actor.FPGA, "boards in maintenance"),
    # ---- operations
    Holding("usage", Actor.OPERATIONS, "usage records of slivers that ended (accounting)"),
    Holding("usage-open", Actor.OPERATIONS, "usage records of slivers still held (quotas), each filed in the "
            "time index under its expiry and counted in its owner's and its project's usage counters (store "
            "tallies, read by a quota check)"),
    Holding("usage-layout", Actor.OPERATIONS, "a layout mark of a store made before its layout steps (removed by step 1, deployment/migrations.py)"),
    Holding("snapshots", Actor.OPERATIONS, "the dashboard's latest snapshot per publisher, and `wanted`: when a "
            "dashboard view last asked for them (publishers build only for 5 minutes after it)"),
    Holding("quota-lock", Actor.OPERATIONS, "user or project → the Allocate being counted against its "
            "limits", claims=True),
    # ---- deployment
    Holding("deployment", Actor.DEPLOYMENT, "the deployment record: whose store this is (`slicex up`)"),
    Holding("store-layout", Actor.DEPLOYMENT, "the last layout step done on the store (`slicex up` runs the "
            "others: slicex/store/migration.py, deployment/migrations.py)"),
    Holding("health", Actor.DEPLOYMENT, "each process's last health probe (a write that proves the store "
            "takes writes)"),
    Holding("actor-roles", Actor.DEPLOYMENT, "role → the active broker or authority process (URL, lease "
            "holder and token), written by it under its lease (deployment/leadership.py)",
            readers=((Actor.SLICE_MANAGER, "the AM workers call the active actor wherever it serves"),)),
    Holding("actor-standbys", Actor.DEPLOYMENT, "standby actor processes and when each was last seen "
            "(`slicex status`)"),
)

_TABLES = {h.name: h for h in OWNERSHIP if not h.claims}
_NAMESPACES = {h.name: h for h in OWNERSHIP if h.claims}


def owned_by(actor: Actor, claims: bool) -> tuple[str, ...]:
    """The tables (or claim namespaces) `actor` owns, in declaration order."""
    return tuple(h.name for h in OWNERSHIP if h.claims == claims and h.owner == actor)


def _check(kind: str, name: str, actor: Actor, write: bool) -> None:
    holding = (_NAMESPACES if kind == "claim namespace" else _TABLES).get(name)
    if holding is None:
        raise OwnershipError(f"{actor} used {kind} {name!r}, which slicex/store/ownership.py declares for no "
                             f"actor: declare its owner there")
    if holding.owner == actor or (not write and any(r == actor for r, _ in holding.readers)):
        return
    readers = ", ".join(r for r, _ in holding.readers)
    raise OwnershipError(f"{actor} {'wrote' if write else 'read'} {kind} {name!r}, which is the {holding.owner}'s"
                         + ("" if write else f" (readers: {readers or 'none'})")
                         + ": ask its owner by message, or change slicex/store/ownership.py")


class OwnedStore:
    """An actor's view of the store: writes only to what it owns, reads only what the declaration lets it."""

    def __init__(self, inner: Store, actor: Actor):
        self.inner = inner
        self.actor = actor

    def _table(self, table: str, write: bool) -> None:
        _check("table", table, self.actor, write)

    def _claims(self, keys: Iterable[str], write: bool) -> None:
        for ns in {namespace_of(k) for k in keys}:
            _check("claim namespace", ns, self.actor, write)

    def get(self, table: str, key: str) -> dict[str, Any] | None:
        self._table(table, write=False)
        return self.inner.get(table, key)

    def put(self, table: str, key: str, doc: dict[str, Any], due: float | None = None,
            tally: Mapping[str, Mapping[str, int]] | None = None) -> None:
        self._table(table, write=True)
        extra: dict[str, Any] = {}
        if due is not None:
            extra["due"] = due
        if tally is not None:
            extra["tally"] = tally
        self.inner.put(table, key, doc, **extra)

    def delete(self, table: str, key: str) -> bool:
        self._table(table, write=True)
        return self.inner.delete(table, key)

    def scan(self, table: str, prefix: str = "") -> list[dict[str, Any]]:
        self._table(table, write=False)
        return self.inner.scan(table, prefix)

    def due(self, table: str, until: float, limit: int | None = None) -> list[tuple[str, float]]:
        self._table(table, write=False)
        return self.inner.due(table, until, limit)

    def page(self, table: str, cursor: str, limit: int) -> tuple[list[dict[str, Any]], str]:
        self._table(table, write=False)
        return self.inner.page(table, cursor, limit)

    def tallies(self, counter: str) -> dict[str, int]:
        """Tallies are named by their table's owner's documents: `<table>|<name>`."""
        self._table(counter.partition("|")[0], write=False)
        return self.inner.tallies(counter)

    def claim(self, key: str, owner: str) -> bool:
        self._claims([key], write=True)
        return self.inner.claim(key, owner)

    def claim_all(self, keys: list[str], owner: str) -> bool:
        self._claims(keys, write=True)
        return self.inner.claim_all(keys, owner)

    def release(self, key: str, owner: str) -> bool:
        self._claims([key], write=True)
        return self.inner.release(key, owner)

    def release_all(self, keys: list[str], owner: str) -> int:
        self._claims(keys, write=True)
        return self.inner.release_all(keys, owner)

    def release_owner(self, owner: str) -> int:
        """Checked against the owner's claims first (one more read): an owner token naming another actor's
        claims is refused before anything is released."""
        self._claims(self.inner.claims_of(owner), write=True)
        return self.inner.release_owner(owner)

    def reown(self, owner: str, new_owner: str) -> int:
        """Checked like `release_owner`: only the actor's own claims change owner."""
        self._claims(self.inner.claims_of(owner), write=True)
        return self.inner.reown(owner, new_owner)

    def owner_of(self, key: str) -> str | None:
        self._claims([key], write=False)
        return self.inner.owner_of(key)

    def claims_of(self, owner: str) -> list[str]:
        keys = self.inner.claims_of(owner)
        self._claims(keys, write=False)
        return keys

    def claims_in(self, namespaces: Iterable[str]) -> dict[str, str]:
        wanted = list(namespaces)
        for ns in wanted:
            _check("claim namespace", ns, self.actor, write=False)
        return self.inner.claims_in(wanted)

    def all_claims(self, prefix: str = "") -> dict[str, str]:
        """Every claim this actor may read (its own namespaces and those it is a reader of), by key prefix."""
        readable = [h.name for h in _NAMESPACES.values()
                    if h.owner == self.actor or any(r == self.actor for r, _ in h.readers)]
        return {k: o for k, o in self.inner.claims_in(readable).items() if k.startswith(prefix)}

    def _readable(self) -> set[str]:
        return {h.name for h in _NAMESPACES.values()
                if h.owner == self.actor or any(r == self.actor for r, _ in h.readers)}

    def claim_counts(self, prefix: str = "") -> dict[str, int]:
        """The claim counters of the namespaces this actor may read."""
        readable = self._readable()
        return {c: n for c, n in self.inner.claim_counts(prefix).items() if namespace_of(c + ":") in readable}

    def claim_changes(self, since: int) -> tuple[int, list[str]]:
        """The changed counters of the namespaces this actor may read (the generation is the store's)."""
        readable = self._readable()
        gen, changed = self.inner.claim_changes(since)
        return gen, [c for c in changed if namespace_of(c + ":") in readable]

    def claims_under(self, counter: str) -> dict[str, str]:
        self._claims([counter + ":"], write=False)
        return self.inner.claims_under(counter)

    def recount_claims(self, repair: bool = False) -> dict[str, int]:
        """Recomputed counters of the namespaces this actor may read (a repair rebuilds every counter, which
        changes no claim)."""
        readable = self._readable()
        return {c: n for c, n in self.inner.recount_claims(repair).items() if namespace_of(c + ":") in readable}

    def close(self) -> None:
        self.inner.close()


def scoped(store: Any, actor: Actor) -> Any:
    """`actor`'s view of `store` (None stays None: a pure actor of tests keeps no state). Given a view already,
    the view is of the same underlying store: a component handing its store to another actor's constructor
    gives that actor its own view, not the first one's."""
    if store is None:
        return None
    return OwnedStore(store.inner if isinstance(store, OwnedStore) else store, actor)


def markdown_table() -> str:
    """docs/architecture.md's ownership table: one row per table or claim namespace (consecutive ones alike but
    for their name, as the broker's unit kinds, share a row)."""
    rows = ["| table or claims | owner (sole writer) | what | also read by |", "|---|---|---|---|"]
    groups: list[list[Holding]] = []
    for h in OWNERSHIP:
        if groups and (groups[-1][0].owner, groups[-1][0].what, groups[-1][0].claims, groups[-1][0].readers) \
                == (h.owner, h.what, h.claims, h.readers):
            groups[-1].append(h)
        else:
            groups.append([h])
    for group in groups:
        h = group[0]
        names = ", ".join(f"`{g.name}:…`" if h.claims else f"`{g.name}`" for g in group)
        readers = "; ".join(f"{r} ({why})" for r, why in h.readers) or "—"
        rows.append(f"| {'claims' if h.claims else 'table'} {names} | {h.owner} | {h.what} | {readers} |")
    return "\n".join(rows)
