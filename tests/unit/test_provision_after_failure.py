"""Provision never answers success for slivers it did not provision. Found by the chaos test's outputs: with
the authority down, Provision fails ("... not reachable; retry when it is back") and the slivers are failed;
the retry it invites answered SUCCESS while every sliver stayed geni_allocated / geni_failed."""

from __future__ import annotations

from datetime import timedelta

import pytest

from deployment.actors import ActorKeys, embedded_slice_manager
from protocol import slice_manager as sm
from rspec.request import parse_request
from slice_manager.actor import ActorSliceManager
from slicex.clock import ManualClock
from slicex.errors import GeniError
from slicex.store.sqlite_store import SqliteStore
from tests.factories import three_node_lan
from tests.unit.test_reservation_slice_manager import KEY, MIN, SLICE, SUB, Flaky, everything_released


def test_provision_again_after_the_authority_was_down_says_the_slivers_failed(tmp_path):
    from authority.substrate.emulated import EmulatedDriver

    store = SqliteStore(str(tmp_path / "s.db"))
    clock = ManualClock()
    real = embedded_slice_manager(store, SUB, EmulatedDriver(SUB), keys=ActorKeys.given(KEY))
    authority = Flaky(real.authority, only=("redeem",))
    asm = ActorSliceManager(store, SUB, real.broker, authority)
    now = clock.now()
    urns = [s.urn for s in asm.allocate(SLICE, "o", parse_request(three_node_lan()), now + 10 * MIN, now)]
    authority.down = True
    with pytest.raises(GeniError, match="not answering"):
        asm.provision(urns, now + timedelta(hours=1), [], now)
    authority.down = False
    with pytest.raises(GeniError, match="failed earlier") as again:  # before: returned the failed slivers
        asm.provision(urns, now + timedelta(hours=1), [], now)
    assert "Allocate again" in again.value.message
    assert {s.allocation_state for s in asm.slivers(SLICE, now)} == {sm.ALLOCATED}
    asm.delete(urns, now)
    asm.reap(now + MIN)
    everything_released(store, real)


def test_a_provisioned_sliver_whose_state_cannot_be_read_is_not_reported_failed(tmp_path):
    """The chaos test saw Provision succeed and, the authority killed just then, the answer show a provisioned
    sliver as geni_failed: its state was unknown, not failed (a user told "failed" deletes a good sliver)."""
    from authority.substrate.emulated import EmulatedDriver

    store = SqliteStore(str(tmp_path / "s.db"))
    clock = ManualClock()
    real = embedded_slice_manager(store, SUB, EmulatedDriver(SUB), keys=ActorKeys.given(KEY))
    authority = Flaky(real.authority, only=("status",))
    asm = ActorSliceManager(store, SUB, real.broker, authority)
    now = clock.now()
    urns = [s.urn for s in asm.allocate(SLICE, "o", parse_request(three_node_lan()), now + 10 * MIN, now)]
    asm.provision(urns, now + timedelta(hours=1), [], now)
    authority.down = True
    slivers = asm.slivers(SLICE, now)
    assert {s.allocation_state for s in slivers} == {sm.PROVISIONED}
    assert sm.FAILED not in {s.operational_state for s in slivers}
    assert all("operational state unknown" in s.error and "not answering" in s.error for s in slivers)
    authority.down = False
    assert sm.FAILED not in {s.operational_state for s in asm.slivers(SLICE, now)}
    asm.delete(urns, now)
