"""Links between the racks of one aggregate (stitching/racks.py): the path over the aggregate's own trunks and
its tags, negotiated by the stitching core as between aggregates — a common tag, else translation at a
trunk port that can, else Q-in-Q — and refused only when no path exists, saying why."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rspec.substrate import Substrate, substrate_from_dict
from stitching.model import StitchingError
from stitching.racks import TPID_8021AD, TPID_8021Q, RackPath, plan_rack_link, tags_of


def racks(ranges: dict[str, str], trunks: list[dict[str, Any]]) -> Substrate:
    """A substrate with one host per switch (`h-<switch>`, interface eth1) and the trunks given."""
    ports: dict[str, list[dict[str, Any]]] = {sw: [{"name": "h"}] for sw in ranges}
    for t in trunks:
        for end in t["between"]:
            sw, port = end.split(":")
            ports[sw].append({"name": port})
    return substrate_from_dict({
        "authority": "racks.example",
        "switches": [{"name": sw, "site": f"rack-{sw}", "vlan_range": [r], "ports": ports[sw]}
                     for sw, r in ranges.items()],
        "trunks": trunks,
        "hosts": [{"name": f"h-{sw}", "site": f"rack-{sw}", "interfaces": [{"name": "eth1", "switch_port": f"{sw}:h"}]}
                  for sw in ranges]})


def iface(sub: Substrate, switch: str) -> str:
    host = sub.host(f"h-{switch}")
    assert host is not None
    return host.interfaces[0].component_id


def link(sub: Substrate, a: str = "a", b: str = "b", taken: set[str] | frozenset[str] = frozenset(),
         name: str = "l") -> RackPath:
    return plan_rack_link(sub, name, iface(sub, a), iface(sub, b), set(taken))


def by_switch(path: RackPath) -> dict[str, int]:
    return {sw.rsplit("+", 1)[1]: tag for sw, tag in path.labels}


def trunk(a: str, b: str, **caps: Any) -> dict[str, Any]:
    return {"name": f"{a}-{b}", "between": [f"{a}:to-{b}", f"{b}:to-{a}"], **caps}


def test_racks_sharing_a_range_get_one_common_tag_over_the_trunk():
    sub = racks({"a": "1000-1099", "b": "1050-1149"}, [trunk("a", "b")])
    path = link(sub)
    assert path.kind == "common"
    assert by_switch(path) == {"a": 1050, "b": 1050}
    trunk_hops = [h for h in path.hops if h.trunk]
    assert [h.tags for h in trunk_hops] == [((TPID_8021Q, 1050),)] * 2


def test_racks_sharing_no_range_are_joined_by_translation_at_the_port_that_can():
    sub = racks({"a": "1000-1099", "b": "2000-2099"}, [trunk("a", "b", vlan_translation=["a:to-b"])])
    path = link(sub)
    assert path.kind == "translated"
    assert by_switch(path) == {"a": 1000, "b": 2000}
    hops = {h.port.rsplit("+", 1)[1]: h for h in path.hops}
    assert hops["a:to-b"].translation and hops["a:to-b"].tags == ((TPID_8021Q, 2000),)
    assert not hops["b:to-a"].translation and hops["b:to-a"].tags == ((TPID_8021Q, 2000),)
    assert hops["a:h"].tags == ((TPID_8021Q, 1000),)


def test_a_transit_switch_that_cannot_carry_the_racks_tags_is_crossed_with_qinq():
    # racks a and b share 1000-1099; the aggregation switch between them carries only 3000-3099
    sub = racks({"a": "1000-1099", "core": "3000-3099", "b": "1000-1099"},
                [trunk("a", "core", qinq=["a:to-core"], s_vlan_range=["3000-3099"]),
                 trunk("core", "b", qinq=["b:to-core"], s_vlan_range=["3000-3099"])])
    path = link(sub)
    assert path.kind == "qinq"
    labels = by_switch(path)
    assert labels["a"] == labels["b"] == 1000 and labels["core"] == 3000
    hops = {h.port.rsplit("+", 1)[1]: h for h in path.hops}
    assert hops["a:to-core"].qinq == "push" and hops["a:to-core"].tags == ((TPID_8021AD, 3000), (TPID_8021Q, 1000))
    assert hops["b:to-core"].qinq == "pop" and hops["b:to-core"].tags == ((TPID_8021AD, 3000), (TPID_8021Q, 1000))
    assert hops["core:to-a"].tags == ((TPID_8021AD, 3000),)  # the transit sees only the S-tag


def test_without_translation_or_qinq_the_refusal_names_racks_ranges_and_ports():
    sub = racks({"a": "1000-1099", "b": "2000-2099"}, [trunk("a", "b")])
    with pytest.raises(StitchingError) as err:
        link(sub)
    msg = err.value.message
    assert err.value.kind == "vlan"
    assert "rack rack-a (switch a, VLANs 1000-1099) and rack rack-b (switch b, VLANs 2000-2099)" in msg
    assert "without VLAN translation: a:to-b, b:to-a; without Q-in-Q: a:to-b, b:to-a" in msg
    assert "urn:publicid" not in msg  # switches and ports by the names the operator wrote


def test_racks_with_no_trunk_between_them_have_no_path():
    sub = racks({"a": "1000-1099", "b": "1000-1099", "c": "1000-1099"}, [trunk("a", "c")])
    with pytest.raises(StitchingError) as err:
        link(sub)
    assert err.value.kind == "path" and "no path" in err.value.message


def test_held_tags_are_not_given_twice_and_running_out_is_refused():
    sub = racks({"a": "1000-1001", "b": "2000-2001"}, [trunk("a", "b", vlan_translation=True)])
    taken: set[str] = set()
    seen = []
    for n in range(2):
        path = link(sub, taken=taken, name=f"l{n}")
        assert not taken & set(path.units())
        taken |= set(path.units())
        seen.append(by_switch(path))
    assert seen == [{"a": 1000, "b": 2000}, {"a": 1001, "b": 2001}]
    with pytest.raises(StitchingError, match="no VLAN tag works"):
        link(sub, taken=taken, name="l2")


def test_a_trunk_wire_range_limits_the_tags_a_translating_port_may_use():
    sub = racks({"a": "1000-1099", "b": "2000-2099"},
                [trunk("a", "b", vlan_translation=True, vlan_range=["3000-3000"])])
    path = link(sub)
    assert [h.tags for h in path.hops if h.trunk] == [((TPID_8021Q, 3000),)] * 2
    assert by_switch(path) == {"a": 1000, "b": 2000}  # both ends map the wire's 3000 to a tag of their own
    with pytest.raises(StitchingError):
        link(sub, taken=set(path.units()), name="l2")  # the trunk's one tag is held


ranges = st.tuples(st.integers(1, 60), st.integers(0, 20)).map(lambda t: f"{t[0]}-{t[0] + t[1]}")


@settings(max_examples=150, deadline=None)
@given(ra=ranges, rb=ranges, translate=st.sampled_from([(), ("a:to-b",), ("b:to-a",), ("a:to-b", "b:to-a")]),
       qinq=st.booleans())
def test_a_path_exists_exactly_when_the_tags_can_meet(ra, rb, translate, qinq):
    sub = racks({"a": ra, "b": rb}, [trunk("a", "b", vlan_translation=list(translate), qinq=qinq)])
    own = {"a": tags_of(sub.switches[0].vlan_range), "b": tags_of(sub.switches[1].vlan_range)}
    # two racks, one trunk: Q-in-Q carries the C-tag unchanged, so only translation frees the ranges
    possible = bool(own["a"] & own["b"]) or bool(translate)
    try:
        path = link(sub)
    except StitchingError as exc:
        assert not possible, exc.message
        return
    assert possible
    labels = by_switch(path)
    assert all(labels[sw] in own[sw] for sw in labels)  # each switch's tag is one it hands out
    for h in path.hops:  # a port that does not translate carries its switch's own tag
        sw = h.switch.rsplit("+", 1)[1]
        if not h.translation:
            assert h.tags[-1][1] == labels[sw]
    a_out, b_in = [h for h in path.hops if h.trunk]
    assert a_out.tags == b_in.tags  # one cable, one tag stack at both ends
    if not translate:
        assert labels["a"] == labels["b"]


def test_a_trunk_carries_links_up_to_its_capacity_then_refuses_for_bandwidth():
    sub = racks({"a": "1000-1099", "b": "1000-1099"}, [trunk("a", "b", bandwidth_kbps=1_000_000)])
    first = plan_rack_link(sub, "l0", iface(sub, "a"), iface(sub, "b"), set(), capacity_kbps=600_000)
    held = [u for u in first.units() if u.startswith("bw:")]
    assert len(held) == 2 * 6  # 600 Mb/s in 100 Mb/s units on each end of the trunk
    with pytest.raises(StitchingError) as err:
        plan_rack_link(sub, "l1", iface(sub, "a"), iface(sub, "b"), set(first.units()), capacity_kbps=600_000)
    assert err.value.kind == "bandwidth" and "1000000 kbps" in err.value.message
    second = plan_rack_link(sub, "l1", iface(sub, "a"), iface(sub, "b"), set(first.units()), capacity_kbps=400_000)
    assert not set(second.units()) & set(first.units())


def test_a_full_trunk_is_avoided_when_another_path_exists():
    sub = racks({"a": "1000-1099", "b": "1000-1099", "c": "1000-1099"},
                [trunk("a", "b", bandwidth_kbps=500_000), trunk("a", "c"), trunk("c", "b")])
    path = plan_rack_link(sub, "l", iface(sub, "a"), iface(sub, "b"), set(), capacity_kbps=800_000)
    assert {h.switch.rsplit("+", 1)[1] for h in path.hops} == {"a", "b", "c"}  # around the thin trunk
