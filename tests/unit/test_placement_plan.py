"""Embedding is pure: given what is claimed, it places nodes and links or says what is short."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.placement import plan
from resources import usage_counts
from rspec.request import parse_request
from rspec.substrate import default_substrate
from slicex.errors import InsufficientNodes, VlanUnavailable
from tests.factories import request_rspec, vm

SUB = default_substrate("t.org")


def test_vm_goes_first_fit_and_claims_cores_and_memory():
    placements = plan(SUB, parse_request(request_rspec([vm("a", sliver_type="m1.medium")])), set())
    (p,) = placements
    assert p.component_id == SUB.hosts[0].component_id
    assert sum(k.startswith("core:") for k in p.keys) == 2
    assert sum(k.startswith("mem:") for k in p.keys) == 8


def test_bare_metal_exhaustion_is_insufficient_nodes():
    req = parse_request(request_rspec([{"client_id": f"b{i}", "sliver_type": "raw-pc"} for i in range(3)]))
    with pytest.raises(InsufficientNodes, match="bare metal"):
        plan(SUB, req, set())


def test_link_gets_lowest_free_vlan():
    req = parse_request(request_rspec([vm("a", ifaces=["a:0"]), vm("b", ifaces=["b:0"])],
                                      [{"client_id": "l", "ifaces": ["a:0", "b:0"]}]))
    sw = SUB.switches[0].component_id
    link = plan(SUB, req, {f"vlan:{sw}:1000"})[-1]
    assert link.details["vlan_tag"] == 1001


def test_all_vlans_taken_is_vlan_unavailable():
    sw = SUB.switches[0].component_id
    used = {f"vlan:{sw}:{t}" for t in range(1000, 1100)}
    req = parse_request(request_rspec([vm("a", ifaces=["a:0"]), vm("b", ifaces=["b:0"])],
                                      [{"client_id": "l", "ifaces": ["a:0", "b:0"]}]))
    with pytest.raises(VlanUnavailable, match="none free"):
        plan(SUB, req, used)


sizes = st.sampled_from(["default-vm", "m1.small", "m1.medium", "m1.large", "raw-pc"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(sizes, min_size=1, max_size=6), min_size=1, max_size=12))
def test_repeated_allocation_never_over_allocates(batches):
    """Whatever sequence of requests arrives, no key is claimed twice and no host exceeds its capacity."""
    claimed: set[str] = set()
    for batch in batches:
        req = parse_request(request_rspec([vm(f"n{i}", sliver_type=s) for i, s in enumerate(batch)]))
        try:
            placements = plan(SUB, req, claimed)
        except InsufficientNodes:
            continue
        keys = [k for p in placements for k in p.keys]
        assert len(keys) == len(set(keys))
        assert not (set(keys) & claimed)
        claimed |= set(keys)
    cores, mem, taken, _ = usage_counts(claimed)
    for h in SUB.hosts:
        assert cores.get(h.component_id, 0) <= h.cores
        assert mem.get(h.component_id, 0) <= h.memory_mb
