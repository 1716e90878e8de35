"""Actor benchmarks: the broker and authority messages, each measured on its own, for a broker holding
10,000 units (100 hosts of 100 cores), with 1, 10 and 100 concurrent slice managers.

Each cell runs phases, one after the other, and each row is timed from its own phase only:
  ticket      per call: a `place` of one default VM (1 core): the broker's policy picks the host (first-fit),
              claims the units, signs the ticket
  redeem      per call: the authority checks the ticket, leases the unit, asks the emulated driver
  close       per call: the authority closes the lease
  relinquish  per call: the broker takes the ticket's unit back
  cycle       per cycle: ticket → redeem → close → relinquish in a loop (a separate phase)
Tickets, leases and the slice managers' threads are made before their phase's clock starts; what a phase
did not reach is cleaned up untimed afterwards, and every run must end with no claim left ("leaked").
A phase runs at least --seconds and until it has --min-samples (so p99 is supported), at most --max-seconds.

Deployments:
  embedded-sqlite  broker and authority objects in this process, over one SQLite file
  embedded-redis   the same over Redis (SLICEX_REDIS_URL, default redis://127.0.0.1:6379/7)
  distributed      `slicex up --distributed` on a temporary SLICEX_HOME: the broker and authority are
                   `slicex actor` processes of their own, called over HTTPS with mutual TLS (as the AM's
                   identity), state in Redis; the slice managers here are only clients
The slice managers are threads of this process in every deployment.

Run: .venv/bin/python bench/actors.py [--seconds S] [--managers 1,10,100] [--deployments a,b,c]"""

from __future__ import annotations

import argparse
import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from bench._common import emit, machine, report  # noqa: E402
from bench.stats import summarise  # noqa: E402

AUTHORITY = "bench.org"
AM = f"urn:publicid:IDN+{AUTHORITY}+authority+am"  # the aggregate's inventory name in tickets and leases
HOSTS, CORES = 100, 100
UNITS = HOSTS * CORES


ONE_VM = ('<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">'
          '<node client_id="n1" exclusive="false"><sliver_type name="default-vm"/></node></rspec>')


def substrate_doc() -> dict:
    """100 hosts of 100 cores: 10,000 core units, what runs out (each host has the memory of 100 default VMs)."""
    return {"authority": AUTHORITY,
            "hosts": [{"name": f"h{h}", "cores": CORES, "memory_mb": CORES * 1024} for h in range(HOSTS)]}


def now() -> datetime:
    return datetime.now(UTC)  # the authority checks tickets against its own (system) clock


# ---- deployments ---------------------------------------------------------------------------------------------
class Embedded:
    """Broker and authority objects in this process, on one store."""

    def __init__(self, name: str, store_url: str):
        from cryptography.hazmat.primitives.asymmetric import rsa

        from authority.actor import Authority
        from authority.substrate.emulated import EmulatedDriver
        from broker.broker import Broker
        from resources import export_substrate
        from rspec.substrate import substrate_from_dict
        from slicex.store import open_store

        self.name = name
        self.store = open_store(store_url)
        if hasattr(self.store, "flush"):
            self.store.flush()
        sub = substrate_from_dict(substrate_doc())
        bkey, akey = (rsa.generate_private_key(public_exponent=65537, key_size=2048) for _ in range(2))
        self.broker = Broker("broker", self.store, bkey, authority=AM)
        self.authority = Authority(AM, EmulatedDriver(sub), {"broker": bkey.public_key()}, store=self.store,
                                   key=akey, inventory=export_substrate(sub, AM, "broker"))
        self.authority.export_to(self.broker)

    def claims(self) -> int:
        return len(self.store.all_claims())

    def warm(self) -> None:
        """Nothing to connect to in-process."""

    def stop(self) -> None:
        if hasattr(self.store, "flush"):
            self.store.flush()
        self.store.close()


class Distributed:
    """`slicex up --distributed` in a process of its own: it starts the broker and authority as `slicex actor`
    processes (and delegates the authority's inventory); this process calls them over mutual TLS."""

    def __init__(self, root: Path, store_url: str):
        from protocol.remote import RemoteAuthority, RemoteBroker
        from slicex.actor_rpc import ActorClient
        from slicex.devpki import actor_urn
        from slicex.home import Home
        from slicex.store import open_store

        self.name = "distributed"
        self.store_url = store_url
        home = root / "distributed"
        home.mkdir(parents=True)
        (home / "substrate.yaml").write_text(yaml.safe_dump(substrate_doc()))
        ports = {k: _free_port() for k in ("sa_port", "am_port", "broker_port", "authority_port")}
        (home / "slicex.yaml").write_text(yaml.safe_dump({
            "authority": AUTHORITY, "host": "127.0.0.1", "store": store_url, "dashboard_port": None,
            "substrate": str(home / "substrate.yaml"), **ports}))
        open_store(store_url).flush()
        subprocess.run([sys.executable, "-m", "cli", "--home", str(home), "ca", "init", "--authority",
                        AUTHORITY], check=True, stdout=subprocess.DEVNULL)
        (home / "logs").mkdir()
        log = open(home / "logs" / "bench-up.log", "ab")  # noqa: SIM115 - open while the process runs
        self.proc = subprocess.Popen([sys.executable, "-m", "cli", "--home", str(home), "up",
                                      "--distributed"], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"`slicex up --distributed` did not serve: "
                                   f"{(home / 'logs' / 'bench-up.log').read_text()[-2000:]}")
            try:
                doc = yaml.safe_load((home / "run" / "slicex.pid").read_text())
            except (OSError, yaml.YAMLError):
                doc = None
            if isinstance(doc, dict) and doc.get("pid") == self.proc.pid:
                break
            time.sleep(0.2)
        self.actor_pids = {role: yaml.safe_load((home / "run" / f"{role}.pid").read_text())["pid"]
                           for role in ("broker", "authority")}
        if os.getpid() in self.actor_pids.values():
            raise RuntimeError("an actor runs in the benchmark's own process")
        h = Home(home)
        creds = (str(h.am_cert), str(h.am_key), str(h.ca_cert))
        self.broker = RemoteBroker(ActorClient("broker", f"https://127.0.0.1:{ports['broker_port']}/", *creds,
                                               actor_urn(AUTHORITY, "broker")))
        self.authority = RemoteAuthority(ActorClient("authority", f"https://127.0.0.1:{ports['authority_port']}/",
                                                     *creds, actor_urn(AUTHORITY, "authority")))
        self.store = open_store(store_url)  # only to count claims left over (the leak check)

    def claims(self) -> int:
        return len(self.store.all_claims())

    def warm(self) -> None:
        """Open this thread's kept-alive TLS connection to each actor before any clock starts (a method the
        actors do not have: they answer with a fault, and the connection stays open)."""
        from slicex.errors import GeniError

        for actor in (self.broker, self.authority):
            try:
                actor.client.call("slicex_bench_connect")
            except GeniError:
                pass

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # `slicex up` stops the actor processes it started
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        store = getattr(self, "store", None)
        if store is not None:
            store.flush()
            store.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- phases ---------------------------------------------------------------------------------------------------
class Managers:
    """`n` slice-manager threads that live for the whole cell, so each keeps its connections to the actors
    (made by `warm` before any clock starts) from phase to phase."""

    def __init__(self, n: int, warm, args):
        self.n, self.args = n, args
        self.jobs: list[queue.Queue] = [queue.Queue() for _ in range(n)]
        self.done: queue.Queue = queue.Queue()
        self.threads = [threading.Thread(target=self._loop, args=(m, warm), daemon=True) for m in range(n)]
        for t in self.threads:
            t.start()
        for _ in range(n):
            self.done.get()  # warmed

    def _loop(self, m: int, warm) -> None:
        from slicex.errors import GeniError

        warm()
        self.done.put(m)
        while (job := self.jobs[m].get()) is not None:
            items, step, ready, go, stop, lat, out, errors, ends = job
            ready.wait()
            go.wait()
            for item in items:
                if stop.is_set():
                    break
                t0 = time.perf_counter()
                try:
                    result = step(m, item)
                except GeniError as exc:
                    errors.append(f"{type(exc).__name__}: {exc.message}")
                    continue
                t1 = time.perf_counter()
                lat[m].append(t1 - t0)
                out[m].append(result)
                ends[m] = t1
            self.done.put(m)

    def phase(self, items: list[list], step, need: int) -> tuple[list[float], float, list[list], list[str]]:
        """Each manager works through its own items with `step`, each step timed. The clock starts once every
        manager has its work; it stops when the phase has run --seconds and has `need` samples, at
        --max-seconds, or when the items run out. Returns (latencies, wall, results per manager, errors)."""
        lat: list[list[float]] = [[] for _ in range(self.n)]
        out: list[list] = [[] for _ in range(self.n)]
        errors: list[str] = []
        ends = [0.0] * self.n
        ready, go, stop = threading.Barrier(self.n + 1), threading.Event(), threading.Event()
        for m in range(self.n):
            self.jobs[m].put((items[m], step, ready, go, stop, lat, out, errors, ends))
        ready.wait()
        t0 = time.perf_counter()
        go.set()
        finished = 0
        while finished < self.n:
            elapsed = time.perf_counter() - t0
            if elapsed >= self.args.max_seconds or (elapsed >= self.args.seconds
                                                     and sum(len(v) for v in lat) >= need):
                stop.set()
            try:
                self.done.get(timeout=0.02)
                finished += 1
            except queue.Empty:
                pass
        wall = max([e for e in ends if e] or [t0]) - t0
        return [x for v in lat for x in v], wall, out, errors

    def close(self) -> None:
        for q in self.jobs:
            q.put(None)
        for t in self.threads:
            t.join()


def run(dep, managers: int, args) -> list[dict]:
    from protocol.messages import SliverSpec, demands_of
    from rspec.request import parse_request
    from slicex.term import Term

    before = dep.claims()
    start = now()
    term = Term(start, start + timedelta(hours=2))
    one_vm = parse_request(ONE_VM)
    crew = Managers(managers, dep.warm, args)
    need = args.min_samples
    cap = int(UNITS * 0.9) // managers  # tickets held at once stay below the inventory
    rows: list[dict] = []
    all_errors: list[str] = []

    def ticket(m: int, rid: str):
        return rid, dep.broker.place(f"sm{m}", demands_of(one_vm, {"n1": rid}), term, now()).tickets[rid]

    def redeem(m: int, held):
        rid, t = held
        dep.authority.redeem(t, SliverSpec(rid, "node", rid), now())
        return held

    def close(m: int, held):
        dep.authority.close(held[1].id, now())
        return held

    def relinquish(m: int, held):
        dep.broker.relinquish(held[1], now())
        return held

    def cycle(m: int, rid: str):
        held = ticket(m, rid)
        try:
            redeem(m, held)
            close(m, held)
        finally:
            relinquish(m, held)

    def record(op: str, unit: str, result) -> list:
        lat, wall, out, errors = result
        all_errors.extend(errors)
        rows.append({"operation": op, **summarise(lat, wall, rate_unit=unit), "errors": len(errors)})
        return out

    rids = [[uuid.uuid4().hex for _ in range(cap)] for _ in range(managers)]
    tickets = record("ticket", "calls/s", crew.phase(rids, ticket, need))
    leases = record("redeem", "calls/s", crew.phase(tickets, redeem, need))
    closed = record("close", "calls/s", crew.phase(leases, close, need))
    for m in range(managers):  # untimed: leases the close phase did not reach
        for held in _not_in(leases[m], closed[m]):
            close(m, held)
    given_back = record("relinquish", "calls/s", crew.phase(tickets, relinquish, need))
    for m in range(managers):  # untimed: tickets the relinquish phase did not reach
        for held in _not_in(tickets[m], given_back[m]):
            relinquish(m, held)
    record("cycle (ticket+redeem+close+relinquish)", "cycles/s",
           crew.phase([[uuid.uuid4().hex for _ in range(cap)] for _ in range(managers)], cycle, need))
    crew.close()
    leaked = dep.claims() - before
    if all_errors:
        print(f"{dep.name} x{managers}: {len(all_errors)} errors, e.g. {all_errors[0]}", file=sys.stderr)
    return [{"bench": "actors", "deployment": dep.name, "units": UNITS, "slice_managers": managers,
             "clients": f"{managers} thread{'s' if managers > 1 else ''} in the benchmark process",
             **r, "leaked_claims": leaked} for r in rows]


def _not_in(held: list, done: list) -> list:
    ids = {t.id for _, t in done}
    return [h for h in held if h[1].id not in ids]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=1.0, help="least time per phase (default 1)")
    p.add_argument("--max-seconds", type=float, default=8.0, help="most time per phase (default 8)")
    p.add_argument("--min-samples", type=int, default=100, help="samples wanted per phase (default 100, for p99)")
    p.add_argument("--managers", default="1,10,100")
    p.add_argument("--deployments", default="embedded-sqlite,embedded-redis,distributed")
    args = p.parse_args()
    redis_url = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/7")
    print(f"machine: {machine()}; slice managers are threads of this process\n")
    rows = []
    with tempfile.TemporaryDirectory(prefix="slicex-bench-") as tmp:
        for name in args.deployments.split(","):
            for managers in (int(m) for m in args.managers.split(",")):
                if name == "embedded-sqlite":
                    dep = Embedded(name, f"sqlite:///{tmp}/bench-{managers}.db")
                elif name == "embedded-redis":
                    dep = Embedded(name, redis_url)
                elif name == "distributed":
                    dep = Distributed(Path(tmp) / f"m{managers}", redis_url)
                else:
                    p.error(f"unknown deployment {name}")
                try:
                    rows += run(dep, managers, args)
                finally:
                    dep.stop()
                print(f"  {name} x{managers} done", file=sys.stderr, flush=True)
    report(rows, ["deployment", "slice_managers", "operation", "rate", "rate_unit", "samples", "p50_ms", "p99_ms",
                  "errors", "leaked_claims"], title="Actors: each message timed in its own phase", json_lines=False)
    emit(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
