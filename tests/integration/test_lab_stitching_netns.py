"""Stitched VLAN links across lab hosts (lab/, docs/lab.md): each aggregate a `slicex up --substrate netns` on
its own lab host, with its own private userspace Open vSwitch in that host's namespace (no shared switch_dir),
the cables between aggregates layer-2 circuits between the hosts (lab.cable) named as each driver expects its
trunk. slicex's SDK (stitching/client.py) allocates, provisions and starts a link over the operator's side
(the AMs on their hosts' addresses); the end nodes ping across it — direct, across a translating transit on a
third host, and through a Q-in-Q tunnel across that transit (the edge's 802.1ad push rule counts the pings) —
and iperf3 measures the link's capacity within 5 %. Each aggregate's ovs-vswitchd runs in its own host's
namespace (checked): one userspace switch per lab host.

Needs what the lab and the netns substrate need; skipped, saying which, only where the machine lacks it.
Takes the lab chain's host-wide lock (tests/conftest.py)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from lxml import etree

from authority.substrate import hostnet
from authority.substrate.netns_plan import netns_name
from authority.substrate.ovs import OvsSwitch
from lab import edge
from stitching.client import StitchClient
from tests.integration.netns_support import have_iperf3, iperf3_mbps, ping, require_host
from tests.integration.stitching_support import (
    CAPACITY_KBPS,
    lab_aggregates,
    request,
    slice_credential,
    wait_until_ready,
)

# switches, servers and routers only inside lab hosts: tests/conftest.py's lab chain, beside the root namespace's
USES_HOST_NETWORK = "lab"

RSPEC3 = "{http://www.geni.net/resources/rspec/3}"


@pytest.fixture(params=["direct", "translated", "qinq"])
def racks(request, tmp_path: Path):
    require_host()
    missing = edge.missing_capabilities()
    if missing:
        pytest.skip("the lab needs: " + "; ".join(missing))
    with lab_aggregates(tmp_path, request.param) as racks:
        yield racks


def pushed(switch: OvsSwitch, bridge: str) -> int:
    """Packets the bridge's 802.1ad push rules have counted."""
    flows = [ln for ln in switch.ofctl("dump-flows", bridge).splitlines() if "push_vlan:0x88a8" in ln]
    return sum(int(m.group(1)) for ln in flows for m in [re.search(r"n_packets=(\d+)", ln)] if m)


def test_a_stitched_link_across_lab_hosts_carries_ping_and_its_capacity(racks):
    ends = (racks["names"][0], racks["names"][-1])
    assert all(racks["host"][n].address in racks["procs"][n]["am_url"] for n in ends)
    sdk = StitchClient(racks["ams"], racks["topology"])
    s, creds = slice_credential(racks["sa"], "sa.test", "labst" + racks["mode"])
    got = sdk.allocate(s, creds, request(*ends))
    assert got.links["st0"].mode == racks["mode"]
    manifests = sdk.provision(s, creds, got)
    sdk.start(s, creds, got)
    states = wait_until_ready(racks["ams"], s, creds)
    assert all(v == {"geni_ready"} for v in states.values()), states
    ns = {}
    for name in ends:
        node = etree.fromstring(manifests[racks["procs"][name]["am_url"]].encode()).find(f"{RSPEC3}node")
        ns[name] = netns_name(racks["prefixes"][name], node.get("sliver_id"))
    first = ends[0]
    switch = OvsSwitch(Path(f"/run/slicex-{racks['prefixes'][first]}"))
    pid = int((switch.run_dir / "ovs-vswitchd.pid").read_text())  # each aggregate's own switch, in its host
    assert os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(f"/run/netns/{racks['host'][first].namespace}").st_ino
    bridge = f"{racks['prefixes'][first]}-br"
    before = pushed(switch, bridge)
    ok, rtt = ping(ns[first], "10.77.0.2", count=5)
    assert ok, f"{racks['mode']}: a cannot reach b across the hosts"
    if racks["mode"] == "qinq":  # the edge pushed an 802.1ad S-tag on what crossed the cable
        deadline = time.monotonic() + 5  # the userspace datapath counts when its revalidator runs (~0.5 s)
        while pushed(switch, bridge) < before + 5 and time.monotonic() < deadline:
            time.sleep(0.25)
        assert pushed(switch, bridge) >= before + 5
    print(f"{racks['mode']} across lab hosts: ping RTT {rtt} ms, tags {[h.tag for h in got.links['st0'].hops]}")
    if have_iperf3():
        mbps = iperf3_mbps(ns[ends[1]], "10.77.0.2", ns[ends[0]], seconds=3)
        print(f"{racks['mode']} across lab hosts: iperf3 TCP {mbps:.2f} Mbit/s on a 10 Mbit/s link")
        assert abs(mbps - CAPACITY_KBPS / 1000) <= 0.05 * CAPACITY_KBPS / 1000, mbps
    assert sdk.release(s, creds, list(got.manifests)) == []
    for name in ends:
        assert ns[name] not in hostnet.namespaces()
