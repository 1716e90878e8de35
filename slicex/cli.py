"""The `slicex` command: set up a deployment's PKI and users, run it, and inspect it."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from slicex.home import Home


def _home(args: argparse.Namespace) -> Home:
    return Home(Path(args.home)) if args.home else Home()


def cmd_ca_init(args: argparse.Namespace) -> int:
    from slicex.devpki import init_ca

    home = _home(args)
    home.write_default_config(**({"authority": args.authority} if args.authority else {}))
    written = init_ca(home, home.config()["authority"], force=args.force)
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
    for p in add_user(home, home.config()["authority"], args.name, args.email):
        print(f"wrote {p}")
    return 0


def _urls(home: Home) -> tuple[str, str]:
    cfg = home.config()
    return f"https://{cfg['host']}:{cfg['sa_port']}/", f"https://{cfg['host']}:{cfg['am_port']}/"


def _write_omni_config(home: Home, user: str | None) -> Path | None:
    from slicex import omniconfig

    users = home.users()
    if not users:
        return None
    user = user or ("alice" if "alice" in users else users[0])
    sa_url, am_url = _urls(home)
    return omniconfig.write(home, user, home.config()["authority"], sa_url, am_url)


def cmd_omni_config(args: argparse.Namespace) -> int:
    home = _home(args)
    path = _write_omni_config(home, args.user)
    if path is None:
        print("no users yet: run `slicex user add NAME` first", file=sys.stderr)
        return 2
    print(path.read_text() if args.show else path)
    return 0


def _answering(home: Home, timeout: float = 1.0) -> bool:
    from slicex.tls_xmlrpc import client

    users = home.users()
    if not users:
        return False
    _sa, am_url = _urls(home)
    try:
        reply = client(am_url, str(home.user_cert(users[0])), str(home.user_key(users[0])), timeout=timeout).GetVersion()
        return reply.get("geni_api") == 3
    except Exception:  # noqa: BLE001 - not answering yet
        return False


def _pid(home: Home) -> int | None:
    try:
        pid = int(home.pid_file.read_text().strip())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def cmd_up(args: argparse.Namespace) -> int:
    home = _home(args)
    if not home.ca_cert.exists():
        print(f"no CA in {home.root}: run `slicex ca init` and `slicex user add NAME` first", file=sys.stderr)
        return 2
    if _pid(home):
        print(f"slicex is already running (pid {_pid(home)}); `slicex down` stops it", file=sys.stderr)
        return 1
    if args.distributed:
        os.environ["SLICEX_STORE"] = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/0")
    if args.detach:
        home.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(home.log_file, "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "slicex.cli", "--home", str(home.root), "up"]
                                    + (["--distributed"] if args.distributed else []),
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                print(f"slicex exited with {proc.returncode}; see {home.log_file}", file=sys.stderr)
                return 1
            if _answering(home):
                path = _write_omni_config(home, None)
                print(f"slicex is up (pid {proc.pid}); omni config: {path}")
                return 0
            time.sleep(0.2)
        print(f"slicex did not answer within 30 s; see {home.log_file}", file=sys.stderr)
        return 1
    return _run_foreground(home, print_config=args.print_config, distributed=args.distributed)


def _wait_for_port(host: str, port: int, proc: subprocess.Popen, what: str, timeout: float = 30) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}; see its log")
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{what} did not listen on {host}:{port} within {timeout:.0f} s")


def _start_actors(home: Home) -> tuple[list[subprocess.Popen], dict[str, str]]:
    """Start the broker and the authority as processes of their own; return them and their URLs."""
    cfg = home.config()
    procs, urls = [], {}
    home.log_file.parent.mkdir(parents=True, exist_ok=True)
    for role in ("broker", "authority"):
        port = cfg[f"{role}_port"]
        with open(home.log_file.with_name(f"{role}.log"), "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "slicex.cli", "--home", str(home.root), "actor", role],
                                    stdout=log, stderr=subprocess.STDOUT)
        procs.append(proc)
        _wait_for_port(cfg["host"], port, proc, f"the {role} actor")
        urls[f"{role}_url"] = f"https://{cfg['host']}:{port}/"
    return procs, urls


def _serve_until_stopped() -> None:
    """Block until SIGTERM (`slicex down`) or Ctrl-C."""
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    try:
        while not stopping:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass


def _run_foreground(home: Home, print_config: bool = False, distributed: bool = False) -> int:
    from am.service import EmbeddedDeployment

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    actors: list[subprocess.Popen] = []
    urls: dict[str, str] = {}
    if distributed:
        actors, urls = _start_actors(home)
    deployment = EmbeddedDeployment(home, **urls)
    endpoints = deployment.start()
    home.pid_file.parent.mkdir(parents=True, exist_ok=True)
    home.pid_file.write_text(str(os.getpid()))
    path = _write_omni_config(home, None)
    print(f"slice authority: {endpoints.sa_url}\naggregate:       {endpoints.am_url}", flush=True)
    print(f"substrate:       {deployment.driver.description}", flush=True)
    if deployment.dashboard_url:
        print(f"dashboard:       {deployment.dashboard_url}", flush=True)
    if distributed:
        print(f"store:           {home.config()['store']}", flush=True)
        print(f"broker actor:    {urls['broker_url']} (pid {actors[0].pid})", flush=True)
        print(f"authority actor: {urls['authority_url']} (pid {actors[1].pid})", flush=True)
    if path:
        print(f"omni config:     {path}", flush=True)
        if print_config:
            print("\n" + path.read_text(), flush=True)
    _serve_until_stopped()
    deployment.stop()
    for proc in actors:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    home.pid_file.unlink(missing_ok=True)
    print("slicex stopped", flush=True)
    return 0


def cmd_actor(args: argparse.Namespace) -> int:
    """Run one actor (broker or authority) over mutual TLS until stopped (used by `up --distributed`)."""
    from am.service import ActorProcess

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    home = _home(args)
    actor = ActorProcess(home, args.role)
    print(f"{args.role} actor at {actor.start()} (store {home.config()['store']})", flush=True)
    _serve_until_stopped()
    actor.stop()
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    home = _home(args)
    pid = _pid(home)
    if pid is None:
        print("slicex is not running")
        return 0
    os.kill(pid, signal.SIGTERM)
    for _ in range(100):
        if _pid(home) is None:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
    home.pid_file.unlink(missing_ok=True)
    print(f"slicex stopped (pid {pid})")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    home = _home(args)
    pid = _pid(home)
    sa_url, am_url = _urls(home)
    print(f"home:       {home.root}")
    print(f"process:    {'running, pid ' + str(pid) if pid else 'not running'}")
    print(f"aggregate:  {am_url} ({'answering' if _answering(home) else 'not answering'})")
    print(f"slice auth: {sa_url}")
    print(f"users:      {', '.join(home.users()) or 'none'}")
    return 0 if pid else 3


def _catalogue(args: argparse.Namespace):
    """(bitstream catalogue of this deployment, the user's URN)."""
    from fpga_aggregate.bitstreams import BitstreamCatalogue
    from slicex.store import open_store

    home = _home(args)
    cfg = home.config()
    return (BitstreamCatalogue(open_store(cfg["store"]), home.root / "bitstreams"),
            f"urn:publicid:IDN+{cfg['authority']}+user+{args.user}")


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
    """Take a host out of (or back into) the broker's inventory; slivers already on it keep running."""
    from datetime import UTC, datetime

    from am.authority import Authority
    from broker.broker import Broker
    from broker.delegation import export_substrate
    from rspec.substrate import default_substrate, load_substrate
    from slicex.store import open_store

    home = _home(args)
    cfg = home.config()
    substrate = load_substrate(cfg["substrate"]) if cfg["substrate"] else default_substrate(cfg["authority"])
    host = substrate.host(args.host)
    if host is None:
        print(f"no host {args.host} in the substrate ({', '.join(h.name for h in substrate.hosts)})", file=sys.stderr)
        return 2
    name = f"urn:publicid:IDN+{cfg['authority']}+authority+am"
    store = open_store(cfg["store"])  # the authority records what it delegates (tickets are checked against it)
    authority = Authority(name, None, {}, store=store, inventory=export_substrate(substrate, name, "broker"))
    pools = authority.inventory.on(host.component_id)
    from slicex.devpki import ensure_actor_identities

    ensure_actor_identities(home, cfg["authority"])  # a home from before the broker had a key of its own
    broker = Broker("broker", store, home.broker_key.read_bytes(), authority=name)
    if args.end:
        authority.delegate(broker, pools)
        print(f"{host.name} is back in the broker's inventory")
        return 0
    _, busy = authority.reclaim(broker, pools, datetime.now(UTC))
    if busy:
        print(f"{host.name}: {len(busy)} of its resources are promised to slivers; they stay until those end. "
              f"Run this again after they expire or are deleted.")
        return 1
    print(f"{host.name} is out of the broker's inventory (maintenance); `slicex maintenance {host.name} --end` "
          f"returns it")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Everything a first-time user needs: CA, a user `alice`, then the deployment in the foreground."""
    from slicex.devpki import add_user, init_ca

    home = _home(args)
    home.write_default_config()
    init_ca(home, home.config()["authority"])
    if not home.user_cert("alice").exists():
        add_user(home, home.config()["authority"], "alice")
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
    init.set_defaults(func=cmd_ca_init)

    user = sub.add_parser("user", help="experimenter accounts")
    user_sub = user.add_subparsers(dest="user_command", required=True)
    add = user_sub.add_parser("add", help="issue a user certificate (URN in subjectAltName) and an ssh key")
    add.add_argument("name")
    add.add_argument("--email")
    add.add_argument("--force", action="store_true", help="reissue an existing user's certificate")
    add.set_defaults(func=cmd_user_add)

    oc = sub.add_parser("omni-config", help="write $SLICEX_HOME/omni_config for a user and print its path")
    oc.add_argument("--user", help="which user (default alice, else the first)")
    oc.add_argument("--show", action="store_true", help="print the config instead of its path")
    oc.set_defaults(func=cmd_omni_config)

    up = sub.add_parser("up", help="run the aggregate, slice authority, broker and authority (foreground unless "
                                   "--detach)")
    up.add_argument("--detach", action="store_true", help="start in the background; return once they answer")
    up.add_argument("--print-config", action="store_true", help="also print the omni config")
    up.add_argument("--distributed", action="store_true",
                    help="run the broker and the authority as processes of their own (actor calls over mutual "
                         "TLS) with all state in the Redis named by SLICEX_REDIS_URL (default "
                         "redis://127.0.0.1:6379/0)")
    up.set_defaults(func=cmd_up)

    down = sub.add_parser("down", help="stop a deployment started with `up --detach`")
    down.set_defaults(func=cmd_down)

    actor = sub.add_parser("actor", help="run one actor over mutual TLS (started by `up --distributed`)")
    actor.add_argument("role", choices=["broker", "authority"])
    actor.set_defaults(func=cmd_actor)

    st = sub.add_parser("status", help="is it running and answering?")
    st.set_defaults(func=cmd_status)

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

    demo = sub.add_parser("demo", help="create a CA and user alice if needed, then run in the foreground")
    demo.set_defaults(func=cmd_demo)

    try:
        from rspec.cli import add_substrate_commands
    except ImportError:
        pass
    else:
        add_substrate_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
