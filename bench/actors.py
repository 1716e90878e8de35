"""Actor benchmarks: tickets per second and redeem latency (p50/p99) for a broker holding 10,000 units, with
1, 10 and 100 concurrent slice managers.

Each slice manager (a thread) loops: ticket (the broker chooses one unit under first-fit, claims it atomically
and signs the ticket) → redeem (the authority verifies the signature, leases the unit once, asks the emulated
driver) → close the lease → relinquish the ticket. Deployments:
  embedded-sqlite  broker and authority in-process over one SQLite file
  embedded-redis   the same over Redis (SLICEX_REDIS_URL, default redis://127.0.0.1:6379/13)
  distributed      broker and authority as actor servers over HTTPS with mutual TLS, state in Redis

Run: .venv/bin/python bench/actors.py [--seconds N] [--managers 1,10,100] [--deployments a,b,c]"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cryptography.hazmat.primitives.asymmetric import rsa  # noqa: E402

from am.authority import Authority, SliverSpec  # noqa: E402
from am.substrate.emulated import EmulatedDriver  # noqa: E402
from bench._common import report, summarise  # noqa: E402
from broker.broker import Broker, Demand  # noqa: E402
from broker.calendar import Pool  # noqa: E402
from broker.delegation import Delegation  # noqa: E402
from rspec.substrate import default_substrate  # noqa: E402
from slicex.errors import GeniError  # noqa: E402
from slicex.store import open_store  # noqa: E402
from slicex.term import Term  # noqa: E402

UNITS = 10_000
HOSTS = 100  # the units live on 100 hosts of 100 (bins, as the policy sees them)
AUTH = "urn:publicid:IDN+bench.org+authority+am"
NOW = datetime(2030, 1, 1, tzinfo=UTC)


def inventory() -> Delegation:
    per = UNITS // HOSTS
    pools = tuple(Pool(f"unit:h{h}", "unit", tuple(f"unit:h{h}:{i}" for i in range(per)), f"h{h}")
                  for h in range(HOSTS))
    return Delegation(AUTH, "broker", pools)


def actors(store, key, home: Path | None):
    """(broker, authority, servers): in-process actors, or proxies to actor servers over mutual TLS."""
    broker = Broker("broker", store, key, authority=AUTH)
    authority = Authority(AUTH, EmulatedDriver(default_substrate("bench.org")), {"broker": key.public_key()},
                          store=store, key=key, inventory=inventory())
    authority.delegate(broker)
    if home is None:
        return broker, authority, []
    from am.authority import RemoteAuthority, authority_handlers
    from broker.remote import RemoteBroker, broker_handlers
    from slicex.actor_rpc import ActorClient, ActorServer
    from slicex.devpki import actor_urn
    from slicex.home import Home

    h = Home(home)
    ca = str(h.ca_cert)
    am = actor_urn("bench.org", "am")
    servers = [ActorServer("broker", broker_handlers(broker), {am}, ("127.0.0.1", 0), str(h.broker_cert),
                           str(h.broker_key), ca),
               ActorServer("authority", authority_handlers(authority), {am}, ("127.0.0.1", 0), str(h.authority_cert),
                           str(h.authority_key), ca)]
    for s in servers:
        s.start()
    creds = (str(h.am_cert), str(h.am_key), ca)
    return (RemoteBroker(ActorClient("broker", servers[0].url, *creds, actor_urn("bench.org", "broker"))),
            RemoteAuthority(ActorClient("authority", servers[1].url, *creds, actor_urn("bench.org", "authority"))),
            servers)


def run(store_url: str, managers: int, seconds: float, deployment: str, key, home: Path | None) -> list[dict]:
    store = open_store(store_url)
    if hasattr(store, "flush"):
        store.flush()
    broker, authority, servers = actors(store, key, home)
    lat: dict[str, list[float]] = {"ticket": [], "redeem": [], "release": []}
    errors: list[str] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds
    term = Term(NOW, NOW + timedelta(hours=1))

    def slice_manager(m: int) -> None:
        mine: dict[str, list[float]] = {k: [] for k in lat}
        while time.monotonic() < stop:
            rid = uuid.uuid4().hex
            try:
                t0 = time.perf_counter()
                (ticket,) = broker.issue(f"sm{m}", {rid: Demand(amounts=(("unit", 1),), what="bench unit")},
                                         term, NOW).values()
                t1 = time.perf_counter()
                authority.redeem(ticket, SliverSpec(rid, "node", rid), NOW)
                t2 = time.perf_counter()
                authority.close(ticket.id, NOW)
                broker.relinquish(ticket, NOW)
                t3 = time.perf_counter()
            except GeniError as exc:
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc.message}")
                continue
            mine["ticket"].append(t1 - t0)
            mine["redeem"].append(t2 - t1)
            mine["release"].append(t3 - t2)
        with lock:
            for k, v in mine.items():
                lat[k] += v

    threads = [threading.Thread(target=slice_manager, args=(m,)) for m in range(managers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    for server in servers:
        server.stop()
    leaked = len(store.all_claims())
    if hasattr(store, "flush"):
        store.flush()
    store.close()
    if errors:
        print(f"{deployment} x{managers}: {len(errors)} errors, e.g. {errors[0]}", file=sys.stderr)
    return [{"bench": "actors", "deployment": deployment, "units": UNITS, "slice_managers": managers,
             "operation": op, "errors": len(errors), "leaked_claims": leaked, **summarise(lat[op], wall)}
            for op in ("ticket", "redeem", "release")]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--managers", default="1,10,100")
    p.add_argument("--deployments", default="embedded-sqlite,embedded-redis,distributed")
    args = p.parse_args()
    redis_url = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/13")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        home = None
        if "distributed" in args.deployments:
            from slicex.devpki import init_ca
            from slicex.home import Home

            home = Path(tmp) / "home"
            home.mkdir()
            (home / "slicex.yaml").write_text("authority: bench.org\n")
            init_ca(Home(home), "bench.org")
        for name in args.deployments.split(","):
            for managers in (int(m) for m in args.managers.split(",")):
                url = f"sqlite:///{tmp}/bench-{managers}.db" if name == "embedded-sqlite" else redis_url
                rows += run(url, managers, args.seconds, name, key, home if name == "distributed" else None)
    report(rows, ["deployment", "slice_managers", "operation", "calls", "per_second", "p50_ms", "p99_ms", "errors",
                  "leaked_claims"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
