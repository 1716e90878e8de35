"""Actor benchmarks: tickets per second and redeem latency (p50/p99) for a broker holding 10,000 units, with
1, 10 and 100 concurrent slice managers, in both deployments: embedded (in-process actors over SQLite, and
over Redis) and distributed (broker and authority as actor servers over mutual TLS, state in Redis).

Run: .venv/bin/python bench/actors.py [--seconds N] [--deployments embedded-sqlite,embedded-redis,distributed]"""

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

from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import rsa  # noqa: E402

from am.authority import Authority  # noqa: E402
from am.substrate.emulated import EmulatedDriver  # noqa: E402
from bench._common import report, summarise  # noqa: E402
from broker.broker import Broker  # noqa: E402
from rspec.substrate import default_substrate  # noqa: E402
from slicex.errors import Busy, GeniError  # noqa: E402
from slicex.store import open_store  # noqa: E402

UNITS = 10_000
NOW = datetime(2030, 1, 1, tzinfo=UTC)


def actors(store, remote_home: Path | None):
    """(broker, authority, servers): in-process objects, or proxies to actor servers over mutual TLS."""
    if remote_home is None:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        return (Broker("broker", store, pem),
                Authority("authority", EmulatedDriver(default_substrate("b.org")), {"broker": key.public_key()}), [])
    from am.authority import RemoteAuthority
    from am.service import ActorProcess
    from broker.remote import RemoteBroker
    from slicex.actor_rpc import ActorClient
    from slicex.home import Home

    home = Home(remote_home)
    servers = [ActorProcess(home, "broker", port=0, store=store), ActorProcess(home, "authority", port=0, store=store)]
    urls = [a.start() for a in servers]
    creds = (str(home.am_cert), str(home.am_key))
    return (RemoteBroker(ActorClient("broker", urls[0], *creds)),
            RemoteAuthority(ActorClient("authority", urls[1], *creds)), servers)


def run(store_url: str, managers: int, seconds: float, deployment: str, remote_home: Path | None = None) -> list[dict]:
    store = open_store(store_url)
    if hasattr(store, "flush"):
        store.flush()
    broker, authority, servers = actors(store, remote_home)
    ticket_lat: list[float] = []
    errors: list[int] = []
    redeem_lat: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def slice_manager(m: int) -> None:
        i = 0
        while time.monotonic() < stop:
            unit = f"unit:{(m * 9973 + i * 7919) % UNITS}"
            i += 1
            rid = uuid.uuid4().hex
            t0 = time.perf_counter()
            try:
                (ticket,) = broker.ticket(f"sm{m}", {rid: [unit]}, NOW, NOW + timedelta(hours=1)).values()
            except Busy:
                continue
            except GeniError:
                errors.append(1)
                continue
            t1 = time.perf_counter()
            authority.redeem(ticket, "node", NOW)
            t2 = time.perf_counter()
            broker.relinquish(ticket)
            with lock:
                ticket_lat.append(t1 - t0)
                redeem_lat.append(t2 - t1)

    threads = [threading.Thread(target=slice_manager, args=(m,)) for m in range(managers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    for server in servers:
        server.stop()
    store.close()
    return [{"bench": "actors", "deployment": deployment, "slice_managers": managers, "operation": "ticket",
             "errors": len(errors), **summarise(ticket_lat, wall)},
            {"bench": "actors", "deployment": deployment, "slice_managers": managers, "operation": "redeem",
             "errors": len(errors), **summarise(redeem_lat, wall)}]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--deployments", default="embedded-sqlite,embedded-redis,distributed")
    args = p.parse_args()
    rows = []
    redis_url = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/13")
    with tempfile.TemporaryDirectory() as tmp:
        from slicex.devpki import init_ca
        from slicex.home import Home

        home = Path(tmp) / "home"
        home.mkdir()
        (home / "slicex.yaml").write_text("authority: b.org\n")
        init_ca(Home(home), "b.org")
        for name in args.deployments.split(","):
            url = f"sqlite:///{tmp}/bench.db" if name == "embedded-sqlite" else redis_url
            for managers in (1, 10, 100):
                rows += run(url, managers, args.seconds, name, home if name == "distributed" else None)
    report(rows, ["deployment", "slice_managers", "operation", "calls", "per_second", "p50_ms", "p99_ms", "errors"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
