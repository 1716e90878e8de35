"""The netns substrate driver on real namespaces, veths, tc and a private Open vSwitch (userspace datapath)
with rules from the os-ken controller: slivers that pass packets, isolation between slices, enforced rates,
stop/start, cleanup, and reconcile after the driver's process is killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime

import pytest

from authority.substrate import hostnet
from authority.substrate.flows import Flow
from authority.substrate.netns import NetnsDriver
from authority.substrate.openflow import cookie_flows
from protocol.messages import SliverSpec
from slicex.codec import encode
from tests.integration.netns_support import (
    assert_shaped,
    cleanup,
    have_iperf3,
    iperf3_mbps,
    new_prefix,
    ping,
    require_host,
    started_driver,
)

NOW = datetime.now(UTC)


@pytest.fixture
def driver():
    with started_driver() as d:
        yield d


def lan_specs(slice_tag: str, vlan: int, n: int = 3, capacity_kbps: int = 0) -> tuple[SliverSpec, list[SliverSpec]]:
    refs = [f"n{k}:if0" for k in range(1, n + 1)]
    link = SliverSpec(f"urn:{slice_tag}:lan", "link", "lan0", labels=(("vlan", vlan),),
                      details={"capacity_kbps": capacity_kbps, "subnet": "10.10.0", "interface_refs": refs})
    nodes = [SliverSpec(f"urn:{slice_tag}:n{k}", "node", f"n{k}", labels=(("vlan", vlan),),
                        details={"interfaces": {refs[k - 1]: {"component_id": "x", "ip": "", "netmask": ""}}})
             for k in range(1, n + 1)]
    return link, nodes


def provision_and_start(d: NetnsDriver, link: SliverSpec, nodes: list[SliverSpec]) -> dict[str, dict]:
    status = {link.id: d.create(link, NOW)}
    for s in nodes:
        status[s.id] = d.create(s, NOW)
    for s in [link, *nodes]:
        status[s.id] = d.modify(s, status[s.id], "geni_start", NOW)
    return status


def test_lan_nodes_ping_each_other_and_other_slices_are_unreachable(driver):
    link_a, nodes_a = lan_specs("a", 1000)
    link_b, nodes_b = lan_specs("b", 1001, n=2)  # the same addresses (10.10.0.1-2) on another VLAN
    st = provision_and_start(driver, link_a, nodes_a)
    st |= provision_and_start(driver, link_b, nodes_b)
    assert all(driver.status(s, st[s.id], NOW) == ("geni_ready", "") for s in [link_a, *nodes_a, link_b, *nodes_b])
    ns = {s.client_id + s.id[4]: st[s.id]["netns"] for s in nodes_a + nodes_b}
    for src in ("n1a", "n2a", "n3a"):
        for k in (1, 2, 3):
            if src != f"n{k}a":
                assert ping(ns[src], f"10.10.0.{k}", count=2)[0], f"{src} cannot reach 10.10.0.{k}"
    assert hostnet.exec_in(ns["n1a"], ["cat", "/etc/hostname"]).stdout.strip() == "n1"
    # slice b's n2 has 10.10.0.2 too; from slice b only b's nodes answer, and slice a's n3 (10.10.0.3) is unseen
    assert ping(ns["n1b"], "10.10.0.2", count=2)[0]
    assert not ping(ns["n1b"], "10.10.0.3", count=2)[0]
    # the bridge forwards by rules only: no frame of VLAN 1000's ports may leave through VLAN 1001's
    assert len(cookie_flows(driver.ovs, driver.bridge)) > 2


def test_stop_takes_a_node_off_the_lan_and_start_brings_it_back(driver):
    link, nodes = lan_specs("s", 1002, n=2)
    st = provision_and_start(driver, link, nodes)
    n1, n2 = (st[s.id]["netns"] for s in nodes)
    st[nodes[1].id] = driver.modify(nodes[1], st[nodes[1].id], "geni_stop", NOW)
    assert driver.status(nodes[1], st[nodes[1].id], NOW)[0] == "geni_notready"
    assert not ping(n1, "10.10.0.2", count=2)[0]
    st[nodes[1].id] = driver.modify(nodes[1], st[nodes[1].id], "geni_start", NOW)
    assert ping(n1, "10.10.0.2", count=2)[0]
    st[link.id] = driver.modify(link, st[link.id], "geni_stop", NOW)  # the segment's rules go
    assert not ping(n1, "10.10.0.2", count=2)[0]
    hostnet.del_namespace(n2)  # something outside slicex removed a node: it is failed, never ready
    state, error = driver.status(nodes[1], st[nodes[1].id], NOW)
    assert state == "geni_failed" and n2 in error


@pytest.mark.skipif(not have_iperf3(), reason="iperf3 is not installed (make test installs it)")
def test_ten_megabit_link_is_shaped_on_both_ends_of_every_interface(driver):
    link, nodes = lan_specs("r", 1003, n=2, capacity_kbps=10_000)
    st = provision_and_start(driver, link, nodes)
    n1, n2 = (st[s.id]["netns"] for s in nodes)
    ends: list[tuple[str | None, str]] = []
    for spec in nodes:  # both ends of every interface: the node's egress and the switch's egress toward it
        iface = driver._node_plan(spec).interfaces[0]
        ends += [(st[spec.id]["netns"], iface.ns_if), (None, iface.host_if)]
    assert_shaped(iperf3_mbps(n2, "10.10.0.2", n1, seconds=3), 10_000, ends)


def test_destroy_leaves_nothing_and_is_idempotent(driver):
    link, nodes = lan_specs("d", 1004, n=2)
    st = provision_and_start(driver, link, nodes)
    for s in [*nodes, link]:
        driver.destroy(s, st[s.id], NOW)
        driver.destroy(s, st[s.id], NOW)
    assert driver.leftovers() == []
    assert len(cookie_flows(driver.ovs, driver.bridge)) == 2  # only the table-miss drops


CHILD = textwrap.dedent("""
    import json, sys, time
    from datetime import UTC, datetime
    from protocol.messages import SliverSpec
    from slicex.codec import decode
    from authority.substrate.netns import NetnsDriver
    d = NetnsDriver(sys.argv[1])
    d.start()
    out = {}
    for doc in json.loads(sys.argv[2]):
        spec = decode(doc, SliverSpec, "spec")
        st = d.create(spec, datetime.now(UTC))
        out[spec.id] = d.modify(spec, st, "geni_start", datetime.now(UTC))
    print(json.dumps(out), flush=True)
    time.sleep(600)
""")


def test_after_sigkill_a_restart_removes_dead_slivers_and_adopts_live_ones(driver):
    """A process creates two slices' slivers and is killed with SIGKILL (nothing of it runs its cleanup);
    the restarted driver is told only slice a is live: slice b's objects go, slice a keeps passing packets."""
    link_a, nodes_a = lan_specs("ka", 1005, n=2)
    link_b, nodes_b = lan_specs("kb", 1006, n=2)
    driver.shutdown()  # the child starts (and owns) the switch and controller, as a crashed aggregate did
    specs = [encode(s) for s in (link_a, *nodes_a, link_b, *nodes_b)]
    child = subprocess.Popen([sys.executable, "-c", CHILD, driver.prefix, json.dumps(specs)],
                             stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    try:
        status = json.loads(child.stdout.readline())
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    ns_b = status[nodes_b[0].id]["netns"]
    assert ns_b in hostnet.namespaces()
    restarted = NetnsDriver(driver.prefix)
    restarted.start()  # adopts the switch and the controller the killed process left running
    live = [(s, status[s.id]) for s in (link_a, *nodes_a)]
    report = restarted.reconcile(live)
    assert ns_b not in hostnet.namespaces()
    assert any(ns_b in r for r in report["removed"])
    assert sorted(report["adopted"]) == sorted(status[s.id]["netns"] for s in nodes_a)
    n1 = status[nodes_a[0].id]["netns"]
    assert ping(n1, "10.10.0.2", count=2)[0]
    assert all(restarted.status(s, st, NOW) == ("geni_ready", "") for s, st in live)
    for s, st in live:
        restarted.destroy(s, st, NOW)
    assert restarted.leftovers() == []


def _rule_keys(line: str) -> tuple[frozenset[str], str]:
    """A rule as ovs-ofctl writes it (a dump-flows line or Flow.to_ofctl): its match fields and its actions,
    without the counters and the cookie, so a declared rule and the switch's copy compare equal."""
    fields, _, actions = line.strip().partition(" actions=")
    skip = ("cookie=", "duration=", "n_packets=", "n_bytes=", "idle_age=", "hard_age=", "reset_counts")
    return frozenset(f.strip() for f in fields.split(",") if f.strip() and not f.strip().startswith(skip)), actions


def test_os_ken_programs_the_switch_where_it_is_installed(driver):
    """The default controller is os-ken and it, not ovs-ofctl, puts the rules on the bridge: the bridge is
    connected to the os-ken process, and after a LAN starts, and again after it stops, the rules the switch
    holds (ovs-ofctl dump-flows) are exactly the rules the driver declared."""
    pytest.importorskip("os_ken", reason="os-ken is not installed here (pip install os-ken)")
    assert driver.flows.name == "os-ken" and "os-ken" in driver.description
    port = (driver.run_dir / "osken.port").read_text().strip()
    assert driver.ovs.vsctl("get-controller", driver.bridge).strip() == f"tcp:127.0.0.1:{port}"

    def declared() -> set[tuple[frozenset[str], str]]:
        state = json.loads((driver.run_dir / "flows-state.json").read_text())
        return {_rule_keys(Flow.from_doc(d).to_ofctl()) for d in state["bridges"][str(driver.dpid)]}

    def held() -> set[tuple[frozenset[str], str]]:
        return {_rule_keys(line) for line in cookie_flows(driver.ovs, driver.bridge)}

    link, nodes = lan_specs("k", 1008, n=2)
    st = provision_and_start(driver, link, nodes)
    # connected (a loaded host may miss an echo and reconnect: OVS's inactivity probe is 5 s)
    deadline = time.monotonic() + 15
    while not driver.ovs.connected(driver.bridge) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert driver.ovs.connected(driver.bridge)
    assert len(declared()) > 2 and held() == declared()
    assert ping(st[nodes[0].id]["netns"], "10.10.0.2", count=2)[0]
    st[link.id] = driver.modify(link, st[link.id], "geni_stop", NOW)
    assert held() == declared() and len(held()) == 2  # only the table-miss drops
    for s in (link, *nodes):
        driver.destroy(s, st[s.id], NOW)


def test_ovs_ofctl_programs_the_same_rules_where_os_ken_is_missing():
    """The other controller behind the same interface, when the operator chooses it: rules pushed with
    ovs-ofctl, the bridge without a controller."""
    require_host()
    d = NetnsDriver(new_prefix(), controller="ovs-ofctl")
    try:
        d.start()
        assert d.flows.name == "ovs-ofctl" and "ovs-ofctl" in d.description
        assert d.ovs.vsctl("get-controller", d.bridge).strip() == ""
        link, nodes = lan_specs("o", 1007, n=2)
        st = provision_and_start(d, link, nodes)
        assert ping(st[nodes[0].id]["netns"], "10.10.0.2", count=2)[0]
        st[link.id] = d.modify(link, st[link.id], "geni_stop", NOW)
        assert not ping(st[nodes[0].id]["netns"], "10.10.0.2", count=2)[0]
    finally:
        cleanup(d)
    assert not d.leftovers()
