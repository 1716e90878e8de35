"""Actor benchmarks: tickets per second and redeem latency (p50/p99) for a broker holding 10,000 units, with
1, 10 and 100 concurrent slice managers, over the embedded store (SQLite) and Redis.

Run: .venv/bin/python bench/actors.py [--seconds N] [--stores sqlite,redis]"""

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
from slicex.errors import Busy  # noqa: E402
from slicex.store import open_store  # noqa: E402

UNITS = 10_000
NOW = datetime(2030, 1, 1, tzinfo=UTC)


def run(store_url: str, managers: int, seconds: float) -> list[dict]:
    store = open_store(store_url)
    if hasattr(store, "flush"):
        store.flush()
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    broker = Broker("bench-broker", store, pem)
    authority = Authority("bench-authority", EmulatedDriver(default_substrate("b.org")), {"bench-broker": key.public_key()})
    broker.claim_delegation("bench-authority", [f"unit:{i}" for i in range(UNITS)])
    ticket_lat: list[float] = []
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
    kind = store_url.split(":")[0]
    store.close()
    return [{"bench": "actors", "store": kind, "slice_managers": managers, "operation": "ticket",
             **summarise(ticket_lat, wall)},
            {"bench": "actors", "store": kind, "slice_managers": managers, "operation": "redeem",
             **summarise(redeem_lat, wall)}]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--stores", default="sqlite,redis")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        urls = {"sqlite": f"sqlite:///{tmp}/bench.db",
                "redis": os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/13")}
        for name in args.stores.split(","):
            for managers in (1, 10, 100):
                rows += run(urls[name], managers, args.seconds)
    report(rows, ["store", "slice_managers", "operation", "calls", "per_second", "p50_ms", "p99_ms"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
