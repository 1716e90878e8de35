"""The embedded slice manager over a real SQLite store with a manual clock."""

from datetime import timedelta

import pytest

from am.embedded import EmbeddedSliceManager
from am.substrate.emulated import EmulatedDriver, FailurePlan
from rspec.request import parse_request
from rspec.substrate import default_substrate
from slicex.clock import ManualClock
from slicex.errors import InsufficientNodes, SearchFailed, Unsupported
from slicex.store.sqlite_store import SqliteStore
from tests.factories import request_rspec, three_node_lan, vm

SLICE = "urn:publicid:IDN+t.org+slice+s1"


@pytest.fixture
def sm(tmp_path):
    sub = default_substrate("t.org")
    return EmbeddedSliceManager(SqliteStore(str(tmp_path / "s.db")), sub, EmulatedDriver(sub, FailurePlan()))


def test_delete_releases_everything(sm):
    clock = ManualClock()
    now = clock.now()
    slivers = sm.allocate(SLICE, "owner", parse_request(three_node_lan()), now + timedelta(minutes=10), now)
    assert len(sm.usage_keys()) > 0
    sm.delete([s.urn for s in slivers], now)
    assert sm.usage_keys() == set()
    assert sm.request_of(SLICE) == []


def test_failed_allocation_takes_nothing(sm):
    now = ManualClock().now()
    req = parse_request(request_rspec([vm("a")] + [{"client_id": f"b{i}", "sliver_type": "raw-pc"} for i in range(3)]))
    with pytest.raises(InsufficientNodes):
        sm.allocate(SLICE, "o", req, now + timedelta(minutes=1), now)
    assert sm.usage_keys() == set()


def test_reap_releases_expired(sm):
    clock = ManualClock()
    now = clock.now()
    sm.allocate(SLICE, "o", parse_request(request_rspec([vm("a")])), now + timedelta(minutes=10), now)
    assert sm.reap(now + timedelta(minutes=9)) == []
    assert len(sm.reap(now + timedelta(minutes=10))) == 1
    assert sm.usage_keys() == set()


def test_unknown_sliver_is_search_failed(sm):
    with pytest.raises(SearchFailed):
        sm.delete(["urn:publicid:IDN+t.org+sliver+nope"], ManualClock().now())


def test_unknown_action_is_unsupported(sm):
    now = ManualClock().now()
    (s,) = sm.allocate(SLICE, "o", parse_request(request_rspec([vm("a")])), now + timedelta(minutes=10), now)
    with pytest.raises(Unsupported):
        sm.perform([s.urn], "geni_fly", now, False, [])


def test_boot_progression_follows_the_clock(sm):
    clock = ManualClock()
    now = clock.now()
    (s,) = sm.allocate(SLICE, "o", parse_request(request_rspec([vm("a")])), now + timedelta(hours=1), now)
    sm.provision([s.urn], now + timedelta(hours=1), [], now)
    (s,) = sm.perform([s.urn], "geni_start", now, False, [])
    assert s.operational_state == "geni_configuring"
    assert sm.sliver(s.urn, now + timedelta(seconds=1)).operational_state == "geni_configuring"
    assert sm.sliver(s.urn, now + timedelta(seconds=2)).operational_state == "geni_ready"


def test_restart_while_configuring_is_accepted(sm):
    """omni's acceptance suite starts, then at once restarts: a booting node may be restarted."""
    now = ManualClock().now()
    (s,) = sm.allocate(SLICE, "o", parse_request(request_rspec([vm("a")])), now + timedelta(hours=1), now)
    sm.provision([s.urn], now + timedelta(hours=1), [], now)
    sm.perform([s.urn], "geni_start", now, False, [])
    (s,) = sm.perform([s.urn], "geni_restart", now, False, [])
    assert s.operational_state == "geni_configuring"
    (s,) = sm.perform([s.urn], "geni_stop", now, False, [])
    assert s.operational_state == "geni_stopping"
