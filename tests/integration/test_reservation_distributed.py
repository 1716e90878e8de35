"""The actor slice manager against a broker and an authority that are processes of their own, reached over
HTTPS with mutual TLS, state in a real Redis; actor processes are killed (SIGKILL, or an exit at an internal
boundary of their own) and restarted, and every reservation converges with nothing leaked."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from authority.actor import LEASES, Authority
from broker.broker import TICKETS, Broker
from protocol.remote import RemoteAuthority, RemoteBroker
from resources import export_substrate
from rspec.request import parse_request
from rspec.substrate import default_substrate
from slice_manager import reservation as rs
from slice_manager.actor import ActorSliceManager
from slicex.clock import ManualClock
from slicex.errors import GeniError, Unavailable
from tests.factories import three_node_lan

REDIS_URL = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/15")
SUB = default_substrate("t.org")
AUTH = "urn:publicid:IDN+t.org+authority+am"
SLICE = "urn:publicid:IDN+t.org+slice+dist"


FAULTS = "test-faults"


def actor_main(role: str, home_dir: str, prefix: str, port: int, conn) -> None:
    """One actor process: its own store connection, its own key load, an mTLS server. It exits like kill -9
    at the internal boundary the test wrote into the store for it."""
    from authority.actor import Authority
    from authority.substrate.emulated import EmulatedDriver
    from protocol.remote import authority_handlers, broker_handlers
    from slicex.actor_rpc import ActorServer
    from slicex.devpki import actor_files, actor_public_key
    from slicex.home import Home
    from slicex.store.redis_store import RedisStore
    from slicex.ticket import load_signing_key

    h = Home(Path(home_dir))
    cert, key_file = actor_files(h, role)
    key = load_signing_key(key_file.read_bytes())
    store = RedisStore(REDIS_URL, prefix=prefix)
    if role == "broker":
        actor = Broker("broker", store, key, authority=AUTH)
        handlers = broker_handlers(actor)
    else:
        actor = Authority(AUTH, EmulatedDriver(SUB), {"broker": actor_public_key(h, "broker", "t.org")}, store=store,
                          key=key, inventory=export_substrate(SUB, AUTH, "broker"))
        handlers = authority_handlers(actor)
    def fault(boundary: str) -> None:
        if (store.get(FAULTS, role) or {}).get("at") == boundary:
            os._exit(137)

    actor.fault = fault
    server = ActorServer(role, handlers, {AUTH: frozenset(handlers)}, ("127.0.0.1", port), str(cert), str(key_file), str(h.ca_cert))
    server.start()
    conn.send(server.url)
    threading.Event().wait()


class Actors:
    def __init__(self, home: Path, prefix: str):
        self.home, self.prefix = home, prefix
        self.procs: dict[str, multiprocessing.Process] = {}
        self.ports: dict[str, int] = {}
        self.urls: dict[str, str] = {}

    def start(self, role: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        p = ctx.Process(target=actor_main, args=(role, str(self.home), self.prefix, self.ports.get(role, 0), child),
                        daemon=True)
        p.start()
        if not parent.poll(60):
            p.kill()
            pytest.fail(f"{role} actor process did not start")
        self.urls[role] = parent.recv()
        self.ports[role] = int(self.urls[role].rsplit(":", 1)[1].strip("/"))
        self.procs[role] = p

    def kill(self, role: str) -> None:
        p = self.procs.pop(role)
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
        p.join(10)

    def stop(self) -> None:
        for role in list(self.procs):
            self.kill(role)


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    from slicex.devpki import init_ca
    from slicex.home import Home

    h = tmp_path_factory.mktemp("home")
    (h / "slicex.yaml").write_text("authority: t.org\n")
    init_ca(Home(h), "t.org")
    return h


@pytest.fixture(scope="module")
def cluster(home):
    """A broker and an authority process over one Redis prefix, for the whole module."""
    from slicex.actor_rpc import ActorClient
    from slicex.devpki import actor_public_key, actor_urn
    from slicex.home import Home
    from slicex.store.redis_store import RedisStore

    prefix = f"dist-{uuid.uuid4().hex[:8]}"
    store = RedisStore(REDIS_URL, prefix=prefix)
    try:
        store.ping()
    except Unavailable as exc:
        pytest.fail(f"Redis is required ({exc}); run `make redis`")
    h = Home(home)
    actors = Actors(home, prefix)
    actors.start("broker")
    actors.start("authority")
    creds = (str(h.am_cert), str(h.am_key), str(h.ca_cert))
    pin = {role: actor_urn("t.org", role) for role in ("broker", "authority")}
    owner = Authority(AUTH, None, {}, store=store, inventory=export_substrate(SUB, AUTH, "broker"))
    owner.delegate(RemoteBroker(ActorClient("broker", actors.urls["broker"], *creds, pin["broker"])))  # ORCA claim

    def connect() -> ActorSliceManager:
        return ActorSliceManager(
            store, SUB, RemoteBroker(ActorClient("broker", actors.urls["broker"], *creds, pin["broker"], timeout=10)),
            RemoteAuthority(ActorClient("authority", actors.urls["authority"], *creds, pin["authority"], timeout=10)),
            lease_key=actor_public_key(h, "authority", "t.org"))

    yield store, actors, connect
    actors.stop()
    store.flush()


@pytest.fixture
def world(cluster):
    store, actors, connect = cluster
    yield cluster
    store.delete(FAULTS, "broker")
    store.delete(FAULTS, "authority")
    for role in ("broker", "authority"):  # leave both running for the next test
        if role not in actors.procs or not actors.procs[role].is_alive():
            actors.procs.pop(role, None)
            actors.start(role)


def released(store, sm: ActorSliceManager) -> None:
    assert {k: v for k, v in store.all_claims().items()} == {}, "claims left"
    assert store.scan(LEASES) == [] and store.scan(TICKETS) == [] and sm.records() == []


def test_a_slice_lifecycle_over_mutual_tls_and_redis(world):
    store, actors, connect = world
    sm = connect()
    now = ManualClock().now()
    slivers = sm.allocate(SLICE, "o", parse_request(three_node_lan()), now + timedelta(minutes=10), now)
    urns = [s.urn for s in slivers]
    sm.provision(urns, now + timedelta(hours=1), [], now)
    sm.perform(urns, "geni_start", now, False, [])
    renewed = sm.renew(urns, now + timedelta(hours=2), now, False)
    assert {s.expires for s in renewed} == {now + timedelta(hours=2)}
    assert len(store.scan(LEASES)) == 4
    sm.delete(urns, now)
    released(store, sm)


@pytest.mark.parametrize("role,boundary,call", [("broker", "broker:claimed", "allocate"),
                                                ("authority", "authority:created", "provision"),
                                                ("authority", "authority:destroyed", "delete")])
def test_an_actor_process_dying_mid_call_converges_after_restart(world, role, boundary, call):
    store, actors, connect = world
    store.put(FAULTS, role, {"at": boundary})
    sm = connect()
    clock = ManualClock()
    now = clock.now()
    try:
        slivers = sm.allocate(SLICE, "o", parse_request(three_node_lan()), now + timedelta(minutes=10), now)
        urns = [s.urn for s in slivers]
        sm.provision(urns, now + timedelta(hours=1), [], now)
        sm.delete(urns, now)  # a close the authority did not confirm stays queued: the user is not kept waiting
        assert call == "delete" and sm.slivers(SLICE, now) == []
    except GeniError as exc:
        assert call != "delete" and role in exc.message, exc
    actors.procs[role].join(10)
    assert not actors.procs[role].is_alive()
    actors.procs.pop(role)
    store.delete(FAULTS, role)
    actors.start(role)  # restarted on the same port, state from Redis
    sm.reap(now)
    assert [r.id for r in sm.records() if r.r.pending != rs.NONE or r.outbox] == []
    clock.advance(timedelta(minutes=11))
    sm.reap(clock.now())
    left = [r.id for r in sm.records() if not r.discard]
    if left:
        sm.delete(left, clock.now())
    released(store, sm)


def test_a_broker_killed_before_relinquish_gets_it_when_back(world):
    store, actors, connect = world
    sm = connect()
    now = ManualClock().now()
    slivers = sm.allocate(SLICE, "o", parse_request(three_node_lan()), now + timedelta(minutes=10), now)
    actors.kill("broker")
    sm.delete([s.urn for s in slivers], now)
    assert sm.slivers(SLICE, now) == [] and store.all_claims() != {}  # the broker did not hear it yet
    actors.start("broker")
    sm.reap(now)
    released(store, sm)
