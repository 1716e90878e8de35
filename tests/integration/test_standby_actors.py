"""Standby broker and authority (issue 37): `slicex actor broker|authority --standby` beside the active ones of
`slicex up --distributed`, on one Redis. The active actor holds its role's lease in the store; killed (kill -9),
the standby serves within 10 s and the AM workers follow it (an Allocate succeeds). Paused (SIGSTOP) until its
lease lapses and another took over, then resumed, the former leader writes nothing: its writes carry its
lease's fencing token, which the store checks inside each write (its own log says so), and the slices and
claims are whole. After deleting every slice nothing is left.

Below, the store primitives themselves: a fenced write after a takeover is refused, whatever the writer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deployment.leadership import LEASE_SECONDS, lease_name, roles_status
from lab.redis_ha import Node, RedisHa
from slicex import procs
from slicex.store.redis_store import Fenced, RedisStore
from tests.integration.test_chaos import REQUEST, Deployment, _wait
from tests.integration.test_sentinel_store import _ok, _slice
from tests.ports import free_ports

TAKEOVER_S = 10


def _redis(root: Path) -> RedisHa:
    """A lone redis-server (no replica, no sentinel) on SLICEX_SENTINEL_PORT_BASE+5 or a free port."""
    base = os.environ.get("SLICEX_SENTINEL_PORT_BASE")
    port = int(base) + 5 if base else free_ports(1)[0]
    return RedisHa(root, Node("127.0.0.1", port), [], [])


class Standby:
    """`slicex actor ROLE --standby --port N` run by hand beside the deployment's own actor."""

    def __init__(self, dep: Deployment, role: str):
        self.role = role
        self.log = dep.root / "logs" / f"{role}-standby.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "cli", "--home", str(dep.root), "actor", role,
                                          "--standby", "--port", str(free_ports(1)[0])], env=dep.env,
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        record = dep.root / "run" / f"{role}-standby.pid"
        assert _wait(lambda: procs.running(record) is not None, 30), self.log.read_text()[-2000:]
        self.holder = procs.running(record).info["holder"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _roles(dep: Deployment) -> dict:
    store = dep.store()
    try:
        return roles_status(store)
    finally:
        store.close()


def _active(dep: Deployment, role: str) -> str | None:
    active = _roles(dep)[role]["active"]
    return active["holder"] if active and active["url"] else None


def _allocate_until_ok(dep: Deployment, name: str, within: float) -> tuple[str, list, float, list[int]]:
    """Allocate a new slice until it succeeds (or `within` passes): the slice, its credential, when, refusals."""
    am, _sa = dep.proxy()
    urn, cred = _slice(dep, name)
    began, codes = time.monotonic(), []
    while time.monotonic() - began < within:
        reply = am.Allocate(urn, cred, REQUEST, {})
        if reply["code"]["geni_code"] == 0:
            return urn, cred, time.monotonic() - began, codes
        codes.append(reply["code"]["geni_code"])
        assert reply["output"].strip(), reply
        time.sleep(0.3)
    pytest.fail(f"no Allocate succeeded within {within:.0f} s: codes {codes}")


@pytest.mark.timeout(300)
def test_a_killed_active_actor_is_replaced_by_its_standby_within_10_s_and_a_paused_one_writes_nothing(
        tmp_path: Path):
    redis = _redis(tmp_path / "redis")
    redis.start()
    dep = Deployment(tmp_path / "home", distributed=True,
                     store=f"redis://{redis.primary.host}:{redis.primary.port}/0")
    standbys: list[Standby] = []
    try:
        dep.up()
        assert dep.status_ok(30), dep.cli("status", check=False).stdout
        before = dep.units()
        slices = [_allocate_until_ok(dep, "first", 10)[:2]]
        for role in ("broker", "authority"):
            standbys.append(Standby(dep, role))
        status = dep.cli("status").stdout
        assert "broker role: active" in status and "standby: " in status, status

        for standby in standbys:  # kill -9 the active one: the standby serves, the AM follows it
            role = standby.role
            active = _active(dep, role)
            assert active and active != standby.holder
            os.kill(int(active.split("/")[1]), signal.SIGKILL)
            killed = time.monotonic()
            assert _wait(lambda r=role, a=active: _active(dep, r) not in (None, a), TAKEOVER_S), _roles(dep)
            assert _active(dep, role) == standby.holder, "the supervisor's restart won, not the standby"
            urn, cred, _t, codes = _allocate_until_ok(dep, f"after-{role}", TAKEOVER_S)
            took = time.monotonic() - killed
            print(f"{role}: killed; {_active(dep, role)} active and an Allocate served {took:.1f} s later "
                  f"({len(codes)} refused before: {codes})")
            assert took < TAKEOVER_S
            slices.append((urn, cred))

        # pause the active broker until another takes its lease, then let it run: its writes are refused
        paused_holder = _active(dep, "broker")
        paused = int(paused_holder.split("/")[1])
        os.kill(paused, signal.SIGSTOP)
        try:
            assert _wait(lambda: _active(dep, "broker") not in (None, paused_holder), LEASE_SECONDS + TAKEOVER_S), \
                _roles(dep)
            slices.append(_allocate_until_ok(dep, "while-paused", TAKEOVER_S)[:2])
        finally:
            os.kill(paused, signal.SIGCONT)
        logs = sorted((dep.root / "logs").glob("broker*.log"))
        assert _wait(lambda: any("no longer active" in p.read_text(errors="replace") for p in logs), 15), \
            "the resumed former broker did not notice it lost its lease"
        assert _active(dep, "broker") != paused_holder
        slices.append(_allocate_until_ok(dep, "after-resume", TAKEOVER_S)[:2])
        status = dep.cli("status", check=False).stdout
        assert "broker role: active" in status and "authority role: active" in status, status

        am, _sa = dep.proxy()
        for urn, cred in slices:
            _ok(am.Delete([urn], cred, {}), f"Delete {urn}")
        settled = _wait(lambda: dep.units() == before and not dep.unsettled(), 30)
        assert settled, f"left: claims {set(dep.units().items()) ^ set(before.items())}, {dep.unsettled()[:5]}"
    finally:
        for standby in standbys:
            standby.stop()
        dep.cli("down", check=False)
        redis.stop()


def test_a_fenced_write_is_refused_once_another_took_the_lease(tmp_path: Path):
    redis = _redis(tmp_path / "redis")
    redis.start()
    try:
        store = RedisStore(f"redis://{redis.primary.host}:{redis.primary.port}/0", prefix="fence-test")
        name = lease_name("broker")
        first = store.take_lease(name, "a", 200)
        assert first is not None and store.take_lease(name, "b", 200) is None  # held: no second holder
        old = store.fenced(name, first)
        old.put("t", "k", {"v": 1})
        assert old.claim("core:h1:1", "old")
        time.sleep(0.3)  # "a" paused past its lease
        second = store.take_lease(name, "b", 5000)
        assert second is not None and second > first
        assert not store.renew_lease(name, "a", first, 200)
        for write in (lambda: old.put("t", "k", {"v": 2}), lambda: old.delete("t", "k"),
                      lambda: old.claim("core:h1:2", "old"), lambda: old.release("core:h1:1", "old"),
                      lambda: old.release_owner("old")):
            with pytest.raises(Fenced) as refused:
                write()
            assert refused.value.code == 14 and "no longer the active one" in refused.value.message
        assert store.get("t", "k") == {"v": 1} and store.owner_of("core:h1:1") == "old"
        assert store.owner_of("core:h1:2") is None
        new = store.fenced(name, second)
        new.put("t", "k", {"v": 3})
        assert new.release("core:h1:1", "old") and store.get("t", "k") == {"v": 3}
        store.flush()
    finally:
        redis.stop()
