"""The OpenStack substrate's pure plan (authority/substrate/openstack_plan.py): VLAN networks, ports, flavors,
images, user-data, GENI states from OpenStack states, and what reconcile removes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from authority.substrate.openstack_plan import (
    Found,
    OpenStackSettings,
    deployment_tag,
    network_plan,
    network_state,
    node_plan,
    node_state,
    orphans,
    owned,
    resource_name,
    sliver_tag,
)
from slicex.errors import BadArgs

S = OpenStackSettings("c", "physnet1", {"XOSmall": "m1.small", "raw-pc": "baremetal"}, {"ubuntu": "ubuntu-22.04"},
                      default_image="cirros", prefix="xab12")


def lan(vlan: int = 1000, **extra):
    return network_plan(S, "urn:lan", "lan0", (("vlan", vlan),),
                        {"subnet": "10.10.0", "interface_refs": ["a:if0", "b:if0"], **extra})


def details(**extra):
    return {"sliver_type": "XOSmall", "vm_size": "XOSmall", "disk_image": "urn:publicid:IDN+x+image+ubuntu",
            "interfaces": {"a:if0": {"ip": "", "netmask": ""}}, **extra}


def test_a_link_is_a_vlan_network_on_the_physical_network_down_until_started():
    body = lan().network_body()
    assert (body["provider_network_type"], body["provider_physical_network"], body["provider_segmentation_id"]) == (
        "vlan", "physnet1", 1000)
    assert body["admin_state_up"] is False
    assert lan().subnet_body("n")["cidr"] == "10.10.0.0/24"


@pytest.mark.parametrize("extra,why", [({"latency_ms": 5}, "latency"), ({"packet_loss": 0.1}, "packet_loss")])
def test_latency_and_loss_are_refused_not_ignored(extra, why):
    with pytest.raises(BadArgs, match=why):
        lan(**extra)


def test_a_link_without_a_vlan_or_with_a_bad_one_is_refused():
    with pytest.raises(BadArgs, match="no VLAN"):
        network_plan(S, "urn:lan", "lan0", (), {})
    with pytest.raises(BadArgs, match="1-4094"):
        lan(vlan=4095)


def test_a_node_gets_a_port_per_interface_with_the_manifest_address_flavor_image_and_keys():
    plan = node_plan(S, "urn:a", "a", (("vlan", 1000),),
                     details(logins=[{"username": "alice", "keys": ["ssh-ed25519 AAA alice"]},
                                     {"username": "bob", "keys": ["ssh-rsa BBB bob"]}]), {1000: lan()})
    assert (plan.flavor, plan.image, plan.keypair_key) == ("m1.small", "ubuntu-22.04", "ssh-ed25519 AAA alice")
    (port,) = plan.ports
    assert (port.network, port.address) == (lan().name, "10.10.0.1")
    assert "name: alice" in plan.user_data and '"ssh-rsa BBB bob"' in plan.user_data
    assert plan.metadata["slicex"] == deployment_tag("xab12")


def test_flavor_and_image_fall_back_to_the_names_and_the_default_image():
    plan = node_plan(S, "urn:a", "a", (), {"vm_size": "m1.tiny", "sliver_type": "m1.tiny"}, {})
    assert (plan.flavor, plan.image) == ("m1.tiny", "cirros")
    assert node_plan(S, "urn:a", "a", (), {"sliver_type": "raw-pc"}, {}).flavor == "baremetal"


def test_an_interface_on_no_link_is_refused():
    with pytest.raises(BadArgs, match="on no link"):
        node_plan(S, "urn:a", "a", (), details(), {})


def test_nodes_of_one_slice_share_a_security_group_and_other_slices_do_not():
    p = [node_plan(S, f"urn:{n}", n, (), {"vm_size": "x", "hostname": f"{n}.{sl}.auth"}, {})
         for n, sl in (("a", "s1"), ("b", "s1"), ("c", "s2"))]
    assert p[0].security_group == p[1].security_group != p[2].security_group


@given(st.text(min_size=1, max_size=100), st.text(max_size=40))
def test_every_resource_name_is_owned_by_its_prefix_only(sliver, part):
    name = resource_name("xab12", sliver, part)
    assert owned("xab12", name) and not owned("xcd34", name)


@pytest.mark.parametrize("status,state", [("BUILD", "geni_configuring"), ("ACTIVE", "geni_ready"),
                                          ("SHUTOFF", "geni_notready"), ("ERROR", "geni_failed"),
                                          ("REBOOT", "geni_configuring")])
def test_server_states_map_to_geni_states(status, state):
    assert node_state({"id": "s", "status": status}, [{"status": "ACTIVE"}], 1, True, "a")[0] == state


def test_a_node_is_configuring_while_a_port_builds_and_failed_when_a_port_is_gone():
    assert node_state({"status": "ACTIVE"}, [{"status": "BUILD"}], 1, True, "a") == ("geni_configuring", "")
    assert node_state({"status": "ACTIVE"}, [], 1, True, "a")[0] == "geni_failed"
    assert node_state(None, [{"status": "DOWN"}], 1, False, "a") == ("geni_notready", "")


def test_network_state_follows_admin_state_and_status():
    assert network_state({"status": "ACTIVE", "is_admin_state_up": False}, "l") == ("geni_notready", "")
    assert network_state({"status": "ACTIVE", "is_admin_state_up": True}, "l") == ("geni_ready", "")
    assert network_state(None, "l")[0] == "geni_failed"


def test_orphans_are_what_no_live_sliver_holds_in_teardown_order():
    dep = deployment_tag("xab12")
    live, dead = "urn:live", "urn:dead"
    found = [Found("network", "n1", resource_name("xab12", dead), frozenset({dep, sliver_tag("xab12", dead)})),
             Found("server", "s1", resource_name("xab12", dead), frozenset({dep, sliver_tag("xab12", dead)})),
             Found("port", "p1", "x", frozenset({dep, sliver_tag("xab12", live)})),
             Found("port", "p2", "y", frozenset({"someone-else"})),
             Found("keypair", resource_name("xab12", dead), resource_name("xab12", dead)),
             Found("keypair", resource_name("xab12", live), resource_name("xab12", live)),
             Found("keypair", "alice-laptop", "alice-laptop")]
    assert [(f.kind, f.id) for f in orphans("xab12", found, [live], [])] == [
        ("server", "s1"), ("network", "n1"), ("keypair", resource_name("xab12", dead))]
