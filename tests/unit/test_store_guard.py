"""The store guard (issue 22): writes stop while the store lacks this deployment's record or carries another's,
and resume once it is back; reads go on; the checks say why."""

from __future__ import annotations

import pytest

from slicex.errors import Unavailable
from slicex.store.guard import DEPLOYMENT_TABLE, RECORD_KEY, GuardedStore, record_fault, sqlite_dir
from slicex.store.sqlite_store import SqliteStore


def _guarded() -> GuardedStore:
    store = SqliteStore(":memory:")
    store.put(DEPLOYMENT_TABLE, RECORD_KEY, {"id": "dep-1", "home": "/h"})
    return GuardedStore(store, "dep-1", "sqlite://:memory:")


def test_a_store_that_carries_the_record_takes_writes_and_the_check_wrote_one():
    g = _guarded()
    assert g.check("am:x") == {"store": "ok"} and g.fault is None
    assert g.inner.get("health", "am:x") is not None
    g.put("t", "k", {"v": 1})
    assert g.get("t", "k") == {"v": 1}


def test_a_wiped_store_refuses_every_write_naming_the_lost_record_until_it_is_back():
    g = _guarded()
    g.put("t", "k", {"v": 1})
    g.inner.delete(DEPLOYMENT_TABLE, RECORD_KEY)  # what a Redis restarted empty looks like
    assert "lost this deployment's record" in g.check("am:x")["store"]
    for write in (lambda: g.put("t", "k2", {}), lambda: g.delete("t", "k"), lambda: g.claim("u", "o"),
                  lambda: g.claim_all(["u"], "o"), lambda: g.release("u", "o"), lambda: g.release_owner("o")):
        with pytest.raises(Unavailable, match="lost this deployment's record"):
            write()
    assert g.get("t", "k") == {"v": 1}  # reads go on
    g.inner.put(DEPLOYMENT_TABLE, RECORD_KEY, {"id": "dep-1", "home": "/h"})  # restored
    assert g.check("am:x") == {"store": "ok"}
    g.put("t", "k2", {})


def test_another_deployments_record_is_named():
    assert "deployment dep-2's record" in record_fault({"id": "dep-2", "home": "/o"}, "dep-1", "redis://r/1")
    assert record_fault({"id": "dep-1"}, "dep-1", "redis://r/1") is None


def test_without_an_expected_record_only_writes_are_checked():
    g = GuardedStore(SqliteStore(":memory:"), None, "sqlite://:memory:")
    assert g.check("am:x") == {"store": "ok"}


def test_the_disk_watched_is_a_file_stores_directory():
    assert str(sqlite_dir("sqlite:///var/x/state.db")) == "/var/x"
    assert sqlite_dir("sqlite://:memory:") is None and sqlite_dir("redis://h:1/0") is None
