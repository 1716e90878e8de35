"""Testbed scale (issue 33): what one call costs with L live slices on the aggregate, for L in a list.

A deployment started with `slicex up` in a process of its own (the embedded one on SQLite; with --store
redis://..., `slicex up --distributed --workers 1`: AM, broker and authority processes on Redis) over a
generated emulated substrate of --hosts VM hosts (default 1,000: --racks 10 racks, 32 cores and 128 GB each, a
top-of-rack switch per rack trunked to one core switch). The store is filled to each L in turn, outside the
timed window, through the AM API over mutual TLS (CreateSlice, Allocate, Provision of a slice of 1-3 nodes, the
node count cycling 1, 2, 3) by --fill-clients client threads at once, each on a kept-alive connection (a
progress bar on stderr; --quiet: none). Filling
goes through the AM API, not the slice manager's Python API, because the AM API is what operators' users call
and the one interface the changes of issue 33 keep; concurrent clients overlap one slice's TLS and parsing
with another's slice manager work. Then, at each L:
  slicex up      the deployment is stopped and started again on the filled store: seconds from starting it
                 to the first GetVersion answered and to the first Allocate placed (the distributed
                 deployment answers before its broker holds the substrate), the resident memory (RSS, all its
                 processes) then
  idle CPU       server CPU milliseconds per second over --idle-seconds with no calls
  lifecycle      --samples cycles of a 1-node Allocate, Provision, Status, Delete (one client, one at a time):
                 server CPU per cycle, its wall time, Allocate's wall time
  Status/Describe  --samples calls of each on one provisioned 3-node slice: server CPU and wall time per call
  ListResources  --list-samples calls (geni_available): wall time and server CPU per call
  store          bytes the store holds (SQLite: the database file with its WAL; Redis: MEMORY USAGE of every
                 key in the database), per live sliver, and per live sliver above what it held at L = 0
Server CPU is the deployment's processes' own CPU clocks (clock_gettime of each process's CPU-time clock, all
threads, nanoseconds), read just before and after each call; it includes whatever the server's background
threads (the reaper's tick) did meanwhile, which "net of idle" (a model, labelled so) takes away at the idle
rate measured at the same L. With Redis, the Redis server's own CPU (INFO cpu; the whole server, so other
users of it count too) is reported per call beside it.

A percentile prints only when the samples support it (p95 needs 20), with n beside it. Output: a table, then
one JSON object per measurement per line (also to --json FILE), and with --plot FILE a PNG of each cost
against L (matplotlib, the `experiment` extra). The figures come from a shared machine when the load average
(printed beside every row) says so.

--fill-minutes caps each fill: when it runs out the bench measures at the L it reached and stops there. A
deployment that places no Allocate --ready-seconds after it answers stops the bench with its authority's last
word on delegating the substrate (a delegation too large for one actor request is refused: docs/architecture.md).
--store redis://HOST:PORT/DB FLUSHES that database before and after the run.

--keep-home DIR keeps the filled deployment (stopped) and writes DIR/scale-home.json (hosts, racks, store,
live slices). --from-home DIR starts a later run from a copy of that home instead of filling again: the L
values below its live count are measured first in a new home (with --store on the next Redis database,
flushed before and after), the rest on the copy, which is restarted and filled further as needed. So a new
build is measured at L = 10,000 without another 20-minute fill, and the kept home stays as it was (on SQLite;
on Redis the database is the kept one, changed only by the lifecycles, which leave it as they found it). A home
kept by an older build is brought up to this build's store layout by `slicex up`, as an operator's would be.

Run: .venv/bin/python bench/scale.py [--hosts 1000] [--racks 10] [--live 0,1000,10000] [--samples 40]
     [--store redis://127.0.0.1:6379/N] [--json FILE] [--plot FILE [--compare LABEL=EARLIER.jsonl]]
     [--fill-minutes M] [--keep-home DIR | --from-home DIR] [--quick]"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from bench._common import emit, machine, report  # noqa: E402
from bench.am_api import AUTH, USER, _Caller, _descendants, _free_port, _proc_stats, _slicex  # noqa: E402
from bench.stats import summarise  # noqa: E402

RSPEC_V3 = {"type": "GENI", "version": "3"}
SIZE = "small"  # every node of every slice: 1 core, 2 GB (20,000 of them fit 1,000 hosts' 32,000 cores)


# ---- the substrate ------------------------------------------------------------------------------------------
def substrate_doc(hosts: int, racks: int, authority: str = AUTH) -> dict[str, Any]:
    """A substrate file's document: `hosts` VM hosts (32 cores, 128 GB) spread over `racks` racks, each rack's
    hosts cabled to its top-of-rack switch, every ToR trunked to one core switch (also the tests' generated
    substrate: tests/unit/test_delegation_compact.py)."""
    racks = max(1, min(racks, hosts))
    per_rack = [hosts // racks + (1 if r < hosts % racks else 0) for r in range(racks)]
    doc: dict[str, Any] = {"authority": authority, "description": f"generated: {hosts} VM hosts in {racks} racks",
                           "provisioning_seconds": 1, "sites": [], "switches": [], "trunks": [], "hosts": [],
                           "vm_sizes": [{"name": SIZE, "cores": 1, "memory_mb": 2048, "disk_gb": 20},
                                        {"name": "large", "cores": 8, "memory_mb": 16384, "disk_gb": 100}],
                           "images": [{"name": "ubuntu-22.04", "os": "Linux", "version": "22.04"}]}
    core_ports = []
    for r, count in enumerate(per_rack, start=1):
        rack, tor = f"rack{r:02d}", f"tor{r:02d}"
        doc["sites"].append({"name": rack, "description": f"generated rack {r}"})
        doc["switches"].append({"name": tor, "site": rack, "vlan_range": [f"{1000 + 100 * r}-{1099 + 100 * r}"],
                                "ports": [{"name": f"h{k}"} for k in range(1, count + 1)] +
                                         [{"name": "uplink", "bandwidth_kbps": 40_000_000}]})
        core_ports.append({"name": tor, "bandwidth_kbps": 40_000_000})
        doc["trunks"].append({"name": f"{tor}-core", "between": [f"{tor}:uplink", f"core:{tor}"],
                              "bandwidth_kbps": 40_000_000})
        doc["hosts"].append({"name": f"r{r:02d}h", "count": count, "site": rack, "cores": 32, "memory_mb": 131072,
                             "interfaces": [{"name": "eth1", "bandwidth_kbps": 10_000_000,
                                             "switch_port": f"{tor}:h{{n}}"}]})
    doc["switches"].append({"name": "core", "vlan_range": ["3000-3999"], "ports": core_ports})
    return doc


def request(nodes: int) -> str:
    """A request RSpec for `nodes` unbound VMs of the small size."""
    body = "".join(f'<node client_id="n{i}"><sliver_type name="{SIZE}"/></node>' for i in range(1, nodes + 1))
    return f'<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">{body}</rspec>'


# ---- the deployment -----------------------------------------------------------------------------------------
def process_cpu_seconds(pid: int) -> float:
    """CPU seconds of process `pid` (all its threads, live and ended) from its CPU-time clock, to the
    nanosecond (/proc/<pid>/stat counts 10 ms ticks, coarser than many calls)."""
    return time.clock_gettime(((~pid) << 3) | 2)  # Linux: CPUCLOCK_SCHED of the whole process


class Server:
    """`slicex up` on its own SLICEX_HOME (made once), started and stopped as an operator does."""

    def __init__(self, root: Path, hosts: int, racks: int, store: str | None):
        self.home, self.store = root / "home", store
        self.proc: subprocess.Popen | None = None
        self.pids: list[int] = []
        self.am_url = self.sa_url = ""
        self.home.mkdir(parents=True)
        (self.home / "substrate.yaml").write_text(yaml.safe_dump(substrate_doc(hosts, racks), sort_keys=False))
        cfg: dict[str, Any] = {"authority": AUTH, "host": "127.0.0.1", "dashboard_port": None,
                               "substrate": str(self.home / "substrate.yaml"),
                               **{k: _free_port() for k in ("sa_port", "am_port", "am_v2_port", "chapi_port",
                                                            "broker_port", "authority_port")}}
        if store:
            cfg["store"] = store
        (self.home / "slicex.yaml").write_text(yaml.safe_dump(cfg))
        _slicex(self.home, "ca", "init", "--authority", AUTH)
        _slicex(self.home, "user", "add", USER)

    @classmethod
    def copied(cls, root: Path, kept: Path, store: str | None) -> Server:
        """A stopped home kept by an earlier run (--keep-home), copied under `root` with new free ports."""
        server = cls.__new__(cls)
        server.home, server.store, server.proc, server.pids, server.am_url, server.sa_url = (
            root / "home", store, None, [], "", "")
        shutil.copytree(kept / "home", server.home, ignore=shutil.ignore_patterns("run", "logs"), symlinks=True)
        cfg = yaml.safe_load((server.home / "slicex.yaml").read_text())
        if (cfg.get("store") or None) != store:
            raise RuntimeError(f"--from-home {kept}: its store is {cfg.get('store') or 'SQLite'}, this run's "
                               f"{store or 'SQLite'}")
        cfg["substrate"] = str(server.home / "substrate.yaml")
        cfg.update({k: _free_port() for k in ("sa_port", "am_port", "am_v2_port", "chapi_port", "broker_port",
                                              "authority_port")})
        (server.home / "slicex.yaml").write_text(yaml.safe_dump(cfg))
        return server

    def start(self) -> float:
        """Start `slicex up`; the seconds until it answered GetVersion."""
        (self.home / "logs").mkdir(exist_ok=True)
        log = open(self.home / "logs" / "bench-up.log", "ab")  # noqa: SIM115 - open while the process runs
        t0 = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, "-m", "cli", "--home", str(self.home), "up",
                                      *(["--distributed", "--workers", "1"] if self.store else [])],
                                     stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"`slicex up` exited with {self.proc.returncode}: "
                                   f"{(self.home / 'logs' / 'bench-up.log').read_text()[-2000:]}")
            if not self.am_url:
                try:
                    doc = yaml.safe_load((self.home / "run" / "slicex.pid").read_text())
                except (OSError, yaml.YAMLError):
                    doc = None
                if isinstance(doc, dict) and doc.get("pid") == self.proc.pid and doc.get("am_url"):
                    self.am_url, self.sa_url = doc["am_url"], doc["sa_url"]
            if self.am_url and self._answers():
                elapsed = time.perf_counter() - t0
                self.pids = sorted(_descendants([self.proc.pid], _proc_stats()))
                return elapsed
            time.sleep(0.05)
        raise RuntimeError("`slicex up` did not answer GetVersion within 30 minutes")

    def _answers(self) -> bool:
        try:
            reply = self.caller(new_connection=True)("GetVersion")
        except OSError:
            return False
        return isinstance(reply, dict) and reply.get("code", {}).get("geni_code") == 0

    def caller(self, new_connection: bool = False, sa: bool = False) -> _Caller:
        return _Caller(self.sa_url if sa else self.am_url, str(self.home / f"{USER}-cert.pem"),
                       str(self.home / f"{USER}-key.pem"), new_connection)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self.proc, self.am_url, self.sa_url = None, "", ""

    def cpu(self) -> float:
        """CPU seconds of the deployment's processes so far."""
        total = 0.0
        for pid in self.pids:
            try:
                total += process_cpu_seconds(pid)
            except OSError:
                pass  # a process that ended
        return total

    def rss_mb(self, field: str = "VmRSS") -> float:
        """Resident memory of the deployment's processes (VmRSS now, or VmHWM: each one's peak), MB."""
        total = 0
        for pid in self.pids:
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith(field + ":")), 0)
        return total / 1024

    def store_bytes(self) -> int:
        """What the store holds on disk (SQLite: database, WAL and shared memory) or in memory (Redis)."""
        if self.store:
            import redis

            client = redis.Redis.from_url(self.store)
            total, pipe, n = 0, client.pipeline(transaction=False), 0
            for key in client.scan_iter(count=1000):
                pipe.memory_usage(key, samples=0)
                n += 1
                if n % 1000 == 0:
                    total += sum(x or 0 for x in pipe.execute())
            return total + sum(x or 0 for x in pipe.execute())
        return sum(p.stat().st_size for p in self.home.glob("state.db*"))

    def redis_cpu(self) -> float:
        """The Redis server's CPU seconds so far (the whole server), 0 on SQLite."""
        if not self.store:
            return 0.0
        import redis

        info = redis.Redis.from_url(self.store).info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


# ---- a client -------------------------------------------------------------------------------------------------
IDLE_SECONDS = 50  # under the servers' 60 s idle timeout (slicex/tls_xmlrpc.py): reconnect before they close


class Client:
    """One user's AM API client on a kept-alive connection (opened again before the server's idle timeout
    would close it), with a slice credential per slice it made."""

    def __init__(self, server: Server):
        self.server = server
        self.am, self.sa = server.caller(), server.caller(sa=True)
        self.used = {"am": time.monotonic(), "sa": time.monotonic()}

    def _fresh(self, which: str) -> _Caller:
        if time.monotonic() - self.used[which] > IDLE_SECONDS:
            setattr(self, which, self.server.caller(sa=which == "sa"))
        self.used[which] = time.monotonic()
        return getattr(self, which)

    def sa_call(self, method: str, *args: object) -> object:
        answer = self._fresh("sa")(method, *args)
        self.used["sa"] = time.monotonic()
        return answer

    def credential(self, name: str) -> tuple[str, list[dict]]:
        urn = f"urn:publicid:IDN+{AUTH}+slice+{name}"
        return urn, [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": self.sa_call("CreateSlice", urn)}]

    def call(self, method: str, *args: object) -> dict:
        """An AM API call that must succeed (a failed one stops the bench with its reason)."""
        reply = self._fresh("am")(method, *args)
        self.used["am"] = time.monotonic()
        code = reply.get("code", {}).get("geni_code") if isinstance(reply, dict) else None
        if code != 0:
            raise RuntimeError(f"{method}: geni_code {code}: {str(reply.get('output', ''))[:300]}")
        return reply


def nodes_of(index: int) -> int:
    """The node count of fill slice `index`: 1, 2, 3, 1, ..."""
    return 1 + index % 3


def live_slivers(live: int) -> int:
    return sum(nodes_of(i) for i in range(live))


def fill(server: Server, start: int, target: int, clients: int, minutes: float | None, quiet: bool) -> int:
    """Slices `start` .. `target`-1 made and provisioned through the AM API by `clients` threads at once;
    the number of live fill slices when done (less than `target` when `minutes` ran out)."""
    if target <= start:
        return start
    from experiment.report import require

    bar = None if quiet else require("tqdm", "the fill's progress bar (--quiet runs without it)").tqdm(
        total=target - start, initial=0, desc=f"fill to {target}", unit="slice", file=sys.stderr)
    deadline = time.monotonic() + minutes * 60 if minutes else None
    local = threading.local()
    done = [0]
    lock = threading.Lock()
    stop = threading.Event()

    def make(index: int) -> None:
        if stop.is_set() or (deadline is not None and time.monotonic() > deadline):
            stop.set()
            return
        if not hasattr(local, "client"):
            local.client = Client(server)
        c = local.client
        urn, creds = c.credential(f"fill{index}")
        c.call("Allocate", urn, creds, request(nodes_of(index)), {})
        c.call("Provision", [urn], creds, {})
        with lock:
            done[0] += 1
        if bar is not None:
            bar.update(1)

    # slices are made in index order with at most `clients` in flight, so a stopped fill leaves 0 .. n-1 (plus
    # whatever was in flight, counted below from the store's answer, not from this loop)
    with ThreadPoolExecutor(max_workers=clients) as pool:
        pending = set()
        for index in range(start, target):
            if stop.is_set():
                break
            pending.add(pool.submit(make, index))
            if len(pending) >= clients * 2:
                finished, pending = wait(pending, return_when=FIRST_EXCEPTION)
                for f in finished:
                    f.result()
        for f in pending:
            f.result()
    if bar is not None:
        bar.close()
    return start + done[0]


# ---- the measurements at one L --------------------------------------------------------------------------------
def timed(server: Server, fn, *args) -> tuple[float, float]:
    """(server CPU seconds, wall seconds) across one call."""
    c0, w0 = server.cpu(), time.perf_counter()
    fn(*args)
    return server.cpu() - c0, time.perf_counter() - w0


def measure(server: Server, live: int, args: argparse.Namespace, filled: float, fill_s: float) -> list[dict]:
    """Restart on the filled store, then every measurement at this L; one row per measurement."""
    slivers = live_slivers(live)
    server.stop()
    up_s = server.start()
    rss = server.rss_mb()
    load = os.getloadavg()[0]
    common = {"bench": "scale", "store": "redis (distributed)" if server.store else "sqlite (embedded)",
              "hosts": args.hosts, "live_slices": live, "live_slivers": slivers}
    rows: list[dict] = []

    def row(what: str, unit: str, samples: list[float] | None = None, value: float | None = None,
            **extra: object) -> None:
        if samples is not None:
            s = summarise(samples, None, (50, 95), rate_unit=None)  # seconds in, milliseconds out
            stats = {"samples": s["samples"], "p50": s["p50_ms"], "p95": s["p95_ms"], "mean": s["mean_ms"]}
        else:
            stats = {"samples": 1, "value": value}
        rows.append({**common, "what": what, "unit": unit, **stats, "load_avg": round(os.getloadavg()[0], 2),
                     **extra})

    row("slicex up to GetVersion answered", "s", value=up_s, load_avg_before=round(load, 2))
    row("slicex up to the first Allocate placed", "s", value=up_s + placeable(server, args.ready_seconds))
    row("RSS after up", "MB", value=rss)
    if fill_s:
        row("fill rate (slices made to reach this L)", "slices/s", value=filled / fill_s if fill_s else None,
            slices=int(filled), wall_s=round(fill_s, 1))
    time.sleep(1)  # the first reaper pass and snapshots settle before idling
    c0, w0 = server.cpu(), time.perf_counter()
    r0 = server.redis_cpu()
    time.sleep(args.idle_seconds)
    idle_cpu, idle_wall = server.cpu() - c0, time.perf_counter() - w0
    idle_rate = idle_cpu / idle_wall  # CPU seconds per second
    row("idle server CPU", "ms/s", value=1000 * idle_rate, seconds=round(idle_wall, 1))
    if server.store:
        row("idle Redis server CPU (whole server)", "ms/s", value=1000 * (server.redis_cpu() - r0) / idle_wall)

    client = Client(server)
    lifecycle(server, client, args, row, idle_rate)
    status_describe(server, client, args, row, idle_rate)
    listed_cpu, listed_wall = [], []
    creds = [{"geni_type": "geni_sfa", "geni_version": "3",
              "geni_value": client.sa_call("CreateUserCredential", (server.home / f"{USER}-cert.pem").read_text())}]
    for _ in range(args.list_samples):
        cpu, wall = timed(server, client.call, "ListResources", creds,
                          {"geni_rspec_version": RSPEC_V3, "geni_available": True})
        listed_cpu.append(cpu)
        listed_wall.append(wall)
    row("ListResources (geni_available) wall", "ms", listed_wall, first=1000 * listed_wall[0])
    row("ListResources server CPU per call", "ms", listed_cpu, first=1000 * listed_cpu[0])
    stored = server.store_bytes()
    row("store", "bytes", value=stored)
    row("store bytes per live sliver", "bytes", value=stored / slivers if slivers else None)
    row("RSS at the end (sum of each process's peak)", "MB", value=server.rss_mb("VmHWM"))
    return rows


def placeable(server: Server, limit: float) -> float:
    """Seconds until a 1-node Allocate is placed (then deleted). The distributed deployment answers GetVersion
    before its authority has delegated the substrate to its broker; until then Allocate says so (geni_code 7).
    Past `limit` seconds the bench stops with the authority's last word on its delegation."""
    client, t0 = Client(server), time.perf_counter()
    urn, creds = client.credential("ready")
    while True:
        try:
            client.call("Allocate", urn, creds, request(1), {})
            break
        except RuntimeError as exc:
            if "delegated no substrate" not in str(exc):
                raise
            if time.perf_counter() - t0 > limit:
                said = [line for line in _lines(server.home / "logs" / "authority.log") if "delegat" in line]
                raise RuntimeError(f"no Allocate placed {limit:.0f} s after `slicex up` answered: {exc}; the "
                                   f"authority's log: {said[-1].strip() if said else '(nothing on delegation)'}"
                                   ) from None
            time.sleep(0.2)
    elapsed = time.perf_counter() - t0
    client.call("Delete", [urn], creds, {})
    return elapsed


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []


def lifecycle(server: Server, client: Client, args: argparse.Namespace, row, idle_rate: float) -> None:
    """--samples 1-node cycles, each call's server CPU and wall time; rows go through `row`."""
    urn, creds = client.credential("probe1")
    steps = {"Allocate": (urn, creds, request(1), {}), "Provision": ([urn], creds, {}),
             "Status": ([urn], creds, {}), "Delete": ([urn], creds, {})}
    cpu: dict[str, list[float]] = {k: [] for k in (*steps, "cycle")}
    wall: dict[str, list[float]] = {k: [] for k in (*steps, "cycle")}
    r0 = server.redis_cpu()
    for _ in range(args.samples):
        total_cpu = total_wall = 0.0
        for method, params in steps.items():
            c, w = timed(server, client.call, method, *params)
            cpu[method].append(c)
            wall[method].append(w)
            total_cpu, total_wall = total_cpu + c, total_wall + w
        cpu["cycle"].append(total_cpu)
        wall["cycle"].append(total_wall)
    row("lifecycle cycle (1 node) server CPU", "ms", cpu["cycle"])
    mean_cpu, mean_wall = (sum(x) / len(x) for x in (cpu["cycle"], wall["cycle"]))
    row("lifecycle cycle server CPU net of idle (model: mean - idle rate x mean wall)", "ms",
        value=1000 * (mean_cpu - idle_rate * mean_wall), model=True)
    row("lifecycle cycle wall", "ms", wall["cycle"])
    for method in steps:
        row(f"  {method} (1 node) server CPU", "ms", cpu[method])
    row("  Allocate (1 node) wall", "ms", wall["Allocate"])
    if server.store:
        row("lifecycle cycle Redis server CPU (whole server, mean)", "ms",
            value=1000 * (server.redis_cpu() - r0) / args.samples)


def status_describe(server: Server, client: Client, args: argparse.Namespace, row, idle_rate: float) -> None:
    """--samples Status and Describe calls on one provisioned 3-node slice (made and deleted untimed)."""
    urn, creds = client.credential("probe3")
    client.call("Allocate", urn, creds, request(3), {})
    client.call("Provision", [urn], creds, {})
    try:
        for method in ("Status", "Describe"):
            params = ([urn], creds, {"geni_rspec_version": RSPEC_V3} if method == "Describe" else {})
            cpu, wall = [], []
            r0 = server.redis_cpu()
            for _ in range(args.samples):
                c, w = timed(server, client.call, method, *params)
                cpu.append(c)
                wall.append(w)
            row(f"{method} (3-node slice) server CPU", "ms", cpu)
            row(f"{method} (3-node slice) server CPU net of idle (model)", "ms",
                value=1000 * (sum(cpu) - idle_rate * sum(wall)) / len(cpu), model=True)
            row(f"{method} (3-node slice) wall", "ms", wall)
            if server.store:
                row(f"{method} Redis server CPU (whole server, mean)", "ms",
                    value=1000 * (server.redis_cpu() - r0) / args.samples)
    finally:
        client.call("Delete", [urn], creds, {})


# ---- the plot -------------------------------------------------------------------------------------------------
# means for server CPU: a call that runs the reaper's pass (today's main) is a rare, costly one a p50 never shows
PLOTTED = (("lifecycle cycle (1 node) server CPU", "mean", "lifecycle cycle, server CPU mean (ms)"),
           ("Status (3-node slice) server CPU", "mean", "Status, 3 nodes, server CPU mean (ms)"),
           ("Describe (3-node slice) server CPU", "mean", "Describe, 3 nodes, server CPU mean (ms)"),
           ("idle server CPU", "value", "idle server CPU (ms/s)"),
           ("ListResources (geni_available) wall", "p50", "ListResources p50 (ms)"),
           ("slicex up to GetVersion answered", "value", "slicex up to answering (s)"),
           ("RSS after up", "value", "RSS after up (MB)"),
           ("store", "above", "store per live sliver above L=0 (bytes)"))


def plot(rows: list[dict], path: Path, title: str) -> None:
    """One small panel per cost against L, a line per store (and per earlier run given with --compare)."""
    from experiment.report import require

    matplotlib = require("matplotlib", "--plot")
    matplotlib.use("Agg")
    plt = require("matplotlib.pyplot", "--plot")
    fig, axes = plt.subplots(2, 4, figsize=(12, 5.2))
    for ax, (what, field, label) in zip(axes.flat, PLOTTED, strict=True):
        for line in dict.fromkeys(_line(r) for r in rows):
            mine = [r for r in rows if _line(r) == line and r["what"] == what]
            if field == "above":  # what the slices added to the store, per sliver (from the store rows)
                empty = next((r["value"] for r in mine if r["live_slices"] == 0), None)
                points = sorted((r["live_slices"], (r["value"] - empty) / r["live_slivers"]) for r in mine
                                if empty is not None and r["live_slivers"])
            else:
                points = sorted((r["live_slices"], r[field]) for r in mine if r.get(field) is not None)
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=line)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("live slices", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    drawn = next((ax for ax in axes.flat if ax.get_legend_handles_labels()[0]), None)
    if drawn is not None:  # one legend, on the first panel with a line
        drawn.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
    from PIL import Image  # matplotlib's own dependency: a 64-colour palette keeps the PNG small for docs/

    with Image.open(path) as image:
        small = image.convert("RGB").quantize(64)
    small.save(path, optimize=True)


def _line(row: dict) -> str:
    """A plotted line's label: the store, and the run's label for a run read with --compare."""
    return f"{row['store']}, {row['run']}" if row.get("run") else row["store"]


def earlier(path: Path, label: str) -> list[dict]:
    """The rows of an earlier run's --json FILE, labelled for the plot."""
    try:
        return [{**json.loads(line), "run": label} for line in path.read_text().splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"--compare {path}: not the JSON lines of an earlier run ({exc})") from None


# ---- main -----------------------------------------------------------------------------------------------------
KEPT = "scale-home.json"  # beside a kept home: what it was filled with


def kept_home(path: Path) -> dict[str, Any]:
    """What an earlier --keep-home run left in `path` (hosts, racks, store, live)."""
    try:
        kept = json.loads((path / KEPT).read_text())
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"--from-home {path}: not a home kept by bench/scale.py --keep-home ({exc})") from None
    if not (path / "home" / "slicex.yaml").is_file():
        raise RuntimeError(f"--from-home {path}: no home/slicex.yaml in it")
    return kept


def next_database(url: str) -> str:
    """The Redis URL of the database after `url`'s (where --from-home measures the L below the kept home's)."""
    base, _, db = url.rstrip("/").rpartition("/")
    return f"{base}/{int(db) + 1}" if db.isdigit() and base.count("/") >= 2 else f"{url.rstrip('/')}/1"


def run(args: argparse.Namespace, targets: list[int], rows: list[dict]) -> None:
    """Fill and measure at each L, appending to `rows` (and to --json FILE as each L is done, so a run that
    stops part way keeps what it measured). With --from-home, the L below the kept home's live count first in
    a new home, then the rest on a copy of the kept one."""
    if args.json:
        Path(args.json).write_text("")
    if not args.from_home:
        _run_on(args, targets, rows, kept=None)
        return
    kept = kept_home(Path(args.from_home))
    below = [t for t in targets if t < kept["live"]]
    if below:
        fresh = argparse.Namespace(**{**vars(args), "store": args.store and next_database(args.store)})
        _run_on(fresh, below, rows, kept=None)
    _run_on(args, [t for t in targets if t >= kept["live"]], rows, kept=kept,
            empty=next((r["value"] for r in rows if r["what"] == "store" and r["live_slices"] == 0), None))


def _run_on(args: argparse.Namespace, targets: list[int], rows: list[dict], kept: dict[str, Any] | None,
            empty: float | None = None) -> None:
    """Fill and measure at each of `targets` on one deployment: a new one, or a copy of the kept home."""
    if not targets:
        return
    with contextlib.ExitStack() as stack:
        tmp = args.keep_home or stack.enter_context(tempfile.TemporaryDirectory(prefix="slicex-scale-"))
        if kept is not None:
            server = Server.copied(Path(tmp), Path(args.from_home), args.store)
        else:
            if args.store:
                _flush(args.store)
            server = Server(Path(tmp), args.hosts, args.racks, args.store)
        live = kept["live"] if kept is not None else 0
        try:
            server.start()
            for target in targets:
                t0 = time.perf_counter()
                before = live
                live = fill(server, live, target, args.fill_clients, args.fill_minutes, args.quiet)
                fill_s = time.perf_counter() - t0 if live > before else 0.0
                if live < target:
                    print(f"fill stopped at {live} live slices of {target} (--fill-minutes {args.fill_minutes})",
                          file=sys.stderr)
                print(f"measuring at {live} live slices", file=sys.stderr, flush=True)
                measured = measure(server, live, args, live - before, fill_s)
                stored = next(r["value"] for r in measured if r["what"] == "store")
                if live == 0:
                    empty = stored
                elif empty is not None:  # what the slices added, without the substrate's and the actors' own
                    first = measured[0]
                    measured.append({**{k: first[k] for k in ("bench", "store", "hosts", "live_slices",
                                                              "live_slivers")},
                                     "what": "store bytes per live sliver above L=0", "unit": "bytes",
                                     "samples": 1, "value": (stored - empty) / first["live_slivers"],
                                     "load_avg": round(os.getloadavg()[0], 2)})
                rows += measured
                if args.json:
                    with open(args.json, "a") as out:
                        out.writelines(json.dumps(r, sort_keys=True) + "\n" for r in measured)
                if live < target:
                    break
        finally:
            server.stop()
            if args.keep_home:
                (Path(args.keep_home) / KEPT).write_text(json.dumps(
                    {"hosts": args.hosts, "racks": args.racks, "store": args.store, "live": live}) + "\n")
            elif args.store and kept is None:
                _flush(args.store)


def _flush(url: str) -> None:
    from slicex.store.redis_store import RedisStore

    RedisStore(url).flush()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=1000, help="VM hosts in the generated substrate (default 1000)")
    p.add_argument("--racks", type=int, default=10, help="racks they are spread over (default 10)")
    p.add_argument("--live", default="0,1000,10000", help="live slice counts L, ascending (default 0,1000,10000)")
    p.add_argument("--samples", type=int, default=40,
                   help="lifecycle cycles, and Status and Describe calls, at each L (default 40; p95 needs 20)")
    p.add_argument("--list-samples", type=int, default=5, help="ListResources calls at each L (default 5)")
    p.add_argument("--idle-seconds", type=float, default=10.0, help="idle window at each L (default 10)")
    p.add_argument("--fill-clients", type=int, default=4, help="client threads filling at once (default 4)")
    p.add_argument("--fill-minutes", type=float, default=None,
                   help="stop a fill after this long and measure at the L reached (default: no limit)")
    p.add_argument("--ready-seconds", type=float, default=300,
                   help="how long after answering GetVersion the deployment may take to place an Allocate "
                        "(default 300)")
    p.add_argument("--store", help="redis://HOST:PORT/DB: `slicex up --distributed` on that Redis database, "
                                   "flushed before and after (default: the embedded deployment on SQLite)")
    p.add_argument("--json", metavar="FILE", help="also write the JSON lines to FILE")
    p.add_argument("--plot", metavar="FILE", help="write a PNG of each cost against L to FILE")
    p.add_argument("--compare", metavar="[LABEL=]FILE", action="append", default=[],
                   help="an earlier run's --json FILE, drawn beside this run on the plot (LABEL=FILE names its "
                        "line; repeatable)")
    p.add_argument("--keep-home", metavar="DIR",
                   help="make the deployment's home under DIR (a new directory) and keep it after the run, "
                        "filled and stopped, to start it again with `slicex --home DIR/home up` (to profile "
                        "it); with --store, the Redis database is then not flushed at the end")
    p.add_argument("--from-home", metavar="DIR",
                   help="start from a copy of the home an earlier --keep-home DIR run left (filled), instead of "
                        "filling again; the L below its live count are measured first in a new home (with "
                        "--store: on the next Redis database); --hosts and --racks are the kept home's")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--quick", action="store_true",
                   help="a small run: --hosts 50 --racks 5 --live 0,50 --samples 20 --list-samples 3 "
                        "--idle-seconds 2")
    args = p.parse_args(argv)
    if args.quick:
        args.hosts, args.racks, args.live, args.samples, args.list_samples, args.idle_seconds = 50, 5, "0,50", 20, 3, 2
    try:
        targets = [int(x) for x in args.live.split(",")]
    except ValueError:
        p.error(f"--live {args.live}: comma-separated whole numbers of live slices")
    if any(t < 0 for t in targets) or targets != sorted(targets):
        p.error(f"--live {args.live}: counts of live slices, ascending (the store only grows)")
    if args.hosts < 1 or args.samples < 1 or args.list_samples < 1 or args.fill_clients < 1 or args.idle_seconds <= 0:
        p.error("--hosts, --samples, --list-samples, --fill-clients and --idle-seconds must be positive")
    if args.keep_home and Path(args.keep_home).exists():
        p.error(f"--keep-home {args.keep_home}: exists; give a new directory")
    if args.keep_home and args.from_home:
        p.error("--keep-home and --from-home: one or the other (copy a kept home by hand to keep it twice)")
    if args.from_home:
        try:
            kept = kept_home(Path(args.from_home))
        except RuntimeError as exc:
            p.error(str(exc))
        if (kept.get("store") or None) != (args.store or None):
            p.error(f"--from-home {args.from_home}: kept on {kept.get('store') or 'SQLite'}; give the same --store")
        args.hosts, args.racks = kept["hosts"], kept["racks"]
    if args.store and not args.store.startswith(("redis://", "rediss://")):
        p.error(f"--store {args.store}: a redis:// URL (the embedded deployment on SQLite is the default)")
    compared = []
    for spec in args.compare:
        label, _, name = spec.rpartition("=")
        compared += earlier(Path(name), label or Path(name).stem)
    if compared and not args.plot:
        p.error("--compare draws an earlier run beside this one on the plot: give --plot FILE too")
    started, where = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), machine()
    print(f"Testbed scale (measured; {where}; started {started}; {args.hosts} hosts in {args.racks} racks; "
          f"{'redis, distributed' if args.store else 'SQLite, embedded'})", flush=True)
    rows: list[dict] = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `slicex up` stopped and Redis flushed on kill too
    try:
        run(args, targets, rows)
    except RuntimeError as exc:  # a call that failed, or a deployment that never served: its reason, no traceback
        print(f"bench/scale.py: {exc}", file=sys.stderr)
        return 1
    finally:  # what was measured is printed even when a later L failed
        show(rows, args, started, where, compared)
    return 0


def show(rows: list[dict], args: argparse.Namespace, started: str, where: str, compared: list[dict]) -> None:
    """The table, the JSON lines and the plot."""
    report(rows, ["live_slices", "live_slivers", "what", "unit", "samples", "p50", "p95", "mean", "value",
                  "load_avg"], title="server CPU and wall per call, ms (p50/p95 where n supports them); model: "
                                     "derived, not measured", json_lines=False)
    emit(rows)
    if args.plot and rows:
        plot(rows + compared, Path(args.plot), f"slicex scale: {args.hosts} hosts, {started} ({where})")


if __name__ == "__main__":
    raise SystemExit(main())
