"""Several AM workers (each its own slice manager, broker and authority objects and its own Redis connection,
as separate processes would have) allocate LANs from one small inventory at once: no unit and no VLAN tag is
ever held by two slivers, losers get a reason, and deleting everything releases everything."""

from __future__ import annotations

import os
import threading
import uuid
from datetime import timedelta

from cryptography.hazmat.primitives.asymmetric import rsa

from authority.actor import LEASES
from authority.substrate.emulated import EmulatedDriver
from deployment.actors import ActorKeys, embedded_slice_manager
from rspec.request import parse_request
from rspec.substrate import default_substrate
from slicex.clock import ManualClock
from slicex.errors import GeniError
from slicex.store.redis_store import RedisStore
from tests.factories import request_rspec, vm

REDIS_URL = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/15")
SUB = default_substrate("t.org")
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
AKEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)  # the authority's: leases, shared by workers


def lan(n: int) -> str:
    nodes = [vm(f"n{i}", ifaces=[f"n{i}:if0"]) for i in range(n)]
    return request_rspec(nodes, [{"client_id": "lan", "ifaces": [f"n{i}:if0" for i in range(n)]}])


def test_workers_racing_for_one_inventory_never_share_a_unit_or_a_tag():
    prefix = f"race-{uuid.uuid4().hex[:8]}"
    now = ManualClock().now()
    workers = [embedded_slice_manager(RedisStore(REDIS_URL, prefix=prefix), SUB, EmulatedDriver(SUB), keys=ActorKeys.given(KEY, AKEY))
               for _ in range(4)]
    held: dict[str, str] = {}  # unit -> sliver, across all workers
    lock = threading.Lock()
    granted: list[tuple[int, list[str]]] = []
    refused: list[str] = []

    def worker(k: int) -> None:
        sm = workers[k]
        for i in range(6):
            try:
                slivers = sm.allocate(f"urn:publicid:IDN+t.org+slice+w{k}x{i}", "o", parse_request(lan(2 + i % 3)),
                                      now + timedelta(minutes=10), now)
            except GeniError as exc:
                with lock:
                    refused.append(exc.message)
                continue
            with lock:
                for s in slivers:
                    for unit in s.details["keys"]:
                        assert unit not in held, f"{unit} held by {held[unit]} and {s.urn}"
                        held[unit] = s.urn
                granted.append((k, [s.urn for s in slivers]))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store = workers[0].store.inner  # the whole store, as the test checks it (a worker sees its own part)
    units = {k: v for k, v in store.all_claims().items() if not k.startswith("leased:")}
    assert set(units) == set(held) and granted and refused  # the inventory ran out: some were refused
    assert all("asked for" in r or "promised" in r or "free" in r or "changed" in r for r in refused), refused[:3]
    tags = [u for u in held if u.startswith("vlan:")]
    assert len(tags) == len(set(tags)) == sum(1 for _, urns in granted)
    for k, urns in granted:
        workers[k].delete(urns, now)
    assert store.all_claims() == {} and store.scan(LEASES) == []
    store.flush()


def two_workers(tmp_path, hook):
    from slice_manager.actor import ActorSliceManager
    from slicex.store.sqlite_store import SqliteStore

    store = SqliteStore(str(tmp_path / "s.db"))
    a = embedded_slice_manager(store, SUB, EmulatedDriver(SUB), name="worker-a", fault=hook, keys=ActorKeys.given(KEY, AKEY))
    b = embedded_slice_manager(store, SUB, EmulatedDriver(SUB), name="worker-b", keys=ActorKeys.given(KEY, AKEY))
    return store, a, b, ActorSliceManager


def test_a_worker_never_recovers_what_a_live_worker_is_doing(tmp_path):
    """Worker B's reaper runs while worker A's allocation is between persisting and asking the broker: B
    leaves A's reservations alone, and A's result is the only one."""
    now = ManualClock().now()
    seen = []

    def hook(boundary):
        if boundary == "ticket:pending" and not seen:
            seen.append(b.reap(now))  # another AM worker's reaper, at the worst moment

    store, a, b, _ = two_workers(tmp_path, hook)
    slivers = a.allocate("urn:publicid:IDN+t.org+slice+s", "o", parse_request(lan(2)), now + timedelta(minutes=10),
                         now)
    assert seen == [[]]
    units = {k: v for k, v in store.all_claims().items() if not k.startswith("sm-lock:")}
    assert units == {u: s.details["reservation"] and a.records()[0].group for s in slivers for u in s.details["keys"]}
    a.delete([s.urn for s in slivers], now)
    assert store.all_claims() == {}


def test_a_dead_workers_reservations_are_taken_over_after_its_silence(tmp_path):
    from slice_manager.actor import LIVENESS, Crash

    now = ManualClock().now()

    def hook(boundary):
        if boundary == "ticket:answered":
            raise Crash(boundary)  # worker A dies holding its reservations' locks

    store, a, b, _ = two_workers(tmp_path, hook)
    try:
        a.allocate("urn:publicid:IDN+t.org+slice+s", "o", parse_request(lan(2)), now + timedelta(minutes=10), now)
    except Crash:
        pass
    b.reap(now)
    assert all(r.r.pending == "Ticketing" for r in b.records())  # A may still be alive: not B's to touch
    later = now + LIVENESS + timedelta(seconds=1)
    b.reap(later)
    assert [r.r.state for r in b.records()] == ["Ticketed"] * 3  # B delivered A's ticket again: same tickets
    b.delete([r.id for r in b.records()], later)
    assert store.all_claims() == {}
