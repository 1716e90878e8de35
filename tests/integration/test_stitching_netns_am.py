"""Stitched links through the AM API of three `slicex up --substrate netns` aggregates on one host, sharing one
Open vSwitch (slicex.yaml `netns: {switch_dir}`): slicex's SDK (stitching/client.py) allocates, provisions
and starts a link whose ends share no VLAN at each aggregate over mutual TLS; each aggregate's driver joins
its bridge to its neighbours' with a veth pair named from the cable's ports; the nodes at the two ends ping
each other across a translating transit and across a Q-in-Q tunnel, whose trunk carries 802.1ad frames (the
edge's push_vlan:0x88a8 rule counts the pings), and iperf3 measures the link's capacity within 5 %. Takes the host-network lock (tests/conftest.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from lxml import etree

from authority.substrate import hostnet
from authority.substrate.login import kill_netns_processes
from authority.substrate.netns_plan import netns_name, shared_trunk_name
from authority.substrate.ovs import OvsSwitch
from slicex.tls_xmlrpc import client
from stitching.client import StitchClient
from stitching.topology import load_topology
from tests.integration.netns_support import (
    assert_shaped,
    have_iperf3,
    iperf3_mbps,
    link_ends,
    new_prefix,
    ping,
    require_host,
    switch_in_this_namespace,
)
from tests.integration.stitching_support import (
    CAPACITY_KBPS,
    MODES,
    Up,
    make_homes,
    port,
    request,
    slice_credential,
    wait_until_ready,
)

RSPEC3 = "{http://www.geni.net/resources/rspec/3}"


@pytest.fixture(params=["translated", "qinq"])
def racks(request, tmp_path: Path):
    require_host()
    mode = request.param
    switch_dir = Path(f"/run/slicex-s{uuid.uuid4().hex[:6]}")
    prefixes = {name: new_prefix() for name in MODES[mode]}
    homes = make_homes(tmp_path, MODES[mode], substrate_driver="netns",
                       netns=lambda name: {"prefix": prefixes[name], "switch_dir": str(switch_dir)})
    ups = {name: Up(home) for name, home in homes.items()}
    try:
        procs = {name: up.start() for name, up in ups.items()}  # one after another: the first starts the switch
        (tmp_path / "topology.yaml").write_text(yaml.safe_dump({"aggregates": [
            {"substrate": f"{name}.yaml", "url": procs[name]["am_url"]} for name in homes]}))
        alice = homes["sa"]
        cert, key = str(alice.user_cert("alice")), str(alice.user_key("alice"))
        yield {"mode": mode, "procs": procs, "prefixes": prefixes, "switch": OvsSwitch(switch_dir),
               "ams": {p["am_url"]: client(p["am_url"], cert, key) for p in procs.values()},
               "topology": load_topology(tmp_path / "topology.yaml"), "sa": client(procs["sa"]["sa_url"], cert, key)}
    finally:
        for name, up in ups.items():
            up.stop()
            subprocess.run([sys.executable, "-m", "cli", "--home", str(homes[name].root), "down"], capture_output=True,
                           timeout=60)
        remove_everything(prefixes.values(), switch_dir, [shared_trunk_name(str(switch_dir), port(name, peer))
                                                          for name, peers in MODES[mode].items() for peer in peers])


def remove_everything(prefixes, switch_dir: Path, trunks: list[str], switch_here: bool = True) -> None:
    """Whatever the test left on the host, even when a step failed half-way: node namespaces (and their
    processes), veths and bridge taps with the test's prefixes, the trunks, the shared switch, run dirs.
    `switch_here`: the test ran a switch in this namespace, whose datapath tap may be left; not for a test
    whose switches ran in lab hosts (this namespace's tap belongs to the root chain's tests running beside)."""
    for prefix in prefixes:
        for ns in hostnet.namespaces():
            if ns.startswith(prefix + "-"):
                kill_netns_processes(ns)
                hostnet.del_namespace(ns)
        for name in hostnet.links():
            if name.startswith(prefix):
                hostnet.del_link(name)
        for d in (Path(f"/run/slicex-{prefix}"), Path(f"/run/slicex-{prefix}-nodes")):
            shutil.rmtree(d, ignore_errors=True)
    for t in trunks:
        hostnet.del_link(t)
    OvsSwitch(switch_dir).stop(remove=True)
    if switch_here and not switch_in_this_namespace():
        hostnet.del_link("ovs-netdev")


def push_packets(switch: OvsSwitch, bridge: str) -> tuple[int, list[str]]:
    flows = [ln for ln in switch.ofctl("dump-flows", bridge).splitlines() if "push_vlan:0x88a8" in ln]
    return sum(int(m.group(1)) for ln in flows for m in [re.search(r"n_packets=(\d+)", ln)] if m), flows


def test_stitched_link_through_the_am_api_of_three_netns_aggregates_carries_ping(racks):
    sdk = StitchClient(racks["ams"], racks["topology"])
    s, creds = slice_credential(racks["sa"], "sa.test", "nsst" + racks["mode"])
    got = sdk.allocate(s, creds, request("sa", "sc"))
    assert got.links["st0"].mode == racks["mode"]
    manifests = sdk.provision(s, creds, got)
    sdk.start(s, creds, got)
    url = {name: p["am_url"] for name, p in racks["procs"].items()}
    states = wait_until_ready(racks["ams"], s, creds)
    assert all(v == {"geni_ready"} for v in states.values()), states
    ns = {}
    for name in ("sa", "sc"):
        node = etree.fromstring(manifests[url[name]].encode()).find(f"{RSPEC3}node")
        ns[name] = netns_name(racks["prefixes"][name], node.get("sliver_id"))
    bridge = f"{racks['prefixes']['sa']}-br"
    before = push_packets(racks["switch"], bridge)[0] if racks["mode"] == "qinq" else 0
    ok, rtt = ping(ns["sa"], "10.77.0.2", count=5)
    assert ok, f"{racks['mode']}: a cannot reach b across the stitched link"
    print(f"{racks['mode']} through the AM API: ping RTT {rtt} ms, tags {[h.tag for h in got.links['st0'].hops]}")
    if racks["mode"] == "qinq":
        # the userspace datapath adds packets to a flow's counters when its revalidator runs (about every 0.5 s)
        deadline = time.monotonic() + 5
        while push_packets(racks["switch"], bridge)[0] < before + 5 and time.monotonic() < deadline:
            time.sleep(0.25)
        after, flows = push_packets(racks["switch"], bridge)
        assert any("set_field:7101->vlan_vid" in ln for ln in flows), flows  # S-tag 3005 (0x1000 | 3005)
        assert after >= before + 5, flows
        print(f"qinq: sa's 802.1ad push rule {before} -> {after} packets")
    if have_iperf3():  # the link's capacity end to end: shaped at both ends at both aggregates
        mbps = iperf3_mbps(ns["sc"], "10.77.0.2", ns["sa"], seconds=3)
        print(f"{racks['mode']} through the AM API: iperf3 TCP {mbps:.2f} Mbit/s on a 10 Mbit/s link")
        assert_shaped(mbps, CAPACITY_KBPS, link_ends([ns["sa"], ns["sc"]]))
    assert sdk.release(s, creds, list(got.manifests)) == []
    for name in ("sa", "sc"):
        assert ns[name] not in hostnet.namespaces()
