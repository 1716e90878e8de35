"""The actors' protocol: one declaration per actor, the proxies and handler tables derived from it, and one
codec that refuses a malformed message with BADARGS at the edge."""

from __future__ import annotations

import inspect
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from authority.actor import Authority
from broker.broker import Broker
from protocol.api import AuthorityApi, BrokerApi
from protocol.messages import NodeDemand, PlaceAnswer, SliverSpec, demands_of
from protocol.remote import (
    RemoteAuthority,
    RemoteBroker,
    authority_callers,
    authority_handlers,
    broker_callers,
    broker_handlers,
    methods,
)
from rspec.request import Request, parse_request
from slicex.codec import decode, encode
from slicex.errors import BadArgs
from slicex.term import Term
from slicex.ticket import Ticket
from tests.factories import three_node_lan

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def _public(cls: type) -> set[str]:
    return {n for n, v in vars(cls).items() if not n.startswith("_") and callable(v)}


@pytest.mark.parametrize(("api", "proxy"), [(BrokerApi, RemoteBroker), (AuthorityApi, RemoteAuthority)])
def test_a_proxy_exposes_exactly_its_protocols_methods(api, proxy):
    assert _public(proxy) == set(methods(api)) == _public(api)
    for name, sig in methods(api).items():
        assert inspect.signature(getattr(proxy, name)) == sig


@pytest.mark.parametrize(("api", "actor"), [(BrokerApi, Broker), (AuthorityApi, Authority)])
def test_the_local_actor_implements_its_protocol(api, actor):
    for name, sig in methods(api).items():
        local = list(inspect.signature(getattr(actor, name)).parameters)[1:]
        assert local[: len(sig.parameters)] == list(sig.parameters), name


def test_callers_and_handlers_come_from_the_declaration():
    callers = broker_callers("sm", "auth")
    assert callers["sm"] == {"place", "find_slot", "extend_ticket", "relinquish", "query", "availability",
                             "reclaimed", "delegations", "tickets"}
    assert callers["auth"] == {"accept", "reclaim", "reclaimed", "delegations", "tickets"}
    assert authority_callers("sm", "operator") == {"sm": set(methods(AuthorityApi)) - {"maintenance"},
                                                   "operator": {"maintenance"}}
    assert set(broker_handlers(object())) == set(methods(BrokerApi))
    assert set(authority_handlers(object())) == set(methods(AuthorityApi))


def test_a_message_survives_the_codec():
    request = parse_request(three_node_lan())
    demands = demands_of(request, {e.client_id: f"r-{e.client_id}" for e in (*request.nodes, *request.links)})
    sig = methods(BrokerApi)["place"]
    hints = {p.name: p.annotation for p in sig.parameters.values()}
    term = Term(T0, T0 + timedelta(hours=1))
    for value, name in ((term, "term"), (T0, "now"), (None, "group")):
        assert decode(encode(value, hints[name]), hints[name], name) == value
    wire = encode(demands, hints["demands"])
    assert decode(wire, hints["demands"], "demands") == demands
    assert decode(wire, hints["demands"], "demands").request == demands.request == Request(
        tuple(NodeDemand.of(n).node() for n in request.nodes), request.links)
    ticket = Ticket("g/r1", "broker", "sm", "r1", ("core:h:0",), T0, T0 + timedelta(hours=1))
    answer = PlaceAnswer({"r1": ticket}, {"r1": {"kind": "node", "component_id": "h", "details": {}}})
    assert decode(encode(answer, sig.return_annotation), sig.return_annotation, "answer") == answer
    spec = SliverSpec("r1", "node", "n1", ("core:h:0",), (("vlan", 7),), {"host": "h"})
    assert decode(encode(spec, SliverSpec), SliverSpec, "spec") == spec


class _Refusing:
    def __getattr__(self, name):
        raise AssertionError(f"a malformed message reached the actor's {name}")


@pytest.mark.parametrize(("method", "args", "why"), [
    ("extend_ticket", ({"id": "x"}, "2030-01-01T00:00:00Z"), "ticket: object missing required field broker"),
    ("extend_ticket", (), "ticket is missing"),
    ("relinquish", ("not a struct",), "ticket: expected object, got str"),
    ("query", ("g", "r1"), "reservations: expected array, got str"),
    ("query", ("g", [1]), r"reservations\[0\]: expected str, got int"),
    ("availability", ("", "yesterday"), "now: invalid RFC3339 encoded datetime"),
    ("availability", ("", None, {"start": "2030-01-01T00:00:00Z"}), "term: object missing required field end"),
    ("place", ("h", {"nodes": [{"client_id": "a"}]}, None, "2030-01-01T00:00:00Z"),
     "demands: object missing required field links"),
    ("place", ("h", {"nodes": [{"client_id": 7}], "links": []}, None, "2030-01-01T00:00:00Z"),
     r"demands.nodes\[0\].client_id: expected str, got int"),
    ("place", ("h", {"nodes": [{"client_id": "a", "interfaces": [{"ip": "x"}]}], "links": []}, None,
               "2030-01-01T00:00:00Z"), r"demands.nodes\[0\].interfaces\[0\]: object missing required field client_id"),
    ("place", ("h", {"nodes": [{"client_id": "a"}], "links": [{"client_id": "a"}]}, None, "2030-01-01T00:00:00Z"),
     "demands: a client_id is named twice"),
    ("place", ("h", {"nodes": [], "links": [{"client_id": "l", "vlan_tag": "x"}]}, None, "2030-01-01T00:00:00Z"),
     r"demands.links\[0\].vlan_tag: expected int \| null, got str"),
    ("extend_ticket", ({"id": "x", "broker": "b", "holder": "h", "reservation": "r", "units": [], "start":
                        "2030-01-01T00:00:00Z", "end": "2030-01-01T00:00:00Z", "labels": [["vlan", "x"]]},
                       "2030-01-01T00:00:00Z"), r"ticket.labels\[0\]\[1\]: expected int, got str"),
    ("find_slot", ("h", {"nodes": [], "links": []}, {"duration_seconds": "1h"}), "query.duration_seconds: expected int"),
    ("reclaimed", ("a", "b"), "takes 1 arguments, 2 given"),
    ("accept", ({"authority": "a"},), "delegation|SignedDelegation"),
    ("reclaim", ({"authority": "a", "broker": "b", "issued": "2030-01-01T00:00:00Z", "names": ["x"],
                  "kind": "delegation"},), "order.kind: invalid value 'delegation'"),
])
def test_the_codec_answers_a_malformed_message_with_badargs(method, args, why):
    with pytest.raises(BadArgs, match=why) as err:
        broker_handlers(_Refusing())[method](*args)
    assert err.value.code == 1


def test_a_malformed_sliver_spec_is_badargs_before_the_authority_acts():
    ticket = encode(Ticket("g/r1", "broker", "sm", "r1", ("core:h:0",), T0, T0 + timedelta(hours=1)))
    with pytest.raises(BadArgs, match="spec: object missing required field id"):
        authority_handlers(_Refusing())["redeem"](ticket, {"kind": "node"}, "2030-01-01T00:00:00Z")


@pytest.mark.parametrize("details, why", [
    ({"cores": 2, "corez": 2}, "unknown detail\\(s\\) corez"),
    ({"cores": "two"}, "details.cores: expected int"),
    ({"interfaces": ["eth0"]}, "details.interfaces: expected object, got array"),
    ({"interfaces": {"eth0": {"ip": [7]}}}, r"details.interfaces\[...\]\[...\]: expected int \| str \| null, got array"),
])
def test_a_sliver_spec_with_an_undeclared_or_mistyped_detail_is_badargs_on_arrival(details, why):
    ticket = encode(Ticket("g/r1", "broker", "sm", "r1", ("core:h:0",), T0, T0 + timedelta(hours=1)))
    spec = {"id": "r1", "kind": "node", "details": details}
    with pytest.raises(BadArgs, match=why):
        authority_handlers(_Refusing())["redeem"](ticket, spec, "2030-01-01T00:00:00Z")


def test_every_detail_a_placement_or_the_slice_manager_writes_is_declared():
    """What the standard resource kinds place (compute, links with stitching uplinks, FPGAs) crosses the wire
    as details: every key is one SliverDetails declares, with a value of its declared type."""
    from pathlib import Path

    from broker.placement import plan
    from protocol.messages import DETAIL_TYPES
    from rspec.fpga_ext import FpgaRequest
    from rspec.request import Request, RequestNode
    from rspec.substrate import load_substrate
    from slicex.inventory import to_doc

    examples = Path(__file__).resolve().parents[2] / "docs" / "examples"
    racks = parse_request(three_node_lan())
    racks = Request(racks.nodes, tuple(replace(lk, capacity_kbps=1000, latency_ms=5) for lk in racks.links))
    placed = plan(load_substrate(examples / "two-rack-site.yaml"), racks, set())
    fpgas = Request((RequestNode("f", fpga=FpgaRequest("fpga-bitstream", "sha256:" + "ab" * 32)),
                     RequestNode("r", fpga=FpgaRequest("virtual-router", "", 50.0, routes=("10.0.0.0/8 1 192.0.2.1",)))),
                    ())
    placed += plan(load_substrate(examples / "fpga-site.yaml"), fpgas, set(),
                   bitstream_parts={"sha256:" + "ab" * 32: "xc2vp70ff1704"})
    assert {p.kind for p in placed} == {"node", "link"}
    added = {"slice_urn": "urn:publicid:IDN+a+slice+s", "owner": "urn:publicid:IDN+a+user+u", "hostname": "n",
             "logins": [{"username": "u", "urn": "urn:publicid:IDN+a+user+u", "hostname": "n", "port": 22,
                         "keys": ["ssh-ed25519 AAAA"]}], "programming_batch": 1,
             "geni_start_time": "2030-01-01T00:00:00Z", "started": "2030-01-01T00:00:00Z",
             "install": [{"url": "http://x/a.tgz", "install_path": "/opt"}]}
    for p in placed:
        doc = to_doc({**p.details, **added})
        assert set(doc) <= set(DETAIL_TYPES), set(doc) - set(DETAIL_TYPES)
        assert decode({"id": p.client_id, "kind": p.kind, "details": doc}, SliverSpec, "spec").details == doc
