"""Broker cost against the number of live bookings: CPU per placement and per clock tick (the broker's tick and
its dashboard snapshot) over a generated substrate of H VM hosts (default 1,000: 10 racks of 100, 32 cores
and 128 GB each, a top-of-rack switch per rack trunked to a core switch), holding L live 1-3-node bookings.

    python bench/broker_scale.py [--hosts 1000] [--live 0,1000,5000] [--store sqlite|redis]

Only public broker calls are used, so the same script measures an older tree (PYTHONPATH=<its export>) back
to back with this one. Server CPU is this process's (time.process_time): the broker runs in it."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import machine, report  # noqa: E402

AUTH = "urn:publicid:IDN+bench.org+authority+am"
RACKS = 10


def substrate(hosts: int):
    from rspec.substrate import substrate_from_dict

    per_rack = -(-hosts // RACKS)
    switches = [{"name": f"tor{r}", "site": f"rack{r}", "vlan_range": ["1000-3999"],
                 "ports": [{"name": f"p{i}"} for i in range(per_rack)] + [{"name": "up"}]} for r in range(RACKS)]
    switches.append({"name": "core", "site": "core", "vlan_range": ["1000-3999"],
                     "ports": [{"name": f"r{r}"} for r in range(RACKS)]})
    trunks = [{"name": f"t{r}", "between": [f"tor{r}:up", f"core:r{r}"]} for r in range(RACKS)]
    hosts_ = [{"name": f"h{i}", "site": f"rack{i // per_rack}", "cores": 32, "memory_mb": 131072,
               "interfaces": [{"name": "eth0", "switch_port": f"tor{i // per_rack}:p{i % per_rack}"}]}
              for i in range(hosts)]
    return substrate_from_dict({"authority": "bench.org", "switches": switches, "trunks": trunks, "hosts": hosts_})


def request(i: int, nodes: int):
    from rspec.request import parse_request

    body = "".join(f'<node client_id="n{k}"><sliver_type name="m1.small"/></node>' for k in range(nodes))
    return parse_request(f'<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">{body}</rspec>')


def open_store(kind: str, tmp: Path):
    if kind == "sqlite":
        from slicex.store.sqlite_store import SqliteStore

        return SqliteStore(str(tmp / f"b-{uuid.uuid4().hex[:6]}.db"))
    from slicex.store.redis_store import RedisStore

    return RedisStore("redis://127.0.0.1:6379/15", prefix=f"bench-{uuid.uuid4().hex[:8]}")  # flushed after


def measure(hosts: int, live: int, kind: str, placements: int, ticks: int) -> dict:
    from cryptography.hazmat.primitives.asymmetric import rsa

    from broker.broker import Broker
    from operations.snapshot import publishers_for
    from protocol.messages import demands_of
    from resources import export_substrate
    from slicex.clock import ManualClock
    from slicex.term import Term

    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(kind, Path(tmp))
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        broker = Broker("broker", store, key, authority=AUTH)
        broker.accept(export_substrate(substrate(hosts), AUTH, "broker"))
        now = ManualClock().now()
        term = Term(now, now + timedelta(hours=24))
        fill = time.perf_counter()
        for i in range(live):  # L live bookings of 1-3 nodes, outside the timed window
            n = 1 + i % 3
            broker.place(f"fill{i}", demands_of(request(i, n), {f"n{k}": f"f{i}n{k}" for k in range(n)}), term, now)
        fill = time.perf_counter() - fill
        demands = demands_of(request(0, 1), {"n0": "m-n0"})
        cpu = time.process_time()
        for i in range(placements):  # place one VM and give it back: L stays the same
            answer = broker.place(f"m{i}", demands, term, now)
            for t in answer.tickets.values():
                broker.relinquish(t, now)
        place_ms = (time.process_time() - cpu) * 1000 / placements
        publisher = publishers_for(store, broker=broker)[0]
        publisher.tick(now)
        cpu = time.process_time()
        for k in range(ticks):  # the broker's clock and its dashboard snapshot, as a deployment's tick runs them
            t = now + timedelta(seconds=k + 1)
            broker.tick(t)
            publisher.tick(t)
        tick_ms = (time.process_time() - cpu) * 1000 / ticks
        if hasattr(store, "flush"):
            store.flush()
        store.close()
    return {"store": kind, "hosts": hosts, "live": live, "place_cpu_ms": round(place_ms, 2),
            "tick_cpu_ms": round(tick_ms, 2), "fill_s": round(fill, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--live", default="0,1000,5000", help="live bookings, comma-separated")
    ap.add_argument("--store", choices=["sqlite", "redis"], default="sqlite")
    ap.add_argument("--placements", type=int, default=50)
    ap.add_argument("--ticks", type=int, default=20)
    args = ap.parse_args()
    rows = [measure(args.hosts, int(n), args.store, args.placements, args.ticks) for n in args.live.split(",")]
    report(rows, ["store", "hosts", "live", "place_cpu_ms", "tick_cpu_ms", "fill_s"],
           title=f"broker cost against live bookings ({machine()})")


if __name__ == "__main__":
    main()
