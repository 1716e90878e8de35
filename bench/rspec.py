"""RSpec benchmarks: advertisement generation (cold and cached) for 1,000- and 10,000-node substrates, the
NDL-OWL graph of the 1,000-node one, and parse + validate, embed, and all three for a 100-node request.

Every row is timed on its own, one call after another in this process (the rate is 1 / mean latency), from
at least --min-samples calls and for at least --seconds (at most --max-samples calls), and on to 100 calls
when that costs at most --p99-budget seconds more: cheap operations collect enough calls for p99, costly ones (a cold 10,000-node advertisement) print p50, min and max and
"n/a (n=…)" for a p99 their sample count cannot support. Substrates and requests are built, and each
operation run once to warm imports and schema caches, before any clock starts.

Run: .venv/bin/python bench/rspec.py [--seconds S] [--min-samples N]
Prints a table, then one JSON object per measurement per line."""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import machine, report  # noqa: E402
from bench.stats import summarise  # noqa: E402
from broker.placement import plan  # noqa: E402
from rspec.advertisement import AdvertisementCache, Usage, build_advertisement  # noqa: E402
from rspec.ndl import substrate_graph  # noqa: E402
from rspec.request import parse_request  # noqa: E402
from rspec.substrate import Substrate, substrate_from_dict  # noqa: E402

NOW = datetime(2030, 1, 1, tzinfo=UTC)
PORTS_PER_SWITCH = 48


def substrate(nodes: int) -> Substrate:
    """`nodes` hosts (every tenth bare metal), 48 to a top-of-rack switch, racks trunked in a chain."""
    racks = -(-nodes // PORTS_PER_SWITCH)
    switches = [{"name": f"sw{s}", "site": f"rack{s}", "vlan_range": ["1000-3999"],
                 "ports": [{"name": f"p{i}"} for i in range(PORTS_PER_SWITCH)] + [{"name": "up"}, {"name": "down"}]}
                for s in range(racks)]
    trunks = [{"name": f"t{s}", "between": [f"sw{s}:up", f"sw{s + 1}:down"]} for s in range(racks - 1)]
    hosts = [{"name": f"h{i}", "site": f"rack{i // PORTS_PER_SWITCH}", "cores": 32, "memory_mb": 131072,
              "exclusive": i % 10 == 0,
              "interfaces": [{"name": "eth0", "switch_port": f"sw{i // PORTS_PER_SWITCH}:p{i % PORTS_PER_SWITCH}"}]}
             for i in range(nodes)]
    return substrate_from_dict({"authority": "bench.org", "switches": switches, "trunks": trunks, "hosts": hosts})


def request(nodes: int) -> str:
    body = [f'<node client_id="n{i}"><sliver_type name="m1.small"/><interface client_id="n{i}:0"/></node>'
            for i in range(nodes)]
    refs = "".join(f'<interface_ref client_id="n{i}:0"/>' for i in range(nodes))
    return (f'<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">{"".join(body)}'
            f'<link client_id="lan">{refs}</link></rspec>')


def timed(fn, args) -> list[float]:
    """Latencies of consecutive calls of `fn` (after one untimed call): at least --min-samples and --seconds,
    and on to the 100 calls a p99 needs when that takes at most --p99-budget seconds more."""
    fn()
    out: list[float] = []
    t_end = time.perf_counter() + args.seconds

    def more() -> bool:
        n = len(out)
        if n < args.min_samples:
            return True
        if n >= args.max_samples:
            return False
        return time.perf_counter() < t_end or (n < 100 and sum(out) / n * (100 - n) <= args.p99_budget)

    while more():
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def row(operation: str, nodes: int, lat: list[float], **extra) -> dict:
    return {"bench": "rspec", "operation": operation, "nodes": nodes, **summarise(lat, sum(lat)),
            "min_ms": min(lat) * 1000, "max_ms": max(lat) * 1000, **extra}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=2.0, help="least time per row (default 2)")
    p.add_argument("--min-samples", type=int, default=5, help="least calls per row (default 5)")
    p.add_argument("--p99-budget", type=float, default=4.0,
                   help="extra seconds a row may take to reach the 100 calls p99 needs (default 4)")
    p.add_argument("--max-samples", type=int, default=2000, help="most calls per row (default 2000)")
    args = p.parse_args()
    print(f"machine: {machine()}; one call at a time, in this process\n")
    rows = []
    for n in (1000, 10000):
        sub = substrate(n)
        ad = build_advertisement(sub, Usage(), NOW)
        size = {"ad_kib": len(ad) // 1024, "compressed_kib": len(zlib.compress(ad.encode())) // 1024}
        rows.append(row("advertisement cold", n, timed(lambda sub=sub: build_advertisement(sub, Usage(), NOW), args),
                        **size))
        cache = AdvertisementCache()
        rows.append(row("advertisement cached", n, timed(lambda sub=sub, cache=cache: cache.get(sub, Usage(), NOW),
                                                         args)))
    sub = substrate(1000)
    rows.append(row("NDL-OWL substrate graph", 1000, timed(lambda: substrate_graph(sub), args)))
    text = request(100)
    parsed = parse_request(text)
    rows.append(row("parse+validate", 100, timed(lambda: parse_request(text), args)))
    rows.append(row("embed", 100, timed(lambda: plan(sub, parsed, set()), args)))
    rows.append(row("parse+validate+embed", 100, timed(lambda: plan(sub, parse_request(text), set()), args)))
    report(rows, ["operation", "nodes", "samples", "rate", "rate_unit", "p50_ms", "p99_ms", "min_ms", "max_ms",
                  "ad_kib", "compressed_kib"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
