"""One aggregate over two racks on the netns substrate (`slicex up --substrate netns` over mutual TLS, as omni
drives it), with the operator guide's two-rack example as its substrate: the racks share no VLAN range, so
a link between them is translated at tor-a's trunk port. Each rack is a bridge of its own, the trunk a veth
pair between them carrying the link under the negotiated tag: a bound 2-node slice gets one node per rack,
the manifest shows each interface's tag and the trunk hop, and the nodes ping across the trunk. An unbound
request is placed where there is room."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from lxml import etree

from authority.substrate import hostnet
from authority.substrate.netns import NetnsDriver
from authority.substrate.netns_plan import RackLayout, trunk_name
from rspec.manifest import RACKS_EXT
from rspec.substrate import load_substrate, urn_name
from tests.factories import RSPEC3, request_rspec, vm
from tests.integration.conftest import AUTHORITY, make_home
from tests.integration.netns_support import cleanup, new_prefix, ping, require_host
from tests.integration.test_netns_am import Up, namespaces_of, ok, slice_of

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "two-rack-site.yaml"


def two_racks(tmp_path: Path) -> Path:
    """The guide's example under this home's authority."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["authority"] = AUTHORITY
    path = tmp_path / "two-rack-site.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def racks_behind_a_transit_switch(tmp_path: Path) -> Path:
    """Racks sharing 1000-1099, joined through an aggregation switch that carries only 3000-3099: the link
    crosses it under an S-tag (Q-in-Q pushed and popped at the racks' uplinks)."""
    doc = {"authority": AUTHORITY,
           "switches": [{"name": "tor-a", "vlan_range": ["1000-1099"], "ports": [{"name": "h"}, {"name": "up"}]},
                        {"name": "core", "vlan_range": ["3000-3099"], "ports": [{"name": "a"}, {"name": "b"}]},
                        {"name": "tor-b", "vlan_range": ["1000-1099"], "ports": [{"name": "h"}, {"name": "up"}]}],
           "trunks": [{"name": "a-core", "between": ["tor-a:up", "core:a"], "qinq": ["tor-a:up"],
                       "s_vlan_range": ["3000-3099"]},
                      {"name": "core-b", "between": ["core:b", "tor-b:up"], "qinq": ["tor-b:up"],
                       "s_vlan_range": ["3000-3099"]}],
           "hosts": [{"name": f"host-{r}", "cores": 4, "memory_mb": 8192,
                      "interfaces": [{"name": "eth1", "switch_port": f"tor-{r}:h"}]} for r in ("a", "b")],
           "vm_sizes": [{"name": "small", "cores": 1, "memory_mb": 1024, "disk_gb": 10}]}
    path = tmp_path / "transit.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def pair(sub, a_host: str | None, b_host: str | None) -> str:
    def bound(h: str | None) -> dict:
        return {"component_id": sub.host(h).component_id} if h else {}
    return request_rspec([vm("a", sliver_type="small", ifaces=["a:0"], **bound(a_host)),
                          vm("b", sliver_type="small", ifaces=["b:0"], **bound(b_host))],
                         [{"client_id": "l", "ifaces": ["a:0", "b:0"]}])


def address(ns: str) -> str:
    out = hostnet.exec_in(ns, ["ip", "-4", "-o", "addr", "show"]).stdout
    found = [a for a in re.findall(r"inet (\S+)/", out) if not a.startswith("127.")]
    assert found, out
    return found[0]


@contextmanager
def racks_am(tmp_path: Path, substrate: Path, prefix: str | None = None,
             switch_hosts: dict[str, str] | None = None) -> Iterator[tuple[Any, str, str, Any]]:
    """`slicex up --substrate netns` of a new home over the racks site at `substrate` (a switch that
    `switch_hosts` names runs in that namespace, the others on this host): the home, its AM's URL, the netns
    prefix and the loaded site. On leaving, the aggregate stopped and everything with the prefix removed."""
    require_host()
    sub = load_substrate(substrate)
    prefix = prefix or new_prefix()
    netns = {"prefix": prefix, **({"switch_hosts": switch_hosts} if switch_hosts else {})}
    home = make_home(tmp_path / "home", substrate_driver="netns", netns=netns, substrate=str(substrate), sa_port=0,
                     am_port=0)
    up = Up(home)
    try:
        yield home, up.start(), prefix, sub
    finally:
        up.stop()
        cleanup(NetnsDriver(prefix, layout=RackLayout.of(sub, switch_hosts)))


def test_a_bound_pair_lands_one_node_per_rack_and_pings_across_the_translating_trunk(tmp_path):
    with racks_am(tmp_path, two_racks(tmp_path)) as (home, am_url, prefix, sub):
        am, urn, cred = slice_of(home, am_url, "alice", "racks")
        ok(am.Allocate(urn, cred, pair(sub, "host-a1", "host-b1"), {}))
        manifest = ok(am.Provision([urn], cred, {"geni_users": []}))["geni_rspec"]
        root = etree.fromstring(manifest.encode())
        hosts = {n.get("client_id"): urn_name(n.get("component_id")) for n in root.iter(f"{{{RSPEC3}}}node")}
        assert hosts == {"a": "host-a1", "b": "host-b1"}
        path = root.find(f".//{{{RSPEC3}}}link/{{{RACKS_EXT}}}path")
        assert path is not None and path.get("kind") == "translated", manifest
        tags = {i.get("client_id"): int(i.get("vlan_tag")) for i in path.iter(f"{{{RACKS_EXT}}}interface")}
        assert 1000 <= tags["a:0"] <= 1499 and 1500 <= tags["b:0"] <= 1999
        trunk = [h for h in path.iter(f"{{{RACKS_EXT}}}hop") if h.get("trunk")]
        assert [urn_name(h.get("port")) for h in trunk] == ["tor-a:trunk-b", "tor-b:trunk-a"]
        assert trunk[0].get("translation") == "true" and trunk[0].get("tags") == trunk[1].get("tags")
        ok(am.PerformOperationalAction([urn], cred, "geni_start", {}))
        status = ok(am.Status([urn], cred, {}))
        assert {s["geni_operational_status"] for s in status["geni_slivers"]} == {"geni_ready"}, status
        ns = namespaces_of(manifest, prefix)
        reached, _rtt = ping(ns["a"], address(ns["b"]))
        assert reached, "a (rack A) did not reach b (rack B) over the trunk"
        # the frames cross the trunk: each rack is a bridge of its own, and with the trunk's veth down the
        # nodes no longer reach each other
        driver = NetnsDriver(prefix, layout=RackLayout.of(sub))
        port_a, port_b = sub.trunks[0].port_a, sub.trunks[0].port_b
        assert set(driver.ovs.ports(f"{prefix}-br")) >= {trunk_name(prefix, port_a)}
        assert set(driver.ovs.ports(f"{prefix}-br1")) >= {trunk_name(prefix, port_b)}
        wire = int(trunk[0].get("tags").split(":")[1])
        assert f"dl_vlan={wire}" in driver.ovs.ofctl("dump-flows", f"{prefix}-br1")  # tor-b: the wire tag is its own
        hostnet.run(["ip", "link", "set", trunk_name(prefix, port_a), "down"])
        assert not ping(ns["a"], address(ns["b"]), count=2)[0], "reached rack B with the trunk down"
        hostnet.run(["ip", "link", "set", trunk_name(prefix, port_a), "up"])
        assert hostnet.wait_carrier(None, trunk_name(prefix, port_a))
        assert ping(ns["a"], address(ns["b"]))[0]
        ok(am.Delete([urn], cred, {}))

        # rack A full (8 large VMs over its two 32-core hosts): an unbound pair goes to rack B
        _, full, full_cred = slice_of(home, am_url, "alice", "full")
        filler = request_rspec([vm(f"f{i}", sliver_type="large", component_id=sub.host(h).component_id)
                                for i, h in enumerate(["host-a1"] * 4 + ["host-a2"] * 4)])
        ok(am.Allocate(full, full_cred, filler, {}))
        _, free, free_cred = slice_of(home, am_url, "alice", "free")
        got = ok(am.Allocate(free, free_cred, pair(sub, None, None), {}))
        placed = etree.fromstring(got["geni_rspec"].encode())
        where = {urn_name(n.get("component_id")) for n in placed.iter(f"{{{RSPEC3}}}node")}
        assert where <= {"host-b1", "host-b2"}, where
        ok(am.Delete([full], full_cred, {}))
        ok(am.Delete([free], free_cred, {}))


def test_racks_behind_a_transit_switch_that_cannot_carry_their_tags_ping_over_qinq(tmp_path):
    with racks_am(tmp_path, racks_behind_a_transit_switch(tmp_path)) as (home, am_url, prefix, sub):
        am, urn, cred = slice_of(home, am_url, "alice", "qinq")
        ok(am.Allocate(urn, cred, pair(sub, "host-a", "host-b"), {}))
        manifest = ok(am.Provision([urn], cred, {"geni_users": []}))["geni_rspec"]
        path = etree.fromstring(manifest.encode()).find(f".//{{{RSPEC3}}}link/{{{RACKS_EXT}}}path")
        assert path is not None and path.get("kind") == "qinq", manifest
        hops = {urn_name(h.get("port")): h for h in path.iter(f"{{{RACKS_EXT}}}hop")}
        assert hops["tor-a:up"].get("qinq") == "push" and hops["tor-b:up"].get("qinq") == "pop"
        assert hops["tor-a:up"].get("tags") == "0x88a8:3000 0x8100:1000"
        assert hops["core:a"].get("tags") == "0x88a8:3000"  # the transit sees only the S-tag
        ok(am.PerformOperationalAction([urn], cred, "geni_start", {}))
        ns = namespaces_of(manifest, prefix)
        assert ping(ns["a"], address(ns["b"]))[0], "a did not reach b through the transit switch"
        driver = NetnsDriver(prefix, layout=RackLayout.of(sub))
        assert "push_vlan:0x88a8" in driver.ovs.ofctl("dump-flows", f"{prefix}-br")  # tor-a pushes the S-tag
        ok(am.Delete([urn], cred, {}))
