"""Pure parts of stitching on one host and at the broker: the names of a shared switch's cables (both sides
of a cable compute both ends' names, which fit Linux's 15 characters and belong to no deployment), and an
external port's bandwidth units (how a link's capacity is rounded, what is left when others hold some)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from authority.substrate.netns_plan import owned, shared_trunk_name, trunk_name
from resources.stitching_port import StitchingPorts, port_bw_unit
from rspec.substrate import ExternalLink, default_substrate
from slicex.errors import InsufficientBandwidth

A = "urn:publicid:IDN+sa.test+interface+sw1:to-sb"
B = "urn:publicid:IDN+sb.test+interface+sw1:to-sa"


def test_cable_ends_are_named_from_the_switch_and_the_port_alone():
    ends = {shared_trunk_name("/run/slicex-sw", A), shared_trunk_name("/run/slicex-sw", B)}
    assert len(ends) == 2 and all(len(e) <= 15 and e.startswith("sxc") for e in ends)
    assert shared_trunk_name("/run/slicex-sw", A.replace("sa.test", "SA.test")) in ends  # URNs compare lower-cased
    assert shared_trunk_name("/run/slicex-other", A) not in ends  # another switch, other cables
    for prefix in ("x1a2b", "s", "sx", "sxc"):  # reconcile of any deployment leaves a cable alone
        assert not any(owned(prefix, e) for e in ends)
    assert trunk_name("x1a2b", A) != shared_trunk_name("/run/slicex-sw", A)


def substrate(capacity: int, granularity: int = 1):
    base = default_substrate("sa.test")
    ext = ExternalLink("up", "urn:publicid:IDN+sa.test+link+up", A, "urn:publicid:IDN+sb.test+authority+am", B,
                       ((100, 110),), capacity, granularity_kbps=granularity)
    return replace(base, external_links=(ext,))


@dataclass
class Link:
    client_id: str
    capacity_kbps: int
    uplinks: tuple = ((A, ((0x8100, 100),)),)


def test_port_units_are_a_hundredth_of_its_capacity_or_its_granularity():
    sub = substrate(10_000)
    assert port_bw_unit(sub.external_links[0]) == 100
    [pool] = StitchingPorts().offer(sub).pools
    name, units = pool.name, pool.units
    assert name == f"bw:{A}" and len(units) == 100
    assert port_bw_unit(substrate(10_000, granularity=1000).external_links[0]) == 1000
    assert len(StitchingPorts.capacity_keys(sub, Link("l", 150), set())) == 2  # rounded up to units


def test_what_others_hold_is_not_given_again_and_a_shortage_is_25_with_what_is_left():
    sub = substrate(10_000)
    first = StitchingPorts.capacity_keys(sub, Link("l1", 6000), set())
    assert len(first) == 60
    with pytest.raises(InsufficientBandwidth) as short:
        StitchingPorts.capacity_keys(sub, Link("l2", 6000), set(first))
    assert short.value.code == 25 and "4000 kbps are left" in short.value.message
    second = StitchingPorts.capacity_keys(sub, Link("l2", 4000), set(first))
    assert not set(first) & set(second)
    assert StitchingPorts.capacity_keys(sub, Link("l3", 0), set()) == [] and StitchingPorts.capacity_keys(sub, Link("l4", 10, ()), set()) == []
