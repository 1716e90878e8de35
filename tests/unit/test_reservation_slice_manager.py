"""The actor slice manager: AM calls become tickets, leases and closes through the reservation machine; what
fails says why, and nothing it took is left behind."""

from __future__ import annotations

from datetime import timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from authority.actor import LEASES
from authority.substrate.emulated import EmulatedDriver
from deployment.actors import ActorKeys, embedded_slice_manager
from deployment.migrations import time_index
from protocol import slice_manager as sm
from protocol.messages import demands_of
from rspec.request import parse_request
from rspec.substrate import default_substrate
from slice_manager import reservation as rs
from slice_manager.actor import ActorSliceManager
from slice_manager.records import ENDED, RESERVATIONS, SLIVERS_OF
from slicex.clock import ManualClock
from slicex.errors import GeniError, SearchFailed, Unavailable, VlanUnavailable
from slicex.store.sqlite_store import SqliteStore
from slicex.term import Term
from tests.factories import request_rspec, three_node_lan, vm

SLICE = "urn:publicid:IDN+t.org+slice+s1"
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
SUB = default_substrate("t.org")
MIN = timedelta(minutes=1)


class Flaky:
    """An actor proxy that can be switched off (the actor is down: UNAVAILABLE)."""

    def __init__(self, actor, only: tuple[str, ...] = ()):
        self.actor = actor
        self.down = False
        self.only = only  # the methods that fail while down (all if empty)

    def __getattr__(self, name):
        attr = getattr(self.actor, name)
        if not callable(attr) or name in ("policy", "name"):
            return attr

        def call(*a, **kw):
            if self.down and (not self.only or name in self.only):
                raise Unavailable(f"{name}: actor at https://127.0.0.1:9/ is not answering")
            return attr(*a, **kw)
        return call


@pytest.fixture
def world(tmp_path):
    store = SqliteStore(str(tmp_path / "s.db"))
    clock = ManualClock()
    asm = embedded_slice_manager(store, SUB, EmulatedDriver(SUB), keys=ActorKeys.given(KEY))
    return store, clock, asm


def everything_released(store, asm) -> None:
    assert store.all_claims() == {}, "claims left"
    assert store.scan(LEASES) == [], "leases left"
    assert asm.broker.calendar.bookings == {}, "broker bookings left"
    assert asm.records() == [], "reservations left"
    assert store.scan(SLIVERS_OF) == [], "index entries left"


def test_allocate_provision_start_delete_a_lan(world):
    store, clock, asm = world
    now = clock.now()
    slivers = asm.allocate(SLICE, "o", parse_request(three_node_lan()), now + 10 * MIN, now)
    assert {s.allocation_state for s in slivers} == {sm.ALLOCATED} and len(slivers) == 4
    link = next(s for s in slivers if s.kind == "link")
    tag = link.details["vlan_tag"]
    assert tag is not None and any(k.endswith(f":{tag}") for k in link.details["keys"])
    nodes = [rec for rec in asm.records(SLICE) if rec.kind == "node"]
    assert all(rec.r.depends_on == (link.urn,) for rec in nodes)  # nodes redeem after their link
    claimed = set(store.all_claims())
    assert claimed == {k for s in slivers for k in s.details["keys"]}

    provisioned = asm.provision([s.urn for s in slivers], now + timedelta(hours=2), [{"urn": "u+alice", "keys": ["k"]}],
                                now)
    assert {(s.allocation_state, s.operational_state) for s in provisioned} == {(sm.PROVISIONED, sm.NOTREADY)}
    assert all(s.expires == now + timedelta(hours=2) for s in provisioned)
    node = next(s for s in provisioned if s.kind == "node")
    (iface,) = node.details["interfaces"].values()
    assert iface["vlan_tag"] == tag and iface["mac_address"] and node.details["logins"][0]["username"] == "alice"
    assert len(store.scan(LEASES)) == 4

    started = asm.perform([s.urn for s in provisioned], "geni_start", now, False, [])
    assert {s.operational_state for s in started if s.kind == "node"} == {sm.CONFIGURING}
    clock.advance(timedelta(minutes=5))
    assert {s.operational_state for s in asm.slivers(SLICE, clock.now())} == {sm.READY}

    deleted = asm.delete([s.urn for s in slivers], clock.now())
    assert {s.allocation_state for s in deleted} == {sm.UNALLOCATED}
    everything_released(store, asm)
    assert asm.slivers(SLICE, clock.now()) == [] and asm.request_of(SLICE) == []


def test_renew_extends_ticket_and_lease_and_refusal_keeps_the_old_end(world):
    store, clock, asm = world
    now = clock.now()
    slivers = asm.allocate(SLICE, "o", parse_request(request_rspec([vm("a")])), now + 10 * MIN, now)
    urns = [s.urn for s in slivers]
    asm.provision(urns, now + timedelta(hours=1), [], now)
    (s,) = asm.renew(urns, now + timedelta(hours=5), now, False)
    rec = asm.records(SLICE)[0]
    assert s.expires == now + timedelta(hours=5) and rec.ticket.end == rec.lease.end == now + timedelta(hours=5)
    assert (rec.r.state, rec.ticket.sequence) == (rs.ACTIVE, 3)  # issued, extended at provision, renewed
    # an advance reservation of the same units from hour 6 stops a renewal past it
    host = SUB.hosts[0]
    assert any(u.startswith(f"core:{host.component_id}:") for u in rec.ticket.units)
    whole_host = [vm(f"adv{i}", component_id=host.component_id) for i in range(host.cores)]  # a core each
    asm.broker.place("other", demands_of(parse_request(request_rspec(whole_host)), {n["client_id"]: n["client_id"]
                                                                                    for n in whole_host}),
                     Term(now + timedelta(hours=6), now + timedelta(hours=7)), now)
    with pytest.raises(GeniError, match="cannot renew a .* promised to someone else"):
        asm.renew(urns, now + timedelta(hours=8), now, False)
    (s,) = asm.slivers(SLICE, now)
    assert s.expires == now + timedelta(hours=5) and "refused" in s.error


def test_a_tag_taken_meanwhile_is_refused_by_the_broker_with_its_reason(world):
    store, clock, asm = world
    now = clock.now()
    sw = SUB.switches[0].component_id
    req = request_rspec([vm("a", ifaces=["a:if0"]), vm("b", ifaces=["b:if0"])],
                        [{"client_id": "l", "ifaces": ["a:if0", "b:if0"], "vlantag": "1042"}])
    store.claim(f"vlan:{sw}:1042", "someone-else")  # another AM worker's broker promised it
    with pytest.raises(VlanUnavailable, match="VLAN 1042") as err:
        asm.allocate(SLICE, "o", parse_request(req), now + 10 * MIN, now)
    assert err.value.code == 24
    assert store.all_claims() == {f"vlan:{sw}:1042": "someone-else"} and asm.records() == []


def test_broker_down_is_unavailable_and_leaves_nothing(tmp_path):
    store = SqliteStore(str(tmp_path / "s.db"))
    clock = ManualClock()
    real = embedded_slice_manager(store, SUB, EmulatedDriver(SUB), keys=ActorKeys.given(KEY))
    broker = Flaky(real.broker, only=("place", "relinquish"))
    asm = ActorSliceManager(store, SUB, broker, real.authority)
    broker.down = True
    with pytest.raises(Unavailable, match="place: actor .* not answering"):
        asm.allocate(SLICE, "o", parse_request(request_rspec([vm("a")])), clock.now() + 10 * MIN, clock.now())
    broker.down = False
    asm.reap(clock.now())
    everything_released(store, real)


def test_releases_that_cannot_be_delivered_are_retried_until_they_are(tmp_path):
    store = SqliteStore(str(tmp_path / "s.db"))
    clock = ManualClock()
    real = embedded_slice_manager(store, SUB, EmulatedDriver(SUB), keys=ActorKeys.given(KEY))
    broker = Flaky(real.broker)
    asm = ActorSliceManager(store, SUB, broker, real.authority)
    now = clock.now()
    slivers = asm.allocate(SLICE, "o", parse_request(three_node_lan()), now + 10 * MIN, now)
    asm.provision([s.urn for s in slivers], now + timedelta(hours=1), [], now)
    broker.down = True
    asm.delete([s.urn for s in slivers], now)
    assert asm.slivers(SLICE, now) == []  # gone for the user at once
    assert store.scan(LEASES) == []  # the authority closed its leases
    assert store.all_claims() != {}  # the broker still holds the units: it did not hear the relinquish
    broker.down = False
    asm.reap(now + MIN)
    everything_released(store, real)


def test_the_term_end_releases_everything(world):
    store, clock, asm = world
    now = clock.now()
    slivers = asm.allocate(SLICE, "o", parse_request(three_node_lan()), now + 10 * MIN, now)
    asm.provision([s.urn for s in slivers], now + timedelta(hours=1), [], now)
    assert asm.reap(now + 59 * MIN) == []
    assert len(asm.reap(now + timedelta(hours=1))) == 4
    everything_released(store, asm)


def test_a_failure_while_provisioning_says_why_and_frees_the_sliver(tmp_path):
    class Broken(EmulatedDriver):
        def provisioned(self, kind, now):
            if kind == "node":
                raise RuntimeError("hypervisor on pc1 refused: out of disk")
            return super().provisioned(kind, now)

    store = SqliteStore(str(tmp_path / "s.db"))
    clock = ManualClock()
    asm = embedded_slice_manager(store, SUB, Broken(SUB), keys=ActorKeys.given(KEY))
    now = clock.now()
    slivers = asm.allocate(SLICE, "o", parse_request(request_rspec([vm("a")])), now + 10 * MIN, now)
    with pytest.raises(GeniError, match="out of disk"):
        asm.provision([s.urn for s in slivers], now + timedelta(hours=1), [], now)
    (s,) = asm.slivers(SLICE, now)
    assert s.operational_state == sm.FAILED and "out of disk" in s.error and "authority" in s.error
    assert store.all_claims() == {} and store.scan(LEASES) == []
    asm.delete([s.urn], now)
    everything_released(store, asm)


def test_one_delete_closes_the_nodes_before_their_link_whatever_order_it_names_them(tmp_path):
    """A cloud refuses to delete a network while ports are on it (Neutron's 409 "ports still in use", seen on
    the all-in-one OpenStack): the link's close goes after the closes of the nodes deleted with it."""
    from authority.actor import EmulatedAdapter
    from slicex.errors import ServerError

    class LikeNeutron(EmulatedAdapter):
        nodes: set[str] = set()

        def create(self, spec, now):
            if spec.kind == "node":
                self.nodes.add(spec.id)
            return super().create(spec, now)

        def destroy(self, spec, status, now):
            if spec.kind == "link" and self.nodes:
                raise ServerError(f"network {spec.client_id}: ports still in use (409)")
            self.nodes.discard(spec.id)

    store = SqliteStore(str(tmp_path / "s.db"))
    now = ManualClock().now()
    asm = embedded_slice_manager(store, SUB, LikeNeutron(EmulatedDriver(SUB)), keys=ActorKeys.given(KEY))
    slivers = asm.allocate(SLICE, "o", parse_request(three_node_lan()), now + 10 * MIN, now)
    asm.provision([s.urn for s in slivers], now + timedelta(hours=1), [], now)
    link_first = sorted((s.urn for s in slivers), key=lambda u: next(s.kind for s in slivers if s.urn == u) != "link")
    asm.delete(link_first, now)
    everything_released(store, asm)


def test_a_new_slice_manager_on_the_same_store_sees_everything(world):
    store, clock, asm = world
    now = clock.now()
    slivers = asm.allocate(SLICE, "o", parse_request(three_node_lan()), now + 10 * MIN, now)
    again = ActorSliceManager(store, SUB, asm.broker, asm.authority)
    assert sorted(s.urn for s in again.slivers(SLICE, now)) == sorted(s.urn for s in slivers)
    with pytest.raises(SearchFailed):
        again.delete(["urn:publicid:IDN+t.org+sliver+nope"], now)
    again.delete([s.urn for s in slivers], now)
    everything_released(store, asm)


def test_a_slice_is_read_through_its_index_and_older_stores_are_indexed_at_start(world):
    """Status/Describe read one slice's records, not every slice's; a store written before the index
    existed (records, no index entries) is indexed when a slice manager starts on it."""
    store, clock, asm = world
    now = clock.now()
    other = "urn:publicid:IDN+t.org+slice+s10"  # its name starts with SLICE's: the index key ends at "#"
    mine = asm.allocate(SLICE, "o", parse_request(request_rspec([vm("a")])), now + 10 * MIN, now)
    theirs = asm.allocate(other, "o", parse_request(request_rspec([vm("b")])), now + 10 * MIN, now)
    assert [rec.id for rec in asm.records(SLICE)] == [mine[0].urn]
    assert [rec.id for rec in asm.records(other)] == [theirs[0].urn]
    for doc in store.scan(SLIVERS_OF):
        store.delete(SLIVERS_OF, f"{doc['slice_urn']}#{doc['id']}")
    assert asm.records(SLICE) == []  # what an older store looks like to the index
    time_index(store)  # the migration step (deployment/migrations.py) `slicex up` runs
    again = ActorSliceManager(store, SUB, asm.broker, asm.authority)
    assert [s.urn for s in again.slivers(SLICE, now)] == [mine[0].urn]
    store.delete(RESERVATIONS, mine[0].urn)  # a crash between the record's delete and its index entry's
    assert again.records(SLICE) == [] and [rec.id for rec in again.records(other)] == [theirs[0].urn]



def test_allocate_and_delete_write_nothing_they_need_not(world):
    """Each write is a transaction of its own: Delete removed a sliver's record and index entry twice (after its
    messages, and at its end), and Allocate and Delete deleted the slice's "why it ended" note that is there only
    when its slivers ended by themselves."""
    store, clock, asm = world
    writes = []
    real_delete, real_put = store.delete, store.put
    store.delete = lambda table, key: writes.append(("delete", table)) or real_delete(table, key)
    store.put = lambda table, key, doc, **kw: writes.append(("put", table)) or real_put(table, key, doc, **kw)
    now = clock.now()
    slivers = asm.allocate(SLICE, "o", parse_request(request_rspec([vm("a")])), now + 10 * MIN, now)
    asm.delete([s.urn for s in slivers], now)
    assert writes.count(("delete", RESERVATIONS)) == 1 and writes.count(("delete", SLIVERS_OF)) == 1
    assert ("delete", ENDED) not in writes
    everything_released(store, asm)
