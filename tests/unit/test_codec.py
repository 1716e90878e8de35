"""The one codec (slicex/codec.py): every message and record type reads back what it wrote, and a malformed
form of each is refused with BADARGS naming the field's path, never a KeyError inside an actor."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operations.accounting import UsageRecord
from protocol.messages import (
    Demand,
    Demands,
    LinkDemand,
    NodeDemand,
    PlaceAnswer,
    SliverSpec,
    SlotAnswer,
    SlotQuery,
)
from resources.kind import Amounts
from rspec.fpga_ext import FpgaRequest
from rspec.request import RequestInterface
from slice_manager import reservation as rs
from slice_manager.records import Record
from slice_manager.update import PendingUpdate
from slicex.codec import MalformedMessage, decode, encode
from slicex.errors import BadArgs
from slicex.ticket import Lease, SignedDelegation, SignedReclaim, Ticket

T0 = datetime(2030, 1, 1, tzinfo=UTC)
H = timedelta(hours=1)
TICKET = Ticket("g/r1", "broker", "sm", "r1", ("core:h:0",), T0, T0 + H, 1, "sig")

names = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12)
times = st.datetimes(datetime(2000, 1, 1), datetime(2100, 1, 1)).map(lambda t: t.replace(tzinfo=UTC))
opt = st.none
interfaces = st.builds(RequestInterface, names, opt() | names, opt() | names, opt() | names)
fpgas = st.builds(FpgaRequest, names, names, st.floats(0, 1e4), st.integers(0, 10**6), names,
                  st.tuples(names) | st.just(()))
nodes = st.builds(NodeDemand, names, st.just("") | names, opt() | names, opt() | names, opt() | st.booleans(),
                  opt() | names, opt() | names, opt() | names, st.lists(interfaces, max_size=3).map(tuple),
                  opt() | fpgas, st.lists(st.tuples(st.integers(1, 65535), st.integers(1, 65535)), max_size=2)
                  .map(tuple))
links = st.builds(LinkDemand, names, st.just("") | names, st.lists(names, max_size=3).map(tuple),
                  st.lists(names, max_size=2).map(tuple), opt() | st.integers(0, 10**8),
                  opt() | st.integers(0, 1000), opt() | st.floats(0, 1), opt() | names, opt() | names,
                  opt() | st.integers(1, 4094),
                  st.lists(st.tuples(names, st.lists(st.tuples(st.integers(0, 65535), st.integers(1, 4094)),
                                                     max_size=2).map(tuple)), max_size=2).map(tuple),
                  opt() | names)
str_maps = st.dictionaries(names, names, max_size=3)


@st.composite
def demands(draw: st.DrawFn) -> Demands:
    ns = draw(st.lists(nodes, max_size=4, unique_by=lambda n: n.client_id))
    ls = draw(st.lists(links, max_size=3, unique_by=lambda lk: lk.client_id))
    ls = [lk for lk in ls if lk.client_id not in {n.client_id for n in ns}]
    kept = draw(st.dictionaries(names, st.fixed_dictionaries(
        {"component_id": names, "interfaces": str_maps, "wanted": st.lists(names, max_size=2)}), max_size=2))
    return Demands(tuple(ns), tuple(ls), draw(names), draw(str_maps), draw(str_maps), kept,
                   tuple(draw(st.lists(names, max_size=2))))


tickets = st.builds(Ticket, names, names, names, names, st.lists(names, max_size=4).map(tuple), times, times,
                    st.integers(0, 99), st.just("") | names,
                    st.lists(st.tuples(names, st.integers(0, 4094)), max_size=2).map(tuple), st.just("") | names)
reservations = st.builds(rs.Reservation, names, st.sampled_from([rs.NASCENT, rs.TICKETED, rs.ACTIVE, rs.FAILED]),
                         st.sampled_from([rs.NONE, rs.TICKETING, rs.REDEEMING]), opt() | times,
                         st.integers(0, 9), st.just("") | names, st.integers(0, 9), names,
                         st.lists(names, max_size=2).map(tuple), st.sampled_from(["ticket", "redeem"]),
                         st.just(""), st.lists(st.tuples(names, st.integers(0, 4094)), max_size=1).map(tuple),
                         opt() | times, opt() | times, opt() | times, opt() | times)
messages = st.builds(rs.Message, st.sampled_from(["ticket", "redeem", "close"]), names, st.integers(0, 9),
                     opt() | times, opt() | times)


def _stored(value: object) -> object:
    """What the store hands back of `value`: its document through JSON."""
    return json.loads(json.dumps(encode(value)))


@settings(max_examples=60, deadline=None)
@given(demands())
def test_demands_read_back_what_they_wrote(d):
    assert decode(_stored(d), Demands, "demands") == d
    assert decode(_stored(d), Demands, "demands").request == d.request


@settings(max_examples=60, deadline=None)
@given(tickets)
def test_a_ticket_reads_back_what_it_wrote_and_its_signed_bytes_stay(t):
    again = decode(_stored(t), Ticket, "ticket")
    assert again == t and again.payload() == t.payload()


@settings(max_examples=40, deadline=None)
@given(reservations, st.lists(messages, max_size=2), tickets, st.booleans(), st.data())
def test_a_slice_manager_record_reads_back_what_it_wrote(r, outbox, t, provisioned, data):
    rid = r.id
    t = Ticket(f"grp/{rid}", t.broker, t.holder, rid, t.units, t.start, t.end, t.sequence, t.signature, t.labels,
               t.authority)
    lease = Lease(t.id, "am", t.id, t.holder, rid, t.units, t.start, t.end, t.sequence, "lsig", t.labels)
    kind = data.draw(st.sampled_from(["node", "link"]))
    element = data.draw(nodes if kind == "node" else links)
    demand = Demand(type(element)(**{**{f: getattr(element, f) for f in element.__struct_fields__},
                                     "reservation": ""}), data.draw(st.integers(0, 5)))
    rec = Record(rid, "urn:s", "urn:u", element.client_id, kind, "", "grp", r, demand, {"host": "h1"}, t,
                 data.draw(st.none() | st.just(lease)), outbox, "", provisioned)
    assert Record.from_doc(_stored(rec.to_doc())) == rec


@pytest.mark.parametrize(("hint", "wire", "why"), [
    (Demands, {"nodes": [{"client_id": "a", "exclusive": "yes"}], "links": []},
     r"demands.nodes\[0\].exclusive: expected bool \| null, got str"),
    (Demands, {"nodes": [], "links": [{"client_id": "l", "uplinks": [["p", [[1]]]]}]},
     r"demands.links\[0\].uplinks\[0\]\[1\]\[0\]: expected array of length 2"),
    (Demands, {"nodes": [], "links": [], "kept": {"n": {"component_id": 3}}},
     r"demands.kept\[...\].component_id: expected str, got int"),
    (Ticket, {**encode(TICKET), "units": "core:h:0"}, "ticket.units: expected array, got str"),
    (Ticket, {**encode(TICKET), "end": "tomorrow"}, "ticket.end: invalid RFC3339 encoded datetime"),
    (Lease, {k: v for k, v in encode(Lease("l", "am", "g/r1", "sm", "r1", (), T0, T0 + H)).items() if k != "holder"},
     "lease: object missing required field holder"),
    (SignedDelegation, {"authority": "a", "broker": "b", "issued": "2030-01-01T00:00:00Z", "body": []},
     "delegation.body: expected object, got array"),
    (SignedReclaim, {"authority": "a", "broker": "b", "issued": "2030-01-01T00:00:00Z", "names": [1]},
     r"reclaim.names\[0\]: expected str, got int"),
    (SliverSpec, {"id": "r1", "kind": "node", "labels": [["vlan", "7"]]},
     r"spec.labels\[0\]\[1\]: expected int, got str"),
    (SliverSpec, {"id": "r1", "kind": "node", "details": {"vlan_tag": "7"}},
     r"details.vlan_tag: expected int \| null, got str"),
    (PlaceAnswer, {"tickets": {"r1": {"id": "x"}}}, r"answer.tickets\[...\]: object missing required field broker"),
    (PlaceAnswer, {"ticket": {}}, "answer: object contains unknown field ticket"),
    (SlotQuery, {"duration_seconds": 60, "earliest": "2030-01-01T00:00:00Z"},
     "query: object missing required field latest"),
    (SlotAnswer, {"found": "no"}, "answer.found: expected bool, got str"),
    (PendingUpdate, {"slice_urn": "s", "phase": "staged", "expires": "2030-01-01T00:00:00Z", "added": "a"},
     "update.added: expected array, got str"),
    (rs.Reservation, {"id": "r", "sequence": "2"}, "reservation.sequence: expected int, got str"),
    (list[rs.Message], [{"kind": "ticket"}], r"outbox\[0\]: object missing required field reservation"),
    (UsageRecord, {"sliver_urn": "s", "slice_urn": "s", "user": "u", "project": None, "kind": "node",
                   "client_id": "n", "amounts": {"cores": 1.5}, "start": "2030-01-01T00:00:00Z"},
     "usage.amounts.cores: expected int, got float"),
    (Amounts, {"nodes": None}, "amounts.nodes: expected int, got null"),
])
def test_a_malformed_form_of_each_type_is_badargs_naming_the_field(hint, wire, why):
    where = why.split(":")[0].split(".")[0].split("[")[0].replace("\\", "")
    with pytest.raises(MalformedMessage, match=why) as err:
        decode(wire, hint, where)
    assert isinstance(err.value, BadArgs) and err.value.code == 1


def test_a_spec_whose_interfaces_carry_their_links_tag_crosses_the_wire():
    """Once provisioned (and after an Update rewires a node), a node's interfaces carry their sliver id, MAC
    and their link's VLAN tag, an int: SliverDetails declared strings only, so the spec of such a node was
    refused on arrival (embedded: a committed Update reverted)."""
    details = {"interfaces": {"n1:if0": {"component_id": "eth1", "ip": "10.0.0.1", "netmask": "255.255.255.0",
                                         "sliver_id": "r1:n1:if0", "mac_address": "02:00:00:00:00:01",
                                         "vlan_tag": 1042}, "n1:if1": {"component_id": "eth2", "vlan_tag": None}}}
    spec = decode({"id": "r1", "kind": "node", "details": details}, SliverSpec, "spec")
    assert spec.details == details
