"""An authority's messages to its broker (delegations and reclaim orders) are signed with its key and numbered;
the broker applies them in that order and runs on its own clock.

The attacks: a caller that can reach the broker (the slice manager's identity, or anyone who read the signed
documents the broker hands out) sends an old delegation again after the host it names went into maintenance,
or an old reclaim order after the host came back; it sends a reclaim order the authority never signed; it
passes a `now` a day ahead so that everyone's promises look ended. Each is refused (or has no effect) and
changes nothing."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from msgspec.structs import replace

from authority.actor import NUMBERED, Authority
from broker.broker import DELEGATIONS, OUT_OF_SERVICE, Broker
from protocol.messages import Demands, demands_of
from resources import export_substrate
from rspec.request import parse_request
from rspec.substrate import default_substrate
from slicex.clock import ManualClock
from slicex.codec import decode, encode
from slicex.errors import BadArgs, CredentialInvalid, InsufficientNodes, Refused
from slicex.store.sqlite_store import SqliteStore
from slicex.term import Term
from slicex.ticket import (
    SignedDelegation,
    SignedReclaim,
    sign_delegation,
    sign_reclaim,
    verify_delegation,
    verify_reclaim,
)
from tests.factories import request_rspec, vm

SUB = default_substrate("t.org")
AUTH = "urn:publicid:IDN+t.org+authority+am"
T0 = datetime(2030, 1, 1, tzinfo=UTC)
HOST = SUB.hosts[0].component_id


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


AUTHORITY_KEY, BROKER_KEY, OTHER_KEY = _key(), _key(), _key()


def broker(store: SqliteStore, clock: ManualClock | None = None) -> Broker:
    return Broker("broker", store, BROKER_KEY, authority=AUTH, authority_keys={AUTH: AUTHORITY_KEY.public_key()},
                  clock=clock)


def authority(store: SqliteStore) -> Authority:
    return Authority(AUTH, None, {}, store=store, key=AUTHORITY_KEY, inventory=export_substrate(SUB, AUTH, "broker"))


def state(b: Broker) -> tuple:
    return (sorted(map(str, b.store.scan(DELEGATIONS))), b.version(), sorted(b.calendar.pools), b.delegated(),
            sorted(b.calendar.draining))


def one_vm(name: str = "n1", host: str = "") -> dict:
    return demands_of(parse_request(request_rspec([vm(name, component_id=host)] if host else [vm(name)])),
                      {name: name})


BARE = next(h.component_id for h in SUB.hosts if h.exclusive)


def one_bare_metal(name: str) -> Demands:
    """One bare-metal node, on BARE."""
    return demands_of(parse_request(request_rspec([vm(name, sliver_type="raw-pc", component_id=BARE)])),
                      {name: name})


class Wire:
    """The broker as seen by an eavesdropper: every message the authority sends it is kept."""

    def __init__(self, broker: Broker):
        self.broker = broker
        self.name = broker.name
        self.sent: list[SignedDelegation | SignedReclaim] = []

    def accept(self, delegation):
        self.sent.append(delegation)
        return self.broker.accept(delegation)

    def reclaim(self, order, now=None):
        self.sent.append(order)
        return self.broker.reclaim(order, now)

    def reclaimed(self, name):
        return self.broker.reclaimed(name)


def test_messages_are_numbered_upwards_across_restarts_and_processes_on_one_store():
    store = SqliteStore(":memory:")
    b = broker(store)
    wire = Wire(b)
    first, second = authority(store), authority(store)  # e.g. the authority actor and `slicex maintenance`
    first.export_to(wire)
    pools = first.inventory.on(HOST)
    second.reclaim(wire, pools, T0)
    first.delegate(wire, pools)
    numbers = [m.sequence for m in wire.sent]
    assert numbers == sorted(numbers) and len(set(numbers)) == 3 and numbers[0] > 0
    assert store.get(NUMBERED, f"{AUTH}|broker")["sequence"] == numbers[-1]
    for m in wire.sent:  # each is the authority's own signed document
        (verify_reclaim if isinstance(m, SignedReclaim) else verify_delegation)(m, AUTHORITY_KEY.public_key())


def test_a_number_is_above_the_last_even_when_the_wall_clock_went_back(monkeypatch):
    store = SqliteStore(":memory:")
    a = authority(store)
    a.export_to(broker(store))
    last = store.get(NUMBERED, f"{AUTH}|broker")["sequence"]
    monkeypatch.setattr("authority.actor.time.time", lambda: 1_000.0)  # the clock stepped back to 1970
    again = authority(store)  # a restart
    again.export_to(broker(store))
    assert store.get(NUMBERED, f"{AUTH}|broker")["sequence"] == last + 1


def delegated_over_a_wire() -> tuple[Broker, Wire, Authority]:
    """A broker, the wire to it, and an authority that delegated its whole inventory over that wire."""
    store = SqliteStore(":memory:")
    b = broker(store)
    wire = Wire(b)
    a = authority(store)
    a.export_to(wire)
    return b, wire, a


def test_an_old_delegation_replayed_after_maintenance_is_refused_and_changes_nothing():
    b, wire, a = delegated_over_a_wire()
    old_grant = wire.sent[0]
    pools = a.inventory.on(HOST)
    free, busy = a.reclaim(wire, pools, T0)
    assert free == pools and not busy
    before = state(b)
    with pytest.raises(Refused, match=r"delegation number \d+ .* is older than its number \d+, already applied"):
        b.accept(old_grant)  # would put the host under maintenance back into the inventory
    assert state(b) == before
    assert not set(pools) & set(b.delegated())
    with pytest.raises(InsufficientNodes):  # nothing can be placed on it
        b.place("sm", one_vm(host=HOST), Term(T0, T0 + timedelta(hours=1)), T0)


def test_an_old_reclaim_order_replayed_after_the_host_came_back_is_refused_and_changes_nothing():
    b, wire, a = delegated_over_a_wire()
    pools = a.inventory.on(HOST)
    a.reclaim(wire, pools, T0)
    old_order = wire.sent[-1]
    a.delegate(wire, pools)  # maintenance ends
    before = state(b)
    with pytest.raises(Refused, match=r"reclaim order number \d+ .* is older than"):
        b.reclaim(old_order, T0)
    assert state(b) == before and set(pools) <= set(b.delegated())
    assert list(b.place("sm", one_vm(host=HOST), Term(T0, T0 + timedelta(hours=1)), T0).tickets) == ["n1"]


def test_the_latest_message_sent_again_changes_nothing_and_is_not_an_error():
    b, wire, a = delegated_over_a_wire()
    before = state(b)
    b.accept(wire.sent[-1])  # a retry after a lost answer
    assert state(b) == before
    pools = a.inventory.on(HOST)
    assert a.reclaim(wire, pools, T0) == (pools, [])
    before = state(b)
    assert b.reclaim(wire.sent[-1], T0) == (pools, [])
    assert state(b) == before


def test_two_processes_of_one_authority_racing_at_start_both_succeed():
    """Two AM workers on one store start at once: each grants the whole inventory; the one numbered lower
    may arrive second (or both got one number), and as it changes nothing it is taken as a resend."""
    store = SqliteStore(":memory:")
    b = broker(store)
    early, late = authority(store), authority(store)
    early_grant = early._grant(early.inventory, "broker")
    late_grant = late._grant(late.inventory, "broker")
    assert early_grant.sequence < late_grant.sequence  # the second read the first's number from the store
    b.accept(late_grant)
    before = state(b)
    b.accept(early_grant)
    assert state(b) == before
    same_number = sign_delegation(replace(early_grant, sequence=late_grant.sequence, signature=""), AUTHORITY_KEY)
    b.accept(same_number)
    assert state(b) == before


def test_a_reclaim_order_the_authority_did_not_sign_is_refused_and_changes_nothing():
    store = SqliteStore(":memory:")
    b = broker(store)
    a = authority(store)
    a.export_to(b)
    pools = tuple(a.inventory.on(HOST))
    genuine = a._order(list(pools), "broker")
    before = state(b)
    forgeries = {
        "unsigned": (replace(genuine, signature=""), CredentialInvalid, "is not signed"),
        "signed by another key": (sign_reclaim(replace(genuine, signature=""), OTHER_KEY), CredentialInvalid,
                                  "not signed by authority"),
        "more names than signed": (replace(genuine, names=(*pools, "vlan:x")), CredentialInvalid, "or was altered"),
        "a later number than signed": (replace(genuine, sequence=genuine.sequence + 1), CredentialInvalid,
                                       "or was altered"),
        "for another broker": (sign_reclaim(replace(genuine, broker="broker2", signature=""), AUTHORITY_KEY),
                               Refused, "is for broker broker2"),
        "from an authority it does not know": (sign_reclaim(replace(genuine, authority="urn:publicid:IDN+evil+authority+am",
                                                                    signature=""), AUTHORITY_KEY),
                                               CredentialInvalid, "does not know authority"),
    }
    for what, (order, error, reason) in forgeries.items():
        with pytest.raises(error, match=re.escape(reason)):
            b.reclaim(order, T0)
        assert state(b) == before, what
    assert b.reclaim(genuine, T0) == (list(pools), [])


def test_a_reclaim_signature_does_not_make_a_delegation_nor_the_other_way():
    """The two documents sign different payloads ("kind": "reclaim"), so one cannot be passed off as the other."""
    store = SqliteStore(":memory:")
    a = authority(store)
    order = a._order(a.inventory.on(HOST), "broker")
    grant = a._grant(a.inventory.only(a.inventory.on(HOST)), "broker")
    as_grant = SignedDelegation(order.authority, order.broker, order.issued, grant.body, order.sequence,
                                order.signature)
    with pytest.raises(CredentialInvalid, match="or was altered"):
        verify_delegation(as_grant, AUTHORITY_KEY.public_key())
    as_order = SignedReclaim(grant.authority, grant.broker, grant.issued, tuple(order.names), grant.sequence,
                             grant.signature)
    with pytest.raises(CredentialInvalid, match="or was altered"):
        verify_reclaim(as_order, AUTHORITY_KEY.public_key())
    with pytest.raises(BadArgs, match="reclaim order: object missing required field names"):
        decode(encode(grant), SignedReclaim, "reclaim order")
    with pytest.raises(BadArgs, match="reclaim order.kind: invalid value 'delegation'"):
        decode({**encode(order), "kind": "delegation"}, SignedReclaim, "reclaim order")


@pytest.mark.parametrize("own_clock", [True, False])
def test_a_caller_cannot_move_the_brokers_clock(own_clock):
    """A broker with a clock (every deployment's) decides by it: a caller's `now` a day ahead neither makes a
    tick end another holder's promise nor gets that holder's units promised again. A broker without one (pure
    tests of the core) takes the caller's time, which is what the attack would exploit."""
    store = SqliteStore(":memory:")
    clock = ManualClock(T0)
    b = broker(store, clock if own_clock else None)
    authority(store).export_to(b)
    unit = f"node:{BARE}"
    hour = Term(T0, T0 + timedelta(hours=1))
    b.place("alice", one_bare_metal("r"), hour, T0, group="alice")
    ahead = T0 + timedelta(days=1)
    expired = b.tick(ahead)["expired"]
    if not own_clock:
        assert expired == ["alice/r"]
        b.place("mallory", one_bare_metal("r"), hour, ahead, group="mallory")
        assert store.owner_of(unit) == "mallory"
        return
    assert expired == []
    with pytest.raises(InsufficientNodes, match="bm1"):
        b.place("mallory", one_bare_metal("r"), hour, ahead, group="mallory")
    assert store.owner_of(unit) == "alice"
    clock.set(ahead)  # by its own clock alice's promise ended long ago
    assert b.tick(T0)["expired"] == ["alice/r"]
    assert store.owner_of(unit) is None


def test_a_caller_cannot_make_a_promise_look_like_an_advance_reservation():
    """An advance reservation is booked but its units are claimed in the store only when it starts. A caller
    whose `now` lies in the past would get today's units unclaimed, invisible to the other broker
    processes on the store: by the broker's own clock the promise starts now and is claimed."""
    store = SqliteStore(":memory:")
    b = broker(store, ManualClock(T0))
    authority(store).export_to(b)
    b.place("alice", one_bare_metal("r"), Term(T0, T0 + timedelta(hours=1)), T0 - timedelta(days=1), group="alice")
    assert store.owner_of(f"node:{BARE}") == "alice"


def test_a_host_another_broker_process_is_draining_takes_no_new_promises():
    """`slicex maintenance` over an embedded deployment's store, or another AM worker's broker, reclaims a host
    that has a sliver: it drains (no new promises) until that sliver ends. The AM's own broker, which loaded
    its calendar before, must see that in the store too, not place a new VM there."""
    store = SqliteStore(":memory:")
    ams = broker(store)
    authority(store).export_to(ams)
    term = Term(T0, T0 + timedelta(hours=1))
    ams.place("alice", one_vm("a", host=HOST), term, T0, group="alice")
    operators = broker(store)  # another process on the same store
    a = authority(store)
    free, busy = a.reclaim(operators, a.inventory.on(HOST), T0)
    assert busy and set(busy) <= set(a.inventory.on(HOST))
    with pytest.raises(InsufficientNodes):
        ams.place("bob", one_vm("b", host=HOST), term, T0, group="bob")
    assert list(ams.place("bob", one_vm("b"), term, T0, group="bob").tickets) == ["b"]  # elsewhere


# ---- what a placement reads: the small out-of-service copy, not the delegation record ------------------------
class _Counting:
    """A store that counts reads per table (and forwards everything)."""

    def __init__(self, store):
        self._store, self.reads = store, {}

    def get(self, table, key):
        self.reads[table] = self.reads.get(table, 0) + 1
        return self._store.get(table, key)

    def __getattr__(self, name):
        return getattr(self._store, name)


def test_a_placement_does_not_read_the_delegation_record_with_its_whole_substrate():
    """The record carries the substrate description and the signed documents (150 KB for the default
    substrate, growing with every host); a placement needs only what is reclaimed or draining."""
    b, wire, a = delegated_over_a_wire()
    a.reclaim(wire, a.inventory.on(HOST), T0)
    counting = _Counting(b.store)
    b.store = counting
    with pytest.raises(InsufficientNodes):  # the host under maintenance is still out, as the store says
        b.place("sm", one_vm(host=HOST), Term(T0, T0 + timedelta(hours=1)), T0)
    assert list(b.place("sm", one_vm("n2"), Term(T0, T0 + timedelta(hours=1)), T0).tickets) == ["n2"]
    assert DELEGATIONS not in counting.reads and counting.reads[OUT_OF_SERVICE] == 2


def test_a_store_written_before_the_out_of_service_copy_existed_is_read_from_the_record():
    b, wire, a = delegated_over_a_wire()
    other = broker(b.store)  # another process on the store: its calendar still holds the host
    a.reclaim(wire, a.inventory.on(HOST), T0)
    b.store.delete(OUT_OF_SERVICE, f"broker|{AUTH}")  # what an older version wrote: the record alone
    with pytest.raises(InsufficientNodes):
        other.place("sm", one_vm(host=HOST), Term(T0, T0 + timedelta(hours=1)), T0)


def test_a_process_dying_between_the_two_writes_leaves_names_out_of_service_never_in_until_repaired():
    """A delegation writes the record, then the copy; a reclaim the copy, then the record. Dying between the two
    leaves the copy more cautious than the record, and the authority's resend (which changes nothing in the
    record) brings the copy back in line."""
    b, wire, a = delegated_over_a_wire()
    pools = a.inventory.on(HOST)
    a.reclaim(wire, pools, T0)
    stale = b.store.get(OUT_OF_SERVICE, f"broker|{AUTH}")
    a.delegate(wire, pools)  # maintenance ends ...
    b.store.put(OUT_OF_SERVICE, f"broker|{AUTH}", stale)  # ... but the copy was not written: the process died
    other = broker(b.store)
    with pytest.raises(InsufficientNodes):  # cautious meanwhile: the host stays out
        other.place("sm", one_vm(host=HOST), Term(T0, T0 + timedelta(hours=1)), T0)
    b.accept(wire.sent[-1])  # the authority sends its delegation again (no answer reached it)
    assert list(broker(b.store).place("sm", one_vm(host=HOST), Term(T0, T0 + timedelta(hours=1)),
                                      T0).tickets) == ["n1"]
