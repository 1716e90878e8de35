"""The netns plan of an aggregate over several racks (authority/substrate/netns_plan.py): one bridge per
switch, each node interface on its own rack's bridge, and a link between racks planned per switch from the
placement's path (its tag on each switch and the trunk ports it crosses there)."""

from __future__ import annotations

from pathlib import Path

import pytest

from authority.substrate.netns_plan import RackLayout, link_plan, node_plan
from broker.placement import plan
from rspec.request import parse_request
from rspec.substrate import default_substrate, load_substrate
from tests.factories import request_rspec, vm

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "two-rack-site.yaml"
SUB = load_substrate(EXAMPLE)
TOR_A, TOR_B = (sw.component_id for sw in SUB.switches)


def test_each_switch_is_a_bridge_and_the_first_is_the_deployments_own():
    layout = RackLayout.of(SUB)
    assert layout.bridges("x1") == {TOR_A: "x1-br", TOR_B: "x1-br1"}
    assert layout.cabled[SUB.host("host-b2").interfaces[0].component_id] == TOR_B
    assert layout.cabled[SUB.external_links[0].local_port] == TOR_A
    (trunk,) = layout.trunks
    assert (trunk[1], trunk[3]) == (TOR_A, TOR_B)
    assert RackLayout.of(default_substrate()).bridges("x1") == {default_substrate().switches[0].component_id: "x1-br"}
    assert RackLayout().bridges("x1") == {"": "x1-br"}


def test_a_link_between_racks_is_planned_per_switch_and_its_nodes_on_their_racks_bridges():
    req = parse_request(request_rspec(
        [vm("a", component_id=SUB.host("host-a1").component_id, ifaces=["a:0"]),
         vm("b", component_id=SUB.host("host-b1").component_id, ifaces=["b:0"])],
        [{"client_id": "l", "ifaces": ["a:0", "b:0"]}]))
    placed = {p.client_id: p for p in plan(SUB, req, set())}
    link = placed["l"]
    (label,) = link.labels.items()
    lp = link_plan("s-l", "l", [("vlan", label[1])], link.details)
    tag_a, tag_b = lp.tag_on(TOR_A), lp.tag_on(TOR_B)
    assert tag_a == lp.vlan and tag_a != tag_b
    (port_a, tags_a), = lp.trunk_hops(TOR_A)
    (port_b, tags_b), = lp.trunk_hops(TOR_B)
    assert port_a.endswith("tor-a:trunk-b") and port_b.endswith("tor-b:trunk-a")
    assert tags_a == tags_b == ((0x8100, tag_b),)  # translated at tor-a: the wire carries rack B's tag
    layout = RackLayout.of(SUB)
    for client, switch in (("a", TOR_A), ("b", TOR_B)):
        node = node_plan("x1", f"s-{client}", client, [("vlan", lp.vlan)], placed[client].details, {lp.vlan: lp},
                         layout)
        (iface,) = node.interfaces
        assert iface.switch == switch and iface.vlan == lp.vlan
        assert layout.bridge("x1", iface.switch) == ("x1-br" if switch == TOR_A else "x1-br1")


def test_switch_hosts_place_switches_by_name_and_an_unknown_switch_is_refused(tmp_path):
    layout = RackLayout.of(SUB, {"tor-b": "sxlab-x-h2"})
    assert layout.hosts == {TOR_B: "sxlab-x-h2"}
    from deployment.service import host_driver
    from slicex.config import ConfigError, parse_config
    from slicex.home import Home

    cfg = parse_config({"authority": "example.edu", "substrate_driver": "netns", "substrate": str(EXAMPLE),
                        "netns": {"switch_hosts": {"tor-c": "sxlab-x-h3"}}})
    with pytest.raises(ConfigError, match="netns.switch_hosts names tor-c, not a switch of the substrate file"):
        host_driver(cfg, Home(tmp_path))
