"""The broker: signed tickets, all-or-nothing grants, delegation and reclaim, never a unit twice."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from hypothesis import given, settings
from hypothesis import strategies as st

from authority.actor import Authority
from authority.substrate.emulated import EmulatedDriver
from broker.broker import Broker
from broker.placement import plan
from broker.policy import BestFit, FirstFit, WorstFit, free_cores
from protocol.delegation import export_prefixes
from protocol.messages import PlaceAnswer, SliverSpec, demands_of
from resources import export_substrate
from rspec.request import parse_request
from rspec.substrate import default_substrate
from slicex.errors import Busy, CredentialInvalid, Expired, InsufficientNodes, Refused
from slicex.store.sqlite_store import SqliteStore
from slicex.term import Term
from slicex.ticket import SignedReclaim
from tests.factories import request_rspec, vm

NOW = datetime(2030, 1, 1, tzinfo=UTC)
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
PEM = KEY.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
SUB = default_substrate("t.org")


def place(broker: Broker, nodes: list[dict], links: list[dict] | None = None, holder: str = "sm") -> PlaceAnswer:
    """Ask `broker` to place these nodes and links for the next hour, each its own reservation."""
    rids = {x["client_id"]: x["client_id"] for x in [*nodes, *(links or [])]}
    return broker.place(holder, demands_of(parse_request(request_rspec(nodes, links)), rids),
                        Term(NOW, NOW + timedelta(hours=1)), NOW)


def bare_metal(name: str, host: str) -> dict:
    return vm(name, sliver_type="raw-pc", component_id=SUB.host(host).component_id)


def test_ticket_verifies_at_the_authority_and_forgery_does_not():
    store = SqliteStore(":memory:")
    broker = Broker("b", store, KEY)
    authority = Authority("a", EmulatedDriver(SUB), {"b": KEY.public_key()}, store=store,
                          inventory=export_substrate(SUB, "a", "b"))
    authority.delegate(broker)
    tickets = place(broker, [vm("a", ifaces=["a:if0"]), vm("b", ifaces=["b:if0"])],
                    [{"client_id": "lan0", "ifaces": ["a:if0", "b:if0"]}]).tickets
    t = tickets["lan0"]
    (switch,) = SUB.switches
    link = SliverSpec("lan0", "link", "lan0")
    with pytest.raises(CredentialInvalid):
        authority.redeem(msgspec.structs.replace(t, units=(f"vlan:{switch.component_id}:1099",)), link, NOW)  # altered after signing
    with pytest.raises(Expired):
        authority.redeem(t, link, NOW + timedelta(hours=2))
    lease, op = authority.redeem(t, link, NOW)
    assert lease.end == t.end and op["state"] == "geni_notready"
    longer = broker.extend_ticket(t, NOW + timedelta(hours=5))
    assert longer.sequence == t.sequence + 1 and authority.extend_lease(lease, longer, NOW).end == longer.end
    assert authority.close(lease.id, NOW) and broker.relinquish(t) == 1
    for node in ("a", "b"):
        broker.relinquish(tickets[node])
    assert store.all_claims() == {}


def test_grants_are_all_or_nothing():
    store = SqliteStore(":memory:")
    broker = Broker("b", store, KEY)
    broker.accept(export_substrate(SUB, "auth", "b"))
    place(broker, [bare_metal("r1", "bm1")])
    with pytest.raises(InsufficientNodes, match="bm1"):
        place(broker, [bare_metal("r2", "bm2"), bare_metal("r3", "bm1")])
    assert store.owner_of(f"node:{SUB.host('bm2').component_id}") is None


def test_delegation_and_reclaim_for_maintenance():
    store = SqliteStore(":memory:")
    broker = Broker("b", store, KEY)
    broker.accept(export_substrate(SUB, "auth", "b"))
    pc1, pc2 = SUB.hosts[0].component_id, SUB.hosts[1].component_id
    place(broker, [vm("r", component_id=pc2)])
    free, busy = broker.reclaim(SignedReclaim("auth", "b", NOW, (f"core:{pc1}", f"core:{pc2}")))
    assert free == [f"core:{pc1}"] and busy == [f"core:{pc2}"]
    with pytest.raises(Refused, match="not in the inventory delegated"):
        place(broker, [vm("r2", component_id=pc1)])


def test_policies_order_hosts():
    used = {f"core:{SUB.hosts[1].component_id}:{i}" for i in range(10)}
    vm_hosts = [h for h in SUB.hosts if not h.exclusive]
    assert FirstFit().order(vm_hosts, used)[0] is vm_hosts[0]
    assert BestFit().order(vm_hosts, used)[0] is vm_hosts[1]  # the fullest host that still has room
    assert WorstFit().order(vm_hosts, used)[-1] is vm_hosts[1]
    placed = plan(SUB, parse_request(request_rspec([vm("a")])), used, policy=BestFit())
    assert placed[0].component_id == vm_hosts[1].component_id
    assert free_cores(vm_hosts[1], used) == 6


BARE_METAL = replace(SUB, hosts=SUB.hosts + tuple(replace(SUB.host("bm1"), name=f"bm{i}", interfaces=(),
                                                             component_id=f"urn:publicid:IDN+t.org+node+bm{i}")
                                                     for i in range(3, 11)))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["b1", "b2"]), st.lists(st.integers(1, 10), min_size=1, max_size=3,
                                                                   unique=True),
                          st.booleans()), max_size=25))
def test_two_brokers_on_one_store_never_promise_a_unit_twice(ops):
    store = SqliteStore(":memory:")
    brokers = {"b1": Broker("b1", store, KEY), "b2": Broker("b2", store, KEY)}
    for name, b in brokers.items():
        b.accept(export_substrate(BARE_METAL, "auth", name))
    live: dict[str, object] = {}
    held: dict[str, str] = {}
    for n, (name, hosts, release) in enumerate(ops):
        keys = [f"node:{BARE_METAL.host(f'bm{h}').component_id}" for h in hosts]  # claims in the broker's namespaces
        try:
            tickets = place(brokers[name], [vm(f"r{n}-{h}", sliver_type="raw-pc",
                                               component_id=BARE_METAL.host(f"bm{h}").component_id)
                                            for h in hosts]).tickets.values()
        except (Busy, InsufficientNodes):
            assert any(k in held for k in keys)  # all or nothing: refused only for a unit someone holds
            continue
        assert sorted(u for t in tickets for u in t.units) == sorted(keys)
        for t in tickets:
            for k in t.units:
                assert held.get(k) in (None, t.id.rsplit("/", 1)[0])
                held[k] = t.id.rsplit("/", 1)[0]
            live[t.id] = t
            if release:
                brokers[name].relinquish(t)
                for k in t.units:
                    held.pop(k, None)
    assert store.all_claims() == held


def test_reclaimed_inventory_stays_out_until_delegated_again():
    store = SqliteStore(":memory:")
    broker = Broker("b", store, KEY)
    broker.accept(export_prefixes("auth", "b", ["core:h1", "core:h2"]))
    broker.reclaim(SignedReclaim("auth", "b", NOW, ("core:h1",)))
    assert broker.reclaimed("auth") == ["core:h1"] and broker.delegated() == ["core:h2"]
    broker.accept(export_prefixes("auth", "b", ["core:h1"]))
    assert broker.reclaimed("auth") == [] and broker.delegated() == ["core:h1", "core:h2"]
