"""Racks on separate hosts (ExoGENI's ExoSM case, issue 25): the operator guide's two-rack example with rack
A's switch on one lab host and rack B's on another (docs/lab.md: each lab host a network namespace with its
own userspace Open vSwitch), the trunk a layer-2 cable between the hosts. The racks share no VLAN range; the
link is translated at tor-a's trunk port as on one host, and the nodes ping across the cable (and not with
it down). Driven at the netns driver, as the authority drives it.

Needs the lab (branch i-lab's `lab/` package) besides what the netns substrate needs."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from authority.substrate import hostnet
from authority.substrate.netns import NetnsDriver
from authority.substrate.netns_plan import RackLayout, trunk_name
from broker.placement import plan
from protocol.messages import SliverSpec
from rspec.request import parse_request
from rspec.substrate import load_substrate
from tests.factories import request_rspec, vm
from tests.integration.netns_support import cleanup, new_prefix, ping, require_host

lab = pytest.importorskip("lab", reason="the multi-host lab (lab/, docs/lab.md) is not in this tree")

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "two-rack-site.yaml"
# /16s outside the 10.200-10.239 that lab names choose from: the labs of tests/conftest.py's lab chain, running
# beside this file, route theirs (by its name, "rka" would take "tl"'s)
NETWORKS = {"rk": "10.240.0.0/16", "rka": "10.241.0.0/16"}
NOW = datetime.now(UTC)


def specs(sub) -> tuple[SliverSpec, list[SliverSpec]]:
    """The slivers of a 2-node slice bound one per rack, as the slice manager hands them to the driver."""
    req = parse_request(request_rspec(
        [vm("a", sliver_type="small", component_id=sub.host("host-a1").component_id, ifaces=["a:0"]),
         vm("b", sliver_type="small", component_id=sub.host("host-b1").component_id, ifaces=["b:0"])],
        [{"client_id": "l", "ifaces": ["a:0", "b:0"]}]))
    placed = {p.client_id: p for p in plan(sub, req, set())}
    link = placed["l"]
    labels = tuple(("vlan", t) for t in link.labels.values())
    details: dict[str, Any] = {**link.details, "slice_urn": "urn:publicid:IDN+example.edu+slice+lab"}
    link_spec = SliverSpec("urn:lab:l", "link", "l", link.keys, labels, details)
    nodes = [SliverSpec(f"urn:lab:{c}", "node", c, placed[c].keys, labels,
                        {**placed[c].details, "disk_image": "", "slice_urn": details["slice_urn"]})
             for c in ("a", "b")]  # the host's default node image
    return link_spec, nodes


def require_lab() -> None:
    """Skip, saying what is missing, where this machine cannot run the netns substrate or the lab."""
    require_host()
    missing = lab.edge.missing_capabilities()
    if missing:
        pytest.skip("the lab needs: " + "; ".join(missing))


def test_racks_on_two_lab_hosts_ping_across_the_cable_between_their_switches():
    require_lab()
    sub = load_substrate(EXAMPLE)
    trunk = sub.trunks[0]
    prefix = new_prefix()
    with lab.running(lab.line("rk", hosts=2, network=NETWORKS["rk"])) as lb:
        h1, h2 = lb.hosts["h1"], lb.hosts["h2"]
        lb.cable("h1", trunk_name(prefix, trunk.port_a), "h2", trunk_name(prefix, trunk.port_b))
        layout = RackLayout.of(sub, {"tor-a": h1.namespace, "tor-b": h2.namespace})
        d = NetnsDriver(prefix, controller="ovs-ofctl", layout=layout)
        try:
            d.start()
            link, nodes = specs(sub)
            status = {link.id: d.create(link, NOW)}
            for s in nodes:
                status[s.id] = d.create(s, NOW)
            for s in [link, *nodes]:
                status[s.id] = d.modify(s, status[s.id], "geni_start", NOW)
            assert all(d.status(s, status[s.id], NOW) == ("geni_ready", "") for s in [link, *nodes])
            ns = {s.client_id: status[s.id]["netns"] for s in nodes}
            addr = {s.client_id: status[s.id]["interfaces"][f"{s.client_id}:0"]["address"].split("/")[0]
                    for s in nodes}
            # each rack's switch runs on its own lab host, and each node's port is on its rack's host
            for host, bridge in ((h1, f"{prefix}-br"), (h2, f"{prefix}-br1")):
                sw = d.remote[bridge]
                assert sw.netns == host.namespace
                pid = int((sw.run_dir / "ovs-vswitchd.pid").read_text())
                assert Path(f"/proc/{pid}/ns/net").stat().st_ino == Path(f"/run/netns/{host.namespace}").stat().st_ino
                host_if = next(p for p, b in d.port_bridge.items() if b == bridge)
                assert host_if in hostnet.links(host.namespace) and host_if not in hostnet.links()
            assert ping(ns["a"], addr["b"])[0], "rack A's node did not reach rack B's over the cable"
            hostnet.set_up(h1.namespace, trunk_name(prefix, trunk.port_a), False)
            assert not ping(ns["a"], addr["b"], count=2)[0], "reached rack B with the cable down"
            hostnet.set_up(h1.namespace, trunk_name(prefix, trunk.port_a), True)
            assert hostnet.wait_carrier(h1.namespace, trunk_name(prefix, trunk.port_a))
            assert ping(ns["a"], addr["b"])[0]
            for s in [*nodes, link]:
                d.destroy(s, status[s.id], NOW)
        finally:
            cleanup(d)
        assert not d.leftovers()


def test_through_the_am_api_a_bound_pair_on_racks_on_two_lab_hosts_pings_across_the_cable(tmp_path):
    """The same through `slicex up --substrate netns` (slicex.yaml `netns: {switch_hosts: ...}`) over the AM
    API, as omni drives it: issue 25's "a 2-node slice at the two-rack example aggregate (racks on two lab
    hosts, no shared tag range) gets one node per rack when the request binds them and pings across the
    trunk"."""
    from tests.integration.test_netns_am import namespaces_of, ok, slice_of
    from tests.integration.test_racks_netns import address, pair, racks_am, two_racks

    require_lab()
    substrate = two_racks(tmp_path)
    trunk = load_substrate(substrate).trunks[0]
    prefix = new_prefix()
    with lab.running(lab.line("rka", hosts=2, network=NETWORKS["rka"])) as lb:
        h1, h2 = lb.hosts["h1"], lb.hosts["h2"]
        lb.cable("h1", trunk_name(prefix, trunk.port_a), "h2", trunk_name(prefix, trunk.port_b))
        hosts = {"tor-a": h1.namespace, "tor-b": h2.namespace}
        with racks_am(tmp_path, substrate, prefix, hosts) as (home, am_url, _prefix, sub):
            am, urn, cred = slice_of(home, am_url, "alice", "labracks")
            ok(am.Allocate(urn, cred, pair(sub, "host-a1", "host-b1"), {}))
            manifest = ok(am.Provision([urn], cred, {"geni_users": []}))["geni_rspec"]
            ok(am.PerformOperationalAction([urn], cred, "geni_start", {}))
            status = ok(am.Status([urn], cred, {}))
            assert {s["geni_operational_status"] for s in status["geni_slivers"]} == {"geni_ready"}, status
            ns = namespaces_of(manifest, prefix)
            d = NetnsDriver(prefix, layout=RackLayout.of(sub, hosts))
            for host, bridge in ((h1, f"{prefix}-br"), (h2, f"{prefix}-br1")):  # each rack's ports on its host
                assert {p for p in d.remote[bridge].ports(bridge) if not p.endswith("t")} <= set(
                    hostnet.links(host.namespace))
            assert ping(ns["a"], address(ns["b"]))[0], "rack A's node did not reach rack B's over the cable"
            ok(am.Delete([urn], cred, {}))
        assert not NetnsDriver(prefix, layout=RackLayout.of(sub, hosts)).leftovers()
