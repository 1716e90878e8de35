"""The broker actor: tickets under a policy, labels, advance reservations, restarts, and never a unit or a
tag twice. Every request is a `place` message (what each node and link needs, protocol.messages.Demands) over
the substrate an authority delegated; the broker's policy picks hosts, units and tags."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.broker import EXPIRY_GRACE, RELINQUISHED, RELINQUISHED_KEPT, RELINQUISHED_SWEEP, Broker
from broker.policy import BestFit, WorstFit
from protocol.messages import PlaceAnswer, demands_of
from resources import export_substrate
from rspec.request import parse_request
from rspec.substrate import Substrate, VmSize, default_substrate
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
from tests.factories import request_rspec, vm

T0 = datetime(2030, 1, 1, tzinfo=UTC)
H = timedelta(hours=1)
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
AUTH = "urn:publicid:IDN+t.org+authority+am"
REDIS_URL = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/15")
BASE = default_substrate("t.org")
HOUR = Term(T0, T0 + H)


def substrate(cores: Sequence[int] = (2, 4, 8), tags: tuple[tuple[int, int], ...] = ((1000, 1004),)) -> Substrate:
    """VM hosts pc1, pc2, ... with these cores (2 GB of memory per core), the bare-metal nodes, one switch with
    these tags, and a VM size per core count (`c<n>`: n cores, 2 GB)."""
    vm_hosts = [h for h in BASE.hosts if not h.exclusive]
    hosts = [replace(h, cores=c, memory_mb=c * 2048, disk_gb=0) for h, c in zip(vm_hosts, cores, strict=False)]
    return replace(BASE, hosts=tuple(hosts) + tuple(h for h in BASE.hosts if h.exclusive),
                   switches=tuple(replace(s, vlan_range=tags) for s in BASE.switches),
                   vm_sizes=tuple(VmSize(f"c{n}", n, 2048) for n in range(1, 10)))


def urn(host: str) -> str:
    return f"urn:publicid:IDN+t.org+node+{host}"


def broker(store=None, policy=None, sub: Substrate | None = None) -> Broker:
    b = Broker("b", store or SqliteStore(":memory:"), KEY, policy=policy, authority=AUTH)
    b.accept(export_substrate(sub or substrate(), AUTH, "b"))
    return b


def node(name: str, cores: int = 1, on: str = "", ifaces: Sequence[str] = ()) -> dict:
    """A VM of `cores` cores (and 2 GB), bound to host `on` if given."""
    return vm(name, sliver_type=f"c{cores}", ifaces=list(ifaces), **({"component_id": urn(on)} if on else {}))


def lan(name: str, tag: int | None = None) -> tuple[list[dict], list[dict]]:
    """Two one-core VMs on a LAN (the link needs a tag on the switch), `tag` if asked."""
    ends = [f"{name}a", f"{name}b"]
    nodes = [node(n, ifaces=[f"{n}:if0"]) for n in ends]
    return nodes, [{"client_id": name, "ifaces": [f"{n}:if0" for n in ends], **({"vlantag": str(tag)} if tag else {})}]


def place(b: Broker, nodes: Sequence[dict], links: Sequence[dict] = (), term: Term = HOUR,
          now: datetime = T0, group: str | None = None) -> PlaceAnswer:
    """Ask `b` to place these nodes and links, each its own reservation named by its client id."""
    rids = {x["client_id"]: x["client_id"] for x in [*nodes, *links]}
    return b.place("sm", demands_of(parse_request(request_rspec(list(nodes), list(links))), rids), term, now,
                   group=group)


def one(b: Broker, *nodes: dict, **kw) -> Ticket:
    (t,) = place(b, nodes, **kw).tickets.values()
    return t


def hosts_of(t: Ticket) -> set[str]:
    return {u.rsplit(":", 1)[0].rsplit("+", 1)[1] for u in t.units}


def test_a_vm_is_placed_on_one_host_and_the_ticket_is_signed():
    b = broker()
    t = one(b, node("r1", 2))
    assert set(t.units) == {f"core:{urn('pc1')}:{i}" for i in range(2)} | {f"mem:{urn('pc1')}:{i}" for i in range(4)}
    assert (t.sequence, t.holder, t.reservation, t.authority) == (1, "sm", "r1", AUTH)
    verify_ticket(t, KEY.public_key())
    with pytest.raises(CredentialInvalid):
        verify_ticket(msgspec.structs.replace(t, units=t.units[:1]), KEY.public_key())
    assert b.store.all_claims() == {u: t.group for u in t.units}


@pytest.mark.parametrize("policy,host", [(None, "pc1"), (BestFit(), "pc1"), (WorstFit(), "pc3")])
def test_the_policy_chooses_the_host(policy, host):
    b = broker(policy=policy)
    place(b, [node("on1", on="pc1"), node("on2", on="pc2")])  # pc1 half full, pc2 a quarter, pc3 empty
    assert hosts_of(one(b, node("r"))) == {host}


def test_best_fit_keeps_the_big_host_for_the_big_request_and_worst_fit_spreads():
    best, worst = broker(policy=BestFit()), broker(policy=WorstFit())
    assert [hosts_of(one(best, node(f"small{i}"))) for i in range(3)] == [{"pc1"}, {"pc1"}, {"pc2"}]
    assert hosts_of(one(best, node("big", 8))) == {"pc3"}
    assert [hosts_of(one(worst, node(f"small{i}"))) for i in range(3)] == [{"pc1"}, {"pc2"}, {"pc3"}]
    with pytest.raises(InsufficientNodes):
        one(worst, node("big", 8))


def test_not_enough_anywhere_says_what_was_asked_and_what_is_free():
    b = broker()
    with pytest.raises(InsufficientNodes) as err:
        one(b, node("big", 9))
    msg = err.value.message
    assert "node big: asked for a c9 VM (9 cores, 2048 MB) on any host" in msg and "pc3: 8 cores free" in msg
    assert b.store.all_claims() == {} and b.calendar.bookings == {}


def test_all_reservations_or_none():
    b = broker()
    with pytest.raises(InsufficientNodes):
        place(b, [node("a", 2), node("b", 8), node("c", 8)])
    assert b.store.all_claims() == {} and b.calendar.bookings == {}


def test_a_link_gets_a_tag_free_on_its_switch_and_no_tag_twice():
    b = broker(sub=substrate(tags=((1000, 1001),)))
    t1, t2 = (place(b, *lan(n)).tickets[n] for n in ("l1", "l2"))
    assert (t1.label("vlan"), t2.label("vlan")) == (1000, 1001)
    assert t1.units == (f"vlan:{urn('sw1')}:1000",)
    with pytest.raises(VlanUnavailable, match="none free"):
        place(b, *lan("l3"))
    b.relinquish(t1)
    assert place(b, *lan("l3", tag=1000)).tickets["l3"].label("vlan") == 1000  # the asked tag, once free


def test_an_asked_tag_is_taken_exactly_or_refused_with_the_reason():
    b = broker()
    assert place(b, *lan("p", tag=1002)).tickets["p"].label("vlan") == 1002
    with pytest.raises(VlanUnavailable, match="VLAN 1002 across sw1 .*none free"):
        place(b, *lan("c", tag=1002))
    with pytest.raises(VlanUnavailable, match="VLAN 1200 is not in the range of sw1"):
        place(b, *lan("c", tag=1200))


def test_advance_reservation_claims_its_units_when_it_starts():
    b = broker(sub=substrate((2,)))
    adv = one(b, node("adv", 2), term=Term(T0 + 5 * H, T0 + 6 * H))
    assert b.store.all_claims() == {}  # nothing is taken before the term starts
    now = one(b, node("now", 2), term=Term(T0, T0 + 5 * H))  # fits before it
    with pytest.raises(InsufficientNodes):
        b.extend_ticket(now, T0 + 5 * H + timedelta(minutes=1), now=T0)
    with pytest.raises(InsufficientNodes):
        one(b, node("overlap"), term=Term(T0 + 4 * H, T0 + 7 * H))
    b.relinquish(now)
    assert b.tick(T0 + 5 * H)["started"] == [adv.id]
    assert set(b.store.all_claims()) == set(adv.units)


def test_extend_and_shorten_renumber_the_ticket():
    b = broker()
    t = one(b, node("r"))
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
    first = place(b, [node("r1"), node("r2")], group="g1")
    again = place(b, [node("r1"), node("r2")], group="g1")
    assert first == again and len(b.store.all_claims()) == 2 * (1 + 4)  # a core and 2 GB each


def test_relinquish_group_gives_back_what_a_lost_answer_held():
    b = broker()
    place(b, [node("r1")], group="g")
    b.store.claim(f"core:{urn('pc2')}:0", "g")  # a crashed earlier attempt of the same group
    assert b.relinquish_group("g", T0) == 1 + 4 + 1
    assert b.store.all_claims() == {} and b.calendar.bookings == {}


def test_a_restarted_broker_rebuilds_its_calendar():
    store = SqliteStore(":memory:")
    t = one(broker(store), node("adv", 8), term=Term(T0 + 2 * H, T0 + 3 * H))
    again = Broker("b", store, KEY, authority=AUTH)
    assert set(again.calendar.bookings) == {t.id}
    with pytest.raises(InsufficientNodes):
        one(again, node("x", 8, on="pc3"), term=Term(T0 + 2 * H, T0 + 4 * H))


def test_units_released_behind_the_brokers_back_are_not_held_against_a_reclaim():
    b = broker()
    t = one(b, node("r", on="pc2"))
    for u in t.units:
        b.store.release(u, t.group)  # a slice manager that releases in the store itself
    assert b.reclaim(SignedReclaim(AUTH, b.name, T0, (f"core:{urn('pc2')}",)), T0) == ([f"core:{urn('pc2')}"], [])
    assert b.calendar.bookings == {}


def test_tickets_nobody_relinquished_are_dropped_after_their_end_and_a_grace():
    b = broker()
    one(b, node("r"))
    assert b.tick(T0 + H)["expired"] == []
    assert len(b.tick(T0 + H + EXPIRY_GRACE)["expired"]) == 1 and b.store.all_claims() == {}


def test_reclaimed_pools_are_refused_and_come_back_with_their_definition():
    b = broker()
    pc3 = (f"core:{urn('pc3')}", f"mem:{urn('pc3')}")
    free, busy = b.reclaim(SignedReclaim(AUTH, b.name, T0, pc3), T0)
    assert (free, busy) == (list(pc3), [])
    with pytest.raises(InsufficientNodes, match="pc3"):
        one(b, node("r", on="pc3"))
    b.accept(export_substrate(substrate(), AUTH, "b").only(list(pc3)))
    assert set(one(b, node("r", 2, on="pc3")).units) >= {f"core:{urn('pc3')}:0", f"core:{urn('pc3')}:1"}


def test_reclaiming_a_promised_host_drains_it():
    b = broker()
    one(b, node("r", on="pc2"))
    free, busy = b.reclaim(SignedReclaim(AUTH, b.name, T0, (f"core:{urn('pc2')}",)), T0)
    assert (free, busy) == ([], [f"core:{urn('pc2')}"])
    with pytest.raises(InsufficientNodes):
        one(b, node("r2", on="pc2"))


# ---- properties ---------------------------------------------------------------------------------------------
OPS = st.lists(st.one_of(
    st.tuples(st.just("vm"), st.integers(1, 4), st.sampled_from(["", "pc1", "pc2", "pc3"]), st.integers(0, 3),
              st.integers(1, 4)),
    st.tuples(st.just("link"), st.sampled_from([None, 1000, 1002]), st.none(), st.integers(0, 3), st.integers(1, 4)),
    st.tuples(st.just("relinquish"), st.integers(0, 30), st.none(), st.none(), st.none()),
    st.tuples(st.just("extend"), st.integers(0, 30), st.integers(1, 6), st.none(), st.none()),
    st.tuples(st.just("tick"), st.none(), st.none(), st.none(), st.none()),
    st.tuples(st.just("restart"), st.none(), st.none(), st.none(), st.none())), max_size=30)


@settings(max_examples=60, deadline=None)
@given(OPS)
def test_never_over_allocates_never_a_tag_twice_and_closing_everything_frees_everything(ops):
    store = SqliteStore(":memory:")
    b = broker(store, sub=substrate((2, 4, 2), tags=((1000, 1002),)))
    now = T0
    live: dict[str, Ticket] = {}
    for n, (op, a, c, start, length) in enumerate(ops):
        try:
            if op in ("vm", "link"):
                term = Term(now + start * H, now + (start + length) * H)
                nodes, links = ([node(f"r{n}", a, on=c)], []) if op == "vm" else lan(f"l{n}", a)
                live.update((t.id, t) for t in place(b, nodes, links, term, now).tickets.values())
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
                b = Broker("b", store, KEY, authority=AUTH)
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
    brokers = [broker(s, sub=substrate((16, 16, 16))) for s in stores]
    got: list[Ticket] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        for i in range(6):
            name = f"w{k}-{i}"
            try:
                t = place(brokers[k % 2], *lan(name)).tickets[name]
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
    claims = stores[0].all_claims()
    assert {k: g for k, g in claims.items() if k.startswith("vlan:")} == {
        f"vlan:{urn('sw1')}:{t.label('vlan')}": t.group for t in got}
    stores[0].flush()


def test_a_ticket_request_arriving_after_its_holder_relinquished_it_is_refused_and_takes_nothing():
    """A slice manager whose ticket call timed out relinquishes the group; the broker may see the request
    only afterwards. Found by tests/integration/test_outages.py: the late ticket held its units until expiry."""
    b = broker()
    b.relinquish(Ticket("g1/r1", "b", "sm", "r1", (), T0, T0), T0)
    with pytest.raises(Refused, match="relinquished by its holder"):
        place(b, [node("r1")], group="g1")
    b.relinquish_group("g2", T0)
    with pytest.raises(Refused):
        place(b, [node("r9")], group="g2")
    assert b.store.all_claims() == {}
    b.tick(T0 + 2 * H)  # the broker forgets after RELINQUISHED_KEPT; the group could be asked again
    assert place(b, [node("r1")], term=Term(T0 + 2 * H, T0 + 3 * H), now=T0 + 2 * H, group="g1").tickets


def test_the_brokers_clock_reads_the_relinquished_tickets_once_per_sweep_not_on_every_tick():
    """Every tick read every relinquished ticket remembered (an hour of them), under the broker's lock: at the
    lifecycle rate one process serves, over 100,000 documents a second after an hour."""
    b = broker()
    for i in range(3):
        b.relinquish(Ticket(f"g{i}/r1", "b", "sm", "r1", (), T0, T0), T0)
    scans = []
    real_scan = b.store.scan

    def scan(table, prefix=""):
        scans.append(table)
        return real_scan(table, prefix)

    b.store.scan = scan
    for second in range(120):  # two minutes of ticks
        b.tick(T0 + timedelta(seconds=second))
    assert scans.count(RELINQUISHED) == 1
    swept = T0 + RELINQUISHED_KEPT - RELINQUISHED_SWEEP / 2
    b.tick(swept)  # a sweep: nothing remembered long enough yet
    b.tick(T0 + RELINQUISHED_KEPT)  # remembered long enough, but the next sweep is not due yet
    assert len(real_scan(RELINQUISHED)) == 3 and scans.count(RELINQUISHED) == 2
    b.tick(swept + RELINQUISHED_SWEEP)  # forgotten at most one sweep late
    assert real_scan(RELINQUISHED) == []
