"""A running process's watch over its store: does the store still carry this deployment's record, and does
it take a write?

The deployment record (`deployment`/`id`, written by the first `slicex up`) is how a process knows the store
is its own. A Redis restarted empty, or a store swapped under a running process, loses it: from then on the
process must not write (a new Allocate would build a second, unrelated state over the one that was lost), so
every write through `GuardedStore` is refused with UNAVAILABLE naming the cause until the record is back. A
disk that is full or read-only refuses writes the same way (multi-document operations are not started only
to fail halfway); reads keep working. A store that answered BUSY (a Sentinel failover under way) refuses them
as BUSY too: the caller retries in seconds. `check` is what `/health`, `slicex status` and the metrics report."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from slicex.diskfaults import remedy, space_fault
from slicex.errors import Busy, GeniError, Unavailable
from slicex.store import Store

log = logging.getLogger("slicex.store")

DEPLOYMENT_TABLE = "deployment"
RECORD_KEY = "id"
HEALTH_TABLE = "health"


def record_fault(doc: dict[str, Any] | None, deployment_id: str, shown_url: str) -> str | None:
    """What is wrong with the deployment record a store holds now (None: it is this deployment's)."""
    if doc is None:
        return (f"the store {shown_url} has lost this deployment's record (wiped, restarted empty, or "
                f"replaced): its slices are not in it, and writes are refused so that no new state is built "
                f"over the lost one. Restore the store's data; or, to start this deployment empty, "
                f"`slicex down` then `slicex up --init-store`")
    if doc.get("id") != deployment_id:
        return (f"the store {shown_url} now carries deployment {doc.get('id')}'s record (home {doc.get('home')}), "
                f"not this one's ({deployment_id}): writes are refused. Point `store` back at this "
                f"deployment's store")
    return None


def sqlite_dir(url: str) -> Path | None:
    """The directory of a file SQLite store (where its journal grows), None for Redis or in-memory."""
    if not url.startswith("sqlite://"):
        return None
    path = url[len("sqlite://"):]
    return None if path in ("", ":memory:", "/:memory:") else Path(path).parent


class GuardedStore:
    """A store whose writes stop while `check` finds the deployment record lost or the disk unwritable."""

    _WRITES = ("put", "delete", "claim", "claim_all", "release", "release_owner")

    def __init__(self, inner: Store, deployment_id: str | None, shown_url: str, disk: Path | None = None):
        """`deployment_id`: the record to expect (None: a store no `slicex up` bound, as in-process tests
        build; only writes and the disk are checked). `disk`: the directory to watch for space."""
        self.inner = inner
        self.deployment_id = deployment_id
        self.shown_url = shown_url
        self.disk = disk
        self.fault: str | None = None  # why writes are refused now
        self._refusal: GeniError | None = None  # what a write raises now (one attribute: read in one step)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if name not in self._WRITES:
            return value

        def refusing_while_faulty(*args: Any, **kwargs: Any) -> Any:
            refusal = self._refusal
            if refusal is not None:
                raise type(refusal)(refusal.message)
            return value(*args, **kwargs)
        return refusing_while_faulty

    def check(self, probe: str, report: bool = True) -> dict[str, str]:
        """Read the deployment record, write `probe`'s health document, look at the disk: each "ok" or why not.
        Writes are refused from now on while any of them fails (and allowed again once all pass); a change
        is logged as an error, or as the recovery (unless `report` is off: a one-off check that prints)."""
        disk = space_fault(self.disk) if self.disk is not None else None
        store, busy = self._store_check(probe, disk)
        checks = {"store": store}
        if self.disk is not None:
            checks["disk"] = f"{disk}: {remedy(disk)}" if disk else "ok"
        failing = "; ".join(v for v in checks.values() if v != "ok") or None
        if failing != self.fault and report:
            if failing:
                log.error("writes refused: %s", failing)
            else:
                log.warning("store %s answers as this deployment's and takes writes again: serving writes",
                            self.shown_url)
        refusal = None if failing is None else (Busy if busy else Unavailable)(
            f"this aggregate is not serving writes: {failing}")
        self._refusal, self.fault = refusal, failing
        return checks

    def _store_check(self, probe: str, disk: str | None) -> tuple[str, bool]:
        """"ok" or why not, and whether the store answered BUSY (failing over). A write refused while `disk`
        names a fault (full, read-only) is put down to it without the store's message, which repeats the cause
        the disk check gives: said once, not three times."""
        try:
            doc = self.inner.get(DEPLOYMENT_TABLE, RECORD_KEY)
        except GeniError as exc:
            return exc.message, isinstance(exc, Busy)
        if self.deployment_id is not None:
            lost = record_fault(doc, self.deployment_id, self.shown_url)
            if lost:
                return lost, False
        try:  # a write, not only a read: a full disk or a read-only Redis answers reads
            self.inner.put(HEALTH_TABLE, probe, {"checked_at": datetime.now(UTC).isoformat()})
        except GeniError as exc:
            if disk:
                return f"the store {self.shown_url} refuses writes: its disk cannot take them", False
            return f"the store {self.shown_url} refuses writes: {exc.message}", isinstance(exc, Busy)
        return "ok", False
