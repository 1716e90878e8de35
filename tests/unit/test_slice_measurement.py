"""Per-slice measurement, the pure parts: the mirror request extension is checked (its capture interface is
the request's own and on no link), the switch's statistics are read, and a slice's counters are summed per
link from its nodes' ports."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from am.measurement import slice_measurement
from authority.substrate.ovs import parse_statistics
from broker.placement import plan
from protocol.messages import Demands, demands_of
from rspec.namespaces import MEASURE
from rspec.request import parse_request
from rspec.substrate import default_substrate
from slicex.codec import decode, encode
from slicex.errors import BadArgs
from tests.factories import request_rspec, vm


def mirrored(to: str, twice: bool = False, links: int = 1) -> str:
    mirror = f'<measure:mirror xmlns:measure="{MEASURE}" to="{to}"/>'
    nodes = [vm("a", ifaces=["a:if0", "a:if1"]), vm("b", ifaces=["b:if0", "b:if1"]), vm("cap", ifaces=["cap:if0"])]
    lks = [{"client_id": f"l{k}", "ifaces": [f"a:if{k}", f"b:if{k}"]} for k in range(links)]
    return request_rspec(nodes, lks).replace("</link>", mirror * (2 if twice else 1) + "</link>")


def test_a_mirror_names_the_capture_interface_and_travels_to_the_driver():
    req = parse_request(mirrored("cap:if0"))
    assert req.links[0].mirror_to == "cap:if0"
    again = decode(encode(demands_of(req, {"a": "1", "b": "2", "cap": "3", "l0": "4"})), Demands, "demands").request
    assert again.links[0].mirror_to == "cap:if0"
    link = next(p for p in plan(default_substrate(), req, set()) if p.kind == "link")
    assert link.details["mirror_to"] == "cap:if0"


@pytest.mark.parametrize("to, twice, links, why", [
    ("nowhere", False, 1, "which no node of the request declares"),
    ("b:if0", False, 1, "which is on a link"),
    ("cap:if0", True, 1, "one measure:mirror per link"),
    ("cap:if0", False, 2, "both mirror to"),
])
def test_a_mirror_to_an_interface_not_free_for_capture_is_badargs(to, twice, links, why):
    text = mirrored(to, twice, links)  # with two links, each mirrors to `to`
    with pytest.raises(BadArgs, match=why):
        parse_request(text)


def test_a_mirror_without_its_target_is_not_valid():
    with pytest.raises(BadArgs, match="not valid"):
        parse_request(mirrored("cap:if0").replace(' to="cap:if0"', ""))


def test_the_switchs_statistics_are_read_as_numbers():
    text = '{collisions=0, rx_bytes=1180, rx_crc_err=0, rx_dropped=0, rx_packets=14, tx_bytes=2212, tx_packets=22}'
    assert parse_statistics(text) == {"collisions": 0, "rx_bytes": 1180, "rx_crc_err": 0, "rx_dropped": 0,
                                      "rx_packets": 14, "tx_bytes": 2212, "tx_packets": 22}
    assert parse_statistics("{}") == {}


@dataclass
class Sliver:
    client_id: str
    kind: str
    details: dict[str, Any] = field(default_factory=dict)


def test_a_links_counters_are_its_endpoints_ports_and_a_nodes_its_machines():
    counters = {"a:if0": {"rx_packets": 5, "tx_packets": 4, "rx_bytes": 490, "tx_bytes": 392}}
    slivers = [Sliver("a", "node", {"container": {"cpu_ns": 7, "memory_bytes": 9, "cores": 1}, "counters": counters}),
               Sliver("b", "node", {"counters": {"b:if0": {"rx_packets": 4, "tx_packets": 5}}}),
               Sliver("l0", "link", {"interface_refs": ["a:if0", "b:if0"]}),
               Sliver("l1", "link", {"interface_refs": ["x:if0"]})]
    out = slice_measurement(slivers)
    assert out["nodes"]["a"] == {"cpu_ns": 7, "memory_bytes": 9, "interfaces": counters}
    assert out["links"]["l0"]["rx_packets"] == 9 and out["links"]["l0"]["tx_bytes"] == 392
    assert set(out["links"]["l0"]["interfaces"]) == {"a:if0", "b:if0"}
    assert out["links"]["l1"] == {"interfaces": {}, "rx_packets": 0, "tx_packets": 0, "rx_bytes": 0, "tx_bytes": 0}


def test_a_mirror_copies_a_started_links_segment_to_its_own_slices_capture_port_only():
    from authority.substrate.netns_plan import LinkPlan, wanted_mirrors

    mine, theirs = "urn:publicid:IDN+x+slice+mine", "urn:publicid:IDN+x+slice+theirs"
    links = {1001: LinkPlan("s1", "lan0", 1001, 0, "10.10.0", ("a:if0", "b:if0"), (), "cap:if0", mine),
             1002: LinkPlan("s2", "lan0", 1002, 0, "10.10.0", ("a:if0", "b:if0"), (), "cap:if0", theirs),
             1003: LinkPlan("s3", "lan1", 1003, 0, "10.10.1", ("c:if0", "d:if0"), (), "", mine)}
    ports = {"pa": (1, 1001, "m"), "pb": (2, 1001, "m"), "qa": (3, 1002, "m"), "qb": (4, 1002, "m"),
             "pc": (5, 1003, "m"), "pd": (6, 1003, "m"), "cap": (7, None, "m"), "qcap": (8, 1002, "m")}
    # their slice names a capture interface of the same name, but theirs is on a segment (not a capture port)
    captures = {(mine, "cap:if0"): "cap", (theirs, "cap:if0"): "qcap"}
    assert wanted_mirrors("px", {1001, 1002, 1003}, links, ports, captures) == {"px-m1001": (("pa", "pb"), "cap")}
    assert wanted_mirrors("px", {1002, 1003}, links, ports, captures) == {}  # a link not started is not mirrored
    assert wanted_mirrors("px", {1001}, links, ports, {(theirs, "cap:if0"): "cap"}) == {}  # not my slice's port
    assert wanted_mirrors("px", {1001}, links, {k: v for k, v in ports.items() if k != "cap"}, captures) == {}
