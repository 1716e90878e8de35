"""Public ports as a resource kind (resources/public_port.py): the request extension is validated, the broker's
plan hands each node the ports it asks for from the operator's range, never one another sliver holds, and
quotas and accounting count them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from broker.placement import dry_run, plan
from resources import STANDARD, export_substrate
from rspec.namespaces import PUBLIC
from rspec.request import parse_request
from rspec.substrate import SubstrateError, default_substrate, substrate_from_dict
from slicex.errors import BadArgs, PortUnavailable
from tests.factories import request_rspec, vm

GATEWAY = replace(default_substrate(), public_ports=((25100, 25101), (25200, 25200)))


def ask(*ports: tuple[str, str | None], cid: str = "n1") -> str:
    els = "".join(f'<public:port xmlns:public="{PUBLIC}" port="{p}"'
                  + (f' public_port="{q}"' if q else "") + "/>" for p, q in ports)
    return request_rspec([vm(cid, extra=els)])


def test_the_request_names_each_node_port_and_the_public_port_asked():
    node = parse_request(ask(("80", None), ("22", "25200"))).nodes[0]
    assert node.public_ports == ((80, 0), (22, 25200))


@pytest.mark.parametrize("port, public_port", [("0", None), ("65536", None), ("http", None), ("80", "-1")])
def test_a_port_that_is_no_tcp_port_is_badargs(port, public_port):
    with pytest.raises(BadArgs):
        parse_request(ask((port, public_port)))


def test_one_node_port_asked_twice_is_badargs():
    with pytest.raises(BadArgs, match="asked twice"):
        parse_request(ask(("80", None), ("80", "25100")))


def test_the_gateways_ports_are_delegated_as_one_pool():
    pools = {p.name: p for p in export_substrate(GATEWAY, "auth", "broker").pools}
    assert pools["pport"].units == ("pport:25100", "pport:25101", "pport:25200")
    assert STANDARD.bin_of("pport:25100") == ("pport", "gateway")
    assert "pport" not in {p.name for p in export_substrate(default_substrate(), "auth", "broker").pools}


def test_asked_ports_are_given_and_others_are_the_lowest_free():
    placed = plan(GATEWAY, parse_request(ask(("80", None), ("22", "25100"))), {"pport:25101"})
    node = placed[0]
    assert node.details["public_ports"] == [{"port": 80, "public_port": 25200}, {"port": 22, "public_port": 25100}]
    assert {"pport:25200", "pport:25100"} <= set(node.keys)


def test_a_port_outside_the_range_is_badargs_and_a_held_one_unavailable():
    with pytest.raises(BadArgs, match=r"outside the operator's range \(25100-25101, 25200\)"):
        plan(GATEWAY, parse_request(ask(("80", "8080"))), set())
    with pytest.raises(PortUnavailable, match="public port 25100 is held by another sliver") as err:
        plan(GATEWAY, parse_request(ask(("80", "25100"))), {"pport:25100"})
    assert err.value.code == 11
    with pytest.raises(PortUnavailable, match="0 of 3 free"):
        plan(GATEWAY, parse_request(ask(("80", None))), {"pport:25100", "pport:25101", "pport:25200"})
    with pytest.raises(BadArgs, match="offers none"):
        plan(default_substrate(), parse_request(ask(("80", None))), set())


def test_two_nodes_of_one_request_never_share_a_port():
    req = parse_request(request_rspec([vm(f"n{k}", extra=f'<public:port xmlns:public="{PUBLIC}" port="80"/>')
                                       for k in (1, 2)]))
    given = [p.details["public_ports"][0]["public_port"] for p in plan(GATEWAY, req, set())]
    assert given == [25100, 25101]


def test_a_dry_run_says_how_many_ports_are_free():
    out = dry_run(GATEWAY, parse_request(ask(("80", None))), {"pport:25100", "pport:25101", "pport:25200"})
    assert not out["fits"]
    assert {"resource": "public ports", "site": "gateway", "asked": 1, "available": 0} in out["short"][0]["needs"]


def test_quotas_and_accounting_count_public_ports():
    req = parse_request(ask(("80", None), ("22", None)))
    assert STANDARD.asked(GATEWAY, req).public_ports == 2
    details = plan(GATEWAY, req, set())[0].details
    assert STANDARD.held("node", details).public_ports == 2
    assert STANDARD.held("node", {"cores": 1}).public_ports == 0


def test_the_substrate_file_gives_the_range_and_refuses_a_bad_one():
    base = {"authority": "x", "hosts": [{"name": "a"}]}
    assert substrate_from_dict({**base, "public_ports": ["25100-25199"]}).public_ports == ((25100, 25199),)
    assert substrate_from_dict(base).public_ports == ()
    with pytest.raises(SubstrateError, match="outside 1-65535"):
        substrate_from_dict({**base, "public_ports": ["0-10"]})


def test_the_manifest_names_the_public_host_and_port_of_each_node_port():
    from lxml import etree

    from rspec.manifest import SliverView, build_manifest
    from rspec.validate import validate_rspec

    given = [{"port": 80, "public_port": 25200, "host": "am.example.edu"}, {"port": 22, "public_port": 25100}]
    view = SliverView("n1", "urn:publicid:IDN+x+sliver+1", "node", details={"public_ports": given})
    manifest = build_manifest([ask(("80", None), ("22", "25100"))], [view], "urn:publicid:IDN+x+authority+am")
    assert validate_rspec(manifest, "manifest") == []
    ports = [(p.get("port"), p.get("public_port"), p.get("host"))
             for p in etree.fromstring(manifest.encode()).iter(f"{{{PUBLIC}}}port")]
    assert ports == [("80", "25200", "am.example.edu"), ("22", "25100", None)]


def test_a_substrate_with_public_ports_is_refused_where_no_driver_forwards_them(tmp_path):
    from deployment.service import deployment_substrate
    from slicex.config import SlicexConfig

    site = tmp_path / "site.yaml"
    site.write_text("authority: x\npublic_ports: ['25100']\nhosts:\n  - name: a\n")
    with pytest.raises(SubstrateError, match="the openstack driver has no gateway"):
        deployment_substrate(SlicexConfig(substrate_driver="openstack", substrate=str(site)))
    assert deployment_substrate(SlicexConfig(substrate=str(site))).public_ports == ((25100, 25100),)
