"""The netns substrate's pure host plan: names, VLANs, addresses, rates (authority/substrate/netns_plan.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from authority.substrate.netns_plan import (
    IFNAME_MAX,
    deployment_prefix,
    link_plan,
    netns_name,
    node_plan,
    owned,
    tbf_args,
    veth_names,
)
from slicex.errors import BadArgs
from slicex.inventory import mac_for

PREFIX = "xab12"
sliver_ids = st.text(min_size=1, max_size=80)
iface_ids = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=1, max_size=40)


def lan(vlan: int = 1000, refs=("a:if0", "b:if0", "c:if0"), cap: int = 10_000):
    return link_plan("urn:lan", "lan0", (("vlan", vlan),), {"capacity_kbps": cap, "subnet": "10.10.0",
                                                            "interface_refs": list(refs)})


def node_details(*ifaces: str, ip: str = "") -> dict:
    return {"interfaces": {i: {"component_id": "x", "ip": ip, "netmask": ""} for i in ifaces}}


@given(sliver_ids, iface_ids, st.sampled_from(["x", "t1234", PREFIX, deployment_prefix("dep-1")]))
def test_veth_names_fit_ifnamsiz_and_belong_to_the_prefix(sliver, iface, prefix):
    for name in veth_names(prefix, sliver, iface):
        assert len(name) <= IFNAME_MAX
        assert name.isascii() and name.isalnum()
        assert owned(prefix, name)
    assert owned(prefix, netns_name(prefix, sliver))


@given(st.lists(st.tuples(sliver_ids, iface_ids), min_size=2, max_size=200, unique=True))
def test_distinct_interfaces_get_distinct_device_names(pairs):
    names = [n for s, i in pairs for n in veth_names(PREFIX, s, i)]
    assert len(set(names)) == len(names)


@given(st.lists(sliver_ids, min_size=2, max_size=200, unique=True))
def test_distinct_slivers_get_distinct_namespaces(ids):
    assert len({netns_name(PREFIX, s) for s in ids}) == len(ids)


def test_another_deployments_objects_are_not_owned():
    other = veth_names("xcd34", "urn:n1", "if0")[0]
    assert not owned(PREFIX, other)
    assert not owned(PREFIX, "eth0") and not owned(PREFIX, PREFIX + "zzz")


def test_node_interfaces_take_their_links_vlan_address_and_rate():
    link = lan()
    plan = node_plan(PREFIX, "urn:b", "b", (("vlan", 1000),), node_details("b:if0"), {1000: link})
    (i,) = plan.interfaces
    assert (i.vlan, i.address, i.rate_kbps) == (1000, "10.10.0.2/24", 10_000)  # second on the LAN, as the manifest
    assert i.mac == mac_for("urn:b", "b:if0")
    assert plan.hostname == "b" and plan.netns == netns_name(PREFIX, "urn:b")


def test_request_address_wins_over_the_link_subnet():
    plan = node_plan(PREFIX, "urn:a", "a", (("vlan", 1000),), node_details("a:if0", ip="192.168.7.9"), {1000: lan()})
    assert plan.interfaces[0].address == "192.168.7.9/24"


def test_an_interface_matches_only_a_link_among_its_own_tags():
    """Two slices reuse client ids: the other slice's LAN (another tag) must not capture this interface."""
    mine, theirs = lan(1000), lan(1001)
    plan = node_plan(PREFIX, "urn:a", "a", (("vlan", 1000),), node_details("a:if0"), {1000: mine, 1001: theirs})
    assert plan.interfaces[0].vlan == 1000
    lonely = node_plan(PREFIX, "urn:z", "z", (), node_details("a:if0"), {1000: mine})
    assert lonely.interfaces[0].vlan is None and lonely.interfaces[0].address == ""


def test_a_rewired_interface_is_on_the_link_its_details_name_while_the_replaced_one_still_exists():
    """An Update replaced link 1000 by 1002 (a capacity change): both name a:if0 until the old one closes; the
    node's redeem labels still say 1000, its interface details say 1002."""
    old, new = lan(1000, cap=10_000), link_plan("urn:lan2", "lan0", (("vlan", 1002),), {
        "capacity_kbps": 20_000, "subnet": "10.10.2", "interface_refs": ["a:if0", "b:if0"]})
    details = {"interfaces": {"a:if0": {"component_id": "x", "ip": "", "netmask": "", "vlan_tag": 1002}}}
    plan = node_plan(PREFIX, "urn:a", "a", (("vlan", 1000),), details, {1000: old, 1002: new})
    assert (plan.interfaces[0].vlan, plan.interfaces[0].address, plan.interfaces[0].rate_kbps) == \
        (1002, "10.10.2.1/24", 20_000)
    # a tag that names no link holding the interface is not believed: the node's own tags decide
    stray = {"interfaces": {"a:if0": {"component_id": "x", "ip": "", "netmask": "", "vlan_tag": 1001}}}
    other = lan(1001, refs=("z:if0",))
    plan = node_plan(PREFIX, "urn:a", "a", (("vlan", 1000),), stray, {1000: old, 1001: other})
    assert plan.interfaces[0].vlan == 1000


def test_latency_and_loss_are_refused_without_netem_naming_the_kernel_feature():
    with pytest.raises(BadArgs, match="netem"):
        link_plan("urn:l", "l", (("vlan", 1000),), {"latency_ms": 20})
    with pytest.raises(BadArgs, match="packet_loss"):
        link_plan("urn:l", "l", (("vlan", 1000),), {"packet_loss": 0.01})
    assert link_plan("urn:l", "l", (("vlan", 1000),), {"latency_ms": 20}, netem=True).vlan == 1000


def test_bad_address_is_badargs():
    with pytest.raises(BadArgs, match="not an IPv4"):
        node_plan(PREFIX, "urn:a", "a", (), node_details("a:if0", ip="999.1.1.1"), {})


def test_prefix_must_be_short_enough_for_device_names():
    with pytest.raises(BadArgs):
        node_plan("toolong", "urn:a", "a", (), node_details("a:if0"), {})


@given(st.integers(min_value=1, max_value=100_000_000))
def test_token_bucket_holds_a_frame_and_scales_with_the_rate(kbps):
    args = tbf_args(kbps)
    burst, limit = int(args[args.index("burst") + 1]), int(args[args.index("limit") + 1])
    frame_kbps = int(args[2].removesuffix("kbit"))
    assert args[:2] == ["tbf", "rate"] and kbps <= frame_kbps * 1500 / 1514 < kbps + 1  # IP rate = capacity
    assert burst >= 1514 and limit >= burst
