"""A full disk under a SQLite store, as a write meets it and as the store guard reports it: the write is
UNAVAILABLE (11), as the operator guide says and as the guard answers once it has noticed (it was DBERROR,
9, until then); the guard's fault, which `/health`, `slicex status` and every refused write show, names the
disk's cause once (it was three times: the disk check, the store's message and an appended copy). Needs
root (a small tmpfs); the whole deployment on a full disk: test_chaos_store_faults.py."""

from __future__ import annotations

import pytest

from slicex.errors import Unavailable
from slicex.store.guard import GuardedStore
from slicex.store.sqlite_store import SqliteStore
from tests.integration.test_chaos_store_faults import _fill, small_disk


def test_a_write_on_a_full_disk_is_unavailable_and_the_guard_says_why_once(tmp_path):
    with small_disk(tmp_path / "disk", "4m") as disk:
        store = SqliteStore(str(disk / "state.db"))
        try:
            guard = GuardedStore(store, None, f"sqlite:///{disk}/state.db", disk)
            store.put("t", "k", {"v": 1})
            filler = _fill(disk)
            with pytest.raises(Unavailable, match=f"the disk holding {disk} is full") as refused:
                store.put("t", "k2", {"v": "x" * 100_000})
            assert refused.value.code == 11

            checks = guard.check("am:test", report=False)
            assert checks["disk"].startswith(f"the disk holding {disk} is full")
            assert guard.fault.count("is full (") == 1 and guard.fault.count("free space there") == 1, guard.fault
            with pytest.raises(Unavailable) as gated:
                guard.put("t", "k3", {})
            assert gated.value.message.count("is full (") == 1
            assert store.get("t", "k") == {"v": 1}  # reads go on

            filler.unlink()
            assert guard.check("am:test", report=False) == {"store": "ok", "disk": "ok"} and guard.fault is None
        finally:
            store.close()
