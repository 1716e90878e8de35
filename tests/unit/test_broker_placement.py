"""The broker decides placement: the slice manager sends demands with no unit named, the broker's policy
picks hosts, units and tags from its own calendar; concurrent placements never promise a unit twice (a
property test over two brokers sharing one store, as two AM workers do); the availability answer is cached by
version and changes when the broker's state does."""

from __future__ import annotations

import tempfile
import threading
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from authority.substrate.emulated import EmulatedDriver
from broker.broker import TICKETS, Broker
from broker.claims import counts_of
from deployment.actors import ActorKeys, embedded_slice_manager
from protocol.messages import PlaceAnswer, demands_of
from protocol.remote import broker_handlers
from resources import STANDARD, InUse, export_substrate, usage_counts
from rspec.advertisement import Usage, build_advertisement
from rspec.request import parse_request
from rspec.substrate import default_substrate
from slice_manager.actor import ActorSliceManager
from slicex.clock import ManualClock, rfc3339
from slicex.codec import encode
from slicex.errors import BadArgs, GeniError
from slicex.store.sqlite_store import SqliteStore
from slicex.term import Term
from tests.factories import request_rspec, three_node_lan, vm

SUB = default_substrate("t.org")
AUTH = "urn:publicid:IDN+t.org+authority+am"
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
SLICE = "urn:publicid:IDN+t.org+slice+p"
MIN = timedelta(minutes=1)


class Recording:
    """The broker as the slice manager sees it, noting every method called and every `place` message."""

    def __init__(self, broker: Any):
        self.broker = broker
        self.calls: list[str] = []
        self.placed: list[dict[str, Any]] = []
        self.answers: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.broker, name)
        if not callable(attr):
            return attr

        def call(*a: Any, **kw: Any) -> Any:
            self.calls.append(name)
            if name == "place":
                self.placed.append(a[1])
            out = attr(*a, **kw)
            if name == "availability":
                self.answers.append(out)
            return out
        return call


def strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in strings(k) + strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in strings(v)]
    return []


def world(tmp_path: Path) -> tuple[SqliteStore, Any, Recording, ActorSliceManager]:
    store = SqliteStore(str(tmp_path / "s.db"))
    real = embedded_slice_manager(store, SUB, EmulatedDriver(SUB), keys=ActorKeys.given(KEY, KEY))
    broker = Recording(real.broker)
    # the broker's clock is not the slice manager's to run here: every call it makes is a message
    return store, real, broker, ActorSliceManager(store, SUB, broker, real.authority, name="sm",
                                                  run_actor_clocks=False)


def test_the_slice_manager_sends_demands_and_the_broker_chooses_the_units(tmp_path):
    store, real, broker, asm = world(tmp_path)
    now = ManualClock().now()
    slivers = asm.allocate(SLICE, "o", parse_request(three_node_lan()), now + 10 * MIN, now)
    assert set(broker.calls) == {"place"}, broker.calls  # no calendar read, no exact-unit ticket request
    demands = encode(broker.placed[0])  # the message as it goes over the wire
    assert len(broker.placed) == 1
    assert [n["client_id"] for n in demands["nodes"]] == ["n1", "n2", "n3"]
    assert [lk["client_id"] for lk in demands["links"]] == ["lan0"]
    named = [s for s in strings(demands) if STANDARD.is_unit(s)]
    assert named == [], f"the slice manager named units: {named}"
    # what the broker chose is what it booked, claimed and told the slice manager
    recs = {rec.client_id: rec for rec in asm.records(SLICE)}
    claims = store.all_claims()
    for rec in recs.values():
        assert rec.ticket is not None and set(rec.ticket.units) <= set(claims)
        assert {claims[u] for u in rec.ticket.units} == {rec.group}
    for n in ("n1", "n2", "n3"):
        host = recs[n].details["host"]
        assert recs[n].component_id == SUB.host(host).component_id
        assert all(u.startswith((f"core:{recs[n].component_id}:", f"mem:{recs[n].component_id}:",
                                 f"disk:{recs[n].component_id}:"))
                   for u in recs[n].ticket.units)
    tag = recs["lan0"].details["vlan_tag"]
    assert dict(recs["lan0"].ticket.labels) == {"vlan": tag} and f"vlan:{SUB.switches[0].component_id}:{tag}" in claims
    asm.delete([s.urn for s in slivers], now)
    assert store.all_claims() == {}


def test_a_bound_node_goes_where_it_is_bound_and_an_asked_tag_taken_is_vlan_unavailable(tmp_path):
    store, real, broker, asm = world(tmp_path)
    now = ManualClock().now()
    pc3 = SUB.host("pc3").component_id
    (s,) = asm.allocate(SLICE, "o", parse_request(request_rspec([vm("a", component_id=pc3)])), now + 10 * MIN, now)
    assert s.component_id == pc3
    lan = request_rspec([vm("x", ifaces=["x:if0"]), vm("y", ifaces=["y:if0"])],
                        [{"client_id": "l", "ifaces": ["x:if0", "y:if0"], "vlantag": "1010"}])
    asm.allocate(SLICE, "o", parse_request(lan), now + 10 * MIN, now)
    with pytest.raises(GeniError) as err:
        asm.allocate("urn:publicid:IDN+t.org+slice+q", "o", parse_request(lan), now + 10 * MIN, now)
    assert err.value.code == 24 and "1010" in err.value.message
    assert asm.records("urn:publicid:IDN+t.org+slice+q") == []


def test_a_dry_run_is_the_same_message_with_dry_run_and_books_nothing(tmp_path):
    store, real, broker, asm = world(tmp_path)
    now = ManualClock().now()
    before = (store.all_claims(), store.scan(TICKETS), real.broker.version())
    plan = asm.dry_run(parse_request(three_node_lan()), "o", now, now + 10 * MIN)
    assert plan["fits"] and len(plan["nodes"]) == 3 and broker.calls == ["place"]
    assert (store.all_claims(), store.scan(TICKETS), real.broker.version()) == before
    assert [s for s in strings(broker.placed[0]) if STANDARD.is_unit(s)] == []


def test_malformed_demands_arriving_at_the_broker_are_badargs():
    store = SqliteStore(":memory:")
    broker = Broker("broker", store, KEY, authority=AUTH)
    broker.accept(export_substrate(SUB, AUTH, "broker"))
    place = broker_handlers(broker)["place"]  # what the broker's actor server calls with the wire form
    now = ManualClock().now()
    term = {"start": rfc3339(now), "end": rfc3339(now + MIN)}
    with pytest.raises(BadArgs, match="place: demands: object missing required field links"):
        place("h", {"nodes": [{"client_id": "a"}]}, term, rfc3339(now))
    with pytest.raises(BadArgs, match=r"place: demands.nodes\[0\].interfaces: expected array, got str"):
        place("h", {"nodes": [{"client_id": "a", "reservation": "r", "interfaces": "eth0"}], "links": []}, term,
              rfc3339(now))


def test_a_broker_without_a_delegated_substrate_refuses_to_place():
    store = SqliteStore(":memory:")
    broker = Broker("broker", store, KEY, authority=AUTH)
    now = ManualClock().now()
    demands = demands_of(parse_request(request_rspec([vm("a")])), {"a": "r"})
    with pytest.raises(GeniError, match="delegated no substrate description"):
        broker.place("h", demands, Term(now, now + MIN), now)


# ---- the availability query and its cache ----------------------------------------------------------------------
def test_availability_is_cached_until_the_broker_changes_even_through_another_worker(tmp_path):
    store, real, broker, asm = world(tmp_path)
    now = ManualClock().now()
    assert asm.in_use(now) == InUse({}, frozenset()) and not broker.answers[-1]["unchanged"]
    assert asm.in_use(now) == InUse({}, frozenset()) and broker.answers[-1] == {
        "version": broker.answers[0]["version"], "unchanged": True}
    bm = SUB.host("bm1").component_id
    (s,) = asm.allocate(SLICE, "o", parse_request(request_rspec([vm("b", sliver_type="raw-pc", component_id=bm)])),
                        now + 10 * MIN, now)
    used = asm.in_use(now)
    assert not broker.answers[-1]["unchanged"] and used.units == {f"node:{bm}"}
    cores, mem, taken, vlans = usage_counts(used.units, used.counts)
    ad = build_advertisement(SUB, Usage(cores=cores, memory_mb=mem, taken=taken, vlans=vlans), now, True)
    assert f'component_id="{bm}"' not in ad  # geni_available leaves out what is taken
    assert f'component_id="{SUB.host("bm2").component_id}"' in ad
    # a second AM worker's broker on the same store grants: this worker's cached answer is stale
    other = Broker("broker", store, KEY, authority=AUTH)
    demands = demands_of(parse_request(request_rspec([vm("c")])), {"c": "r-c"})
    got = other.place("sm2", demands, Term(now, now + 10 * MIN), now)
    used = asm.in_use(now)
    granted = got.tickets["r-c"].units  # a VM's units: counted per pool (cores, memory, disk), not named
    assert not broker.answers[-1]["unchanged"] and used.counts == counts_of({u: "" for u in granted})
    cores, mem, _, _ = usage_counts(used.units, used.counts)
    host = next(u for u in granted if u.startswith("core:")).split(":", 1)[1].rsplit(":", 1)[0]
    assert cores == {host: sum(u.startswith("core:") for u in granted)} and mem[host] > 0
    asm.delete([s.urn], now)
    assert f"node:{bm}" not in asm.in_use(now).units and not broker.answers[-1]["unchanged"]


# ---- property: concurrent placements never promise a unit twice ------------------------------------------------
SMALL = replace(SUB, hosts=tuple(replace(h, cores=3, memory_mb=4096) if not h.exclusive else h for h in SUB.hosts),
                switches=tuple(replace(sw, vlan_range=((1000, 1003),)) for sw in SUB.switches))
NODE = st.fixed_dictionaries({"kind": st.sampled_from(["default-vm", "m1.small", "m1.medium", "raw-pc"]),
                              "bound": st.sampled_from(["", "pc1", "pc2", "bm1"])})
REQUEST = st.fixed_dictionaries({"nodes": st.lists(NODE, min_size=1, max_size=3), "lan": st.booleans(),
                                 "tag": st.sampled_from([None, 1000, 1002])})


def rspec_of(i: int, req: dict[str, Any]) -> str:
    nodes = []
    for k, n in enumerate(req["nodes"]):
        bound = SMALL.host(n["bound"]) if n["bound"] else None
        if bound is not None and bound.exclusive != (n["kind"] == "raw-pc"):
            bound = None  # a VM is never bound to a bare-metal node here (that is BADARGS, not a race)
        nodes.append(vm(f"r{i}n{k}", sliver_type=n["kind"], ifaces=[f"r{i}n{k}:if0"] if req["lan"] else [],
                        **({"component_id": bound.component_id} if bound else {})))
    links = [{"client_id": f"r{i}lan", "ifaces": [f"r{i}n{k}:if0" for k in range(len(nodes))],
              **({"vlantag": str(req["tag"])} if req["tag"] else {})}] if req["lan"] and len(nodes) > 1 else []
    return request_rspec(nodes, links)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(REQUEST, min_size=2, max_size=6))
def test_concurrent_placements_never_book_a_unit_twice(requests):
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(str(Path(tmp) / "s.db"))
        first = Broker("broker", store, KEY, authority=AUTH)
        first.accept(export_substrate(SMALL, AUTH, "broker"))
        brokers = [first, Broker("broker", store, KEY, authority=AUTH)]  # two AM workers' brokers, one store
        now = ManualClock().now()
        start = threading.Barrier(len(requests), timeout=10)
        outcomes: list[Any] = [None] * len(requests)

        def ask(i: int) -> None:
            request = parse_request(rspec_of(i, requests[i]))
            rids = {e.client_id: f"q{i}-{e.client_id}" for e in (*request.nodes, *request.links)}
            start.wait()
            try:
                outcomes[i] = brokers[i % 2].place(f"h{i}", demands_of(request, rids), Term(now, now + 10 * MIN),
                                                   now)
            except GeniError as exc:
                outcomes[i] = exc

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(requests))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
        assert all(o is not None for o in outcomes)
        for o in outcomes:
            if isinstance(o, GeniError):
                assert o.code in (2, 7, 24, 14, 25, 26) or "Insufficient" in type(o).__name__, o
        booked: dict[str, str] = {}
        claims = store.all_claims()
        for doc in store.scan(TICKETS):
            if doc["state"] != "active":
                continue
            group = doc["ticket"]["id"].rsplit("/", 1)[0]
            for unit in doc.get("booked", doc["ticket"]["units"]):
                assert unit not in booked, f"{unit} promised to {booked[unit]} and {doc['ticket']['id']}"
                booked[unit] = doc["ticket"]["id"]
                assert claims.get(unit) == group, f"{unit} booked by {group}, claimed by {claims.get(unit)}"
        granted = [o for o in outcomes if isinstance(o, PlaceAnswer)]
        assert sum(len(o.tickets) for o in granted) == len(store.scan(TICKETS))
        assert set(claims) == set(booked)  # nothing claimed that no ticket books (all or nothing)
        store.close()


def test_a_request_asked_again_after_a_partial_grant_is_placed_again_as_a_whole():
    """A broker that wrote one ticket of a group and not the other (cut short) answers the repeated request
    with both, and its calendar and claims hold exactly what the tickets name."""
    store = SqliteStore(":memory:")
    first = Broker("broker", store, KEY, authority=AUTH)
    first.accept(export_substrate(SUB, AUTH, "broker"))
    now = ManualClock().now()
    demands = demands_of(parse_request(request_rspec([vm("a"), vm("b")])), {"a": "ra", "b": "rb"})
    first.place("h", demands, Term(now, now + 10 * MIN), now, group="g")
    store.delete(TICKETS, "g/rb")  # as if the broker died between its two ticket writes
    again = Broker("broker", store, KEY, authority=AUTH)  # restarted: the calendar from the store
    got = again.place("h", demands, Term(now, now + 10 * MIN), now, group="g")
    units = {u for t in got.tickets.values() for u in t.units}
    assert len(units) == sum(len(t.units) for t in got.tickets.values())
    assert {u for b in again.calendar.bookings.values() for u in b.units} == units
    assert set(store.claims_of("g")) == units


def test_an_answer_missing_a_ticket_fails_the_allocation_and_gives_everything_back(tmp_path):
    store, real, broker, asm = world(tmp_path)
    now = ManualClock().now()

    class Short:
        def __getattr__(self, name):
            return getattr(real.broker, name)

        def place(self, *a, **kw):
            answer = real.broker.place(*a, **kw)
            answer.tickets.pop(next(iter(answer.tickets)))
            return answer

    asm = ActorSliceManager(store, SUB, Short(), real.authority, name="sm", run_actor_clocks=False)
    with pytest.raises(GeniError, match="holds no ticket for n1"):
        asm.allocate(SLICE, "o", parse_request(three_node_lan()), now + 10 * MIN, now)
    assert asm.records() == [] and store.all_claims() == {} and real.broker.calendar.bookings == {}


def test_a_node_with_a_dataset_is_allocated_and_provisioned_with_its_blockstore_as_the_driver_reads_it(tmp_path):
    """The slice manager hands a blockstore to the authority as SliverDetails declares it (strings: size_mb
    "64"), so the spec the driver gets passes the check on arrival and reads back the same Blockstore."""
    from rspec.blockstore import Blockstore

    store, real, broker, asm = world(tmp_path)
    now = ManualClock().now()
    xml = ('<rspec xmlns="http://www.geni.net/resources/rspec/3" '
           'xmlns:emulab="http://www.protogeni.net/resources/rspec/ext/emulab/1" type="request">'
           '<node client_id="n1" exclusive="false"><sliver_type name="XOSmall"/>'
           '<emulab:blockstore name="b" mountpoint="/data" size="64MB" dataset="d1"/></node></rspec>')
    asm.allocate(SLICE, "o", parse_request(xml), now + 10 * MIN, now)
    (rec,) = asm.records(SLICE)
    assert rec.details["blockstores"] == [{"name": "b", "dataset": "d1", "mountpoint": "/data", "size_mb": "64"}]
    spec = asm._spec(rec, ())
    assert [Blockstore.from_doc(b) for b in spec.details["blockstores"]] == [Blockstore("b", "d1", "/data", 64)]
