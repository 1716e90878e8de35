"""The stitched data plane on the netns substrate: aggregates on one host, each its own netns deployment with
its own bridge (on one shared private Open vSwitch: two userspace-datapath ovs-vswitchd cannot share a host),
joined by veth trunks the drivers make themselves from the substrate files' external ports (one pair per
cable, named from the switch and both ports). The path service computes the path
(`compute_path`, what `slicex scs` serves), each aggregate takes its own hops from the answer (`apply_hops`,
what its Allocate does) and its netns driver installs the hops' tags, translations and S-tags as flows at the
trunk ports. Nodes at the two ends ping each other across a direct, a translated and a Q-in-Q path; the
Q-in-Q transit trunk carries 802.1ad frames (flow dump: push_vlan:0x88a8 with rising packet counters)."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from authority.substrate import hostnet
from authority.substrate.netns import NetnsDriver
from authority.substrate.netns_plan import shared_trunk_name
from authority.substrate.ovs import OvsSwitch
from protocol.messages import SliverSpec
from rspec.request import parse_request
from rspec.substrate import load_substrate
from stitching.am_hops import apply_hops
from stitching.scs import compute_path
from stitching.topology import load_topology
from tests.integration.netns_support import (
    assert_shaped,
    cleanup,
    have_iperf3,
    iperf3_mbps,
    link_ends,
    new_prefix,
    ping,
    require_host,
    switch_in_this_namespace,
)
from tests.integration.stitching_support import CAPACITY_KBPS, MODES, port, substrate, urn

NOW = datetime(2026, 11, 23, tzinfo=UTC)


def request(a: str, b: str) -> str:
    return f"""<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">
  <node client_id="a" component_manager_id="{urn(a)}" exclusive="false">
    <sliver_type name="default-vm"/><interface client_id="a:if0"><ip address="10.77.0.1" netmask="255.255.255.0"/>
    </interface></node>
  <node client_id="b" component_manager_id="{urn(b)}" exclusive="false">
    <sliver_type name="default-vm"/><interface client_id="b:if0"><ip address="10.77.0.2" netmask="255.255.255.0"/>
    </interface></node>
  <link client_id="st0"><component_manager name="{urn(a)}"/><component_manager name="{urn(b)}"/>
    <interface_ref client_id="a:if0"/><interface_ref client_id="b:if0"/>
    <property source_id="a:if0" dest_id="b:if0" capacity="{CAPACITY_KBPS}"/>
    <property source_id="b:if0" dest_id="a:if0" capacity="{CAPACITY_KBPS}"/></link></rspec>"""


def specs(sub, service_rspec: str) -> list[SliverSpec]:
    """What one aggregate's Allocate + Provision hand its driver for the path service's answer."""
    whole = parse_request(service_rspec)
    mine = apply_hops(sub, whole.for_aggregate(urn(sub.authority.removesuffix(".test"))), whole)
    out = []
    for lk in mine.links:
        out.append(SliverSpec(f"link-{sub.authority}-{lk.client_id}", "link", lk.client_id, (),
                              (("vlan", lk.vlan_tag),),
                              {"vlan_tag": lk.vlan_tag, "capacity_kbps": lk.capacity_kbps or 0,
                               "interface_refs": [r for r in lk.interface_refs
                                                  if any(r.startswith(n.client_id + ":") for n in mine.nodes)],
                               "uplinks": [{"port": p, "tags": [list(t) for t in w]} for p, w in lk.uplinks]}))
    for n in mine.nodes:
        ifaces = {i.client_id: {"ip": i.ip, "netmask": i.netmask} for i in n.interfaces}
        out.append(SliverSpec(f"node-{sub.authority}-{n.client_id}", "node", n.client_id, (),
                              tuple(("vlan", lk.vlan_tag) for lk in mine.links), {"interfaces": ifaces}))
    return out


@pytest.fixture
def stitched(tmp_path: Path):
    """Build a mode's aggregates, trunks and the stitched link; yield (drivers, node namespaces, plans)."""
    require_host()
    made: list[NetnsDriver] = []
    trunks: list[str] = []
    shared = OvsSwitch(Path(f"/run/slicex-{new_prefix()}"))

    def build(mode: str) -> dict:
        racks = MODES[mode]
        entries = []
        for name, peers in racks.items():
            (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(substrate(name, peers)))
            entries.append({"substrate": f"{name}.yaml", "url": f"https://{name}.test/am"})
        (tmp_path / "topology.yaml").write_text(yaml.safe_dump({"aggregates": entries}))
        names = list(racks)
        res = compute_path(load_topology(tmp_path / "topology.yaml"),
                           {"slice_urn": urn(names[0], "slice+s"), "request_rspec": request(names[0], names[-1])}, NOW)
        assert res["code"]["geni_code"] == 0, res["output"]
        shared.start()
        drivers = {}
        for name in names:  # each driver joins its bridge to its neighbours' itself (cables from its substrate)
            sub = load_substrate(tmp_path / f"{name}.yaml")
            d = NetnsDriver(new_prefix(), switch_dir=shared.run_dir,
                            cables={e.local_port: e.remote_port for e in sub.external_links})
            made.append(d)
            d.start()
            drivers[name] = d
        trunks.extend(shared_trunk_name(str(shared.run_dir), port(name, peer))
                      for name, peers in racks.items() for peer in peers)
        nodes, links = {}, {}
        for name in names:
            sub = load_substrate(tmp_path / f"{name}.yaml")
            for s in sorted(specs(sub, res["value"]["service_rspec"]), key=lambda s: s.kind):  # links first
                status = drivers[name].create(s, NOW)
                drivers[name].modify(s, status, "geni_start", NOW)
                if s.kind == "node":
                    nodes[s.client_id] = status["netns"]
                else:
                    links[name] = s.details["uplinks"]
        return {"drivers": drivers, "nodes": nodes, "uplinks": links, "service_rspec": res["value"]["service_rspec"]}

    try:
        yield build
    finally:
        for d in made:
            cleanup(d)
        for t in trunks:
            hostnet.del_link(t)
        shared.stop(remove=True)
        if not switch_in_this_namespace():
            hostnet.del_link("ovs-netdev")


def trunk_flows(d: NetnsDriver) -> list[str]:
    return [ln for ln in d.ovs.ofctl("dump-flows", d.bridge).splitlines() if "push_vlan" in ln]


def packets(flows: list[str], needle: str) -> int:
    return sum(int(m.group(1)) for ln in flows if needle in ln for m in [re.search(r"n_packets=(\d+)", ln)] if m)


def capacity_measured(s: dict, mode: str) -> None:
    """iperf3 TCP a -> b across the trunk, shaped at both ends of both aggregates' veths (assert_shaped)."""
    if not have_iperf3():
        return
    mbps = iperf3_mbps(s["nodes"]["b"], "10.77.0.2", s["nodes"]["a"], seconds=3)
    print(f"{mode}: iperf3 TCP {mbps:.2f} Mbit/s on a {CAPACITY_KBPS / 1000:g} Mbit/s link")
    assert_shaped(mbps, CAPACITY_KBPS, link_ends([s["nodes"]["a"], s["nodes"]["b"]]))


def test_direct_path_same_tag_pings_and_measures_the_capacity(stitched):
    s = stitched("direct")
    assert [u["tags"] for u in s["uplinks"]["sa"]] == [[[0x8100, 100]]] == [u["tags"] for u in s["uplinks"]["sb"]]
    ok, rtt = ping(s["nodes"]["a"], "10.77.0.2")
    assert ok, "a cannot reach b across the stitched link"
    print(f"direct: ping RTT {rtt} ms")
    capacity_measured(s, "direct")


def test_translated_path_pings_across_the_translating_transit(stitched):
    s = stitched("translated")
    assert [u["tags"] for u in s["uplinks"]["sb"]] == [[[0x8100, 100]], [[0x8100, 200]]]
    ok, rtt = ping(s["nodes"]["a"], "10.77.0.2")
    assert ok, "a cannot reach b across the translating transit"
    print(f"translated: ping RTT {rtt} ms")
    capacity_measured(s, "translated")


def test_qinq_path_pings_and_the_transit_trunk_carries_8021ad(stitched):
    s = stitched("qinq")
    assert [u["tags"] for u in s["uplinks"]["sa"]] == [[[0x88A8, 3005], [0x8100, 100]]]
    assert [u["tags"] for u in s["uplinks"]["sb"]] == [[[0x88A8, 3005]], [[0x88A8, 3005]]]
    before = packets(trunk_flows(s["drivers"]["sa"]), "push_vlan:0x88a8")
    ok, rtt = ping(s["nodes"]["a"], "10.77.0.2", count=5)
    assert ok, "a cannot reach c's node across the Q-in-Q tunnel:\n" + "\n".join(
        f"{n}: {d.ovs.ofctl('dump-flows', d.bridge)}" for n, d in s["drivers"].items())
    # the userspace datapath adds packets to a flow's counters when its revalidator runs (about every 0.5 s)
    deadline = time.monotonic() + 5
    while True:
        flows, transit = trunk_flows(s["drivers"]["sa"]), trunk_flows(s["drivers"]["sb"])
        counted = packets(flows, "push_vlan:0x88a8") >= before + 5 and packets(transit, "push_vlan:0x88a8") >= 10
        if counted or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    assert any("push_vlan:0x88a8" in ln and "set_field:7101->vlan_vid" in ln for ln in flows), flows
    assert packets(flows, "push_vlan:0x88a8") >= before + 5, flows
    assert packets(transit, "push_vlan:0x88a8") >= 10, transit  # both directions re-tagged as 802.1ad
    print(f"qinq: ping RTT {rtt} ms; sa 802.1ad push packets {before} -> {packets(flows, 'push_vlan:0x88a8')}")
    capacity_measured(s, "qinq")
