"""OpenFlow rules of the netns bridge (authority/substrate/flows.py): isolation by construction, the stitching
hooks (VLAN translation, Q-in-Q push/pop), and one rule set for os-ken and ovs-ofctl."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from authority.substrate.flows import (
    TPID_8021AD,
    TPID_8021Q,
    AccessPort,
    Flow,
    Segment,
    Uplink,
    segment_flows,
)


def mac(n: int) -> str:
    return f"02:00:00:00:00:{n:02x}"


def reach(flows: list[Flow], in_port: int) -> set[int]:
    """Every port a frame entering at `in_port` can leave by (any destination, table 0 only)."""
    return {int(v) for f in flows if f.table == 0 and ("in_port", in_port) in f.match
            for a, v in f.actions if a == "output"}


segments_st = st.lists(st.lists(st.integers(1, 60), min_size=1, max_size=5, unique=True), min_size=1, max_size=6)


@given(segments_st)
def test_no_rule_moves_a_frame_between_segments(groups):
    used: set[int] = set()
    segs = []
    for k, ports in enumerate(groups):
        ports = [p for p in ports if p not in used]
        used.update(ports)
        segs.append(Segment(1000 + k, tuple(AccessPort(p, mac(p)) for p in ports)))
    flows = segment_flows(segs)
    for seg in segs:
        mine = {p.ofport for p in seg.ports}
        for p in mine:
            assert reach(flows, p) <= mine - {p}


def test_unicast_goes_to_the_one_port_and_broadcast_to_the_others():
    seg = Segment(1000, tuple(AccessPort(p, mac(p)) for p in (1, 2, 3)))
    flows = segment_flows([seg])
    uni = [f for f in flows if ("eth_dst", mac(2)) in f.match and ("in_port", 1) in f.match]
    assert [f.actions for f in uni] == [(("output", 2),)]
    flood = next(f for f in flows if f.match == (("in_port", 1),))
    assert {v for a, v in flood.actions if a == "output"} == {2, 3}
    assert any(f.priority == 0 and f.actions == () for f in flows)  # table miss drops


def test_a_port_in_two_segments_is_refused():
    with pytest.raises(ValueError, match="two segments"):
        segment_flows([Segment(1, (AccessPort(1, mac(1)),)), Segment(2, (AccessPort(1, mac(1)),))])


def test_translated_uplink_pushes_its_own_tag_and_pops_it_on_the_way_in():
    seg = Segment(1000, (AccessPort(1, mac(1)),), (Uplink(9, ((TPID_8021Q, 3100),)),))
    flows = segment_flows([seg])
    out = next(f for f in flows if f.match == (("in_port", 1),))
    assert out.actions == (("push_vlan", TPID_8021Q), ("set_vlan_vid", 3100), ("output", 9), ("pop_vlan", 0))
    inbound = next(f for f in flows if ("in_port", 9) in f.match)
    assert ("vlan_vid", 0x1000 | 3100) in inbound.match and inbound.actions == (("pop_vlan", 0), ("output", 1))


def test_qinq_uplink_pushes_c_then_s_tag_and_pops_both():
    seg = Segment(1000, (AccessPort(1, mac(1)),), (Uplink(9, ((TPID_8021AD, 200), (TPID_8021Q, 1000))),))
    flows = segment_flows([seg])
    out = next(f for f in flows if f.match == (("in_port", 1),))
    assert out.actions == (("push_vlan", TPID_8021Q), ("set_vlan_vid", 1000), ("push_vlan", TPID_8021AD),
                           ("set_vlan_vid", 200), ("output", 9), ("pop_vlan", 0), ("pop_vlan", 0))
    outer = next(f for f in flows if f.table == 0 and ("in_port", 9) in f.match)
    inner = next(f for f in flows if f.table == 1 and ("in_port", 9) in f.match)
    assert outer.goto == 1 and outer.actions == (("pop_vlan", 0),)
    assert ("vlan_vid", 0x1000 | 1000) in inner.match and inner.actions[-1] == ("output", 1)


def test_bad_uplink_tags_are_refused():
    with pytest.raises(ValueError):
        Uplink(9, ())
    with pytest.raises(ValueError):
        Uplink(9, ((0x9100, 5),))


def test_rules_round_trip_through_the_controller_document_and_render_for_ofctl():
    seg = Segment(1000, (AccessPort(1, mac(1)), AccessPort(2, mac(2))), (Uplink(9, ((TPID_8021AD, 200), (TPID_8021Q, 7))),))
    flows = segment_flows([seg])
    assert [Flow.from_doc(f.to_doc()) for f in flows] == flows
    text = "\n".join(f.to_ofctl() for f in flows)
    assert "dl_dst=02:00:00:00:00:02 actions=output:2" in text
    assert "push_vlan:0x88a8,set_field:4296->vlan_vid" in text and "goto_table:1" in text
