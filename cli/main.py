"""The `slicex` command: set up a deployment's PKI and users, run it, and inspect it."""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from cli import image as image_cli
from cli import lab as lab_cli
from slicex import procs
from slicex.config import ConfigError, SlicexConfig, reference
from slicex.errors import BadArgs, GeniError, Refused, Unavailable
from slicex.home import Home
from slicex.store import is_shared
from slicex.store.redis_store import redact

if TYPE_CHECKING:
    from protocol.api import BrokerApi


def _home(args: argparse.Namespace) -> Home:
    return Home(Path(args.home)) if args.home else Home()


def cmd_ca_init(args: argparse.Namespace) -> int:
    from slicex.devpki import init_ca

    home = _home(args)
    overrides: dict[str, Any] = {"authority": args.authority} if args.authority else {}
    if args.public_hostname:  # the advertised name; Fed4FIRE expects the AM's URN to carry it too
        if home.config_file.exists():
            if home.config().public_hostname != args.public_hostname.lower().rstrip("."):
                print(f"{home.config_file} exists: set public_hostname there (`slicex up` then issues the AM "
                      f"certificate again with that name)", file=sys.stderr)
                return 2
        overrides["public_hostname"] = args.public_hostname
        overrides.setdefault("authority", args.public_hostname.lower().rstrip("."))
    if args.port_base is not None:  # two homes on one machine: each its own six ports
        if home.config_file.exists():
            print(f"{home.config_file} exists: set the ports there", file=sys.stderr)
            return 2
        keys = ("sa_port", "am_port", "broker_port", "authority_port", "dashboard_port", "am_v2_port")
        overrides.update({key: args.port_base + i for i, key in enumerate(keys)})
    home.write_default_config(**overrides)
    written = init_ca(home, home.config().authority, force=args.force)
    if not written:
        print(f"CA already exists at {home.ca_cert} (use --force to replace it)")
    for p in written:
        print(f"wrote {p}")
    return 0


def cmd_user_add(args: argparse.Namespace) -> int:
    from slicex.devpki import add_user

    home = _home(args)
    if not home.ca_cert.exists():
        print(f"no CA in {home.root}: run `slicex ca init` first", file=sys.stderr)
        return 2
    if home.user_cert(args.name).exists() and not args.force:
        print(f"user {args.name} exists ({home.user_cert(args.name)}); use --force to reissue")
        return 0
    for p in add_user(home, home.config().authority, args.name, args.email):
        print(f"wrote {p}")
    return 0


def _urls(home: Home, advertised: bool = False) -> tuple[str, str]:
    """(slice authority URL, AM URL): where the deployment listens, or (`advertised`) what clients are given,
    under slicex.yaml `public_hostname` when set."""
    cfg = home.config()
    host = cfg.advertised_host() if advertised else cfg.host
    return f"https://{host}:{cfg.sa_port}/", f"https://{host}:{cfg.am_port}/"


def _write_omni_config(home: Home, user: str | None) -> Path | None:
    from slicex import omniconfig

    users = home.users()
    if not users:
        return None
    user = user or ("alice" if "alice" in users else users[0])
    sa_url, am_url = _urls(home, advertised=True)
    return omniconfig.write(home, user, home.config().authority, sa_url, am_url)


def cmd_omni_config(args: argparse.Namespace) -> int:
    from slicex import omniconfig

    home = _home(args)
    if args.framework == "chapi":
        return _chapi_omni_config(home, args)
    users = home.users()
    if not users:
        print("no users yet: run `slicex user add NAME` first", file=sys.stderr)
        return 2
    if args.show:  # prints only: omni_config stays the one later omni runs use
        user = args.user or ("alice" if "alice" in users else users[0])
        print(omniconfig.render(home, user, home.config().authority, *_urls(home, advertised=True)))
        return 0
    print(_write_omni_config(home, args.user))
    return 0


def _chapi(home: Home, user: str, service: str, timeout: float = 10.0) -> Any:
    """An XML-RPC client of the deployment's CH API (`/CH`, `/SA`, `/MA`) as `user`."""
    from slicex.tls_xmlrpc import client

    cfg = home.config()
    url = f"https://{cfg.host}:{cfg.chapi_endpoint_port()}/{service}"
    return client(url, str(home.user_cert(user)), str(home.user_key(user)), timeout=timeout)


def _project_exists_or_create(home: Home, user: str, project: str) -> tuple[bool, str]:
    """Make sure `project` exists at the running deployment (created with `user` as lead if new)."""
    try:
        reply = _chapi(home, user, "SA").create_project([], {"fields": {"PROJECT_NAME": project}})
    except Exception as exc:  # noqa: BLE001 - not running, or not answering
        return False, f"could not reach the CH API ({type(exc).__name__}: {exc}); start `slicex up` and run " \
                      f"`slicex project create {project}`"
    if reply["code"] in (0, 5):  # created, or it already exists
        return True, "created" if reply["code"] == 0 else "exists"
    return False, reply["output"]


def _chapi_omni_config(home: Home, args: argparse.Namespace) -> int:
    from slicex import omniconfig

    users = home.users()
    if not users:
        print("no users yet: run `slicex user add NAME` first", file=sys.stderr)
        return 2
    user = args.user or ("alice" if "alice" in users else users[0])
    cfg = home.config()
    _sa, am_url = _urls(home, advertised=True)
    chapi_url, path = f"https://{cfg.advertised_host()}:{cfg.chapi_endpoint_port()}", home.root / "omni_config_chapi"
    if args.show:  # prints only: no file written, no project created
        print(omniconfig.render_chapi(home, user, cfg.authority, chapi_url, am_url, args.project, path))
        return 0
    omniconfig.write_chapi(home, user, cfg.authority, chapi_url, am_url, args.project, path)
    if args.project:
        ok, how = _project_exists_or_create(home, user, args.project)
        print(f"project {args.project}: {how}", file=sys.stderr)
        if not ok:
            return 3
    print(path)
    return 0


def cmd_project_create(args: argparse.Namespace) -> int:
    home = _home(args)
    user = args.user or ("alice" if "alice" in home.users() else (home.users() or [""])[0])
    if not user:
        print("no users yet: run `slicex user add NAME` first", file=sys.stderr)
        return 2
    ok, how = _project_exists_or_create(home, user, args.name)
    print(f"project {args.name}: {how}", file=sys.stderr if not ok else sys.stdout)
    return 0 if ok else 3


def _answering(home: Home, timeout: float = 1.0) -> bool:
    """Whether this home's AM answers GetVersion: asked as a local user, or with the AM's own certificate on a
    home that has none (a testbed whose only users are its peers' serves all the same)."""
    from slicex.tls_xmlrpc import client

    users = home.users()
    cert, key = (home.user_cert(users[0]), home.user_key(users[0])) if users else (home.am_cert, home.am_key)
    _sa, am_url = _urls(home)
    try:
        reply = client(am_url, str(cert), str(key), timeout=timeout).GetVersion()
        return reply.get("geni_api") == 3
    except Exception:  # noqa: BLE001 - not answering yet
        return False


ACTORS = ("broker", "authority")
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"


def _pid_path(home: Home, role: str) -> Path:
    """run/slicex.pid for the deployment's own process (AM + slice authority), run/<role>.pid for an actor or
    an AM worker (am-worker-1, ...)."""
    return home.pid_file if role == "slicex" else home.pid_file.with_name(f"{role}.pid")


def _worker_role(index: int) -> str:
    """The role (pid file, log file) of AM worker `index` >= 1 of `up --distributed --workers N`."""
    return f"am-worker-{index}"


def _worker_roles(home: Home) -> list[str]:
    """The AM workers this home's pid files name (left by any `up`, whatever its --workers), by index."""
    found = [p.stem for p in home.pid_file.parent.glob("am-worker-*.pid")] if home.pid_file.parent.is_dir() else []
    return sorted(found, key=lambda role: int(role.rsplit("-", 1)[1]) if role.rsplit("-", 1)[1].isdigit() else 0)


def _record_config(home: Home, key: str, value: Any) -> None:
    """Set one top-level key of slicex.yaml, keeping the rest of the file (and the operator's comments)."""
    line = yaml.safe_dump({key: value}, default_flow_style=True).strip().removeprefix("{").removesuffix("}")
    text = home.config_file.read_text() if home.config_file.exists() else ""
    # the key's line and its block continuation (indented lines, or `- item` lines of a block list)
    pattern = re.compile(rf"^{re.escape(key)}:.*$(?:\n(?:[ \t]+\S|- ).*$)*", re.MULTILINE)
    text = pattern.sub(lambda _m: line, text, count=1) if pattern.search(text) else \
        text + ("" if text.endswith("\n") or not text else "\n") + line + "\n"
    home.config_file.write_text(text)


def _configure_store(home: Home, distributed: bool) -> str:
    """The store this deployment runs on, recorded in slicex.yaml so every process of it (actors started by
    hand included) reads the same one. SLICEX_STORE overrides the file and is written into it."""
    raw = (yaml.safe_load(home.config_file.read_text()) or {}).get("store") if home.config_file.exists() else None
    store = os.environ.get("SLICEX_STORE") or raw
    if distributed and not store:
        store = DEFAULT_REDIS
    if distributed and not is_shared(str(store)):
        raise BadArgs(f"`slicex up --distributed` keeps all state in Redis, but the store is {redact(str(store))}; "
                      f"set `store: redis://HOST:PORT/DB` (or redis+sentinel://HOST:PORT,.../MASTER/DB) in "
                      f"{home.config_file}")
    if store and store != raw:
        _record_config(home, "store", store)
        print(f"store {redact(store)} recorded in {home.config_file}: every process of this deployment reads it",
              flush=True)
    return str(home.config().store)




def _port_taken(host: str, port: int) -> bool:
    """Something listens on host:port (tested by binding, so the listener sees no connection)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def _bind_deployment_store(home: Home, url: str, init_store: bool) -> None:
    """The deployment's id (slicex.yaml `deployment_id`, made by a home's first `up`) checked against the
    record in its store. The record is written only into a store this home has never run on (its first
    `up`, or the first on another store: `up --distributed` after the embedded demo), recorded in
    slicex.yaml `deployment_stores`, or with `--init-store` (and it says so): a store this home ran on that
    lost the record (a Redis restarted empty) is refused, never silently adopted."""
    from deployment.service import bind_store
    from slicex.store import open_store

    cfg = home.config()
    known = cfg.deployment_id
    # a home from before stores were recorded: the one it names is taken as used (a wiped one is refused)
    used = list(cfg.deployment_stores) or ([redact(url)] if known else [])
    fresh = redact(url) not in used
    dep = str(known or uuid.uuid4().hex[:16])
    store = open_store(url)
    try:
        made = bind_store(store, dep, home, create=init_store or not known or fresh, migrating=True)
    finally:
        store.close()
    if not known:  # after the store took it: a first `up` that failed there is still a first `up`
        _record_config(home, "deployment_id", dep)
    if fresh:
        _record_config(home, "deployment_stores", [*used, redact(url)])
    if made:
        why = ("--init-store: it starts empty" if init_store and known else
               "this home's first `slicex up`" if not known else "this home's first `slicex up` on this store")
        print(f"store {redact(url)} initialised for deployment {dep} ({why})", flush=True)


def _migrate_store(url: str) -> None:
    """Bring the store to this slicex's layout (deployment/migrations.py) before any process of the deployment
    runs on it; a store made new is marked current at once."""
    from deployment.migrations import STEPS
    from slicex.store import open_store
    from slicex.store.migration import migrate

    store = open_store(url)
    try:
        migrate(store, STEPS, say=lambda line: print(line, flush=True))
    finally:
        store.close()


def _prepare(home: Home, distributed: bool, init_store: bool = False) -> None:
    """Before a deployment starts: its store and id recorded and checked, actors left running by an `up`
    that was killed (or started by hand) stopped, and its ports free. Refused (an error naming the cause)
    when it cannot start."""
    url = _configure_store(home, distributed)
    _bind_deployment_store(home, url, init_store)
    for role in (*ACTORS, *_worker_roles(home)):
        leftover = procs.running(_pid_path(home, role))
        if leftover is not None:
            what = f"the {role} actor" if role in ACTORS else role.replace("am-worker-", "AM worker ")
            print(f"stopping {what} left running (pid {leftover.pid}); this deployment starts its own",
                  flush=True)
            procs.stop(leftover)
        _pid_path(home, role).unlink(missing_ok=True)
    _migrate_store(url)
    cfg = home.config()
    ports = [("sa_port", cfg.sa_port), ("am_port", cfg.am_port)]
    ports += [("broker_port", cfg.broker_port), ("authority_port", cfg.authority_port)] if distributed else []
    # the ports derived from those unless set: the AM API v2 endpoint and the CH API
    ports += [("am_v2_port", cfg.am_v2_endpoint_port()), ("chapi_port", cfg.chapi_endpoint_port())]
    for key, port in ports:
        if port and _port_taken(cfg.host, port):
            raise Refused(f"port {port} ({key}) on {cfg.host} is in use by a process that is not part of "
                          f"this deployment; stop it or set another {key} in {home.config_file}")


def _home_fault(home: Home) -> str | None:
    """Why this home (and the directory of its SQLite store) cannot take the writes a deployment makes (a
    full disk, a read-only file system, no permission), with what to do; None when it can."""
    from slicex.diskfaults import remedy, write_fault
    from slicex.store.guard import sqlite_dir

    store_dir = sqlite_dir(str(home.config().store))
    for directory in dict.fromkeys([home.root] + ([store_dir] if store_dir else [])):
        fault = write_fault(directory) if directory.is_dir() else None
        if fault:
            return f"{fault}: {remedy(fault)}"
    return None


def _exit_cause(home: Home) -> str:
    """Why a detached `up` exited, for the terminal: the home's disk fault (its log may not have taken the
    cause), else the last line of its log."""
    fault = _home_fault(home)
    if fault:
        return fault
    try:
        with open(home.log_file, "rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - 4096))
            lines = [line.strip() for line in log.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1] if lines else "its log is empty"


def _workers_refused(home: Home, workers: int, distributed: bool) -> str | None:
    """Why `up --workers N` cannot run here, or None."""
    if workers < 1:
        return f"--workers {workers}: at least one AM worker serves"
    if workers == 1:
        return None
    if not distributed:
        return (f"--workers {workers} needs --distributed: AM workers side by side share one broker, one "
                f"authority and one store, which only the distributed deployment has (its actors are processes "
                f"of their own, its state in Redis); the embedded deployment's broker and authority live inside "
                f"its one process, and a second process would be a second broker over the same inventory")
    cfg = home.config()
    if not cfg.am_port or cfg.am_v2_endpoint_port() == 0:
        return (f"--workers {workers}: the AM workers share the AM API ports, so am_port (and am_v2_port) in "
                f"{home.config_file} must name a port, not 0 (any free port)")
    return None


def cmd_up(args: argparse.Namespace) -> int:
    home = _home(args)
    home.config()  # a wrong slicex.yaml is refused (ConfigError naming the key) before anything starts
    if not home.ca_cert.exists():
        print(f"no CA in {home.root}: run `slicex ca init` and `slicex user add NAME` first", file=sys.stderr)
        return 2
    refused = _workers_refused(home, args.workers, args.distributed)
    if refused:
        print(f"error: {refused}", file=sys.stderr)
        return 2
    fault = _home_fault(home)
    if fault is None:
        try:
            return _up(home, args)
        except OSError as exc:  # a write the check above could not foresee (the disk filled since)
            from slicex.diskfaults import os_fault, remedy

            fault = os_fault(Path(exc.filename or home.root), exc)
            fault = f"{fault}: {remedy(fault)}"
    print(f"error: slicex cannot start: {fault}", file=sys.stderr, flush=True)  # a detached child's: its log
    return 2


def _up(home: Home, args: argparse.Namespace) -> int:
    running = procs.running(home.pid_file)
    if running is not None:
        print(f"slicex is already running (pid {running.pid}); `slicex down` stops it", file=sys.stderr)
        return 1
    home.pid_file.unlink(missing_ok=True)  # a dead process's (or a reused pid's) file
    if getattr(args, "substrate", None):  # recorded, so the detached child and the authority actor read it too
        _record_config(home, "substrate_driver", args.substrate)
    try:
        _ensure_node_image(home)
    except GeniError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    from deployment.service import shared_disk_note

    note = shared_disk_note(home.config(), home)
    if note:
        print(note, file=sys.stderr)
    if not args.detach:
        return _run_foreground(home, print_config=args.print_config, distributed=args.distributed,
                               init_store=args.init_store, workers=args.workers)
    try:
        _prepare(home, args.distributed, args.init_store)
    except GeniError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    home.log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(home.log_file, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "cli", "--home", str(home.root), "up"]
                                + (["--distributed"] if args.distributed else [])
                                + (["--workers", str(args.workers)] if args.workers > 1 else []),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            print(f"slicex exited with {proc.returncode}: {_exit_cause(home)}; see {home.log_file}", file=sys.stderr)
            return 1
        record = procs.read(home.pid_file)
        if record is not None and record.pid == proc.pid and _answering(home):  # its own servers, not others'
            print(f"slicex is up (pid {proc.pid})")
            print("\n".join(record.info.get("summary", [])))  # what the foreground `up` prints
            if _write_omni_config(home, None) is None:
                print("no omni config: no local users (`slicex user add NAME` adds one)")
            return 0
        time.sleep(0.2)
    print(f"slicex did not answer within 60 s; see {home.log_file}", file=sys.stderr)
    return 1


def _ensure_node_image(home: Home) -> None:
    """On the netns substrate nodes boot an image of the host's catalogue: the first `up` that finds none
    builds the default one here, with a progress bar, before any server starts (once per host)."""
    cfg = home.config()
    if cfg.substrate_driver != "netns":
        return
    from deployment.service import node_images

    catalogue, name = node_images(cfg.netns)
    if catalogue.get(name) is None:
        image_cli.build_with_progress(catalogue, name)


class _Supervisor:
    """The actor processes and extra AM workers a deployment owns: started as its children (they die with it,
    even by kill -9), restarted when they die, stopped with it."""

    def __init__(self, home: Home):
        self.home = home
        self.procs: dict[str, subprocess.Popen] = {}
        self._commands: dict[str, list[str]] = {}  # role -> `slicex` arguments that start it
        self._retry_at: dict[str, float] = {}

    def start(self, role: str, command: list[str] | None = None, timeout: float = 30) -> subprocess.Popen:
        """Start one actor (`command`: by default `actor <role>`) and wait until it serves (it writes its pid
        file once it listens)."""
        home = self.home
        command = self._commands.setdefault(role, command or ["actor", role])
        log_path = home.log_file.with_name(f"{role}.log")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "cli", "--home", str(home.root), *command],
                                    stdout=log, stderr=subprocess.STDOUT,
                                    env={**os.environ, "SLICEX_SUPERVISOR_PID": str(os.getpid())})
        self.procs[role] = proc
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise Unavailable(f"the {role} actor exited with {proc.returncode}; see {log_path}")
            record = procs.read(_pid_path(home, role))
            if record is not None and record.pid == proc.pid:
                return proc
            time.sleep(0.05)
        raise Unavailable(f"the {role} actor did not start within {timeout:.0f} s; see {log_path}")

    def check(self) -> None:
        """Restart an actor that died (kill -9, a crash); one that fails to start is tried again in 2 s."""
        for role, proc in list(self.procs.items()):
            if proc.poll() is None or time.monotonic() < self._retry_at.get(role, 0):
                continue
            logging.getLogger("slicex.supervisor").warning("the %s actor (pid %d) exited with %s; restarting it",
                                                           role, proc.pid, proc.returncode)
            try:
                self.start(role)
            except GeniError as exc:
                logging.getLogger("slicex.supervisor").error("%s; trying again in 2 s", exc.message)
                self._retry_at[role] = time.monotonic() + 2

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for role, proc in self.procs.items():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            record = procs.read(_pid_path(self.home, role))
            if record is not None and record.pid == proc.pid:
                _pid_path(self.home, role).unlink(missing_ok=True)


def _serve_until_stopped(every: Callable[[], None] | None = None) -> None:
    """Block until SIGTERM (`slicex down`) or Ctrl-C, calling `every` about twice a second."""
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    try:
        while not stopping:
            time.sleep(0.2)
            if every is not None and not stopping:
                every()
    except KeyboardInterrupt:
        pass


def _run_foreground(home: Home, print_config: bool = False, distributed: bool = False,
                    init_store: bool = False, workers: int = 1) -> int:
    from deployment.service import AmWorker, EmbeddedDeployment
    from slicex import logs, runtime

    logs.configure(home.config())  # log_format: text | json (slicex.logs)
    try:
        runtime.tune_process(home.config())
        _prepare(home, distributed, init_store)
    except GeniError as exc:
        print(f"error: {exc.message}", file=sys.stderr, flush=True)
        return 2
    supervisor = _Supervisor(home)
    urls: dict[str, str] = {}
    cfg = home.config()
    try:
        if distributed:
            for role in ACTORS:
                supervisor.start(role)
                urls[f"{role}_url"] = cfg.actor_url(role)
        deployment = EmbeddedDeployment(home, **urls, worker=AmWorker(0, workers))
        endpoints = deployment.start()
    except (GeniError, OSError) as exc:
        supervisor.stop()
        print(f"error: slicex cannot start: {getattr(exc, 'message', exc)}", file=sys.stderr, flush=True)
        return 1
    try:  # the other AM workers, on the ports this one bound (SO_REUSEPORT), once it serves
        for index in range(1, workers):
            supervisor.start(_worker_role(index), ["am-worker", str(index), "--of", str(workers)], timeout=60)
    except GeniError as exc:
        deployment.stop()
        supervisor.stop()
        print(f"error: slicex cannot start: {exc.message}", file=sys.stderr, flush=True)
        return 1
    # slicex.yaml `scs:`: the path service runs with the deployment
    from stitching import service as scs_service
    from stitching.topology import TopologyError

    try:
        scs = scs_service.from_config(cfg, home.root)
    except TopologyError as exc:
        deployment.stop()
        supervisor.stop()
        print(f"error: slicex cannot start the path service: {exc}", file=sys.stderr, flush=True)
        return 1
    scs_url = scs.start() if scs else None
    path = _write_omni_config(home, None)
    summary = [f"slice authority: {endpoints.sa_url}", f"aggregate:       {endpoints.am_url}",
               f"substrate:       {deployment.driver.description}"]
    if deployment.dashboard_url:
        summary.append(f"dashboard:       {deployment.dashboard_url}")
    if scs is not None:
        summary.append(f"path service:    {scs.describe()}")
    summary.append(f"store:           {redact(str(cfg.store))}")
    for role, proc in supervisor.procs.items():
        if role in ACTORS:
            summary.append(f"{role} actor:{' ' * (6 - len(role) + 3)}{urls[f'{role}_url']} (pid {proc.pid})")
    if workers > 1:
        pids = ", ".join(str(p.pid) for r, p in supervisor.procs.items() if r not in ACTORS)
        summary.append(f"AM workers:      {workers} on {endpoints.am_url} (pids {os.getpid()}, {pids})")
    if path:
        summary.append(f"omni config:     {path}")
    # the summary goes in the pid file too: `up --detach` prints it from there, as the foreground `up` does
    procs.write(home.pid_file, procs.this_process({"role": "slicex", "distributed": distributed, "workers": workers,
                                                   "am_url": endpoints.am_url, "sa_url": endpoints.sa_url,
                                                   "dashboard_url": deployment.dashboard_url,
                                                   **deployment.actor_urls,
                                                   **({"chapi_url": deployment.chapi.url} if deployment.chapi else {}),
                                                   **({"scs_url": scs_url} if scs_url else {}),
                                                   "summary": summary}))
    print("\n".join(summary), flush=True)
    if path:
        if print_config:
            print("\n" + path.read_text(), flush=True)
    _serve_until_stopped(supervisor.check if distributed else None)
    if scs is not None:
        scs.stop()
    deployment.stop()
    supervisor.stop()
    procs.remove_if_mine(home.pid_file)
    print("slicex stopped", flush=True)
    return 0


def cmd_actor(args: argparse.Namespace) -> int:
    """Run one actor (broker or authority) over mutual TLS until stopped (`up --distributed` starts them)."""
    from deployment.service import ActorProcess
    from slicex import logs, runtime

    home = _home(args)
    logs.configure(home.config())  # log_format: text | json (slicex.logs)
    try:
        runtime.tune_process(home.config())
    except GeniError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    supervisor = os.environ.get("SLICEX_SUPERVISOR_PID")
    if supervisor and not procs.die_with_parent(int(supervisor)):
        print(f"the {args.role} actor's `slicex up` (pid {supervisor}) is gone; not starting", file=sys.stderr)
        return 1
    def start(store: Any, cfg: Any) -> tuple[dict[str, Any], str, Callable[[], None]]:
        from deployment.leadership import Leadership, supports_leases

        def serve(on: Any) -> tuple[str, Callable[[], None]]:
            actor = ActorProcess(home, args.role, port=args.port, store=on)
            return actor.start(), actor.stop

        shown = redact(str(cfg.store))
        if not supports_leases(store):  # SQLite: one process, so one actor of each role and no standby
            if args.standby:
                raise Refused(f"--standby needs the deployment's store in Redis (plain or Sentinel); it is {shown}")
            url, stop = serve(store)
            return {"role": args.role, "url": url}, f"{args.role} actor at {url} (store {shown})", stop
        lead = Leadership(store, args.role, serve, standby=args.standby)
        lead.start()
        where = f"at {lead.url}" if lead.url else "standing by: another process holds the lease"
        return ({"role": args.role, "url": lead.url or "", "standby": args.standby, "holder": lead.holder},
                f"{args.role} actor {lead.state} {where} (store {shown})", lead.stop)

    role = f"{args.role}-standby" if args.standby else args.role
    return _serve_as(home, _pid_path(home, role), f"the {role.replace('-', ' ')} actor", start)


def _serve_as(home: Home, path: Path, what: str,
              start: Callable[[Any, Any], tuple[dict[str, Any], str, Callable[[], None]]]) -> int:
    """Run one process of a running deployment on its store until stopped: refuse a second copy of it, bind
    the store, `start(store, cfg)` -> (its pid record, what to print, how to stop it), serve, clean up."""
    from deployment.service import bind_store
    from slicex.store import open_store

    running = procs.running(path)
    if running is not None:
        print(f"{what} is already running (pid {running.pid})", file=sys.stderr)
        return 1
    cfg = home.config()
    store = open_store(str(cfg.store))
    try:
        bind_store(store, cfg.deployment_id or "", home, create=False)
        record, banner, stop = start(store, cfg)
    except (GeniError, OSError) as exc:
        print(f"error: {what} will not start: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 2
    procs.write(path, procs.this_process(record))
    print(banner, flush=True)
    _serve_until_stopped()
    stop()
    procs.remove_if_mine(path)
    return 0


JOINED_WORKER = "am-worker-joined"
"""The role (pid file, log file) of the AM worker `slicex am-worker --join` runs on a host of its own."""


def cmd_am_worker(args: argparse.Namespace) -> int:
    """Run AM worker `index` of `up --distributed --workers N` (which starts and supervises it) until stopped:
    the AM API on the deployment's AM ports beside the others (SO_REUSEPORT), calling its broker and authority,
    on its store. With `--join`: the AM worker of another host, on its own `host`, calling the actors at
    slicex.yaml's `broker_url` and `authority_url` (a copy of the deployment's home: same CA, users, store)."""
    from deployment.service import AmWorker, EmbeddedDeployment
    from slicex import logs, runtime

    home = _home(args)
    logs.configure(home.config())
    if args.join:
        return _join_as_am_worker(home)
    if args.index is None or args.of is None:
        print("error: `slicex am-worker INDEX --of N` (under `up --distributed --workers N`) or `slicex "
              "am-worker --join` (on another host)", file=sys.stderr)
        return 2
    if not 1 <= args.index < args.of:
        print(f"error: AM worker {args.index} of {args.of}: the index runs from 1 to {args.of - 1} (0 is "
              f"`slicex up` itself)", file=sys.stderr)
        return 2
    supervisor = os.environ.get("SLICEX_SUPERVISOR_PID")
    if not supervisor:  # its ports, actors and store are its `up`'s; alone it would serve beside nothing
        print("error: an AM worker runs under `slicex up --distributed --workers N`, which starts it",
              file=sys.stderr)
        return 2
    if not procs.die_with_parent(int(supervisor)):
        print(f"AM worker {args.index}'s `slicex up` (pid {supervisor}) is gone; not starting", file=sys.stderr)
        return 1
    try:
        runtime.tune_process(home.config())
    except GeniError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    def start(store: Any, cfg: Any) -> tuple[dict[str, Any], str, Callable[[], None]]:
        deployment = EmbeddedDeployment(home, store=store, worker=AmWorker(args.index, args.of),
                                        broker_url=f"https://{cfg.host}:{cfg.broker_port}/",
                                        authority_url=f"https://{cfg.host}:{cfg.authority_port}/")
        endpoints = deployment.start()
        return ({"role": "am-worker", "index": args.index, "am_url": endpoints.am_url, "sm_name": deployment.sm.name},
                f"AM worker {args.index} of {args.of} at {endpoints.am_url} (slice manager {deployment.sm.name})",
                deployment.stop)

    return _serve_as(home, _pid_path(home, _worker_role(args.index)), f"AM worker {args.index}", start)


def _join_as_am_worker(home: Home) -> int:
    """`slicex am-worker --join`: an AM worker on this host of a distributed deployment whose broker and
    authority run on another (slicex.yaml `broker_url`, `authority_url`), on the deployment's Redis. Nothing
    supervises it here: run it under the host's service manager, as `slicex up` would restart its own."""
    from deployment.service import AmWorker, EmbeddedDeployment
    from slicex import runtime

    cfg = home.config()
    refused = _join_refused(cfg)
    if refused:
        print(f"error: {refused}", file=sys.stderr)
        return 2
    try:
        runtime.tune_process(cfg)
    except GeniError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2

    def start(store: Any, cfg: Any) -> tuple[dict[str, Any], str, Callable[[], None]]:
        deployment = EmbeddedDeployment(home, store=store, worker=AmWorker.joined(cfg.host),
                                        broker_url=cfg.actor_url("broker"), authority_url=cfg.actor_url("authority"))
        endpoints = deployment.start()
        return ({"role": JOINED_WORKER, "am_url": endpoints.am_url, "sm_name": deployment.sm.name,
                 "broker_url": cfg.actor_url("broker"), "authority_url": cfg.actor_url("authority")},
                f"AM worker at {endpoints.am_url} (slice manager {deployment.sm.name}), joined to the broker at "
                f"{cfg.actor_url('broker')} and the authority at {cfg.actor_url('authority')}", deployment.stop)

    return _serve_as(home, _pid_path(home, JOINED_WORKER), "the joined AM worker", start)


def _join_refused(cfg: Any) -> str | None:
    """Why this home cannot join a distributed deployment from another host, or None: its state must be on
    a shared Redis, and its actors somewhere else than itself."""
    if not is_shared(str(cfg.store or "")):
        return (f"an AM worker joins a distributed deployment on its Redis, but the store is "
                f"{redact(str(cfg.store or 'state.db'))}; copy the deployment's slicex.yaml (its `store`)")
    if not (cfg.broker_url and cfg.authority_url):
        return ("set `broker_url` and `authority_url` in slicex.yaml: where this host reaches the deployment's "
                "broker and authority actors (https://<their host's address>:<broker_port|authority_port>/)")
    return None


def cmd_down(args: argparse.Namespace) -> int:
    """Stop the deployment and every actor and AM worker it (or an earlier, killed `up`) started; clear the
    pid files."""
    home = _home(args)
    stopped = []
    standbys = [f"{role}-standby" for role in ACTORS]
    for role in ("slicex", *_worker_roles(home), *ACTORS, *standbys):  # the deployment first: it stops its children
        record = procs.running(_pid_path(home, role))
        if record is not None:
            killed = procs.stop(record, grace=20 if role == "slicex" else 10)
            stopped.append(f"{role} pid {record.pid}" + (" (killed)" if killed else ""))
        _pid_path(home, role).unlink(missing_ok=True)
    stopped += _stop_host_switch(home)
    print(f"slicex stopped ({', '.join(stopped)})" if stopped else "slicex is not running")
    return 0


def _stop_host_switch(home: Home) -> list[str]:
    """The netns substrate's private Open vSwitch and OpenFlow controller, if an `up` killed before it could
    stop them left them running (slivers' namespaces stay: their leases are live, the next `up` adopts them);
    with no sliver on the host, its bridge and run directories too."""
    cfg = home.config()
    if cfg.substrate_driver != "netns":
        return []
    from deployment.service import host_driver

    driver = host_driver(cfg, home)
    if not driver.ovs.running():
        left = [str(p) for p in (driver.run_dir, driver.nodes_dir) if p.exists()]
        if left and not driver.holds_slivers():
            driver.shutdown()
            return [f"removed {', '.join(left)}"]
        return []
    driver.shutdown()
    if driver.shared_switch:  # netns: {switch_dir}: other aggregates' bridges are on it
        return [f"OpenFlow controller (the shared Open vSwitch in {driver.ovs.run_dir} keeps running)"]
    return [f"Open vSwitch and OpenFlow controller in {driver.ovs.run_dir}"]


def _actor_answering(home: Home, url: str) -> str:
    """Whether an actor answers a call over mutual TLS, made as the aggregate (an unknown method: a live
    actor answers with a fault)."""
    import xmlrpc.client

    from slicex.tls_xmlrpc import client

    try:
        client(url, str(home.am_cert), str(home.am_key), timeout=3).slicex_status_ping()
    except xmlrpc.client.Fault:
        pass  # it answered
    except (OSError, xmlrpc.client.ProtocolError) as exc:
        return f"not answering: {exc}"
    return "answering"


def _health(record: procs.ProcessRecord) -> str:
    """The deployment's own verdict (dashboard /health): serving, or why not."""
    import json
    import urllib.error
    import urllib.request

    url = record.info.get("dashboard_url")
    if not url:
        return "unknown (the dashboard, which serves /health, is off)"
    try:
        with urllib.request.urlopen(url + "health", timeout=5) as reply:
            report = json.load(reply)
    except urllib.error.HTTPError as exc:
        report = json.load(exc)
    except (OSError, ValueError) as exc:
        return f"unknown ({url}health: {exc})"
    if report.get("serving"):
        return "serving"
    return "NOT SERVING: " + "; ".join(f"{k}: {v}" for k, v in report.get("checks", {}).items() if v != "ok")


def _store_status(home: Home) -> tuple[bool, str]:
    from deployment.service import bind_store
    from slicex.store import open_store
    from slicex.store.guard import GuardedStore, sqlite_dir

    cfg = home.config()
    try:
        store = open_store(str(cfg.store))
        try:
            bind_store(store, cfg.deployment_id or "", home, create=False)
            # and a write, as /health makes: a full disk or a read-only Redis still answers reads
            guard = GuardedStore(store, None, redact(str(cfg.store)), sqlite_dir(str(cfg.store)))
            checks = guard.check("status", report=False)
        finally:
            store.close()
        failing = "; ".join(v for v in checks.values() if v != "ok")
        if failing:
            return False, f"{redact(str(cfg.store))}: this deployment's, but {failing}"
    except GeniError as exc:
        return False, f"{redact(str(cfg.store))}: {exc.message}"
    except Exception as exc:  # noqa: BLE001 - status reports whatever is wrong
        return False, f"{redact(str(cfg.store))}: {type(exc).__name__}: {exc}"
    return True, f"{redact(str(cfg.store))} (answering, this deployment's)"


def _actor_roles(home: Home) -> dict[str, dict[str, Any]] | None:
    """Who holds each actor role's lease and who stands by (deployment/leadership.py); None on a store
    without leases (SQLite) or one that does not answer (the store line says why)."""
    from deployment.leadership import roles_status, supports_leases
    from slicex.store import open_store

    try:
        store = open_store(str(home.config().store))
    except (GeniError, ValueError):
        return None
    try:
        return roles_status(store) if supports_leases(store) else None
    except GeniError:
        return None
    finally:
        store.close()


def _role_lines(home: Home, roles: dict[str, dict[str, Any]]) -> tuple[bool, list[str]]:
    """One line per role: the active process (its URL answering?, lease token, seconds since it renewed the
    lease) and its standbys; not good while a role has no active process that answers."""
    from deployment.leadership import LEASE_SECONDS

    good, lines = True, []
    for role, seen in roles.items():
        active, standbys = seen["active"], seen["standbys"]
        waiting = ", ".join(f"{d['holder']} (seen {time.time() - float(d['seen_at']):.1f} s ago)" for d in standbys)
        spare = f"; standby: {waiting}" if waiting else "; no standby"
        if active is None:
            good = False
            lines.append(f"{role} role: NO ACTIVE PROCESS (lease free){spare}")
            continue
        state = _actor_answering(home, active["url"]) if active["url"] else "not published yet"
        good = good and state == "answering"
        lines.append(f"{role} role: active {active['holder']} at {active['url']} ({state}), lease token "
                     f"{active['token']}, renewed {active['age']:.1f} s ago (lapses after {LEASE_SECONDS:.0f} s)"
                     f"{spare}")
    return good, lines


def cmd_status(args: argparse.Namespace) -> int:
    """Each process of the deployment (by pid file identity), whether it answers, and the store."""
    home = _home(args)
    sa_url, am_url = _urls(home)
    good = True
    print(f"home:       {home.root}")
    record = procs.running(home.pid_file)
    if record is None:
        stale = procs.read(home.pid_file)
        print("process:    not running" + (f" (stale pid file: pid {stale.pid} is gone)" if stale else ""))
        good = False
    else:
        print(f"process:    running, pid {record.pid}")
    answering = _answering(home)
    good = good and answering
    print(f"aggregate:  {am_url} ({'answering' if answering else 'not answering'})")
    print(f"slice auth: {sa_url}")
    if record is not None:
        health = _health(record)
        good = good and not health.startswith("NOT")
        print(f"health:     {health}")
    last = record or procs.read(home.pid_file)
    if record is not None and record.info.get("scs_url"):  # slicex.yaml `scs:` (stitching/service.py)
        from stitching.service import answering as scs_answering

        scs_ok = scs_answering(record.info["scs_url"])
        good = good and scs_ok
        print(f"path svc:   {record.info['scs_url']} ({'answering' if scs_ok else 'not answering'})")
    distributed = bool(last and last.info.get("distributed"))
    workers = int(last.info.get("workers", 1)) if last else 1
    roles = list(dict.fromkeys([*(_worker_role(i) for i in range(1, workers)), *_worker_roles(home)]))
    for role in roles:  # the AM workers beside `up`'s own process, on the same AM port
        worker = procs.running(_pid_path(home, role))
        label = role.replace("am-worker-", "AM worker ")
        if worker is None:
            if record is not None and role in (_worker_role(i) for i in range(1, workers)):
                good = False
                print(f"{label}: not running")
            continue
        print(f"{label}: running, pid {worker.pid}, {worker.info.get('am_url')} "
              f"(slice manager {worker.info.get('sm_name')})")
    roles = _actor_roles(home)
    for role in ACTORS:
        actor = procs.running(_pid_path(home, role))
        active = (roles or {}).get(role, {}).get("active")
        if actor is None:
            if distributed:
                good = False
                print(f"{role}:{' ' * (11 - len(role))}not running")
        elif roles is not None and (active is None or active["holder"] != actor.info.get("holder")):
            print(f"{role}:{' ' * (11 - len(role))}running, pid {actor.pid}, standby")
        else:
            state = _actor_answering(home, actor.info.get("url", ""))
            good = good and state == "answering"
            print(f"{role}:{' ' * (11 - len(role))}running, pid {actor.pid}, {actor.info.get('url')} ({state})")
    if roles is not None and (distributed or any(r["active"] or r["standbys"] for r in roles.values())):
        roles_ok, lines = _role_lines(home, roles)
        good = good and roles_ok
        for line in lines:
            print(line)
    store_ok, store_text = _store_status(home)
    good = good and store_ok
    print(f"store:      {store_text}")
    if store_ok:
        delegation_ok, lines = _delegation_lines(home)
        good = good and delegation_ok
        for line in lines:
            print(line)
    for line in _node_lines(home):
        print(line)
    print(f"users:      {', '.join(home.users()) or 'none'}")
    return 0 if good else 3


def _delegation_lines(home: Home) -> tuple[bool, list[str]]:
    """Whether the authority's delegation at start reached its broker (authority/actor.py `Delegator`): until
    it has, nothing can be placed; one refused for good (too large for a request) fails the status."""
    from authority.actor import DELEGATION_STATUS
    from slicex.store import open_store

    try:
        store = open_store(str(home.config().store))
        try:
            docs = store.scan(DELEGATION_STATUS)
        finally:
            store.close()
    except Exception as exc:  # noqa: BLE001 - status reports whatever is wrong
        return True, [f"delegation: unknown ({type(exc).__name__}: {exc})"]
    lines, good = [], True
    for d in docs:
        state = d.get("state", "")
        if state == "delegated":
            text = f"delegated to its broker at {d.get('at')}"
        elif state == "refused":
            good = False
            text = f"REFUSED at {d.get('at')}, not retried: {d.get('error')}"
        else:
            text = f"not delegated yet, retrying (since {d.get('at')}: {d.get('error')})"
        lines.append(f"delegation: {text}")
    return good, lines


def _node_lines(home: Home) -> list[str]:
    """On the netns substrate, each node (container or VM) of this deployment: running or not, the limits it got,
    the memory and CPU time it used."""
    cfg = home.config()
    if cfg.substrate_driver != "netns":
        return []
    from authority.substrate.netns import STATE_ROOT
    from authority.substrate.vm import machine_at
    from deployment.service import netns_prefix

    lxcpath = Path(cfg.netns.state_dir or STATE_ROOT / f"slicex-{netns_prefix(cfg, home)}") / "lxc"
    names = sorted(d.name for d in lxcpath.iterdir()) if lxcpath.is_dir() else []
    lines = [f"nodes:      {len(names)} node{'s' if len(names) != 1 else ''} in {lxcpath}"]
    for name in names:
        n = machine_at(lxcpath, name).summary()
        kind = f"VM ({n.get('accel') or '?'})" if n.get("machine") == "qemu" else "container"
        lines.append(f"  {n['hostname'] or '?':<12} {name}  {kind:<9} {'running' if n['running'] else 'stopped':<8} "
                     f"cores {n.get('cores', '?')} (cpuset {n.get('cpuset', '?')}), memory {n.get('memory_mb', '?')} MB "
                     f"(using {int(n.get('memory_bytes', 0)) / 2**20:.1f} MB), disk {n.get('disk_gb', '?')} GB "
                     f"(using {int(n.get('disk_used_bytes', 0)) / 2**20:.1f} MB), pids {n.get('pids', '?')}, "
                     f"cpu {int(n.get('cpu_ns', 0)) / 1e9:.1f} s")
    return lines


def _catalogue(args: argparse.Namespace):
    """(bitstream catalogue of this deployment, the user's URN)."""
    from fpga_aggregate.bitstreams import BitstreamCatalogue
    from slicex.store import open_store

    home = _home(args)
    cfg = home.config()
    return (BitstreamCatalogue(open_store(str(cfg.store)), home.root / "bitstreams"),
            f"urn:publicid:IDN+{cfg.authority}+user+{args.user}")


def cmd_fpga_upload(args: argparse.Namespace) -> int:
    from slicex.errors import GeniError

    catalogue, user = _catalogue(args)
    try:
        b = catalogue.upload(user, Path(args.file).name, Path(args.file).read_bytes())
    except (GeniError, OSError) as exc:
        print(f"error: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 1
    print(f"{b.ref}  {b.name}  part {b.part}  {b.size} bytes  (use bitstream=\"{b.ref}\" in your request)")
    return 0


def cmd_fpga_list(args: argparse.Namespace) -> int:
    catalogue, user = _catalogue(args)
    for b in catalogue.list(user):
        print(f"{b.ref}  {b.name}  part {b.part}  {b.size} bytes")
    return 0


def cmd_maintenance(args: argparse.Namespace) -> int:
    """Take a host out of (or back into) the broker's inventory; slivers already on it keep running. The order
    is a message to the running authority actor (either deployment serves it), sent with the authority's own
    certificate: only the site's operator holds that key. With nothing running, the same message goes to an
    authority and a broker built over the store for this command, and the deployment reads it at its start."""
    from datetime import UTC, datetime

    from deployment.service import deployment_substrate

    home = _home(args)
    cfg = home.config()
    substrate = deployment_substrate(cfg)
    host = substrate.host(args.host)
    if host is None:
        print(f"no host {args.host} in the substrate ({', '.join(h.name for h in substrate.hosts)})", file=sys.stderr)
        return 2
    url = _running_actor_url(home, "authority")
    try:
        if url:
            from deployment.actors import Caller, authority_client

            authority = authority_client(url, Caller.of_home(home, "authority"), cfg.authority,
                                         cfg.actor_timeout_seconds)
            answer = authority.maintenance(host.component_id, args.end, datetime.now(UTC))
        else:
            answer = _maintenance_at_rest(home, cfg, substrate, host.component_id, args.end)
    except GeniError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    where = f" (the authority actor at {url})" if url else " (nothing running: recorded in the store)"
    if answer.back:
        print(f"{host.name} is back in the broker's inventory{where}")
        return 0
    if answer.busy:
        print(f"{host.name}: {len(answer.busy)} of its resources are promised to slivers; they stay until those "
              f"end. Run this again after they expire or are deleted.")
        return 1
    print(f"{host.name} is out of the broker's inventory (maintenance){where}; `slicex maintenance {host.name} "
          f"--end` returns it")
    return 0


def _maintenance_at_rest(home: Home, cfg: SlicexConfig, substrate: Any, host: str, back: bool) -> Any:
    """The maintenance message with no deployment running: to the authority and broker of this home built
    over its store (deployment/actors.py), as `slicex up` builds them."""
    from datetime import UTC, datetime

    from deployment.actors import home_keys_and_names, make_authority, make_broker
    from slicex.clock import SystemClock
    from slicex.store import open_store

    keys, name = home_keys_and_names(home, cfg.authority)  # a home from before the broker had a key of its own
    store = open_store(str(cfg.store))
    try:
        broker = make_broker(store, keys, name, clock=SystemClock())
        authority = make_authority(store, keys, name, substrate, None, clock=SystemClock(), broker=broker)
        return authority.maintenance(host, back, datetime.now(UTC))
    finally:
        store.close()


def _running_actor_url(home: Home, role: str) -> str:
    """Where this home's running `role` actor ("broker" or "authority") is served: its own process (`up
    --distributed`, `slicex actor`), else the embedded deployment's process; "" when none runs."""
    own = procs.running(_pid_path(home, role))
    if own is not None:  # the active one of the role, which may be another process (a standby took over)
        return _active_actor_url(home, role) or str(own.info.get("url", ""))
    embedded = procs.running(home.pid_file)
    return str(embedded.info.get(f"{role}_url", "")) if embedded is not None else ""


def _active_actor_url(home: Home, role: str) -> str | None:
    """The URL the active `role` actor published in the store (deployment/leadership.py); None if none."""
    from deployment.leadership import active_url
    from slicex.store import open_store

    try:
        store = open_store(str(home.config().store))
    except (GeniError, ValueError):
        return None
    try:
        return active_url(store, role)
    except GeniError:
        return None
    finally:
        store.close()


def _running_broker(home: Home, cfg: SlicexConfig, as_role: str) -> BrokerApi | None:
    """The running broker actor of this home (None when there is none), called over mutual TLS with the
    certificate of `as_role` ("authority", or "am": the slice manager's identity)."""
    url = _running_actor_url(home, "broker")
    if not url:
        return None
    from deployment.actors import Caller, broker_client

    return broker_client(url, Caller.of_home(home, as_role), cfg.authority, cfg.actor_timeout_seconds)


def cmd_plan(args: argparse.Namespace) -> int:
    """Dry-run placement of a request RSpec against the deployment's current state; nothing is held.
    Exit 0: it fits; 1: something is short (named); 2: the request itself is wrong."""
    import json
    from datetime import UTC, datetime

    from deployment.plan import plan_at_home, plan_text

    home = _home(args)
    try:
        # a running broker actor answers itself (as it would the AM's Allocate with slicex_dry_run)
        broker = _running_broker(home, home.config(), "am")
        answer = plan_at_home(home, Path(args.request).read_text(), datetime.now(UTC), args.user, broker=broker)
    except GeniError as exc:
        print(f"slicex plan: {type(exc).__name__}: {exc.message}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"slicex plan: cannot read {args.request}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(answer, indent=1) if args.json else plan_text(answer))
    if broker is not None and not args.json:
        print(f"(answered by the broker actor at {broker.client.url})")
    return 0 if answer["fits"] else 1


def cmd_scs(args: argparse.Namespace) -> int:
    """Serve ComputePath over the topology file (stitching/server.py)."""
    from stitching.server import serve
    from stitching.topology import TopologyError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        return serve(Path(args.topology), args.host, args.port)
    except TopologyError as exc:
        print(f"slicex scs: {exc}", file=sys.stderr)
        return 2


def cmd_demo(args: argparse.Namespace) -> int:
    """Everything a first-time user needs: CA, a user `alice`, then the deployment in the foreground."""
    from slicex.devpki import add_user, init_ca

    home = _home(args)
    home.write_default_config()
    init_ca(home, home.config().authority)
    if not home.user_cert("alice").exists():
        add_user(home, home.config().authority, "alice")
    return _run_foreground(home, print_config=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="slicex", description="slicex: a GENI AM API v3 aggregate manager, slice "
                                "authority and broker. All state lives under $SLICEX_HOME (default ~/.slicex).")
    p.add_argument("--home", help="use this directory instead of $SLICEX_HOME")
    sub = p.add_subparsers(dest="command", required=True)

    ca = sub.add_parser("ca", help="development certificate authority")
    ca_sub = ca.add_subparsers(dest="ca_command", required=True)
    init = ca_sub.add_parser("init", help="create the root CA and the aggregate's and slice authority's certificates")
    init.add_argument("--authority", help="GENI authority name (default slicex.local)")
    init.add_argument("--force", action="store_true", help="replace an existing CA")
    init.add_argument("--public-hostname", metavar="NAME",
                      help="the DNS name clients reach this deployment by (slicex.yaml public_hostname): in "
                           "GetVersion's URLs and the AM certificate; also the authority, unless --authority "
                           "is given, so the AM's URN is urn:publicid:IDN+NAME+authority+am as Fed4FIRE asks")
    init.add_argument("--port-base", type=int, metavar="N",
                      help="listen on N..N+5 (slice authority, AM, broker, authority, dashboard, AM API v2) "
                           "instead of 8000-8004 and 8006")
    init.set_defaults(func=cmd_ca_init)
    from cli.peers import add_ca_export_root, add_peer_commands

    add_ca_export_root(ca_sub)

    user = sub.add_parser("user", help="experimenter accounts")
    user_sub = user.add_subparsers(dest="user_command", required=True)
    add = user_sub.add_parser("add", help="issue a user certificate (URN in subjectAltName) and an ssh key")
    add.add_argument("name")
    add.add_argument("--email")
    add.add_argument("--force", action="store_true", help="reissue an existing user's certificate")
    add.set_defaults(func=cmd_user_add)

    oc = sub.add_parser("omni-config", help="write $SLICEX_HOME/omni_config for a user and print its path")
    oc.add_argument("--user", help="which user (default alice, else the first)")
    oc.add_argument("--show", action="store_true", help="only print the config: write no file (and, with "
                                                        "--framework chapi, create no project)")
    oc.add_argument("--framework", choices=["gcf", "chapi"], default="gcf",
                    help="chapi: omni's Common Federation API framework (CH, SA, MA on chapi_port), written to "
                         "$SLICEX_HOME/omni_config_chapi (docs/federation.md)")
    oc.add_argument("--project", help="chapi: default project (created at the running deployment if new); "
                                      "without it the config says useprojects = false")
    oc.set_defaults(func=cmd_omni_config)

    proj = sub.add_parser("project", help="CH API projects (slices of omni's chapi framework live in one)")
    proj_sub = proj.add_subparsers(dest="project_command", required=True)
    pc = proj_sub.add_parser("create", help="create a project at the running deployment, the user as its lead")
    pc.add_argument("name")
    pc.add_argument("--user", help="the project's lead (default alice, else the first user)")
    pc.set_defaults(func=cmd_project_create)

    up = sub.add_parser("up", help="run the aggregate, slice authority, broker and authority (foreground unless "
                                   "--detach)")
    up.add_argument("--detach", action="store_true", help="start in the background; return once they answer")
    up.add_argument("--print-config", action="store_true", help="also print the omni config")
    up.add_argument("--init-store", action="store_true",
                    help="start on a store without this deployment's record (one that lost its data), writing "
                         "the record: the deployment starts empty there. Without it such a store is refused; a "
                         "store this home never ran on (its first `up`, or the first on another store) is "
                         "initialised by itself (slicex.yaml deployment_stores)")
    up.add_argument("--distributed", action="store_true",
                    help="run the broker and the authority as processes of their own (actor calls over mutual "
                         "TLS), restarted if they die, with all state in the Redis that `store` in slicex.yaml "
                         "names (default redis://127.0.0.1:6379/0, recorded there)")
    up.add_argument("--workers", type=int, default=1, metavar="N",
                    help="with --distributed: N AM worker processes serving the same AM API port (the kernel's "
                         "SO_REUSEPORT spreads new connections over them), each calling the one broker and "
                         "authority on the one Redis store; `up` itself is the first and alone serves the slice "
                         "authority, CH API and dashboard; a worker that dies is restarted (default 1; the "
                         "embedded deployment refuses more)")
    up.add_argument("--substrate", choices=["emulated", "netns", "openstack"],
                    help="netns: real slivers on this host (each node an unprivileged LXC container in its own "
                         "network namespace, booted from `slicex image` images, the first `up` building the "
                         "default one; links on a private Open vSwitch programmed by an os-ken controller, tc "
                         "rates; needs root; docs/substrate-netns.md); openstack: "
                         "servers and VLAN networks of the clouds.yaml entry in slicex.yaml's `openstack:` "
                         "(docs/substrate-openstack.md); recorded in "
                         "slicex.yaml as substrate_driver")
    up.set_defaults(func=cmd_up)

    down = sub.add_parser("down", help="stop the deployment and every actor it started")
    down.set_defaults(func=cmd_down)

    actor = sub.add_parser("actor", help="run one actor over mutual TLS on the deployment's store (`up "
                                         "--distributed` starts and supervises them)")
    actor.add_argument("role", choices=["broker", "authority"])
    actor.add_argument("--standby", action="store_true",
                       help="a second process of the role (on another host, or beside the active one): it serves "
                            "only once the active one's lease in the store lapses (Redis stores only)")
    actor.add_argument("--port", type=int, metavar="N",
                       help="listen on this port instead of broker_port/authority_port (a standby on the same host)")
    actor.set_defaults(func=cmd_actor)

    amw = sub.add_parser("am-worker", help="one more AM worker of a running `up --distributed --workers N` "
                                           "(which starts and supervises them)")
    amw.add_argument("index", type=int, nargs="?", help="1 .. N-1 (`up` itself is worker 0)")
    amw.add_argument("--of", type=int, metavar="N", help="how many AM workers share the port")
    amw.add_argument("--join", action="store_true",
                     help="an AM worker on another host than the deployment's broker and authority (slicex.yaml "
                          "`broker_url`, `authority_url`, on its Redis; docs/operator-guide.md), in the foreground")
    amw.set_defaults(func=cmd_am_worker)

    st = sub.add_parser("status", help="each process (running? answering? serving?) and the store; exit 3 if "
                                       "anything is wrong")
    st.set_defaults(func=cmd_status)

    image_cli.add_parser(sub)
    lab_cli.add_parser(sub)

    fpga = sub.add_parser("fpga", help="bitstream catalogue of the FPGA aggregate")
    fpga_sub = fpga.add_subparsers(dest="fpga_command", required=True)
    up_bit = fpga_sub.add_parser("upload", help="add a Xilinx .bit file to a user's catalogue")
    up_bit.add_argument("file")
    up_bit.add_argument("--user", default="alice")
    up_bit.set_defaults(func=cmd_fpga_upload)
    ls_bit = fpga_sub.add_parser("list", help="list a user's bitstreams")
    ls_bit.add_argument("--user", default="alice")
    ls_bit.set_defaults(func=cmd_fpga_list)

    mnt = sub.add_parser("maintenance", help="take a host out of the broker's inventory (or --end to return it)")
    mnt.add_argument("host", help="host name or component id")
    mnt.add_argument("--end", action="store_true", help="return the host to the inventory")
    mnt.set_defaults(func=cmd_maintenance)

    pl = sub.add_parser("plan", help="dry-run placement: does a request RSpec fit now, where would each node and "
                                     "link go, what is short (nothing is allocated)")
    pl.add_argument("request", help="request RSpec (GENI v3)")
    pl.add_argument("--user", help="whose bitstream catalogue FPGA nodes use")
    pl.add_argument("--json", action="store_true", help="the answer as JSON (as Allocate with slicex_dry_run)")
    pl.set_defaults(func=cmd_plan)

    conf = sub.add_parser("config", help="check $SLICEX_HOME/slicex.yaml against the configuration model "
                                         "(slicex/config.py), or list every key with --keys")
    conf.add_argument("--keys", action="store_true", help="every key: its type, default and what it is for")
    conf.set_defaults(func=cmd_config)

    demo = sub.add_parser("demo", help="create a CA and user alice if needed, then run in the foreground")
    demo.set_defaults(func=cmd_demo)

    scs = sub.add_parser("scs", help="the stitching path computation service (plain-HTTP XML-RPC ComputePath, "
                                     "for stitcher.py --scsURL); docs/stitching.md")
    scs.add_argument("--topology", required=True, help="topology file (YAML) naming the aggregates' substrate "
                                                       "files, advertisements or ports")
    scs.add_argument("--host", default="127.0.0.1")
    scs.add_argument("--port", type=int, default=8081)
    scs.set_defaults(func=cmd_scs)

    from experiment.runner import add_command as add_experiment_command

    add_experiment_command(sub)

    from cli.substrate import add_substrate_commands

    add_substrate_commands(sub)

    from cli.usage import add_command as add_usage_command

    add_usage_command(sub)
    __import__("cli.find_slot").find_slot.add_command(sub)  # slicex find-slot (cli/find_slot.py)
    add_peer_commands(sub)
    __import__("cli.sep").sep.add_sep_command(sub)  # slicex sep: the Slice Exchange Point (cli/sep.py)
    return p


def cmd_config(args: argparse.Namespace) -> int:
    """Check this home's slicex.yaml (exit 2 naming a wrong key), or print every key the model knows."""
    home = _home(args)
    if args.keys:
        width = max(len(key) for key, *_ in reference())
        for key, kind, default, what in reference():
            print(f"{key:<{width}}  {kind}{f' = {default}' if default else ''}\n{'':<{width}}  {what}")
        return 0
    home.config()
    print(f"{home.config_file}: ok" if home.config_file.exists() else f"{home.config_file}: absent (all defaults)")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:  # any command that reads the home's configuration
        print(f"error: {exc.message}", file=sys.stderr)
        return 2


