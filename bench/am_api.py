"""AM API over mutual TLS against a deployment started with `slicex up` in processes of its own.

Measures, at each concurrency (default 1, 4, 16):
  GetVersion        calls/s and per-call latency
  lifecycle         1-node Allocate → Provision → Status → Delete: cycles/s, cycle latency, and each call's
                    latency on its own rows (those rows have no rate: every cycle makes one call of each)
each with a NEW TLS connection per call (a TCP connect and full handshake per call, as omni and geni-lib do)
and with one kept-alive connection per client.

Setup is outside the timed window: the CA, the user's certificate and key, the deployment, each client's
slice and slice credential and its TLS context exist before the clock starts. Each client is a process of
its own (multiprocessing) by default, so the load generator's GIL neither limits the clients nor shares the
server's; the deployment is another process again (`slicex up`), or more:
  embedded        one `slicex up` (AM, slice authority, broker and authority in one process, SQLite)
  redis-2workers  two `slicex up` from copies of one home on one Redis store, each with its own port, broker
                  and authority in process; the clients split between them
  redis-workers   `slicex up --distributed --workers 1` and `--workers 2` side by side (each on a Redis
                  database of its own), measured cell by cell in turn: the broker and the authority are
                  processes of their own, and the AM workers serve ONE port (SO_REUSEPORT) all clients call
The clients and the deployment share this machine's CPUs, so on a small machine the figures include the
clients' own cost.

Each lifecycle/GetVersion row also reports the CPU time spent per cycle (per call) during the timed window:
by the deployment's processes (each `slicex up` and its children, from /proc) and by the clients (each client's
own thread CPU time), and for a lifecycle the same per call (over the calls the window finished). For
redis-workers the deployment's share is also split by process: the AM workers, the broker actor, the
authority actor, and the Redis server (its own counters, INFO cpu: the whole server, so whatever else uses it
then is included). Two ceilings are computed, not measured, and labelled "model": the machine's cores over
the CPU per cycle of server and clients together, and (redis-workers) the rate at which the busiest process
would use a whole core if every process had one (an AM worker, the broker, the authority and Redis each run
their Python, or Redis's event loop, on about one core at a time; the AM workers share their cycles).

A cell runs at least --seconds and until it has --min-cycles samples (so p99 of a cycle is supported) or
--max-seconds pass; a percentile the samples cannot support prints as "n/a (n=…)".

Run: .venv/bin/python bench/am_api.py [--deployments embedded,redis-2workers,redis-workers]
     [--connections new,keepalive] [--operations GetVersion,lifecycle] [--concurrency 1,4,16] [--rounds R]
     [--seconds S] [--min-cycles N] [--clients processes|threads]
Redis: SLICEX_REDIS_URL, default redis://127.0.0.1:6379/7 (redis-workers also uses the next database)."""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import xmlrpc.client
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from bench._common import emit, machine, report  # noqa: E402
from bench.stats import summarise  # noqa: E402

AUTH = "bench.slicex"
USER = "bench"
REQUEST = ('<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">'
           '<node client_id="n1"><sliver_type name="default-vm"/></node></rspec>')
LIFECYCLE = ("Allocate", "Provision", "Status", "Delete")


# ---- the deployment, in processes of its own ------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _slicex(home: Path, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "cli", "--home", str(home), *args], check=True,
                   stdout=subprocess.DEVNULL)


class Deployment:
    """`slicex up` on a temporary SLICEX_HOME with free ports; `workers` homes (AM processes with ports of
    their own) share one store; `shared_workers` > 0: `up --distributed --workers N`, N AM workers on one
    port."""

    def __init__(self, root: Path, name: str, store: str | None = None, workers: int = 1, shared_workers: int = 0):
        self.root, self.name, self.store, self.workers = root, name, store, workers
        self.shared_workers = shared_workers
        self.up_args = ["--distributed", "--workers", str(shared_workers)] if shared_workers else []
        self.procs: list[subprocess.Popen] = []
        self.homes: list[Path] = []
        self.am_urls: list[str] = []
        self.sa_url = ""

    def start(self) -> Deployment:
        home = self.root / f"{self.name}-0"
        home.mkdir(parents=True)
        cfg = {"authority": AUTH, "host": "127.0.0.1", "dashboard_port": None}
        if self.store:
            cfg["store"] = self.store
        (home / "slicex.yaml").write_text(yaml.safe_dump(cfg))
        _slicex(home, "ca", "init", "--authority", AUTH)
        _slicex(home, "user", "add", USER)
        self._up(home)
        for w in range(1, self.workers):  # same CA, users, config and deployment id; ports of its own
            other = self.root / f"{self.name}-{w}"
            shutil.copytree(home, other, ignore=shutil.ignore_patterns("run", "logs", "state.db*"))
            self._up(other)
        return self

    @property
    def am_workers(self) -> int:
        """How many AM worker processes serve the clients."""
        return self.shared_workers or len(self.am_urls)

    def _up(self, home: Path) -> None:
        text = yaml.safe_load((home / "slicex.yaml").read_text())
        text.update({key: _free_port() for key in ("sa_port", "am_port", "am_v2_port", "chapi_port", "broker_port",
                                                   "authority_port")})
        (home / "slicex.yaml").write_text(yaml.safe_dump(text))
        (home / "logs").mkdir(exist_ok=True)
        log = open(home / "logs" / "bench-up.log", "ab")  # noqa: SIM115 - open while the process runs
        proc = subprocess.Popen([sys.executable, "-m", "cli", "--home", str(home), "up", *self.up_args],
                                stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.procs.append(proc)
        self.homes.append(home)
        pid_file = home / "run" / "slicex.pid"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"`slicex up` exited with {proc.returncode}: "
                                   f"{(home / 'logs' / 'bench-up.log').read_text()[-2000:]}")
            try:
                doc = yaml.safe_load(pid_file.read_text())
            except (OSError, yaml.YAMLError):
                doc = None
            if isinstance(doc, dict) and doc.get("pid") == proc.pid and doc.get("am_url"):
                self.am_urls.append(doc["am_url"])
                self.sa_url = self.sa_url or doc["sa_url"]
                return
            time.sleep(0.1)
        raise RuntimeError(f"`slicex up` in {home} did not serve within 90 s")

    @property
    def cert(self) -> str:
        return str(self.homes[0] / f"{USER}-cert.pem")

    @property
    def key(self) -> str:
        return str(self.homes[0] / f"{USER}-key.pem")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


# ---- one client ---------------------------------------------------------------------------------------------
class _Caller:
    """Calls AM API methods over one kept-alive connection, or a new connection (TCP + TLS handshake) each."""

    def __init__(self, url: str, cert: str, key: str, new_connection: bool):
        from slicex.tls_xmlrpc import SafeTransport, client_context

        self.url, self.new_connection = url, new_connection
        self.context = client_context(cert, key)  # omni does not verify the server either
        self._transport = SafeTransport
        self.proxy = None if new_connection else self._proxy()

    def _proxy(self) -> xmlrpc.client.ServerProxy:
        return xmlrpc.client.ServerProxy(self.url, transport=self._transport(self.context, 120), allow_none=True)

    def __call__(self, method: str, *args):
        if not self.new_connection:
            return getattr(self.proxy, method)(*args)
        proxy = self._proxy()
        try:
            return getattr(proxy, method)(*args)
        finally:
            proxy("close")()


class _Count:
    """A shared counter for client threads (processes share a multiprocessing.Value)."""

    def __init__(self):
        self.value = 0
        self._lock = threading.Lock()

    def get_lock(self) -> threading.Lock:
        return self._lock


def client_main(spec: dict, ready, go, stop, done, results) -> None:
    """One client: set up (caller, slice credential), report ready, loop until told to stop, send samples.
    Samples are (operation, end time, seconds, error or "")."""
    try:
        call = _Caller(spec["am_url"], spec["cert"], spec["key"], spec["new_connection"])
        urn = creds = None
        if spec["operation"] == "lifecycle":
            sa = _Caller(spec["sa_url"], spec["cert"], spec["key"], False)
            urn = f"urn:publicid:IDN+{AUTH}+slice+{spec['slice']}"
            creds = [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": sa("CreateSlice", urn)}]
            call("Delete", [urn], creds, {})  # nothing left from an earlier cell (not timed)
    except Exception as exc:  # noqa: BLE001 - reported to the coordinator
        ready.put(f"client {spec['index']} setup failed: {type(exc).__name__}: {exc}")
        return
    ready.put("")
    go.wait()
    cpu0 = time.thread_time()
    samples: list[tuple[str, float, float, str]] = []
    while not stop.is_set():
        if spec["operation"] == "GetVersion":
            t0 = time.perf_counter()
            reply = call("GetVersion")
            t1 = time.perf_counter()
            samples.append(("GetVersion", time.monotonic(), t1 - t0, _error(reply)))
            _count(done, samples[-1])
            continue
        steps = (("Allocate", (urn, creds, REQUEST, {})), ("Provision", ([urn], creds, {})),
                 ("Status", ([urn], creds, {})), ("Delete", ([urn], creds, {})))
        c0 = time.perf_counter()
        failed = ""
        for method, args in steps:
            if failed and method != "Delete":
                continue  # after a failure only clean up
            t0 = time.perf_counter()
            try:
                reply = call(method, *args)
                err = _error(reply)
            except Exception as exc:  # noqa: BLE001 - counted, the run goes on
                err = f"{type(exc).__name__}: {exc}"
            t1 = time.perf_counter()
            samples.append((method, time.monotonic(), t1 - t0, err))
            failed = failed or (f"{method}: {err}" if err else "")
        samples.append(("lifecycle", time.monotonic(), time.perf_counter() - c0, failed))
        _count(done, samples[-1])
    results.put((samples, time.thread_time() - cpu0))


def _count(done, sample: tuple[str, float, float, str]) -> None:
    if not sample[3]:
        with done.get_lock():
            done.value += 1


def _error(reply) -> str:
    code = reply.get("code", {}).get("geni_code") if isinstance(reply, dict) else None
    return "" if code == 0 else f"geni_code {code}: {str(reply.get('output', ''))[:200]}"


# ---- one cell ------------------------------------------------------------------------------------------------
def run_cell(dep: Deployment, operation: str, concurrency: int, new_connection: bool, args, tag: str) -> list[dict]:
    """`concurrency` clients against `dep` until the cell has enough samples; rows for the table."""
    if args.clients == "processes":
        ctx = mp.get_context("spawn")
        ready, results, go, stop, done = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Event(), ctx.Value("i", 0)
        start = ctx.Process
    else:
        ready, results, go, stop, done = queue.Queue(), queue.Queue(), threading.Event(), threading.Event(), _Count()
        start = threading.Thread
    workers = []
    for i in range(concurrency):
        spec = {"index": i, "am_url": dep.am_urls[i % len(dep.am_urls)], "sa_url": dep.sa_url, "cert": dep.cert,
                "key": dep.key, "new_connection": new_connection, "operation": operation, "slice": f"{tag}w{i}"}
        w = start(target=client_main, args=(spec, ready, go, stop, done, results), daemon=True)
        w.start()
        workers.append(w)
    problems = [p for p in (ready.get(timeout=120) for _ in workers) if p]
    if problems:
        stop.set()
        go.set()
        raise RuntimeError(problems[0])
    unit = "lifecycle" if operation == "lifecycle" else "GetVersion"
    need = args.min_cycles if operation == "lifecycle" else args.min_calls
    server_cpu0 = _tree_cpu_seconds([p.pid for p in dep.procs])
    roles0 = _cpu_by_role([p.pid for p in dep.procs], dep.store) if dep.shared_workers else {}
    t0 = time.monotonic()
    go.set()
    samples: list[tuple[str, float, float, str]] = []
    client_cpu = 0.0
    collected = 0
    while collected < len(workers):  # stop once the cell has enough samples (and ran --seconds), or at the limit
        elapsed = time.monotonic() - t0
        if elapsed >= args.max_seconds or (elapsed >= args.seconds and done.value >= need):
            stop.set()
        try:
            batch = results.get(timeout=0.2)
        except queue.Empty:
            continue
        samples += batch[0]
        client_cpu += batch[1]
        collected += 1
    server_cpu = _tree_cpu_seconds([p.pid for p in dep.procs]) - server_cpu0
    roles = _cpu_by_role([p.pid for p in dep.procs], dep.store) if dep.shared_workers else {}
    for w in workers:
        w.join(timeout=30)
    done = [s for s in samples if s[0] == unit]
    wall = (max(s[1] for s in done) if done else time.monotonic()) - t0
    ok = [s[2] for s in done if not s[3]]
    errors = [s[3] for s in done if s[3]]
    if errors:
        print(f"{dep.name} {operation} x{concurrency}: {len(errors)} failed, e.g. {errors[0]}", file=sys.stderr)
    common = {"bench": "am_api", "deployment": dep.name, "am_workers": dep.am_workers,
              "connection": "new per call" if new_connection else "keep-alive", "concurrency": concurrency,
              "clients": f"{concurrency} client {args.clients}" if concurrency > 1 else
              f"1 client {dict(processes='process', threads='thread')[args.clients]}"}
    calls = sum(1 for s in samples if s[0] in LIFECYCLE)
    by_role = {f"{role}_cpu_ms": 1000 * (roles[role] - roles0[role]) / len(done)
               for role in roles if role in roles0} if done else {}
    rows = [{**common, "operation": "lifecycle (1 node)" if unit == "lifecycle" else "GetVersion",
             **summarise(ok, wall, rate_unit="cycles/s" if unit == "lifecycle" else "calls/s"), "errors": len(errors),
             "wall_s": round(wall, 2), **_cpu_columns(server_cpu, client_cpu, len(done)), **by_role,
             **({"server_cpu_ms_per_call": 1000 * server_cpu / calls, "client_cpu_ms_per_call": 1000 * client_cpu / calls}
                if unit == "lifecycle" and calls else {})}]
    if unit == "lifecycle":
        for method in LIFECYCLE:
            lat = [s[2] for s in samples if s[0] == method and not s[3]]
            rows.append({**common, "operation": f"  {method} (per call)", **summarise(lat, None, rate_unit=None),
                         "errors": sum(1 for s in samples if s[0] == method and s[3])})
    return rows


def _cpu_columns(server_cpu: float, client_cpu: float, units: int) -> dict[str, object]:
    """Measured CPU milliseconds per cycle (call) on each side, over every unit the window finished (failed ones
    too: they cost CPU as well)."""
    if not units:
        return {"server_cpu_ms": None, "client_cpu_ms": None}
    return {"server_cpu_ms": 1000 * server_cpu / units, "client_cpu_ms": 1000 * client_cpu / units}


def _tree_cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of these processes and all their descendants now alive (Linux /proc)."""
    stats = _proc_stats()
    return sum(stats[pid][1] for pid in _descendants(pids, stats) if pid in stats)


def _proc_stats() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, user + system CPU seconds) of every process now alive."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "
        stats[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    return stats


def _descendants(pids: list[int], stats: dict[int, tuple[int, float]]) -> set[int]:
    """`pids` and every process descending from them."""
    wanted = set(pids)
    changed = True
    while changed:  # close over children
        changed = False
        for pid, (parent, _cpu) in stats.items():
            if parent in wanted and pid not in wanted:
                wanted.add(pid)
                changed = True
    return wanted


def _cpu_by_role(pids: list[int], store: str | None) -> dict[str, float]:
    """CPU seconds so far of a distributed deployment's processes by role, from their command lines: "am" (`up`
    itself and its `slicex am-worker`s), "broker", "authority" (`slicex actor ...`); and "redis", the Redis
    server's own user + system CPU (INFO cpu), when `store` is one."""
    stats = _proc_stats()
    out = {"am": 0.0, "broker": 0.0, "authority": 0.0}
    for pid in _descendants(pids, stats):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv]
        role = next((r for r in ("broker", "authority") if "actor" in words and r in words), "am")
        out[role] += stats.get(pid, (0, 0.0))[1]
    if store and store.startswith("redis"):
        import redis

        info = redis.Redis.from_url(store).info("cpu")
        out["redis"] = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return out


def ceiling_rows(rows: list[dict]) -> list[dict]:
    """Model: the most cycles (calls) per second this machine's cores could give at each row's measured CPU cost
    per unit, if nothing but CPU limited it; and, where the row splits the server's CPU by process, the rate
    at which the busiest process would need a whole core (each with a core of its own, the clients elsewhere)."""
    cores = os.cpu_count() or 1
    out = []
    for r in rows:
        if r.get("server_cpu_ms") is None or r.get("client_cpu_ms") is None or r["operation"].startswith("  "):
            continue
        per_unit = (r["server_cpu_ms"] + r["client_cpu_ms"]) / 1000
        keep = {k: r[k] for k in ("deployment", "connection", "concurrency", "am_workers") if k in r}
        if "round" in r:
            keep["round"] = r["round"]
        out.append({**keep, "operation": f"{r['operation']} CPU-bound ceiling on {cores} cores (model)",
                    "rate": cores / per_unit if per_unit > 0 else None, "rate_unit": r.get("rate_unit")})
        per_process = {role: r[f"{role}_cpu_ms"] / (r.get("am_workers", 1) if role == "am" else 1)
                       for role in ("am", "broker", "authority", "redis") if r.get(f"{role}_cpu_ms")}
        if per_process:
            busiest = max(per_process, key=lambda role: per_process[role])
            out.append({**keep, "operation": f"{r['operation']} one core per process: {busiest} first "
                                             f"(model)", "rate": 1000 / per_process[busiest],
                        "rate_unit": r.get("rate_unit")})
    return out


# ---- main -----------------------------------------------------------------------------------------------------
DEPLOYMENTS = ("embedded", "redis-2workers", "redis-workers")
CONNECTIONS = ("new", "keepalive")
OPERATIONS = ("GetVersion", "lifecycle")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--deployments", default="embedded",
                   help="embedded (one `slicex up`, SQLite), redis-2workers (two `slicex up` on one Redis), "
                        "redis-workers (`up --distributed` with 1 and with 2 AM workers on one port, in turn)")
    p.add_argument("--connections", default="new,keepalive", help="new (a TLS connection per call), keepalive")
    p.add_argument("--concurrency", default="1,4,16", help="comma-separated client counts")
    p.add_argument("--operations", default="GetVersion,lifecycle")
    p.add_argument("--seconds", type=float, default=3.0, help="least measurement time per cell (default 3)")
    p.add_argument("--max-seconds", type=float, default=25.0, help="most measurement time per cell (default 25)")
    p.add_argument("--min-cycles", type=int, default=100, help="lifecycle samples wanted per cell (default 100)")
    p.add_argument("--min-calls", type=int, default=300, help="GetVersion samples wanted per cell (default 300)")
    p.add_argument("--clients", choices=["processes", "threads"], default="processes")
    p.add_argument("--rounds", type=int, default=1, help="how many times each deployment's cells run (default 1)")
    args = p.parse_args()
    for flag, given, known in (("--deployments", args.deployments, DEPLOYMENTS),
                               ("--connections", args.connections, CONNECTIONS),
                               ("--operations", args.operations, OPERATIONS)):
        unknown = [x for x in given.split(",") if x not in known]
        if unknown:  # measured nothing and printed a row of zeros for a misspelt name before
            p.error(f"{flag}: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    redis_url = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/7")
    rows: list[dict] = []
    print(f"machine: {machine()}; clients are {args.clients}; the deployment runs in its own process(es)\n")
    with tempfile.TemporaryDirectory(prefix="slicex-bench-") as tmp:
        for name in args.deployments.split(","):
            # the deployments of one name run side by side, their cells in turn
            if name == "embedded":
                group = [Deployment(Path(tmp), name)]
            elif name == "redis-2workers":
                group = [Deployment(Path(tmp), name, store=redis_url, workers=2)]
            else:
                group = [Deployment(Path(tmp), f"{name}-{n}", store=_database(redis_url, n - 1), shared_workers=n)
                         for n in (1, 2)]
            try:
                for dep in group:
                    if dep.store:
                        _flush(dep.store)
                    dep.start()
                n = 0
                for rnd in range(1, args.rounds + 1):
                    for conn in args.connections.split(","):
                        for op in args.operations.split(","):
                            for c in (int(x) for x in args.concurrency.split(",")):
                                for dep in group:
                                    n += 1
                                    cell_rows = run_cell(dep, op, c, conn == "new", args, f"b{n}")
                                    rows += [{**r, "round": rnd} for r in cell_rows]
                                    head = cell_rows[0]
                                    print(f"  {dep.name} {conn} {op} x{c}: {head['samples']} in {head['wall_s']} s",
                                          file=sys.stderr, flush=True)
            finally:
                for dep in group:
                    dep.stop()
                    if dep.store:
                        _flush(dep.store)
    split = any("am_cpu_ms" in r for r in rows)
    report(rows, ["deployment", "am_workers", "connection", "operation", "concurrency", "round", "rate", "rate_unit",
                  "samples", "p50_ms", "p99_ms", "mean_ms", "server_cpu_ms", "client_cpu_ms",
                  "server_cpu_ms_per_call", "client_cpu_ms_per_call", "errors"], title="AM API over mutual TLS "
           "(measured; *_cpu_ms: CPU milliseconds per cycle (lifecycle) or call (GetVersion); *_per_call: per "
           "call of a lifecycle)", json_lines=False)
    if split:
        report([r for r in rows if "am_cpu_ms" in r],
               ["deployment", "am_workers", "operation", "concurrency", "round", "server_cpu_ms", "am_cpu_ms",
                "broker_cpu_ms", "authority_cpu_ms", "redis_cpu_ms"],
               title="Server CPU ms per cycle (call) by process (measured; redis: the whole Redis server's)",
               json_lines=False)
    model = ceiling_rows(rows)
    report(model, ["deployment", "am_workers", "connection", "operation", "concurrency", "round", "rate",
                   "rate_unit"], title="Model, not measured: cores / (server + client CPU per unit); one core per "
                                       "process: 1000 / the busiest process's CPU ms per unit (AM workers' "
                                       "shared)", json_lines=False)
    emit(rows + [{**m, "model": True} for m in model])
    return 0


def _database(url: str, offset: int) -> str:
    """The Redis URL `offset` databases after `url`'s."""
    server, _, db = url.rpartition("/")
    return f"{server}/{int(db or 0) + offset}"


def _flush(url: str) -> None:
    from slicex.store.redis_store import RedisStore

    RedisStore(url).flush()


if __name__ == "__main__":
    sys.exit(main())
