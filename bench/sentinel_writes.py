"""What waiting for a replica costs a store write (issue 37): one client, sequential writes, on a Redis that
Sentinel manages (one primary, REPLICAS replicas, three sentinels, all on this host), measured as

- `redis://` to the primary directly (no Sentinel, no WAIT: the plain store),
- `redis+sentinel://...?replicas=0` (the primary found through the sentinels, no WAIT),
- `redis+sentinel://...` (the default: WAIT for one replica after each write, one round trip with it),
- `?replicas=0` on servers started with `min-replicas-to-write 1` (the server-side guard instead of WAIT).

    python bench/sentinel_writes.py [--calls 2000] [--replicas 1] [--port-base N]

Each write is a `put` (a document and its index entries, in the health probes' table, under a prefix of
the bench's own) or a `claim_all` + `release` of two keys; the
figures are per store call. --port-base N runs the Redis processes on ports N.. (else free ports)."""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import machine, report, summarise  # noqa: E402


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _measure(url: str, calls: int) -> list[dict]:
    from slicex.store.redis_store import RedisStore

    store = RedisStore(url, prefix=f"bench-{uuid.uuid4().hex[:8]}")
    rows = []
    try:
        for op in ("put", "claim_all+release"):
            samples = []
            began = time.perf_counter()
            for i in range(calls):
                t = time.perf_counter()
                if op == "put":
                    store.put("health", f"bench-{i % 100}", {"i": i, "pad": "x" * 200}, due=1e9 + i)
                else:
                    store.claim_all([f"core:h{i % 50}:{i}", f"vlan:s:{i}"], "bench")
                    store.release(f"core:h{i % 50}:{i}", "bench")
                samples.append(time.perf_counter() - t)
            rows.append({"op": op, **summarise(samples, time.perf_counter() - began)})
        store.flush()
    finally:
        store.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    from lab.redis_ha import Node, RedisHa

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--port-base", type=int)
    args = ap.parse_args(argv)
    n = 1 + args.replicas + 3
    print(f"{machine()}; {args.calls} sequential calls per row; 1 primary, {args.replicas} replica(s), 3 sentinels")
    rows = []
    for guard in (0, 1):
        ports = list(range(args.port_base, args.port_base + n)) if args.port_base else _free_ports(n)
        nodes = [Node("127.0.0.1", p) for p in ports]
        with tempfile.TemporaryDirectory() as tmp:
            ha = RedisHa(Path(tmp), nodes[0], nodes[1:1 + args.replicas], nodes[1 + args.replicas:],
                         min_replicas_to_write=guard)
            ha.start()
            try:
                cases = [("min-replicas-to-write 1, no WAIT", ha.url(replicas=0))] if guard else [
                    ("redis:// (primary, no WAIT)", f"redis://127.0.0.1:{ports[0]}/0"),
                    ("sentinel, no WAIT", ha.url(replicas=0)),
                    (f"sentinel, WAIT {min(1, args.replicas)}", ha.url()),
                ]
                if not guard and args.replicas > 1:
                    cases.append((f"sentinel, WAIT {args.replicas}", ha.url(replicas=args.replicas)))
                for name, url in cases:
                    rows += [{"store": name, **row} for row in _measure(url, args.calls)]
            finally:
                ha.stop()
    report(rows, ["store", "op", "samples", "rate", "mean_ms", "p50_ms", "p99_ms"],
           title="store write latency (per call)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
