"""One slice manager serving many AM calls at once: calls on different slices proceed in parallel while an
actor call for one of them is held open; calls on one slice wait for each other; concurrent allocations of one
process do not fight over the same units; and under a mixed load with the reaper running, every claim,
lease and broker promise ends up released."""

from __future__ import annotations

import os
import threading
import uuid
from datetime import timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from authority.actor import LEASES
from authority.substrate.emulated import EmulatedDriver
from broker.broker import TICKETS
from deployment.actors import ActorKeys, embedded_slice_manager
from protocol import slice_manager as sm
from rspec.request import parse_request
from rspec.substrate import default_substrate
from slice_manager import reservation as rs
from slice_manager.actor import ActorSliceManager
from slicex.clock import ManualClock
from slicex.errors import Busy
from slicex.store.sqlite_store import SqliteStore
from tests.factories import request_rspec, vm
from tests.integration.test_reservation_distributed import cluster, home, world  # noqa: F401 - actor processes

SUB = default_substrate("t.org")
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
AKEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
REDIS_URL = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/15")
MIN = timedelta(minutes=1)
WAIT = 10.0  # seconds: generous on a loaded 2-core machine; a serialised slice manager never gets there


def slice_urn(name: str) -> str:
    return f"urn:publicid:IDN+t.org+slice+{name}"


def one_node(client_id: str) -> str:
    return request_rspec([vm(client_id)])


class HeldBroker:
    """The broker, except that a placement request naming node `held` stays open (as a slow remote broker's
    would) until the test lets it go."""

    def __init__(self, broker, held: str):
        self.broker = broker
        self.held = held
        self.entered = threading.Event()
        self.go = threading.Event()
        self.issued: list[str] = []  # the ticket groups asked for (place messages), in order

    def __getattr__(self, name):
        return getattr(self.broker, name)

    def place(self, holder, demands, term, now, group=None, dry_run=False, authority=""):
        self.issued.append(group)
        if any(n.client_id == self.held for n in demands.request.nodes):
            self.entered.set()
            assert self.go.wait(30), "the test never released the held ticket call"
        return self.broker.place(holder, demands, term, now, group=group, dry_run=dry_run, authority=authority)


def held_world(tmp_path, held: str = "a1"):
    store = SqliteStore(str(tmp_path / "s.db"))
    real = embedded_slice_manager(store, SUB, EmulatedDriver(SUB), keys=ActorKeys.given(KEY, AKEY))
    broker = HeldBroker(real.broker, held)
    return store, real, broker, ActorSliceManager(store, SUB, broker, real.authority, name="sm")


def run(fn, *args) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def target():
        try:
            out["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            out["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, out


def everything_released(store, real) -> None:
    assert store.all_claims() == {}, "claims left"
    assert store.scan(LEASES) == [] and store.scan(TICKETS) == [], "leases or tickets left"
    if real is not None:  # an in-process broker: its calendar too
        assert real.broker.calendar.bookings == {}, "broker promises left"
    assert store.scan("sm-reservations") == [] and store.scan("sm-requests") == [], "records left"


def test_another_slices_allocate_completes_while_a_broker_ticket_call_is_held_open(tmp_path):
    store, real, broker, asm = held_world(tmp_path)
    try:
        allocate_b_while_a_is_held(store, real, broker, asm)
    finally:
        broker.go.set()  # never leave slice a's call hanging when an assertion failed


def allocate_b_while_a_is_held(store, real, broker, asm) -> None:
    now = ManualClock().now()
    a, a_out = run(asm.allocate, slice_urn("a"), "o", parse_request(one_node("a1")), now + 10 * MIN, now)
    assert broker.entered.wait(WAIT), "slice a's ticket request never reached the broker"

    b, b_out = run(asm.allocate, slice_urn("b"), "o", parse_request(one_node("b1")), now + 10 * MIN, now)
    b.join(WAIT)
    assert not b.is_alive(), "slice b's Allocate waited for slice a's broker call"
    assert "error" not in b_out, b_out
    assert a.is_alive() and not broker.go.is_set(), "slice a's ticket call is still held"
    (sb,) = b_out["value"]
    assert sb.allocation_state == sm.ALLOCATED and sb.slice_urn == slice_urn("b")

    # the rest of slice b's life does not wait either
    assert asm.provision([sb.urn], now + timedelta(hours=1), [], now)[0].allocation_state == sm.PROVISIONED
    assert [s.urn for s in asm.slivers(slice_urn("b"), now)] == [sb.urn]
    asm.delete([sb.urn], now)
    assert a.is_alive()

    broker.go.set()
    a.join(WAIT)
    assert not a.is_alive() and "error" not in a_out, a_out
    (sa,) = a_out["value"]
    assert sa.allocation_state == sm.ALLOCATED
    assert set(sa.details["keys"]) <= set(store.all_claims())
    asm.delete([sa.urn], now)
    everything_released(store, real)


def test_a_call_on_the_same_slice_waits_for_the_held_one_and_does_not_repeat_its_ticket_request(tmp_path):
    store, real, broker, asm = held_world(tmp_path)
    try:
        status_waits_for_allocate(store, real, broker, asm)
    finally:
        broker.go.set()


def status_waits_for_allocate(store, real, broker, asm) -> None:
    now = ManualClock().now()
    a, a_out = run(asm.allocate, slice_urn("a"), "o", parse_request(one_node("a1")), now + 10 * MIN, now)
    assert broker.entered.wait(WAIT)
    status, status_out = run(asm.slivers, slice_urn("a"), now)  # sees the reservation pending Ticketing
    status.join(0.5)
    assert status.is_alive(), "a Status on the slice ran in the middle of its Allocate"
    reaper, _ = run(asm.reap, now)
    reaper.join(WAIT)
    assert not reaper.is_alive(), "the reaper waited for a call's broker request"
    assert len(broker.issued) == 1, "the reaper delivered a ticket request a call has in flight"
    broker.go.set()
    a.join(WAIT)
    status.join(WAIT)
    assert "error" not in a_out and "error" not in status_out, (a_out, status_out)
    (s,) = status_out["value"]
    assert s.allocation_state == sm.ALLOCATED and s.urn == a_out["value"][0].urn
    assert len(broker.issued) == 1, "the held ticket request was delivered again"
    asm.delete([s.urn], now)
    everything_released(store, real)


def test_concurrent_allocations_of_one_process_do_not_choose_the_same_units(tmp_path):
    """Both allocations have their placement request at the broker at once: the broker's policy gives them
    different units, and refuses neither (no lost race, no second round)."""
    store = SqliteStore(str(tmp_path / "s.db"))
    real = embedded_slice_manager(store, SUB, EmulatedDriver(SUB), keys=ActorKeys.given(KEY, AKEY))
    both_asked = threading.Barrier(2, timeout=3)
    refused: list[str] = []

    class Racing:
        def __getattr__(self, name):
            return getattr(real.broker, name)

        def place(self, *a, **kw):
            try:
                both_asked.wait()
            except threading.BrokenBarrierError:
                pass
            try:
                return real.broker.place(*a, **kw)
            except Busy as exc:
                refused.append(exc.message)
                raise

    asm = ActorSliceManager(store, SUB, Racing(), real.authority, name="sm")
    now = ManualClock().now()
    calls = [run(asm.allocate, slice_urn(f"p{i}"), "o", parse_request(one_node(f"n{i}")), now + 10 * MIN, now)
             for i in range(2)]
    for t, _ in calls:
        t.join(WAIT)
    outs = [out for _, out in calls]
    assert all("value" in out for out in outs), outs
    keys = [set(out["value"][0].details["keys"]) for out in outs]
    assert keys[0] and keys[1] and not keys[0] & keys[1]
    assert refused == [], refused
    asm.delete([out["value"][0].urn for out in outs], now)
    everything_released(store, real)


def lifecycle(asm: ActorSliceManager, name: str, clock: ManualClock, rounds: int, errors: list) -> None:
    for i in range(rounds):
        urn = slice_urn(f"{name}x{i}")
        now = clock.now()
        try:
            slivers = asm.allocate(urn, "o", parse_request(one_node(f"{name}n{i}")), now + 10 * MIN, now)
            urns = [s.urn for s in slivers]
            if i % 2 == 0:
                asm.provision(urns, now + timedelta(hours=1), [], now)
            assert {s.urn for s in asm.slivers(urn, now)} == set(urns)
            if i % 3 == 0:
                asm.renew(urns, now + timedelta(hours=2), now, False)
            asm.delete(urns, now)
            assert asm.slivers(urn, now) == []
        except Exception as exc:  # noqa: BLE001 - collected, the test fails on any
            errors.append(f"{name} round {i}: {type(exc).__name__}: {exc}")


@pytest.mark.parametrize("deployment", ["sqlite-1", "redis-2"])
def test_mixed_calls_on_many_slices_at_once_leave_nothing_held(tmp_path, deployment):
    """Eight threads run lifecycles on slices of their own through one or two slice managers (AM workers
    on one Redis), with their reapers running all along: every call succeeds, and nothing is left pending,
    claimed, leased or promised."""
    if deployment == "sqlite-1":
        stores = [SqliteStore(str(tmp_path / "s.db"))]
    else:
        from slicex.store.redis_store import RedisStore

        prefix = f"smc-{uuid.uuid4().hex[:8]}"
        stores = [RedisStore(REDIS_URL, prefix=prefix) for _ in range(2)]
    workers = [embedded_slice_manager(s, SUB, EmulatedDriver(SUB), name=f"w{k}", keys=ActorKeys.given(KEY, AKEY))
               for k, s in enumerate(stores)]
    clock = ManualClock()
    errors: list[str] = []
    stop = threading.Event()

    def reaper(asm):
        while not stop.is_set():
            asm.reap(clock.now())

    reapers = [threading.Thread(target=reaper, args=(w,), daemon=True) for w in workers]
    threads = [threading.Thread(target=lifecycle, args=(workers[k % len(workers)], f"t{k}", clock, 4, errors))
               for k in range(8)]
    for t in reapers + threads:
        t.start()
    for t in threads:
        t.join(120)
    stop.set()
    for t in reapers:
        t.join(30)
    assert not any(t.is_alive() for t in threads + reapers), "a call never finished"
    assert errors == [], errors[:5]
    for w in workers:
        w.reap(clock.now())
    store = stores[0]
    try:
        assert [r.id for r in workers[0].records() if r.r.pending != rs.NONE or r.outbox] == []
        assert store.all_claims() == {}, "claims left"
        assert store.scan(LEASES) == [] and store.scan(TICKETS) == [], "leases or tickets left"
        if deployment == "sqlite-1":
            assert workers[0].broker.calendar.bookings == {}, "broker promises left"
        assert store.scan("sm-reservations") == [] and store.scan("sm-requests") == [], "records left"
    finally:
        if deployment != "sqlite-1":
            store.flush()


def test_over_mutual_tls_another_slices_allocate_completes_while_a_remote_broker_call_is_held_open(world):  # noqa: F811
    """The same, with the broker and the authority processes of their own behind mutual TLS and the state
    in Redis: slice a's ticket request to the remote broker is held in flight."""
    store, _actors, connect = world
    remote = connect()
    broker = HeldBroker(remote.broker, "a1")
    asm = ActorSliceManager(store, SUB, broker, remote.authority, lease_key=remote.lease_key)
    try:
        allocate_b_while_a_is_held(store, None, broker, asm)
    finally:
        broker.go.set()
