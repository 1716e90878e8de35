"""Every index and counter the store and the actors keep beside their documents and claims, recomputed from
those documents and claims: what the property, crash and migration tests compare them with.

`mismatch` recomputes all of them in one pass and names the first that differs (None when all agree); the
order is the order below, so a failure names the most basic index that went wrong:

* the time index of the slice manager's records (`due_at`), of the authority's leases (their end) and of the
  open usage records (their expiry), and no other table filed in it;
* the slice index of records (`<slice>#<sliver>` names each record of the slice, nothing else when `exact`);
  the requests stored by slice;
* the held index (a federation peer's usage): every live sliver filed under its owner's and its slice's
  authority, nothing else when `exact` (a crash may leave an entry for a sliver that ended: over-counting);
* the open usage records: exactly the usage records not yet ended; the usage counters per user and project
  (what the open records count against limits: `tally_of`), and each replaced record naming its replacement;
* Redis: every table's key index equals its hash's keys, and its time index names only documents it holds;
* the claim counters per pool (per host: `core:<host>`, `mem:<host>`, ...; per switch: `vlan:<switch>`) and
  each pool's list of claims; Redis's namespace hashes and owner sets;
* the authority's lease claims (`leased:<unit>`, owned by its lease's `lease_owner`) equal the leases' units;
* the broker tickets' time index (each active ticket under its end plus the grace) and `broker-advance` (every
  active ticket not claimed yet);
* with a broker: its calendar holds stored active tickets as stored, every advance one and, for each group it
  read, every one of the group; the calendar's interval index (by end), its group, unit and idle/busy indexes
  equal a recomputation from its bookings, the advance tickets waiting to start are those not claimed yet, the
  store's unit claims are exactly the started tickets' units, its in-memory copy of the unit claims equals the
  store's for every pool it read, and its counts (the counters read at start for the others) the store's."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from authority.actor import LEASES, lease_document, lease_owner
from broker.broker import ADVANCE, TICKETS, ticket_due
from broker.claims import counts_of
from operations.ledger import OPEN, USAGE
from slice_manager import held
from slice_manager.records import REQUESTS, RESERVATIONS, SLIVERS_OF, Record, due_at
from slicex.codec import decode
from slicex.inventory import UNIT_KINDS
from slicex.store import counter_of, namespace_of
from slicex.store.ownership import KEY_INDEXED
from slicex.ticket import Lease, Ticket

TIMED = (RESERVATIONS, LEASES, OPEN, TICKETS)
"""The tables whose documents are filed in the time index."""


def inner(store: Any) -> Any:
    """The store under an actor's view (slicex.store.ownership) or a guard."""
    while hasattr(store, "inner"):
        store = store.inner
    return store


class Mismatch(Exception):
    """An index or counter that differs from its recomputation (caught by `mismatch`)."""


def _same(name: str, want: Any, got: Any) -> None:
    """Raise Mismatch naming `name` and what differs (for mappings and sets: only the differing entries)."""
    if want == got:
        return
    if isinstance(want, Mapping) and isinstance(got, Mapping):
        keys = sorted((k for k in want.keys() | got.keys() if want.get(k, _GONE) != got.get(k, _GONE)), key=repr)
        shown = {k: (want.get(k, _GONE), got.get(k, _GONE)) for k in keys[:3]}
        raise Mismatch(f"{name}: {len(keys)} entries differ, e.g. (recomputed, kept) {shown!r}")
    if isinstance(want, (set, frozenset)) and isinstance(got, (set, frozenset)):
        raise Mismatch(f"{name}: only recomputed {sorted(want - got, key=repr)[:3]!r}, "
                       f"only kept {sorted(got - want, key=repr)[:3]!r}")
    raise Mismatch(f"{name}: recomputed {want!r}, kept {got!r}")


class _Gone:
    def __repr__(self) -> str:
        return "<none>"


_GONE = _Gone()


def _filed(store: Any, table: str) -> dict[str, float]:
    return dict(store.due(table, math.inf))


def _documents(store: Any) -> None:
    recs = [Record.from_doc(d) for d in store.scan(RESERVATIONS)]
    _same("records' time index", {r.id: due_at(r) for r in recs if due_at(r) is not None},
          _filed(store, RESERVATIONS))
    leases = [decode(lease_document(d)["lease"], Lease, "lease") for d in store.scan(LEASES)]
    _same("leases' time index", {x.id: x.end.timestamp() for x in leases}, _filed(store, LEASES))
    from operations.accounting import UsageRecord

    ended = [decode(d, UsageRecord, "usage record") for d in store.scan(USAGE)]
    _same("open usage records kept in `usage` (it holds ended ones only)", set(),
          {r.sliver_urn for r in ended if r.end is None})
    open_now = {r.sliver_urn: r for r in (decode(d, UsageRecord, "usage record") for d in store.scan(OPEN))}
    _same("ended usage records kept in `usage-open`", set(), {u for u, r in open_now.items() if r.end is not None})
    _usage_counters(store, open_now)
    expiring = {urn: r.expires for urn, r in open_now.items()}
    _same("open usage records' time index", {u: e.timestamp() for u, e in expiring.items() if e is not None},
          _filed(store, OPEN))
    tickets = store.scan(TICKETS)
    _same("broker tickets' time index", {d["ticket"]["id"]: ticket_due(d) for d in tickets
                                         if d.get("state") == "active"}, _filed(store, TICKETS))
    waiting = {d["ticket"]["id"] for d in tickets if d.get("state") == "active" and not d.get("claimed", True)}
    _same("advance tickets not named in broker-advance", set(), waiting - {d["id"] for d in store.scan(ADVANCE)})
    _same("tables filed in the time index", set(), _timed_tables(store) - set(TIMED))
    return recs


def _kept_tallies(store: Any) -> dict[str, dict[str, int]]:
    """Every usage counter the store keeps (its non-zero fields)."""
    redis = getattr(store, "_r", None)
    if redis is not None:
        head = store._tally("")
        kept = {k[len(head):]: {f: int(n) for f, n in redis.hgetall(k).items() if int(n)}
                for k in redis.scan_iter(match=head + "*")}
    else:
        kept = {}
        for c, f, n in store._read(lambda db: db.execute("SELECT counter, field, n FROM tallies").fetchall()):
            if n:
                kept.setdefault(c, {})[f] = int(n)
    return {c: fields for c, fields in kept.items() if fields}


def _usage_counters(store: Any, open_now: Mapping[str, Any]) -> None:
    from operations.accounting import tally_of

    want: dict[str, dict[str, int]] = {}
    for rec in open_now.values():
        for c, fields in tally_of(OPEN, rec, open_now.get(rec.replaces) if rec.replaces else None).items():
            for f, n in fields.items():
                want.setdefault(c, {})[f] = want.setdefault(c, {}).get(f, 0) + n
    want = {c: {f: n for f, n in fields.items() if n} for c, fields in want.items()}
    _same("usage counters (per user and project: what the open usage records count against limits)",
          {c: fields for c, fields in want.items() if fields}, _kept_tallies(store))
    _same("replaced usage records naming the records replacing them",
          {r.replaces: u for u, r in open_now.items() if r.replaces in open_now},
          {u: r.replaced_by for u, r in open_now.items() if r.replaced_by and u in
           {x.replaces for x in open_now.values()}})


def _slices(store: Any, recs: list[Record], exact: bool) -> None:
    named = {d["slice_urn"] + "#" + d["id"] for d in store.scan(SLIVERS_OF)}
    want = {f"{r.slice_urn}#{r.id}" for r in recs}
    if exact:
        _same("records' slice index", want, named)
    else:  # a crash between deleting a record and its index entry leaves the entry (reads skip it)
        _same("records' slice index (records it does not name)", set(), want - named)
    for slice_urn in {r.slice_urn for r in recs}:  # what a call reads: its slice's entries, found by key prefix
        found = {d["id"] for d in store.scan(SLIVERS_OF, f"{slice_urn}#")}
        _same(f"slice index read by prefix ({slice_urn})", {r.id for r in recs if r.slice_urn == slice_urn},
              found & {r.id for r in recs})
    stray = {d["key"] for d in store.scan(REQUESTS) if not d["key"].startswith(d["slice_urn"] + "#")}
    _same("requests filed under another slice", set(), stray)


def _held(store: Any, recs: list[Record], exact: bool) -> None:
    filed = {(d["id"], k) for k in ("o", "s") for d in store.scan(held.HELD, f"{k}#")}
    live = [e for r in recs if (e := held.filed(r)) is not None]
    want = {(e["id"], k) for e in live for k in ("o", "s")}
    if exact:
        _same("held index", want, filed)
    else:  # written before a sliver goes live and removed after it ends: a crash can only over-count
        _same("held index (live slivers it does not name)", set(), want - filed)
    for e in live:  # what finds it (a store made before also holds its kind and cores, which nothing reads)
        stored = {k: store.get(held.HELD, k) for k in held.keys(e)}
        _same(f"held index entries of {e['id']}", {k: e for k in held.keys(e)},
              {k: {f: d.get(f) for f in e} if d else d for k, d in stored.items()})


def _timed_tables(store: Any) -> set[str]:
    redis = getattr(store, "_r", None)
    if redis is not None:
        head = store._d("")
        return {k[len(head):] for k in redis.scan_iter(match=head + "*") if redis.zcard(k)}
    rows = store._read(lambda db: db.execute("SELECT DISTINCT tbl FROM docs WHERE due IS NOT NULL").fetchall())
    return {r[0] for r in rows}


def _redis_keys(store: Any) -> None:
    redis = getattr(store, "_r", None)
    if redis is None:
        return
    tables: set[str] = set()
    for head in (store._t(""), store._k(""), store._d("")):
        tables |= {k[len(head):] for k in redis.scan_iter(match=head + "*")}
    for table in sorted(tables):
        keys = set(redis.hkeys(store._t(table)))
        indexed = keys if table in KEY_INDEXED else set()  # only tables read by prefix keep a key index
        _same(f"Redis key index of {table}", indexed, set(redis.zrange(store._k(table), 0, -1)))
        _same(f"Redis time index of {table} (documents it names that are gone)", set(),
              set(redis.zrange(store._d(table), 0, -1)) - keys)


def _claims(store: Any) -> dict[str, str]:
    claims = store.all_claims()
    counts = counts_of(claims)
    _same("claim counters (per pool: per host, per switch)", counts, store.claim_counts())
    for c in sorted(counts.keys() | set(store.claim_counts())):
        _same(f"claims of pool {c}", {k: o for k, o in claims.items() if counter_of(k) == c}, store.claims_under(c))
    namespaces = {namespace_of(k) for k in claims} | set(UNIT_KINDS)
    for ns in sorted(namespaces):
        _same(f"claims of namespace {ns!r}", {k: o for k, o in claims.items() if namespace_of(k) == ns},
              store.claims_in([ns]))
    redis = getattr(store, "_r", None)
    if redis is not None:
        head = store._o("")
        owners: dict[str, set[str]] = {}
        for k, o in claims.items():
            owners.setdefault(o, set()).add(k)
        kept = {k[len(head):]: set(redis.smembers(k)) for k in redis.scan_iter(match=head + "*")}
        _same("Redis owner sets", owners, {o: ks for o, ks in kept.items() if ks})
        pools = {k[len(store._pool("")):] for k in redis.scan_iter(match=store._pool("") + "*") if redis.hlen(k)}
        _same("Redis pool hashes", set(counts), pools)
    else:
        for owner in sorted(set(claims.values())):
            _same(f"claims of owner {owner}", sorted(k for k, o in claims.items() if o == owner),
                  store.claims_of(owner))
    return claims


def _leased(store: Any, claims: Mapping[str, str]) -> None:
    leases = [decode(lease_document(d)["lease"], Lease, "lease") for d in store.scan(LEASES)]
    _same("lease claims (leased:<unit> → lease)", {f"leased:{u}": lease_owner(x.id) for x in leases for u in x.units},
          {k: o for k, o in claims.items() if k.startswith("leased:")})


def _spans(bookings: Iterable[Any]) -> dict[str, list[tuple]]:
    out: dict[str, list[tuple]] = {}
    for b in bookings:
        for u in b.units:
            out.setdefault(u, []).append((b.term.start, b.term.end, b.holder))
    return {u: sorted(s) for u, s in out.items()}


def _broker(broker: Any, store: Any, claims: Mapping[str, str]) -> None:
    cal = broker.calendar
    tickets = {}
    for td in store.scan(TICKETS):
        if td.get("broker") == broker.name and td.get("state") == "active":
            t = decode(td["ticket"], Ticket, "ticket")
            tickets[t.id] = (frozenset(td.get("booked", t.units)), t.term, bool(td.get("claimed", True)))
    # a start books the advance tickets only; a started one joins the calendar with its group, when a call
    # touches the group (then every ticket of the group is there)
    def booked(h: str, claimed: bool) -> bool:
        return (broker._all_loaded or not claimed or h in cal.bookings
                or h.rsplit("/", 1)[0] in broker._groups_loaded)
    held = {h: (u, term) for h, (u, term, c) in tickets.items() if booked(h, c)}
    _same("broker calendar against its stored tickets", held, {h: (b.units, b.term) for h, b in cal.bookings.items()})
    _same("broker's claimed flags", {h: c for h, (_u, _t, c) in tickets.items() if h in cal.bookings},
          dict(broker._claimed))
    _same("advance tickets waiting to start", {h for h, (_u, _t, c) in tickets.items() if not c},
          set(broker._claimed.waiting))
    _same("calendar's interval index (by end)", sorted((b.term.end, h) for h, b in cal.bookings.items()), cal._ends)
    groups: dict[str, set[str]] = {}
    for h in cal.bookings:
        groups.setdefault(h.rsplit("/", 1)[0], set()).add(h)
    _same("calendar's group index", groups, cal._groups)
    _same("calendar's unit index", _spans(cal.bookings.values()),
          {u: sorted(s) for u, s in cal._by_unit.items()})
    for name, pool in cal.pools.items():
        busy = {i for i, u in enumerate(pool.units) if cal._by_unit.get(u)}
        _same(f"calendar's busy units of {name}", busy, cal._busy.get(name, set()))
        _same(f"calendar's idle units of {name}", sorted(set(range(len(pool.units))) - busy), cal._idle.get(name))
    units = {k: o for k, o in claims.items() if namespace_of(k) in UNIT_KINDS}
    _same("unit claims against the started tickets", {u: h.rsplit("/", 1)[0] for h, (us, _t, c) in tickets.items()
                                                       if c for u in us}, units)
    copy = broker._copy
    read = {k: o for k, o in units.items() if copy.complete or counter_of(k) in copy.loaded}
    _same("broker's copy of the unit claims", read, copy.owner)
    by_counter: dict[str, set[str]] = {}
    by_owner: dict[str, set[str]] = {}
    for k, o in read.items():
        by_counter.setdefault(counter_of(k), set()).add(k)
        by_owner.setdefault(o, set()).add(k)
    _same("broker's copy by pool", by_counter, copy.by_counter)
    _same("broker's copy by owner", by_owner, copy.by_owner)
    _same("broker's copy's counts against the store's counters", copy.stored_counts(), copy.counts())
    _same("broker's unpublished bookings", {}, dict(broker._unpublished))


def mismatch(store: Any, broker: Any = None, exact: bool = False) -> str | None:
    """The first index or counter that differs from a full recomputation from the documents and claims, named
    with what differs; None when every one agrees. `exact`: no crash happened, so the slice index names
    nothing but records, and (with a `broker`) the broker's state is compared too."""
    store = inner(store)
    try:
        recs = _documents(store)
        _slices(store, recs, exact)
        _held(store, recs, exact)
        _redis_keys(store)
        claims = _claims(store)
        _leased(store, claims)
        if broker is not None:
            _broker(broker, store, claims)
    except Mismatch as exc:
        return str(exc)
    return None


def assert_indexes_match(store: Any, broker: Any = None, exact: bool = False) -> None:
    """Fail naming the first index or counter that differs from its recomputation (`mismatch`)."""
    found = mismatch(store, broker, exact)
    assert found is None, found
