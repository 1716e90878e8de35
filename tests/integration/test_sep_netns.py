"""The SEP's data plane on the netns substrate: two `slicex up --substrate netns` testbeds (sa.test and sb.test,
each its own CA, each trusting the other's root for its namespace) share one private Open vSwitch
(slicex.yaml `netns: {switch_dir}`), joined by one cable (VLANs 100-110 each side). Through the exchange point
alone (SDK `span_slice`: Allocate, Provision, geni_start over mutual TLS, speaking for alice), one slice gets a
node at each testbed and the cross-domain link between them, stitched on the tag the SEP negotiated from the
two advertisements; the node at A pings the node at B across it, and iperf3 measures the link's 10 Mbit/s.
Delete through the SEP removes both nodes' namespaces. Takes the host-network lock (tests/conftest.py)."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from lxml import etree

from authority.substrate import hostnet
from authority.substrate.netns_plan import netns_name, shared_trunk_name
from federation.sep.config import load_config
from federation.sep.sdk import span_slice
from federation.sep.server import SepServer
from slicex.tls_xmlrpc import client
from tests.integration.netns_support import (
    assert_shaped,
    have_iperf3,
    iperf3_mbps,
    link_ends,
    new_prefix,
    ping,
    require_host,
)
from tests.integration.stitching_support import CAPACITY_KBPS, MODES, Up, make_homes, port, request, urn
from tests.integration.test_stitching_netns_am import remove_everything

RSPEC3 = "{http://www.geni.net/resources/rspec/3}"


@pytest.fixture
def testbeds(tmp_path: Path):
    require_host()
    racks = MODES["direct"]
    switch_dir = Path(f"/run/slicex-s{uuid.uuid4().hex[:6]}")
    prefixes = {name: new_prefix() for name in racks}
    homes = make_homes(tmp_path, racks, substrate_driver="netns",
                       netns=lambda name: {"prefix": prefixes[name], "switch_dir": str(switch_dir)})
    ups = {name: Up(home) for name, home in homes.items()}
    sep = None
    try:
        procs = {name: up.start() for name, up in ups.items()}  # one after another: the first starts the switch
        sep_yaml = tmp_path / "sep" / "sep.yaml"
        init = subprocess.run([sys.executable, "-m", "cli", "--home", str(homes["sa"].root), "sep", "init",
                               "--config", str(sep_yaml), "--port", "0",
                               *(a for n in racks for a in ("--aggregate", f"{urn(n)}={procs[n]['am_url']}"))],
                              capture_output=True, text=True, timeout=60)
        assert init.returncode == 0, init.stderr
        sep = SepServer(load_config(sep_yaml))
        sep.start()
        alice = homes["sa"]
        cert, key = str(alice.user_cert("alice")), str(alice.user_key("alice"))
        yield {"sep": sep, "prefixes": prefixes, "cert": cert, "key": key,
               "sa": client(procs["sa"]["sa_url"], cert, key)}
    finally:
        if sep is not None:
            sep.stop()
        for name, up in ups.items():
            up.stop()
            subprocess.run([sys.executable, "-m", "cli", "--home", str(homes[name].root), "down"], capture_output=True,
                           timeout=60)
        remove_everything(prefixes.values(), switch_dir, [shared_trunk_name(str(switch_dir), port(name, peer))
                                                          for name, peers in racks.items() for peer in peers])


def test_a_slice_across_two_netns_testbeds_through_the_sep_carries_ping_over_the_joining_link(testbeds):
    s = urn("sa", "slice+sepnet")
    slice_cred = testbeds["sa"].CreateSlice(s)
    got = span_slice(testbeds["sep"].url, testbeds["cert"], testbeds["key"], s, slice_cred, request("sa", "sb"))
    creds = got["credentials"]
    sep = client(testbeds["sep"].url, testbeds["cert"], testbeds["key"])
    deadline = time.monotonic() + 30
    while True:
        states = {x["geni_sliver_urn"]: x["geni_operational_status"]
                  for x in sep.Status([s], creds, {})["value"]["geni_slivers"]}
        if set(states.values()) == {"geni_ready"} or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    assert set(states.values()) == {"geni_ready"}, states
    assert {u.split("+")[1] for u in states} == {"sa.test", "sb.test"}
    desc = sep.Describe([s], creds, {"geni_rspec_version": {"type": "GENI", "version": "3"}})["value"]["geni_rspec"]
    nodes = {n.get("client_id"): n.get("sliver_id") for n in etree.fromstring(desc.encode()).iter(f"{RSPEC3}node")}
    ns = {"a": netns_name(testbeds["prefixes"]["sa"], nodes["a"]), "b": netns_name(testbeds["prefixes"]["sb"], nodes["b"])}
    assert all(n in hostnet.namespaces() for n in ns.values()), ns
    ok, rtt = ping(ns["a"], "10.77.0.2", count=5)
    assert ok, "the node at testbed A cannot reach the node at testbed B across the SEP's joining link"
    print(f"SEP netns: ping a@sa.test -> b@sb.test RTT {rtt} ms")
    if have_iperf3():
        mbps = iperf3_mbps(ns["b"], "10.77.0.2", ns["a"], seconds=3)
        print(f"SEP netns: iperf3 TCP {mbps:.2f} Mbit/s on a {CAPACITY_KBPS / 1000:g} Mbit/s link")
        assert_shaped(mbps, CAPACITY_KBPS, link_ends([ns["a"], ns["b"]]))
    gone = sep.Delete([s], creds, {})
    assert gone["code"]["geni_code"] == 0, gone["output"]
    deadline = time.monotonic() + 15
    while any(n in hostnet.namespaces() for n in ns.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(n in hostnet.namespaces() for n in ns.values())
