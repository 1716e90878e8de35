"""Random sequences of Allocate (now, or an advance reservation the broker's calendar holds until its start),
Provision, Renew, Update (a node added, a node with a new link to a kept node added, a node and its links
removed; staged on a provisioned slice until Provision commits it, Cancel or its expiry reverts it), Cancel,
Delete, the clock passing terms (the reaper's tick: expiry) and restarts of every actor or of one, on SQLite
and on a real Redis. The calls go as the AM API and the deployment make them, usage records included
(operations/ledger.py). After every step, every index and counter the store and the actors keep equals a full
recomputation from the documents and claims (tests/store_indexes.py `mismatch` names the first that does
not), and after a reaper pass nothing is left due at or before the clock.

Run time: a step costs 5-25 ms (a recomputation reads every document and claim of the store), so the default
of 15 sequences of up to 25 steps per store keeps both stores together near 15 s under `pytest`, while 25 steps
reach every call on a provisioned, updated, renewed and expired slice (two slices, so one's index entries sit
beside another's). SLICEX_PROPERTY_EXAMPLES=N runs N sequences per store instead (a hunt by hand: 2,000)."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from datetime import timedelta
from typing import Any

from cryptography.hazmat.primitives.asymmetric import rsa
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from authority.actor import LEASES, Authority, lease_document, lease_owner
from authority.substrate.emulated import EmulatedDriver
from broker.broker import Broker
from operations.ledger import OPEN, USAGE, Ledger
from protocol import slice_manager as sm_protocol
from resources import export_substrate
from rspec.request import parse_request
from rspec.substrate import default_substrate
from slice_manager.actor import ActorSliceManager
from slice_manager.records import REQUESTS, RESERVATIONS, SLIVERS_OF
from slicex.clock import ManualClock
from slicex.errors import GeniError
from slicex.store.sqlite_store import SqliteStore
from tests.factories import request_rspec, vm
from tests.store_indexes import mismatch

SUB = default_substrate("t.org")
AUTH = "urn:publicid:IDN+t.org+authority+am"
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
REDIS_URL = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/15")
SLICES = [f"urn:publicid:IDN+t.org+slice+p{i}" for i in range(2)]
OWNER = "urn:publicid:IDN+t.org+user+o"
MIN = timedelta(minutes=1)
EXAMPLES = int(os.environ.get("SLICEX_PROPERTY_EXAMPLES", "15"))
STEPS = 25

WHICH = st.integers(0, len(SLICES) - 1)
MINUTES = st.integers(1, 40)


class World:
    """The three actors and the ledger over one store, on a manual clock."""

    def __init__(self, store: Any):
        self.store = store
        self.clock = ManualClock()
        self.broker: Broker | None = None
        self.authority: Authority | None = None
        self.start({"broker", "authority", "sm"}, first=True)

    def start(self, victims: set[str], first: bool = False) -> None:
        """Build the named actors again over the same store (a restart: nothing but the store carries over),
        then do what a deployment's start does before it answers: a reaper pass and the ledger's reconcile."""
        if "broker" in victims:
            self.broker = Broker("broker", self.store, KEY, authority=AUTH)
        if "authority" in victims:
            self.authority = Authority(AUTH, EmulatedDriver(SUB), {"broker": KEY.public_key()}, store=self.store,
                                       key=KEY, inventory=export_substrate(SUB, AUTH, "broker"))
        if first:
            self.authority.delegate(self.broker)
        if "sm" in victims:
            self.sm = ActorSliceManager(self.store, SUB, self.broker, self.authority, name="sm")
            self.ledger = Ledger(self.store, SUB)
            self.sm.ledger = self.ledger
        else:  # the slice manager goes on, talking to the restarted actor
            self.sm.broker, self.sm.authority = self.broker, self.authority
        self.sm.reap(self.clock.now())
        self.ledger.sweep(self.sm.holds, self.clock.now())

    def live(self, slice_urn: str) -> list[Any]:
        return self.sm.slivers(slice_urn, self.clock.now())


class Lifecycle(RuleBasedStateMachine):
    """One store, two slices; `asked` remembers each request element by client_id (the desired RSpec of an
    Update is built from the live slivers' elements)."""

    def open_store(self) -> Any:
        raise NotImplementedError

    def close_store(self) -> None:
        raise NotImplementedError

    @initialize()
    def begin(self) -> None:
        self.store = self.open_store()
        self.w = World(self.store)
        self.asked: dict[str, dict[str, Any]] = {}  # client_id -> ("node", vm dict) | ("link", link dict)
        self.names = 0
        self.reaped = True

    def teardown(self) -> None:
        if hasattr(self, "store"):
            self.close_store()

    def _name(self, what: str) -> str:
        self.names += 1
        return f"{what}{self.names}"

    def _call(self, what: str, fn, *args) -> Any:
        """A call as the AM API makes it: a refusal (no room, a term out of range, a state that does not allow
        it) is an answer, and the indexes must hold after it as after a success (`event`: how often each was
        which, for --hypothesis-show-statistics)."""
        self.reaped = False
        try:
            out = fn(*args)
        except GeniError as exc:
            event(f"{what}: refused ({type(exc).__name__})")
            return None
        event(f"{what}: done")
        return out

    def holding(self) -> bool:
        """Whether any slice has slivers (the calls on them are drawn only then: fewer steps wasted)."""
        return bool(self.store.scan(SLIVERS_OF))

    # ---- the AM API --------------------------------------------------------------------------------------
    @rule(which=WHICH, nodes=st.integers(1, 2), lan=st.booleans(), minutes=MINUTES)
    def allocate_now(self, which: int, nodes: int, lan: bool, minutes: int) -> None:
        self.allocate(which, nodes, lan, minutes, 0)

    @rule(which=WHICH, nodes=st.integers(1, 2), lan=st.booleans(), minutes=MINUTES, later=st.sampled_from([5, 30]))
    def allocate_later(self, which: int, nodes: int, lan: bool, minutes: int, later: int) -> None:
        """An advance reservation: booked in the broker's calendar now, claimed at its start."""
        self.allocate(which, nodes, lan, minutes, later)

    def allocate(self, which: int, nodes: int, lan: bool, minutes: int, later: int) -> None:
        names = [self._name("n") for _ in range(nodes)]
        lan = lan and nodes > 1
        node_docs = [vm(n, ifaces=[f"{n}:if0"] if lan else []) for n in names]
        links = [{"client_id": self._name("l"), "ifaces": [f"{n}:if0" for n in names]}] if lan else []
        request = parse_request(request_rspec(node_docs, links))
        now = self.w.clock.now()
        start = now + later * MIN if later else None
        end = (start or now) + minutes * MIN

        def allocate() -> list[Any]:
            return self.w.ledger.allocate(OWNER, SLICES[which], request, now, end, True,
                                          lambda e: self.w.sm.allocate(SLICES[which], OWNER, request, e, now,
                                                                       start=start))

        if self._call("allocate" + (" later" if later else ""), allocate) is not None:
            self.asked.update({d["client_id"]: ("node", d) for d in node_docs})
            self.asked.update({d["client_id"]: ("link", d) for d in links})

    @precondition(lambda self: self.holding())
    @rule(which=WHICH, minutes=MINUTES)
    def provision(self, which: int, minutes: int) -> None:
        """Provision the slice (commits a staged Update)."""
        live = self.w.live(SLICES[which])
        if live:
            now = self.w.clock.now()
            urns = [s.urn for s in live]
            done = self._call("provision", self.w.sm.provision, urns, now + 2 * minutes * MIN, [], now)
            if done is not None:
                self.w.ledger.extended(done)

    @precondition(lambda self: self.holding())
    @rule(which=WHICH, minutes=MINUTES)
    def renew(self, which: int, minutes: int) -> None:
        live = self.w.live(SLICES[which])
        if live:
            now = self.w.clock.now()
            end = max(s.expires for s in live) + minutes * MIN
            done = self._call("renew", self.w.sm.renew, [s.urn for s in live], end, now, True)
            if done is not None:
                self.w.ledger.extended(done)

    @precondition(lambda self: self.holding())
    @rule(which=WHICH, change=st.sampled_from(["add", "add-linked", "remove"]), pick=st.integers(0, 5),
          minutes=MINUTES)
    def update(self, which: int, change: str, pick: int, minutes: int) -> None:
        """Update the slice to its live elements with one change: a node added, a node added with a link to a
        kept node (rewired), or a node removed with its links (the nodes at their other ends rewired)."""
        slice_urn = SLICES[which]
        live = self.w.live(slice_urn)
        kept = [s.client_id for s in live if s.client_id in self.asked]
        if not kept:
            return
        nodes = {c: dict(self.asked[c][1]) for c in kept if self.asked[c][0] == "node"}
        links = {c: dict(self.asked[c][1]) for c in kept if self.asked[c][0] == "link"}
        if not nodes:
            return
        target = sorted(nodes)[pick % len(nodes)]
        if change == "add":
            new = self._name("n")
            nodes[new] = vm(new)
        elif change == "add-linked":
            new, link = self._name("n"), self._name("l")
            ifaces = [f"{new}:if0", f"{target}:{link}"]
            nodes[new] = vm(new, ifaces=[ifaces[0]])
            nodes[target] = {**nodes[target], "ifaces": [*nodes[target].get("ifaces", []), ifaces[1]]}
            links[link] = {"client_id": link, "ifaces": ifaces}
        else:
            gone = {i for i in nodes.pop(target).get("ifaces", [])}
            cut = {c for c, lk in links.items() if gone & set(lk["ifaces"])}
            dropped = {i for c in cut for i in links.pop(c)["ifaces"]}
            for c, n in nodes.items():
                if dropped & set(n.get("ifaces", [])):
                    nodes[c] = {**n, "ifaces": [i for i in n["ifaces"] if i not in dropped]}
        now = self.w.clock.now()
        end = now + minutes * MIN

        def update() -> list[Any]:  # a desired RSpec that contradicts itself is refused (BADARGS) as the AM does
            request = parse_request(request_rspec(list(nodes.values()), list(links.values())))
            return self.w.ledger.update(OWNER, slice_urn, request, live, now, end,
                                        lambda: self.w.sm.update(slice_urn, [], request, end, end, now))

        staged = any(s.allocation_state != sm_protocol.ALLOCATED for s in live)
        if self._call(f"update {change}" + (" staged" if staged else ""), update) is not None:
            self.asked.update({c: ("node", d) for c, d in nodes.items()})
            self.asked.update({c: ("link", d) for c, d in links.items()})

    @precondition(lambda self: self.holding())
    @rule(which=WHICH)
    def cancel(self, which: int) -> None:
        """Cancel the slice's pending Update (or, with none, its allocated slivers)."""
        if self.w.live(SLICES[which]):
            now = self.w.clock.now()
            done = self._call("cancel", self.w.sm.cancel, SLICES[which], [], now)
            if done is not None:
                self.w.ledger.ended([s.urn for s in done if s.allocation_state == sm_protocol.UNALLOCATED], now,
                                    "cancelled")

    @precondition(lambda self: self.holding())
    @rule(which=WHICH)
    def delete(self, which: int) -> None:
        live = self.w.live(SLICES[which])
        if live:
            now = self.w.clock.now()
            done = self._call("delete", self.w.sm.delete, [s.urn for s in live], now)
            if done is not None:
                self.w.ledger.ended([s.urn for s in done], now, "deleted")

    # ---- the clock and restarts ----------------------------------------------------------------------------
    @rule(minutes=st.sampled_from([1, 5, 15, 45, 200]))
    def tick(self, minutes: int) -> None:
        """The clock passes; the deployment's reaper runs (expiry, advance reservations starting, Updates
        expiring) and ends the usage of what it ended."""
        self.w.clock.advance(minutes * MIN)
        now = self.w.clock.now()
        gone = self.w.sm.reap(now)
        self.w.ledger.settle(gone, self.w.sm.holds, now)
        self.reaped = True

    @rule(victims=st.sampled_from(["all", "all", "sm", "broker", "authority"]))
    def restart(self, victims: str) -> None:
        self.w.start({"broker", "authority", "sm"} if victims == "all" else {victims})
        self.reaped = True

    # ---- after every step ----------------------------------------------------------------------------------
    @invariant()
    def indexes_equal_their_recomputation(self) -> None:
        if not hasattr(self, "w"):
            return
        found = mismatch(self.store, self.w.broker, exact=True)
        assert found is None, found
        if self.reaped:  # every expiry, deadline and undelivered message the index filed by now was worked off
            now = self.w.clock.now()
            until = now.timestamp()
            left = [rid for rid, _ in self.store.due(RESERVATIONS, until)
                    if not self.w.sm._starting(self.w.sm._load(rid), now)]  # the broker started it after the
            assert left == [], "records the reaper left due"  # slice manager's pass: seen on the next one
            assert self.store.due(LEASES, until) == [], "expired leases the authority did not reap"
            assert [u for u, _ in self.store.due(OPEN, until) if not self.w.sm.holds(u)] == [], \
                "expired usage left open"


PROPERTY = settings(max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None,
                    suppress_health_check=list(HealthCheck))


class OnSqlite(Lifecycle):
    def open_store(self) -> Any:
        self.dir = tempfile.mkdtemp(prefix="slicex-prop-")
        return SqliteStore(os.path.join(self.dir, "s.db"))

    def close_store(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class OnRedis(Lifecycle):
    def open_store(self) -> Any:
        from slicex.store.redis_store import RedisStore

        store = RedisStore(REDIS_URL, prefix=f"prop-{uuid.uuid4().hex[:8]}")
        store.ping()  # Redis is required: UNAVAILABLE names the URL (`make redis` starts one)
        return store

    def close_store(self) -> None:
        self.store.flush()
        self.store.close()


TestIndexesEqualTheirRecomputationOnSqlite = OnSqlite.TestCase
TestIndexesEqualTheirRecomputationOnSqlite.settings = PROPERTY
TestIndexesEqualTheirRecomputationOnRedis = OnRedis.TestCase
TestIndexesEqualTheirRecomputationOnRedis.settings = PROPERTY


def corruptions(store: Any, w: World) -> list[tuple[str, Any]]:
    """Ways an index or counter can go wrong, each with the name `mismatch` must give it: the recomputation
    is checked to fail (a check that cannot fail proves nothing)."""
    rec = w.sm.records()[0]
    lease = lease_document(store.scan(LEASES)[0])  # with what a lean lease leaves to its ticket
    redis = getattr(store, "_r", None)
    pool = next(c for c in store.claim_counts() if c.startswith("core:"))
    out: list[tuple[str, Any]] = [
        ("records' time index", lambda: store.put(RESERVATIONS, rec.id, rec.to_doc(), due=1.0)),
        ("leases' time index", lambda: store.put(LEASES, lease["lease"]["id"], lease)),
        # an open record copied into `usage` (which holds ended ones only, issue 33's lean records)
        ("open usage records", lambda: store.put(USAGE, rec.id, store.get(OPEN, rec.id))),
        # an open usage record written again without its tally: its user's counter no longer counts it
        ("usage counters", lambda: store.put(OPEN, rec.id, store.get(OPEN, rec.id))),
        ("records' slice index", lambda: store.delete(SLIVERS_OF, f"{rec.slice_urn}#{rec.id}")),
        ("lease claims", lambda: store.release(f"leased:{lease['lease']['units'][0]}", lease_owner(lease["lease"]["id"]))),
        ("broker calendar against its stored tickets", lambda: w.broker.calendar.release(rec.ticket.id)),
        ("calendar's interval index", lambda: w.broker.calendar._ends.pop()),
        ("broker's copy of the unit claims", lambda: w.broker._copy._remove(rec.ticket.units[0])),
    ]
    if redis is not None:
        out += [("claim counters", lambda: redis.hincrby(store._counts(), pool, 1)),
                ("Redis key index of sm-requests",  # a table read by prefix (KEY_INDEXED): the others keep none
                 lambda: redis.zrem(store._k(REQUESTS), redis.zrange(store._k(REQUESTS), 0, 0)[0])),
                ("Redis owner sets", lambda: redis.srem(store._o(rec.group), rec.ticket.units[0]))]
    else:
        out += [("claim counters", lambda: store._run(lambda db: db.execute(
            "UPDATE claim_counts SET n = n + 1 WHERE counter = ?", (pool,))))]
    return out


def check_corruptions(open_store) -> None:
    store, w = fresh(open_store())
    names = [name for name, _corrupt in corruptions(store, w)]
    close(store)
    for name in names:
        store, w = fresh(open_store())
        try:
            assert mismatch(store, w.broker, exact=True) is None
            dict(corruptions(store, w))[name]()
            found = mismatch(store, w.broker, exact=True)
            assert found is not None and found.startswith(name), (name, found)
        finally:
            close(store)


def fresh(store: Any) -> tuple[Any, World]:
    """A provisioned slice of two linked nodes, its usage recorded."""
    w = World(store)
    now = w.clock.now()
    request = parse_request(request_rspec([vm("a", ifaces=["a:if0"]), vm("b", ifaces=["b:if0"])],
                                          [{"client_id": "l", "ifaces": ["a:if0", "b:if0"]}]))
    slivers = w.ledger.allocate(OWNER, SLICES[0], request, now, now + 10 * MIN, True,
                                lambda e: w.sm.allocate(SLICES[0], OWNER, request, e, now))
    w.ledger.extended(w.sm.provision([s.urn for s in slivers], now + 60 * MIN, [], now))
    return store, w


def close(store: Any) -> None:
    if hasattr(store, "flush"):
        store.flush()
    store.close()


def test_every_corruption_of_an_index_or_counter_is_named_on_sqlite():
    check_corruptions(lambda: SqliteStore(":memory:"))


def test_every_corruption_of_an_index_or_counter_is_named_on_redis():
    from slicex.store.redis_store import RedisStore

    check_corruptions(lambda: RedisStore(REDIS_URL, prefix=f"prop-{uuid.uuid4().hex[:8]}"))
