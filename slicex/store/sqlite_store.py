"""SQLite store: the embedded default. One file, safe across threads of one process and across processes
(SQLite's own locking; claims use INSERT so two owners can never both succeed).

Writes go through one connection under a lock; reads of a file store take a connection of their own from a
pool, so a request thread reading never queues behind another's write (WAL lets readers and the writer run
together, and every read sees the writes committed before it began).

Opening is safe against concurrent openers: every connection waits on locks (busy timeout), and the opening
steps SQLite answers "database is locked" without waiting for (switching to WAL while another connection
checkpoints or closes the file) are retried with a jittered backoff until the same deadline."""

from __future__ import annotations

import json
import queue
import random
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from slicex.diskfaults import remedy, space_fault
from slicex.errors import DbError, GeniError, Unavailable
from slicex.store import counter_of
from slicex.store.codec import decode, encode

_SCHEMA = """
CREATE TABLE IF NOT EXISTS docs (tbl TEXT NOT NULL, key TEXT NOT NULL, doc TEXT NOT NULL, due REAL,
                                 PRIMARY KEY (tbl, key));
CREATE TABLE IF NOT EXISTS claims (key TEXT PRIMARY KEY, owner TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS claims_owner ON claims (owner);
"""
_DUE_INDEX = "CREATE INDEX IF NOT EXISTS docs_due ON docs (tbl, due) WHERE due IS NOT NULL"
"""The time index: a document's `due` lives in its own row, so it is written in the same statement as the
document (no crash can separate them) and read in time order without touching the other rows."""


_CLAIM_ALL = """INSERT OR IGNORE INTO claims (key, owner) SELECT value, :owner FROM json_each(:keys)
WHERE NOT EXISTS (SELECT 1 FROM claims WHERE key IN (SELECT value FROM json_each(:keys)) AND owner != :owner)"""
_RELEASE_ALL = "DELETE FROM claims WHERE owner = :owner AND key IN (SELECT value FROM json_each(:keys))"
_COUNT_MINE = "SELECT COUNT(*) FROM claims WHERE owner = :owner AND key IN (SELECT value FROM json_each(:keys))"

# ---- claim counters: per counter (slicex.store.counter_of, a unit's pool), how many claims it holds --------------
def _counter_sql(key: str) -> str:
    """SQL for `counter_of(key)`: the text before the last ":" (rtrim strips every character but ":" from the
    right, then one more for the ":" itself)."""
    return f"substr({key}, 1, length(rtrim({key}, replace({key}, ':', ''))) - 1)"


_COUNTS_TABLE = "CREATE TABLE IF NOT EXISTS claim_counts (counter TEXT PRIMARY KEY, n INTEGER NOT NULL)"
_COUNTS_TRIGGERS = (
    # triggers run inside the statement that claims or releases: the counts change in the same transaction
    f"""CREATE TRIGGER IF NOT EXISTS claim_counted AFTER INSERT ON claims WHEN instr(NEW.key, ':') > 0 BEGIN
  INSERT INTO claim_counts (counter, n) VALUES ({_counter_sql('NEW.key')}, 1)
  ON CONFLICT (counter) DO UPDATE SET n = n + 1;
END""",
    f"""CREATE TRIGGER IF NOT EXISTS claim_uncounted AFTER DELETE ON claims WHEN instr(OLD.key, ':') > 0 BEGIN
  UPDATE claim_counts SET n = n - 1 WHERE counter = {_counter_sql('OLD.key')};
  DELETE FROM claim_counts WHERE counter = {_counter_sql('OLD.key')} AND n <= 0;
END""",
)
_CHANGES_TABLE = ("CREATE TABLE IF NOT EXISTS claim_changes (counter TEXT PRIMARY KEY, gen INTEGER NOT NULL)",
                  "CREATE INDEX IF NOT EXISTS claim_changes_gen ON claim_changes (gen)")
"""Per counter, the claims generation of its last change (a claim, release or new owner of one of its
claims): a reader asks for the counters changed after the generation it last saw and reads only those (an
index on `gen`). The generation is MAX(gen) + 1, taken inside the statement that changes the claim."""


def _changed_sql(key: str) -> str:
    """SQL marking `counter_of(key)` changed at a new generation (run by a trigger, so in the claim's statement)."""
    return (f"INSERT INTO claim_changes (counter, gen) VALUES ({_counter_sql(key)}, "
            f"(SELECT COALESCE(MAX(gen), 0) + 1 FROM claim_changes)) "
            f"ON CONFLICT (counter) DO UPDATE SET gen = excluded.gen;")


_CHANGES_TRIGGERS = (
    f"""CREATE TRIGGER IF NOT EXISTS claim_change_in AFTER INSERT ON claims WHEN instr(NEW.key, ':') > 0 BEGIN
  {_changed_sql('NEW.key')}
END""",
    f"""CREATE TRIGGER IF NOT EXISTS claim_change_out AFTER DELETE ON claims WHEN instr(OLD.key, ':') > 0 BEGIN
  {_changed_sql('OLD.key')}
END""",
    f"""CREATE TRIGGER IF NOT EXISTS claim_change_owner AFTER UPDATE OF owner ON claims
WHEN instr(NEW.key, ':') > 0 BEGIN
  {_changed_sql('NEW.key')}
END""",
)
# ---- tallies: per counter and field, the sum of what the documents' `tally` column adds (slicex.store)
_TALLIES_TABLE = ("CREATE TABLE IF NOT EXISTS tallies (counter TEXT NOT NULL, field TEXT NOT NULL, n INTEGER NOT NULL, "
                  "PRIMARY KEY (counter, field))")
_TALLY_ROWS = "SELECT c.key AS counter, f.key AS field, f.value AS n FROM json_each({0}) c, json_each(c.value) f"


def _tally_sql(column: str, sign: str) -> str:
    """SQL adding (sign '+') or taking out ('-') what a row's tally holds, run by a trigger in its statement."""
    return (f"INSERT INTO tallies (counter, field, n) SELECT counter, field, {sign}n FROM "
            f"({_TALLY_ROWS.format(column)}) WHERE true "
            f"ON CONFLICT (counter, field) DO UPDATE SET n = n + excluded.n;")


_TALLY_TRIGGERS = (
    f"""CREATE TRIGGER IF NOT EXISTS tally_in AFTER INSERT ON docs WHEN NEW.tally IS NOT NULL BEGIN
  {_tally_sql('NEW.tally', '+')}
END""",
    f"""CREATE TRIGGER IF NOT EXISTS tally_out AFTER DELETE ON docs WHEN OLD.tally IS NOT NULL BEGIN
  {_tally_sql('OLD.tally', '-')}
END""",
    f"""CREATE TRIGGER IF NOT EXISTS tally_moved AFTER UPDATE OF tally ON docs
WHEN OLD.tally IS NOT NULL OR NEW.tally IS NOT NULL BEGIN
  {_tally_sql('OLD.tally', '-')}
  {_tally_sql('NEW.tally', '+')}
END""",
)
_PUT = ("INSERT INTO docs (tbl, key, doc, due, tally) VALUES (?, ?, ?, ?, ?) ON CONFLICT (tbl, key) DO UPDATE SET "
        "doc = excluded.doc, due = excluded.due, tally = excluded.tally")
"""An upsert, not INSERT OR REPLACE: a replaced row fires the update trigger (REPLACE's delete fires none)."""

_RECOUNT = f"SELECT {_counter_sql('key')} AS c, COUNT(*) FROM claims WHERE instr(key, ':') > 0 GROUP BY c"

BUSY_TIMEOUT_SECONDS = 30.0
_LAST = "\U0010ffff"  # the greatest code point: every key starting with P sorts below P + _LAST


def _failure(what: str, path: str, exc: sqlite3.Error) -> GeniError:
    """SQLite's error as a GENI one, with what the file system says against writing there when it says
    something (a full disk reads "disk I/O error" or "database or disk is full", a read-only one "unable to
    open"). That is UNAVAILABLE (11), as the store guard answers once it has noticed the disk: the aggregate
    cannot take writes until the operator frees space, and the data are sound (DBERROR, 9, is for the rest)."""
    fault = space_fault(Path(path).parent) if path != ":memory:" else None
    if fault:
        return Unavailable(f"{what}: {exc} ({fault}: {remedy(fault)})")
    return DbError(f"{what}: {exc}")


def _busy(exc: sqlite3.Error) -> bool:
    text = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)


class SqliteStore:
    def __init__(self, path: str, busy_timeout: float = BUSY_TIMEOUT_SECONDS):
        self.path = path
        self._lock = threading.RLock()
        self._busy_timeout = busy_timeout
        self._readers: queue.SimpleQueue[sqlite3.Connection] | None = None if path == ":memory:" else queue.SimpleQueue()
        self._opened: list[sqlite3.Connection] = []
        deadline = time.monotonic() + busy_timeout
        delay = 0.005
        try:
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=busy_timeout)
            self._db.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        except sqlite3.Error as exc:
            raise _failure(f"cannot open SQLite store {path}", path, exc) from None
        while True:
            try:
                self._prepare()
                return
            except sqlite3.Error as exc:
                if not _busy(exc) or time.monotonic() + delay > deadline:
                    self._db.close()
                    raise _failure(f"cannot open SQLite store {path}", path, exc) from None
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.25)

    def _prepare(self) -> None:
        """Journal mode and schema; idempotent, so a busy attempt is simply run again."""
        if self.path == ":memory:":
            self._db.execute("PRAGMA journal_mode=MEMORY")
        elif str(self._db.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
            self._db.execute("PRAGMA journal_mode=WAL")  # persistent: only the first opener of a file switches
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("BEGIN IMMEDIATE")  # one opener creates the schema; the others wait, then see it
        try:
            for statement in filter(str.strip, _SCHEMA.split(";")):
                self._db.execute(statement)
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(docs)")}
            if "due" not in columns:
                self._db.execute("ALTER TABLE docs ADD COLUMN due REAL")  # a store made before the time index
            if "tally" not in columns:
                self._db.execute("ALTER TABLE docs ADD COLUMN tally TEXT")  # a store made before tallies
            self._db.execute(_DUE_INDEX)
            for statement in (_TALLIES_TABLE, *_TALLY_TRIGGERS):
                self._db.execute(statement)
            self._prepare_claim_counts()
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def _run(self, fn):
        with self._lock:
            try:
                return fn(self._db)
            except sqlite3.Error as exc:
                raise _failure(f"SQLite store {self.path}", self.path, exc) from None

    def _read(self, fn):
        """Run a read on a pooled connection (an in-memory store has only its one connection)."""
        if self._readers is None:
            return self._run(fn)
        try:
            db = self._readers.get_nowait()
        except queue.Empty:
            db = self._open_reader()
        try:
            return fn(db)
        except sqlite3.Error as exc:
            raise DbError(f"SQLite store {self.path}: {exc}") from None
        finally:
            self._readers.put(db)

    def _open_reader(self) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None,
                                 timeout=self._busy_timeout)
            db.execute("PRAGMA query_only=1")
        except sqlite3.Error as exc:
            raise _failure(f"cannot open SQLite store {self.path}", self.path, exc) from None
        with self._lock:
            self._opened.append(db)
        return db

    def get(self, table: str, key: str) -> dict[str, Any] | None:
        row = self._read(lambda db: db.execute("SELECT doc FROM docs WHERE tbl=? AND key=?", (table, key)).fetchone())
        return decode(row[0]) if row else None

    def put(self, table: str, key: str, doc: dict[str, Any], due: float | None = None,
            tally: Mapping[str, Mapping[str, int]] | None = None) -> None:
        text = encode(doc)
        counts = json.dumps({c: {f: int(n) for f, n in fields.items() if n} for c, fields in tally.items()},
                            sort_keys=True) if tally else None
        self._run(lambda db: db.execute(_PUT, (table, key, text, due, counts)))

    def tallies(self, counter: str) -> dict[str, int]:
        rows = self._read(lambda db: db.execute("SELECT field, n FROM tallies WHERE counter=?", (counter,)).fetchall())
        return {f: int(n) for f, n in rows if n}

    def delete(self, table: str, key: str) -> bool:
        cur = self._run(lambda db: db.execute("DELETE FROM docs WHERE tbl=? AND key=?", (table, key)))
        return cur.rowcount > 0

    def scan(self, table: str, prefix: str = "") -> list[dict[str, Any]]:
        if prefix:  # a range of the primary key: only the matching rows are read
            rows = self._read(lambda db: db.execute(
                "SELECT doc FROM docs WHERE tbl=? AND key>=? AND key<? ORDER BY key",
                (table, prefix, prefix + _LAST)).fetchall())
        else:
            rows = self._read(lambda db: db.execute("SELECT doc FROM docs WHERE tbl=? ORDER BY key",
                                                    (table,)).fetchall())
        return [decode(r[0]) for r in rows]

    def due(self, table: str, until: float, limit: int | None = None) -> list[tuple[str, float]]:
        """The partial index on (tbl, due): only the rows due by `until` are read, earliest first."""
        rows = self._read(lambda db: db.execute(
            "SELECT key, due FROM docs WHERE tbl=? AND due IS NOT NULL AND due<=? ORDER BY due, key LIMIT ?",
            (table, until, -1 if limit is None else limit)).fetchall())
        return [(k, float(d)) for k, d in rows]

    def page(self, table: str, cursor: str, limit: int) -> tuple[list[dict[str, Any]], str]:
        """The next `limit` documents by key after the key `cursor` names (a range of the primary key)."""
        rows = self._read(lambda db: db.execute(
            "SELECT key, doc FROM docs WHERE tbl=? AND key>? ORDER BY key LIMIT ?", (table, cursor, limit)).fetchall())
        return [decode(r[1]) for r in rows], (rows[-1][0] if len(rows) == limit else "")

    def claim(self, key: str, owner: str) -> bool:
        return self.claim_all([key], owner)

    def claim_all(self, keys: list[str], owner: str) -> bool:
        """One statement, so atomic: every key not yet held is inserted if no key is held by another owner,
        else nothing is. Nothing inserted means all were this owner's already, or one was someone else's."""
        wanted = sorted(set(keys))
        if not wanted:
            return True
        args = {"owner": owner, "keys": json.dumps(wanted)}
        if self._run(lambda db: db.execute(_CLAIM_ALL, args).rowcount) > 0:
            return True
        return self._read(lambda db: db.execute(_COUNT_MINE, args).fetchone()[0]) == len(wanted)

    def release(self, key: str, owner: str) -> bool:
        return self.release_all([key], owner) > 0

    def release_all(self, keys: list[str], owner: str) -> int:
        """One statement (one transaction: the counters' and claim changes' triggers write their pages once)."""
        wanted = sorted(set(keys))
        if not wanted:
            return 0
        args = {"owner": owner, "keys": json.dumps(wanted)}
        return self._run(lambda db: db.execute(_RELEASE_ALL, args).rowcount)

    def release_owner(self, owner: str) -> int:
        cur = self._run(lambda db: db.execute("DELETE FROM claims WHERE owner=?", (owner,)))
        return cur.rowcount

    def reown(self, owner: str, new_owner: str) -> int:
        """One statement: the claims keep their keys, so their counters do not move."""
        return self._run(lambda db: db.execute("UPDATE claims SET owner=? WHERE owner=?", (new_owner, owner))).rowcount

    def owner_of(self, key: str) -> str | None:
        row = self._read(lambda db: db.execute("SELECT owner FROM claims WHERE key=?", (key,)).fetchone())
        return row[0] if row else None

    def claims_of(self, owner: str) -> list[str]:
        rows = self._read(lambda db: db.execute("SELECT key FROM claims WHERE owner=? ORDER BY key",
                                                (owner,)).fetchall())
        return [r[0] for r in rows]

    def claims_in(self, namespaces: Iterable[str]) -> dict[str, str]:
        """Key ranges of the primary key, one per namespace (keys without a ":" are namespace "")."""
        clauses, args = [], []
        for ns in sorted(set(namespaces)):
            if ns:
                clauses.append("(key>=? AND key<?)")
                args += [ns + ":", ns + ":" + _LAST]
            else:
                clauses.append("instr(key, ':')=0")
        if not clauses:
            return {}
        rows = self._read(lambda db: db.execute(f"SELECT key, owner FROM claims WHERE {' OR '.join(clauses)}",
                                                args).fetchall())
        return {k: o for k, o in rows}

    def all_claims(self, prefix: str = "") -> dict[str, str]:
        # a key range, not LIKE: LIKE ignores ASCII case and reads "_" and "%" in the prefix as wildcards
        rows = self._read(lambda db: db.execute("SELECT key, owner FROM claims WHERE key>=? AND key<?",
                                                (prefix, prefix + _LAST)).fetchall())
        return {k: o for k, o in rows}

    # ---- claim counters ----------------------------------------------------------------------------------------
    def _prepare_claim_counts(self) -> None:
        """The counters' table and triggers (inside `_prepare`'s transaction). A store made before counters
        existed gets them counted from its claims here, once, before any other opener can claim."""
        new = self._db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='claim_counts'").fetchone() \
            is None
        self._db.execute(_COUNTS_TABLE)
        for trigger in _COUNTS_TRIGGERS:
            self._db.execute(trigger)
        if new:
            self._db.execute(f"INSERT INTO claim_counts (counter, n) {_RECOUNT}")
        for statement in (*_CHANGES_TABLE, *_CHANGES_TRIGGERS):  # a store made before: empty, generation 0
            self._db.execute(statement)

    def claim_counts(self, prefix: str = "") -> dict[str, int]:
        """Counter → claims it holds (counters starting with `prefix`), as the triggers keep them."""
        rows = self._read(lambda db: db.execute("SELECT counter, n FROM claim_counts WHERE counter>=? AND counter<?",
                                                (prefix, prefix + _LAST)).fetchall())
        return {c: n for c, n in rows if n > 0}

    def claims_under(self, counter: str) -> dict[str, str]:
        """The claims one counter counts (a range of the primary key)."""
        rows = self._read(lambda db: db.execute("SELECT key, owner FROM claims WHERE key>? AND key<?",
                                                (counter + ":", counter + ":" + _LAST)).fetchall())
        return {k: o for k, o in rows if counter_of(k) == counter}

    def claim_changes(self, since: int) -> tuple[int, list[str]]:
        """The store's claims generation now and the counters whose claims changed after generation `since`
        (one statement, so one snapshot: an indexed range, as many rows as counters changed, not as counters in
        use, and the index's last entry)."""
        rows = self._read(lambda db: db.execute(
            "SELECT counter, gen FROM claim_changes WHERE gen > ? "
            "UNION ALL SELECT NULL, COALESCE(MAX(gen), 0) FROM claim_changes", (since,)).fetchall())
        return int(rows[-1][1]), [c for c, _g in rows if c is not None]

    def recount_claims(self, repair: bool = False) -> dict[str, int]:
        """Every counter recomputed from the claims themselves (a full read: start-up checks and tests); with
        `repair`, the kept counters are replaced by the recomputed ones in one transaction."""
        def recount(db: sqlite3.Connection) -> dict[str, int]:
            if not repair:
                return {c: n for c, n in db.execute(_RECOUNT).fetchall()}
            db.execute("BEGIN IMMEDIATE")
            try:
                counts = {c: n for c, n in db.execute(_RECOUNT).fetchall()}
                db.execute("DELETE FROM claim_counts")
                db.executemany("INSERT INTO claim_counts (counter, n) VALUES (?, ?)", counts.items())
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            return counts
        return self._run(recount) if repair else self._read(recount)

    def close(self) -> None:
        with self._lock:
            for db in self._opened:
                db.close()
            self._opened.clear()
            self._db.close()
