"""The broker actor: tickets under a policy, labels, advance reservations, restarts, and never a unit or a
tag twice."""

from __future__ import annotations

import os
import threading
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.broker import EXPIRY_GRACE, Broker, Demand
from broker.policy import BestFit, WorstFit
from protocol.delegation import Delegation, LabelSet, Pool
from slicex.errors import (
    BadArgs,
    Busy,
    CredentialInvalid,
    InsufficientNodes,
    Refused,
    SearchFailed,
    VlanUnavailable,
)
from slicex.store.sqlite_store import SqliteStore
from slicex.term import Term
from slicex.ticket import SignedReclaim, Ticket, verify_ticket

T0 = datetime(2030, 1, 1, tzinfo=UTC)
H = timedelta(hours=1)
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
PEM = KEY.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
REDIS_URL = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/15")


def delegation(hosts=(("pc1", 8), ("pc2", 4), ("pc3", 2))) -> Delegation:
    pools = []
    for h, cores in hosts:
        pools.append(Pool(f"core:{h}", "core", tuple(f"core:{h}:{i}" for i in range(cores)), h))
        pools.append(Pool(f"mem:{h}", "mem", tuple(f"mem:{h}:{i}" for i in range(cores * 2)), h))
    labels = (LabelSet("vlan:sw1", ((100, 104),)), LabelSet("vlan:sw2", ((103, 120),)))
    return Delegation("auth", "b", tuple(pools), labels)


def broker(store=None, policy=None, d=None) -> Broker:
    b = Broker("b", store or SqliteStore(":memory:"), KEY, policy=policy, authority="auth")
    b.accept(d or delegation())
    return b


def vm(cores=1, mem=2, what="node n1") -> Demand:
    return Demand(amounts=(("core", cores), ("mem", mem)), what=what)


def one(tickets) -> Ticket:
    (t,) = tickets.values()
    return t


def test_a_vm_is_placed_on_one_host_and_the_ticket_is_signed():
    b = broker()
    t = one(b.issue("sm", {"r1": vm(2, 3)}, Term(T0, T0 + H), T0))
    assert set(t.units) == {"core:pc1:0", "core:pc1:1", "mem:pc1:0", "mem:pc1:1", "mem:pc1:2"}
    assert (t.sequence, t.holder, t.reservation, t.authority) == (1, "sm", "r1", "auth")
    verify_ticket(t, KEY.public_key())
    with pytest.raises(CredentialInvalid):
        verify_ticket(replace(t, units=t.units[:1]), KEY.public_key())
    assert b.store.all_claims() == {u: t.group for u in t.units}


@pytest.mark.parametrize("policy,host", [(None, "pc1"), (BestFit(), "pc3"), (WorstFit(), "pc1")])
def test_the_policy_chooses_the_host(policy, host):
    t = one(broker(policy=policy).issue("sm", {"r": vm(1, 2)}, Term(T0, T0 + H), T0))
    assert all(u.split(":")[1] == host for u in t.units)


def test_best_fit_keeps_the_big_host_for_the_big_request():
    b = broker(policy=BestFit())
    for i in range(3):
        b.issue("sm", {f"small{i}": vm(1, 1)}, Term(T0, T0 + H), T0)
    big = one(b.issue("sm", {"big": vm(8, 8)}, Term(T0, T0 + H), T0))
    assert {u.split(":")[1] for u in big.units} == {"pc1"}


def test_not_enough_anywhere_says_what_was_asked_and_what_is_free():
    b = broker()
    with pytest.raises(InsufficientNodes) as err:
        b.issue("sm", {"r": vm(9, 1, what="node big")}, Term(T0, T0 + H), T0)
    msg = err.value.message
    assert "broker b: node big: asked for 9 core + 1 mem on one host" in msg and "most free: 8 core" in msg
    assert b.store.all_claims() == {} and b.calendar.bookings == {}


def test_all_reservations_or_none():
    b = broker()
    with pytest.raises(InsufficientNodes):
        b.issue("sm", {"a": vm(2, 2), "b": vm(8, 2), "c": vm(8, 2)}, Term(T0, T0 + H), T0)
    assert b.store.all_claims() == {} and b.calendar.bookings == {}


def test_a_link_gets_one_tag_free_on_every_switch_it_crosses():
    b = broker()
    link = Demand(label_sets=("vlan:sw1", "vlan:sw2"), what="link lan0")
    t1 = one(b.issue("sm", {"l1": link}, Term(T0, T0 + H), T0))
    t2 = one(b.issue("sm", {"l2": link}, Term(T0, T0 + H), T0))
    assert (t1.label("vlan"), t2.label("vlan")) == (103, 104)
    assert set(t1.units) == {"vlan:sw1:103", "vlan:sw2:103"}
    with pytest.raises(VlanUnavailable, match="none is free on all of them"):
        b.issue("sm", {"l3": link}, Term(T0, T0 + H), T0)
    t3 = one(b.issue("sm", {"l3": Demand(label_sets=("vlan:sw2",), suggested_label=110)}, Term(T0, T0 + H), T0))
    assert t3.label("vlan") == 110


def test_an_imported_tag_is_taken_exactly_or_refused_with_the_reason():
    b = broker()
    b.issue("sm", {"p": Demand(label_sets=("vlan:sw2",), label=105)}, Term(T0, T0 + H), T0)
    with pytest.raises(VlanUnavailable, match="vlan 105 .* promised to another reservation"):
        b.issue("sm", {"c": Demand(label_sets=("vlan:sw2",), label=105)}, Term(T0, T0 + H), T0)
    with pytest.raises(VlanUnavailable, match="outside the delegated range"):
        b.issue("sm", {"c": Demand(label_sets=("vlan:sw1",), label=200)}, Term(T0, T0 + H), T0)
    with pytest.raises(Refused, match="not delegated"):
        b.issue("sm", {"c": Demand(label_sets=("vlan:nowhere",))}, Term(T0, T0 + H), T0)


def test_a_count_ticket_promises_a_number_and_names_no_unit():
    b = broker()
    t = one(b.issue("sm", {"r": Demand(amounts=(("core", 3),), by_count=True)}, Term(T0, T0 + H), T0))
    assert (t.units, t.count, t.resource_type) == ((), 3, "core:pc1")
    assert len(b.store.all_claims()) == 3  # the broker still accounts for three units
    with pytest.raises(BadArgs, match="one resource type"):
        b.issue("sm", {"r2": Demand(amounts=(("core", 1), ("mem", 1)), by_count=True)}, Term(T0, T0 + H), T0)


def test_advance_reservation_claims_its_units_when_it_starts():
    b = broker(d=delegation((("pc1", 2),)))
    later = Term(T0 + 5 * H, T0 + 6 * H)
    adv = one(b.issue("sm", {"adv": vm(2, 4)}, later, T0))
    assert b.store.all_claims() == {}  # nothing is taken before the term starts
    now = one(b.issue("sm", {"now": vm(2, 4)}, Term(T0, T0 + 5 * H), T0))  # fits before it
    with pytest.raises(InsufficientNodes):
        b.extend_ticket(now, T0 + 5 * H + timedelta(minutes=1), now=T0)
    with pytest.raises(InsufficientNodes):
        b.issue("sm", {"overlap": vm(1, 1)}, Term(T0 + 4 * H, T0 + 7 * H), T0)
    b.relinquish(now)
    assert b.tick(T0 + 5 * H)["started"] == [adv.id]
    assert set(b.store.all_claims()) == set(adv.units)


def test_extend_and_shorten_renumber_the_ticket():
    b = broker()
    t = one(b.issue("sm", {"r": vm()}, Term(T0, T0 + H), T0))
    longer = b.extend_ticket(t, T0 + 3 * H, now=T0)
    assert (longer.sequence, longer.end, longer.units) == (2, T0 + 3 * H, t.units)
    assert b.extend_ticket(t, T0 + 3 * H, now=T0) == longer  # asked again after a lost answer
    shorter = b.extend_ticket(longer, T0 + 2 * H, now=T0)
    assert shorter.sequence == 3
    with pytest.raises(BadArgs):
        b.extend_ticket(shorter, T0 - H)
    b.relinquish(shorter)
    with pytest.raises(SearchFailed, match="not held any more"):
        b.extend_ticket(shorter, T0 + 4 * H)


def test_asking_again_with_the_same_group_returns_the_same_tickets():
    b = broker()
    first = b.issue("sm", {"r1": vm(), "r2": vm()}, Term(T0, T0 + H), T0, group="g1")
    again = b.issue("sm", {"r1": vm(), "r2": vm()}, Term(T0, T0 + H), T0, group="g1")
    assert first == again and len(b.store.all_claims()) == 6


def test_relinquish_group_gives_back_what_a_lost_answer_held():
    b = broker()
    b.issue("sm", {"r1": vm()}, Term(T0, T0 + H), T0, group="g")
    b.store.claim("core:pc2:0", "g")  # a crashed earlier attempt of the same group
    assert b.relinquish_group("g", T0) == 4
    assert b.store.all_claims() == {} and b.calendar.bookings == {}


def test_a_restarted_broker_rebuilds_its_calendar():
    store = SqliteStore(":memory:")
    b = broker(store)
    t = one(b.issue("sm", {"adv": vm(8, 16)}, Term(T0 + 2 * H, T0 + 3 * H), T0))
    again = Broker("b", store, KEY)
    assert set(again.calendar.bookings) == {t.id}
    with pytest.raises(InsufficientNodes):
        again.issue("sm", {"x": Demand(units=(), amounts=(("core", 8),), bins=("pc1",))},
                    Term(T0 + 2 * H, T0 + 4 * H), T0)


def test_units_released_behind_the_brokers_back_are_not_held_against_new_tickets():
    b = broker()
    t = one(b.ticket("sm", {"r": ["core:pc1:0"]}, T0, T0 + H))
    b.store.release("core:pc1:0", t.group)  # a slice manager that releases in the store itself
    assert one(b.ticket("sm", {"r2": ["core:pc1:0"]}, T0, T0 + H)).units == ("core:pc1:0",)


def test_tickets_nobody_relinquished_are_dropped_after_their_end_and_a_grace():
    b = broker()
    one(b.issue("sm", {"r": vm()}, Term(T0, T0 + H), T0))
    assert b.tick(T0 + H)["expired"] == []
    assert len(b.tick(T0 + H + EXPIRY_GRACE)["expired"]) == 1 and b.store.all_claims() == {}


def test_reclaimed_pools_are_refused_and_come_back_with_their_definition():
    b = broker()
    free, busy = b.reclaim(SignedReclaim("auth", b.name, T0, ("core:pc3", "mem:pc3")), T0)
    assert (free, busy) == (["core:pc3", "mem:pc3"], [])
    with pytest.raises(Refused, match="not in the inventory"):
        b.ticket("sm", {"r": ["core:pc3:0"]}, T0, T0 + H)
    b.accept(delegation().only(["core:pc3", "mem:pc3"]))
    t = one(b.issue("sm", {"r": Demand(amounts=(("core", 2),), bins=("pc3",))}, Term(T0, T0 + H), T0))
    assert t.units == ("core:pc3:0", "core:pc3:1")


def test_reclaiming_a_promised_host_drains_it():
    b = broker()
    one(b.issue("sm", {"r": Demand(amounts=(("core", 1),), bins=("pc2",))}, Term(T0, T0 + H), T0))
    free, busy = b.reclaim(SignedReclaim("auth", b.name, T0, ("core:pc2",)), T0)
    assert (free, busy) == ([], ["core:pc2"])
    with pytest.raises(InsufficientNodes):
        b.issue("sm", {"r2": Demand(amounts=(("core", 1),), bins=("pc2",))}, Term(T0, T0 + H), T0)


# ---- properties ---------------------------------------------------------------------------------------------
OPS = st.lists(st.one_of(
    st.tuples(st.just("vm"), st.integers(1, 4), st.integers(1, 6), st.integers(0, 3), st.integers(1, 4)),
    st.tuples(st.just("link"), st.sampled_from([("vlan:sw1",), ("vlan:sw2",), ("vlan:sw1", "vlan:sw2")]),
              st.none(), st.integers(0, 3), st.integers(1, 4)),
    st.tuples(st.just("relinquish"), st.integers(0, 30), st.none(), st.none(), st.none()),
    st.tuples(st.just("extend"), st.integers(0, 30), st.integers(1, 6), st.none(), st.none()),
    st.tuples(st.just("tick"), st.none(), st.none(), st.none(), st.none()),
    st.tuples(st.just("restart"), st.none(), st.none(), st.none(), st.none())), max_size=30)


@settings(max_examples=60, deadline=None)
@given(OPS)
def test_never_over_allocates_never_a_tag_twice_and_closing_everything_frees_everything(ops):
    store = SqliteStore(":memory:")
    b = broker(store)
    now = T0
    live: dict[str, Ticket] = {}
    for n, (op, a, c, start, length) in enumerate(ops):
        try:
            if op == "vm":
                t = one(b.issue("sm", {f"r{n}": vm(a, c)}, Term(now + start * H, now + (start + length) * H), now))
                live[t.id] = t
            elif op == "link":
                t = one(b.issue("sm", {f"r{n}": Demand(label_sets=a)},
                                Term(now + start * H, now + (start + length) * H), now))
                live[t.id] = t
            elif op == "relinquish" and live:
                t = live.pop(list(live)[a % len(live)])
                b.relinquish(t, now)
            elif op == "extend" and live:
                tid = list(live)[a % len(live)]
                try:
                    live[tid] = b.extend_ticket(live[tid], live[tid].end + c * H, now=now)
                except SearchFailed:  # only a ticket whose term is over may have been given to someone else
                    assert live.pop(tid).end <= now
            elif op == "tick":
                now += H
                b.tick(now)
                live = {tid: t for tid, t in live.items() if t.end + EXPIRY_GRACE > now}
            elif op == "restart":
                b = Broker("b", store, KEY)
        except (InsufficientNodes, VlanUnavailable, Busy):
            pass
        tickets = list(live.values())
        for i, t1 in enumerate(tickets):  # no unit (cores, memory, tags) in two overlapping tickets
            for t2 in tickets[i + 1:]:
                if t1.term.overlaps(t2.term):
                    assert not set(t1.units) & set(t2.units), f"{t1.id} and {t2.id} share units"
        for p in b.calendar.pools.values():  # never more than the pool holds, at any moment
            for k in range(8):
                q = Term(now + k * H, now + (k + 1) * H)
                assert sum(1 for t in tickets for u in t.units if u in p.units and t.term.overlaps(q)) <= len(p.units)
        current = {u: t.group for t in tickets if t.start <= now < t.end for u in t.units}
        claims = store.all_claims()
        assert {u: claims.get(u) for u in current} == current  # tickets in their term hold their claims
        for u, g in claims.items():  # and nothing else is claimed but units of tickets just ended
            assert u in current or any(t.group == g and u in t.units and t.end <= now for t in tickets)
    for t in list(live.values()):
        b.relinquish(t, now)
    assert store.all_claims() == {} and b.calendar.bookings == {}


def test_two_brokers_on_one_redis_never_give_a_tag_twice():
    """Two broker processes (here: two objects, each with its own connection) sharing a Redis race for the
    same five tags from several threads."""
    from slicex.store.redis_store import RedisStore

    prefix = f"brk-{uuid.uuid4().hex[:8]}"
    stores = [RedisStore(REDIS_URL, prefix=prefix) for _ in range(2)]
    d = Delegation("auth", "b", (), (LabelSet("vlan:sw1", ((100, 104),)),))
    brokers = [broker(s, d=d) for s in stores]
    got: list[Ticket] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        for i in range(6):
            try:
                t = one(brokers[k % 2].issue("sm", {f"w{k}-{i}": Demand(label_sets=("vlan:sw1",))},
                                             Term(T0, T0 + H), T0))
            except (VlanUnavailable, Busy):
                continue
            with lock:
                got.append(t)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tags = [t.label("vlan") for t in got]
    assert len(tags) == len(set(tags)) == 5
    assert stores[0].all_claims() == {f"vlan:sw1:{t.label('vlan')}": t.group for t in got}
    stores[0].flush()


def test_a_ticket_request_arriving_after_its_holder_relinquished_it_is_refused_and_takes_nothing():
    """A slice manager whose ticket call timed out relinquishes the group; the broker may see the request
    only afterwards. Found by tests/integration/test_outages.py: the late ticket held its units until expiry."""
    b = broker()
    b.relinquish(Ticket("g1/r1", "b", "sm", "r1", (), T0, T0), T0)
    with pytest.raises(Refused, match="relinquished by its holder"):
        b.issue("sm", {"r1": vm()}, Term(T0, T0 + H), T0, group="g1")
    b.relinquish_group("g2", T0)
    with pytest.raises(Refused):
        b.issue("sm", {"r9": vm()}, Term(T0, T0 + H), T0, group="g2")
    assert b.store.all_claims() == {}
    b.tick(T0 + 2 * H)  # the broker forgets after RELINQUISHED_KEPT; the group could be asked again
    assert b.issue("sm", {"r1": vm()}, Term(T0 + 2 * H, T0 + 3 * H), T0 + 2 * H, group="g1")
