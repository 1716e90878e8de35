"""A broker that is down, or a store that is down, gives a clear result and loses nothing; service resumes
when they are back."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import yaml

from deployment.service import ActorProcess
from tests.factories import request_rspec, vm
from tests.integration.conftest import REDIS_URL, start, stop
from tests.integration.test_am_api import code, ok


@contextmanager
def distributed_on_redis(pki_home) -> Iterator:
    """The distributed deployment (broker and authority actor servers) on the test Redis, emptied before and
    after; the home's config is put back."""
    from slicex.store.redis_store import RedisStore

    cfg = yaml.safe_load((pki_home.root / "slicex.yaml").read_text())
    (pki_home.root / "slicex.yaml").write_text(yaml.safe_dump({**cfg, "store": REDIS_URL}))
    RedisStore(REDIS_URL).flush()
    r = start(pki_home, distributed=True)
    try:
        yield r
    finally:
        stop(r)
        RedisStore(REDIS_URL).flush()
        (pki_home.root / "slicex.yaml").write_text(yaml.safe_dump(cfg))


def test_broker_outage_is_unavailable_and_recovers(pki_home, tmp_path):
    with distributed_on_redis(pki_home) as r:
        alice = r.user("alice")
        urn, creds = alice.slice_credential("outage")
        ok(alice.am.Allocate(urn, creds, request_rspec([vm("kept")]), {}))
        held = r.deployment.sm.usage_keys()
        broker_port = int(r.actors[0].url.rsplit(":", 1)[1].strip("/"))
        r.actors[0].stop()
        reply = alice.am.Allocate(urn, creds, request_rspec([vm("more")]), {})
        assert code(reply) == 11 and "broker" in reply["output"]
        assert r.deployment.sm.usage_keys() == held  # nothing taken, nothing lost
        assert len(ok(alice.am.Status([urn], creds, {}))["geni_slivers"]) == 1
        again = ActorProcess(pki_home, "broker", port=broker_port)
        again.start()
        r.actors = (again, r.actors[1])
        ok(alice.am.Allocate(urn, creds, request_rspec([vm("more")]), {}))
        assert len(ok(alice.am.Status([urn], creds, {}))["geni_slivers"]) == 2


def test_store_outage_is_a_result_not_a_crash(pki_home):
    from slicex.store.redis_store import RedisStore

    cfg = yaml.safe_load((pki_home.root / "slicex.yaml").read_text())
    r = start(pki_home)
    try:
        alice = r.user("alice")
        urn, creds = alice.slice_credential("storedown")
        real = r.deployment.sm.store
        r.deployment.sm.store = RedisStore("redis://127.0.0.1:1/0", timeout=0.5)  # a store that is not there
        reply = alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {})
        assert code(reply) == 11 and "not answering" in reply["output"]
        r.deployment.sm.store = real
        ok(alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {}))
    finally:
        stop(r)
        (pki_home.root / "slicex.yaml").write_text(yaml.safe_dump(cfg))


# ---- a Redis server that is killed and restarted -------------------------------------------------------------------
class RedisServer:
    """A private redis-server with an append-only file synced on every write, killed like a crash."""

    def __init__(self, root):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.root = root
        self.proc = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import subprocess
        import time

        import redis

        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.root),
             "--appendonly", "yes", "--appendfsync", "always", "--save", ""],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                redis.Redis.from_url(self.url).ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def test_redis_killed_then_restarted_answers_unavailable_then_loses_nothing(pki_home, tmp_path):
    server = RedisServer(tmp_path)
    server.start()
    cfg = yaml.safe_load((pki_home.root / "slicex.yaml").read_text())
    (pki_home.root / "slicex.yaml").write_text(yaml.safe_dump({**cfg, "store": server.url}))
    r = start(pki_home)
    try:
        alice = r.user("alice")
        urn, creds = alice.slice_credential("redisdown")
        ok(alice.am.Allocate(urn, creds, request_rspec([vm("kept")]), {}))
        ok(alice.am.Provision([urn], creds, {}))
        held = r.deployment.sm.usage_keys()
        server.kill()
        for reply in (alice.am.Allocate(urn, creds, request_rspec([vm("more")]), {}),
                      alice.am.Status([urn], creds, {}), alice.am.Delete([urn], creds, {})):
            assert code(reply) in (8, 11) and "redis://127.0.0.1" in reply["output"], reply
        server.start()  # same directory: it replays its append-only file
        slivers = ok(alice.am.Status([urn], creds, {}))["geni_slivers"]
        assert [s["geni_allocation_status"] for s in slivers] == ["geni_provisioned"]
        assert r.deployment.sm.usage_keys() == held  # nothing lost, nothing half-taken by the failed calls
        ok(alice.am.Allocate(urn, creds, request_rspec([vm("more")]), {}))
        ok(alice.am.Delete([urn], creds, {}))
        assert r.deployment.sm.usage_keys() == set()
    finally:
        stop(r)
        server.kill()
        (pki_home.root / "slicex.yaml").write_text(yaml.safe_dump(cfg))


# ---- an actor that answers too late ----------------------------------------------------------------------------------
def test_slow_broker_is_timedout_and_its_late_ticket_is_given_back(pki_home):
    import threading
    import time

    from slicex.store.redis_store import RedisStore

    cfg = yaml.safe_load((pki_home.root / "slicex.yaml").read_text())
    (pki_home.root / "slicex.yaml").write_text(yaml.safe_dump({**cfg, "store": REDIS_URL,
                                                               "actor_timeout_seconds": 1}))
    RedisStore(REDIS_URL).flush()
    r = start(pki_home, distributed=True)
    broker = r.actors[0].actor
    fast_place = broker.place
    granted = threading.Event()

    def slow_place(*a, **kw):
        time.sleep(2)  # longer than the slice manager waits
        try:
            return fast_place(*a, **kw)
        finally:
            granted.set()

    try:
        alice = r.user("alice")
        urn, creds = alice.slice_credential("slowbroker")
        broker.place = slow_place
        reply = alice.am.Allocate(urn, creds, request_rspec([vm("late")]), {})
        assert code(reply) == 8 and "broker" in reply["output"], reply
        assert granted.wait(10)  # the broker did grant, after the slice manager gave up
        broker.place = fast_place
        deadline = time.monotonic() + 10
        while r.deployment.sm.usage_keys() and time.monotonic() < deadline:
            r.clock.advance(timedelta(seconds=1))  # the slice manager's clock gives the late ticket back
            time.sleep(0.1)
        assert r.deployment.sm.usage_keys() == set()
        assert ok(alice.am.Describe([urn], creds, {"geni_rspec_version": {"type": "GENI", "version": "3"}}))
        ok(alice.am.Allocate(urn, creds, request_rspec([vm("late")]), {}))  # service goes on
    finally:
        stop(r)
        RedisStore(REDIS_URL).flush()
        (pki_home.root / "slicex.yaml").write_text(yaml.safe_dump(cfg))


def test_authority_outage_at_provision_is_unavailable_naming_the_authority(pki_home, tmp_path):
    """A node and its link provisioned while the authority is down: the answer is UNAVAILABLE (11) naming
    the authority, not ERROR (2) from the node that failed only because its link did."""
    with distributed_on_redis(pki_home) as r:
        alice = r.user("alice")
        urn, creds = alice.slice_credential("authdown")
        lan = [{"client_id": "l0", "ifaces": ["a:if0", "b:if0"]}]
        ok(alice.am.Allocate(urn, creds, request_rspec([vm("a", ifaces=["a:if0"]), vm("b", ifaces=["b:if0"])],
                                                       lan), {}))
        r.actors[1].stop()
        reply = alice.am.Provision([urn], creds, {})
        assert code(reply) == 11 and "authority" in reply["output"], reply
