"""Chaos under load (issue 14): client loops run Allocate -> Provision -> geni_start -> Status -> Delete over
mutual TLS while the deployment's processes are killed with SIGKILL and brought back the documented way
(`slicex up --detach`, the supervisor for actors, Redis from its append-only file). Afterwards every slice
can be deleted, the store's unit/core/tag claims are back where they started, nothing is pending, and every
failed call carried a GENI code that names the cause; "no answer" is only accepted while the AM was down.

Timing comes from a seeded random.Random: the seed is printed, and SLICEX_CHAOS_SEED=N replays a run."""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import xml.parsers.expat
import xmlrpc.client
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from slice_manager.records import Record
from slicex import procs
from slicex.home import Home
from slicex.store import Store, open_store
from slicex.tls_xmlrpc import client
from tests.factories import request_rspec, vm
from tests.integration.test_outages import RedisServer
from tests.ports import free_ports

AUTHORITY = "chaos.test"
CLIENTS = 4
# Failure codes that name a transient cause the caller can act on (retry, or the slice is gone).
TRANSIENT = {8: "TIMEDOUT", 9: "DBERROR", 10: "RPCERROR", 11: "UNAVAILABLE", 12: "SEARCHFAILED", 14: "BUSY",
             16: "INPROGRESS"}
# ERROR (2) is accepted only when its output says which part failed.
CAUSES = ("broker", "authority", "store", "redis", "unavailable", "not reachable", "did not answer", "timed out")
# A request with two VMs joined by a link: it takes cores, memory and a VLAN tag.
REQUEST = request_rspec([vm("a", ifaces=["a:if0"]), vm("b", ifaces=["b:if0"])],
                        [{"client_id": "lan", "ifaces": ["a:if0", "b:if0"]}])
# no answer: refused, reset, or a reply cut short by the kill (an empty body is an ExpatError)
NO_ANSWER = (OSError, http.client.HTTPException, xmlrpc.client.ProtocolError, xml.parsers.expat.ExpatError)


def _seed() -> int:
    seed = int(os.environ.get("SLICEX_CHAOS_SEED") or random.SystemRandom().randrange(1 << 31))
    print(f"chaos seed {seed} (SLICEX_CHAOS_SEED={seed} replays this run's timing)")
    return seed


def _port_base() -> int:
    """The first of eight consecutive free ports (ca init --port-base N uses N..N+5, the CH API N+7)."""
    return free_ports(8, consecutive=True)[0]


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


# ---- the deployment, run as an operator runs it --------------------------------------------------------------------
class Deployment:
    """A fresh home started, killed and restarted with the `slicex` command; the store read directly."""

    def __init__(self, root: Path, distributed: bool, store: str | None = None):
        self.root = root
        self.distributed = distributed
        self.env = {k: v for k, v in os.environ.items() if k not in ("SLICEX_STORE", "SLICEX_REDIS_URL")}
        base = _port_base()
        self.cli("ca", "init", "--authority", AUTHORITY, "--port-base", str(base))
        cfg = yaml.safe_load((root / "slicex.yaml").read_text())
        # a fast actor clock (the reaper and the actors' expiry), and actor calls that give up within seconds
        cfg.update({"tick_seconds": 0.2, "actor_timeout_seconds": 5, "store": store})
        (root / "slicex.yaml").write_text(yaml.safe_dump(cfg))
        self.cli("user", "add", "alice")
        self.home = Home(root)
        self.cfg = self.home.config()
        self.am_url = f"https://127.0.0.1:{self.cfg.am_port}/"
        self.sa_url = f"https://127.0.0.1:{self.cfg.sa_port}/"

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run([sys.executable, "-m", "cli", "--home", str(self.root), *args],
                             capture_output=True, text=True, timeout=90, env=self.env)
        assert not check or out.returncode == 0, f"slicex {' '.join(args)}: {out.stdout}{out.stderr}"
        return out

    def up(self) -> None:
        """The documented start (and restart after a crash)."""
        self.cli("up", "--detach", *(["--distributed"] if self.distributed else []))

    def pid(self, role: str) -> int | None:
        record = procs.running(self.root / "run" / f"{role}.pid")
        return record.pid if record else None

    def status_ok(self, timeout: float) -> bool:
        return _wait(lambda: self.cli("status", check=False).returncode == 0, timeout)

    def proxy(self, timeout: float = 30) -> tuple[xmlrpc.client.ServerProxy, xmlrpc.client.ServerProxy]:
        cert, key = str(self.home.user_cert("alice")), str(self.home.user_key("alice"))
        return client(self.am_url, cert, key, timeout=timeout), client(self.sa_url, cert, key, timeout=timeout)

    def store(self) -> Store:
        return open_store(str(self.home.config().store))

    def units(self) -> dict[str, str]:
        """Every claim but the slice authority's slice names: units, tags, leases, reservation locks."""
        store = self.store()
        try:
            return {k: v for k, v in store.all_claims().items() if not k.startswith("sa_slice:")}
        finally:
            store.close()

    def unsettled(self) -> list[dict[str, Any]]:
        """What is left once every slice is deleted: reservations still pending, still sending or still
        holding something; tickets the broker keeps or queues; leases the authority keeps active."""
        store = self.store()
        try:
            left: list[dict[str, Any]] = [
                {"id": r.id, "slice": r.slice_urn, "state": r.r.state, "pending": r.r.pending,
                 "outbox": r.outbox, "reason": r.r.reason}
                for r in map(Record.from_doc, store.scan("sm-reservations"))
                if r.r.pending != "None" or r.outbox or r.r.state not in ("Closed", "Failed")]
            left += [{"broker-tickets": d["ticket"].get("id")} for d in store.scan("broker-tickets")]
            left += [{"authority-leases": d["lease"].get("id")} for d in store.scan("authority-leases")
                     if d.get("state") == "active"]
            return left
        finally:
            store.close()


# ---- clients ---------------------------------------------------------------------------------------------------------
@dataclass
class Call:
    client: int
    method: str
    slice_urn: str
    ended: float
    code: int | None  # the GENI code of a result or a fault; None: no answer (the process was not there)
    output: str
    kind: str  # "result", "fault" (slice authority), "no answer", "false success" (code 0, not done)


@dataclass
class Loops:
    """CLIENTS threads, each creating slices of its own and running the lifecycle on them until stopped."""

    dep: Deployment
    calls: list[Call] = field(default_factory=list)
    slices: dict[str, str | None] = field(default_factory=dict)  # every slice asked for -> its credential
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        self.threads = [threading.Thread(target=self._loop, args=(i,), name=f"chaos-client-{i}", daemon=True)
                        for i in range(CLIENTS)]
        for t in self.threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)
        assert not any(t.is_alive() for t in self.threads), "a client loop hung"

    def _record(self, call: Call) -> None:
        with self.lock:
            self.calls.append(call)

    def _call(self, i: int, proxy: xmlrpc.client.ServerProxy, method: str, urn: str, *args: Any) -> Any:
        """One call, recorded; returns the reply, or None when there was no answer or a fault."""
        try:
            reply = getattr(proxy, method)(*args)
        except xmlrpc.client.Fault as exc:
            self._record(Call(i, method, urn, time.monotonic(), exc.faultCode, exc.faultString, "fault"))
            return None
        except NO_ANSWER as exc:
            self._record(Call(i, method, urn, time.monotonic(), None, f"{type(exc).__name__}: {exc}", "no answer"))
            time.sleep(0.2)
            return None
        if method == "CreateSlice":
            self._record(Call(i, method, urn, time.monotonic(), 0, "", "result"))
            return reply
        self._record(Call(i, method, urn, time.monotonic(), reply["code"]["geni_code"], reply.get("output") or "",
                          "result"))
        return reply

    def _loop(self, i: int) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            self._cycle(i, f"urn:publicid:IDN+{AUTHORITY}+slice+chaos{i}x{n}")

    def _cycle(self, i: int, urn: str) -> None:
        """A new slice through the lifecycle; Delete also after a failed step, as a careful script does."""
        am, sa = self.dep.proxy()  # new connections per cycle, as omni makes
        with self.lock:
            self.slices[urn] = None  # asked for: it may exist even if the answer was lost
        cred = self._call(i, sa, "CreateSlice", urn, urn)
        if cred is None:
            return
        with self.lock:
            self.slices[urn] = cred
        creds = [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": cred}]
        for method, args in (("Allocate", (urn, creds, REQUEST, {})), ("Provision", ([urn], creds, {})),
                             ("PerformOperationalAction", ([urn], creds, "geni_start", {})),
                             ("Status", ([urn], creds, {}))):
            reply = self._call(i, am, method, urn, *args)
            if method == "Provision" and reply is not None and reply["code"]["geni_code"] != 0:
                reply = self._call(i, am, method, urn, *args)  # the retry a transient error invites
            if reply is None or reply["code"]["geni_code"] != 0:
                break
            if method == "Provision":  # success means provisioned: every sliver, nothing failed
                states = {(s["geni_allocation_status"], s["geni_operational_status"]) for s in reply["value"]["geni_slivers"]}
                if any(a != "geni_provisioned" or o == "geni_failed" for a, o in states):
                    self._record(Call(i, "Provision", urn, time.monotonic(), -1, f"SUCCESS with slivers {states}",
                                      "false success"))
                    break
        self._call(i, am, "Delete", urn, [urn], creds, {})


# ---- the run ---------------------------------------------------------------------------------------------------------
@dataclass
class Chaos:
    dep: Deployment
    rng: random.Random
    down: list[tuple[float, float]] = field(default_factory=list)  # when the AM could not answer
    kills: list[str] = field(default_factory=list)
    at: list[float] = field(default_factory=list)  # when each kill was made (time.monotonic)
    last: float = 0.0  # when the last killed process was back

    def killed(self, what: str, at: float) -> None:
        self.kills.append(what)
        self.at.append(at)
        self.last = time.monotonic()

    def pause(self, low: float, high: float) -> None:
        time.sleep(self.rng.uniform(low, high))

    def kill_deployment(self) -> None:
        """SIGKILL `slicex up` at a random moment; its actors must die with it; restart it as documented."""
        dep = self.dep
        pids = {role: dep.pid(role) for role in ("slicex", "broker", "authority")}
        assert pids["slicex"], "the deployment is not running"
        began = time.monotonic()
        os.kill(pids["slicex"], signal.SIGKILL)
        if dep.distributed:
            assert _wait(lambda: all(_gone(pids[r]) for r in ("broker", "authority")), 15), \
                "actors outlived their deployment"
        self.pause(0.2, 1.5)
        dep.up()
        self.down.append((began, time.monotonic() + 1.0))
        self.killed(f"slicex up (pid {pids['slicex']})", began)

    def kill_actor(self, role: str) -> None:
        """SIGKILL an actor; the deployment's supervisor must start another."""
        pid = self.dep.pid(role)
        assert pid, f"the {role} actor is not running"
        began = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        assert _wait(lambda: self.dep.pid(role) not in (None, pid), 20), f"the {role} actor was not restarted"
        self.killed(f"{role} actor (pid {pid}, back in {time.monotonic() - began:.1f} s)", began)

    def kill_redis(self, redis: RedisServer) -> None:
        """SIGKILL Redis; restart it on its port from its append-only file."""
        pid, began = redis.proc.pid, time.monotonic()
        redis.kill()
        self.pause(0.5, 2.0)
        redis.start()
        self.killed(f"redis-server (pid {pid})", began)


def _gone(pid: int | None) -> bool:
    stat = procs._stat(pid) if pid else None
    return stat is None or stat[0] in ("Z", "X")


def _cleanup(dep: Deployment, loops: Loops) -> list[str]:
    """Delete every slice a client created, with the slice credential the slice authority gave its owner;
    the problems seen. A slice whose CreateSlice got no answer had no AM calls: nothing of it to delete."""
    problems = []
    am, _sa = dep.proxy()
    for urn, cred in sorted(loops.slices.items()):
        if cred is None:
            continue  # no credential, so no AM call was made for it (the store check below sees the rest)
        reply = am.Delete([urn], [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": cred}], {})
        if reply["code"]["geni_code"] not in (0, 12):  # 12: nothing of it left here
            problems.append(f"Delete {urn} after the chaos: {reply['code']['geni_code']} {reply['output']}")
    return problems


def _judge(calls: list[Call], down: list[tuple[float, float]]) -> list[str]:
    """Every failure named its cause with a transient GENI code; no answer only while the AM was down."""
    bad = []
    for c in calls:
        where = f"client {c.client} {c.method} {c.slice_urn.rsplit('+', 1)[-1]}"
        if c.kind == "false success":
            bad.append(f"{where}: {c.output}")
        elif c.kind == "no answer":
            if not any(a <= c.ended <= b for a, b in down):
                bad.append(f"{where}: no answer while the AM was up: {c.output}")
        elif c.code != 0:
            if not c.output.strip():
                bad.append(f"{where}: code {c.code} with no output")
            elif c.code == 2:
                if not any(word in c.output.lower() for word in CAUSES):
                    bad.append(f"{where}: ERROR that does not name its cause: {c.output}")
            elif c.code not in TRANSIENT:
                bad.append(f"{where}: code {c.code} ({c.kind}): {c.output}")
    return bad


def _summary(calls: list[Call]) -> str:
    """Calls by method and code, and one output of each kind of failure (what a reader of a failed run needs)."""
    counts = Counter((c.method, "no answer" if c.code is None else c.code) for c in calls)
    samples = {(c.method, c.code): c.output for c in calls if c.code != 0}
    return ", ".join(f"{m} {code}: {n}" for (m, code), n in sorted(counts.items(), key=str)) + "".join(
        f"\n  e.g. {m} {code}: {out[:300]}" for (m, code), out in sorted(samples.items(), key=str))


def _run(dep: Deployment, chaos: Chaos, schedule) -> None:
    """Clients under the kills of `schedule`; then clean up and check the store returns to where it began."""
    dep.up()
    assert dep.status_ok(30)
    before = dep.units()
    loops = Loops(dep)
    started = time.monotonic()
    loops.start()
    try:
        schedule()
        chaos.pause(3.0, 5.0)  # the loops run on the restarted deployment
    finally:
        loops.join()
    chaos_s = time.monotonic() - started
    assert dep.status_ok(30), dep.cli("status", check=False).stdout
    cleaning = time.monotonic()
    problems = _cleanup(dep, loops)
    settled = _wait(lambda: dep.units() == before and not dep.unsettled(), 30)
    print(f"{len(chaos.kills)} kills survived in {chaos_s:.0f} s: {'; '.join(chaos.kills)}; cleanup and "
          f"settling {time.monotonic() - cleaning:.0f} s")
    print(f"{len(loops.calls)} calls by {CLIENTS} clients on {len(loops.slices)} slices: {_summary(loops.calls)}")
    log = dep.root.parent / "chaos-calls.jsonl"  # every call and kill, for reading a failed run
    log.write_text("".join(json.dumps(asdict(c)) + "\n" for c in loops.calls)
                   + "".join(json.dumps({"kill": k, "at": t}) + "\n" for k, t in zip(chaos.kills, chaos.at, strict=True)))
    print(f"calls and kills: {log}")
    bad = _judge(loops.calls, chaos.down)
    resumed = [c for c in loops.calls if c.method == "Status" and c.code == 0 and c.ended > chaos.last]
    assert resumed, "no client completed a cycle after the last kill: service did not resume"
    assert not problems, problems[:10]
    leftover = {k: v for k, v in dep.units().items() if before.get(k) != v}
    assert settled, f"not back to the start: claims {dict(list(leftover.items())[:10])}, " \
                    f"reservations {dep.unsettled()[:5]}"
    assert not bad, f"{len(bad)} failures without a cause: {bad[:10]}\nlogs: {dep.root / 'logs'}"


@pytest.mark.timeout(150)
def test_chaos_embedded_process_killed_under_load(tmp_path: Path):
    rng = random.Random(_seed())
    dep = Deployment(tmp_path / "home", distributed=False)
    chaos = Chaos(dep, rng)

    def schedule() -> None:
        chaos.pause(2.0, 4.0)
        for _ in range(3):
            chaos.kill_deployment()
            chaos.pause(4.0, 8.0)

    try:
        _run(dep, chaos, schedule)
    finally:
        dep.cli("down", check=False)
    assert len(chaos.kills) == 3


@pytest.mark.timeout(150)
def test_chaos_distributed_actors_am_and_redis_killed_under_load(tmp_path: Path):
    rng = random.Random(_seed())
    redis = RedisServer(tmp_path)
    redis.start()
    try:
        dep = Deployment(tmp_path / "home", distributed=True, store=redis.url)
        chaos = Chaos(dep, rng)

        def schedule() -> None:
            chaos.pause(2.0, 4.0)
            chaos.kill_actor("broker")
            chaos.pause(3.0, 6.0)
            chaos.kill_actor("authority")
            chaos.pause(3.0, 6.0)
            chaos.kill_deployment()
            chaos.pause(3.0, 6.0)
            chaos.kill_redis(redis)
            assert dep.status_ok(30), dep.cli("status", check=False).stdout

        try:
            _run(dep, chaos, schedule)
        finally:
            dep.cli("down", check=False)
        assert len(chaos.kills) == 4
    finally:
        if redis.proc.poll() is None:
            redis.kill()
