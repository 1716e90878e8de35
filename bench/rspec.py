"""RSpec benchmarks: advertisement generation (cold and cached) for 1,000- and 10,000-node substrates, and
parse + validate + embed of a 100-node request.

Run: .venv/bin/python bench/rspec.py [--repeat N]"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from am.embed import plan  # noqa: E402
from bench._common import report, summarise  # noqa: E402
from rspec.advertisement import AdvertisementCache, Usage, build_advertisement  # noqa: E402
from rspec.request import parse_request  # noqa: E402
from rspec.substrate import substrate_from_dict  # noqa: E402

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def substrate(nodes: int):
    per_switch = 48
    switches = [{"name": f"sw{s}", "vlan_range": ["1000-3999"],
                 "ports": [{"name": f"p{i}"} for i in range(per_switch)]} for s in range(-(-nodes // per_switch))]
    hosts = [{"name": f"h{i}", "cores": 32, "memory_mb": 131072, "exclusive": i % 10 == 0,
              "interfaces": [{"name": "eth0", "switch_port": f"sw{i // per_switch}:p{i % per_switch}"}]}
             for i in range(nodes)]
    return substrate_from_dict({"authority": "bench.org", "switches": switches, "hosts": hosts})


def request(nodes: int) -> str:
    body = [f'<node client_id="n{i}"><sliver_type name="m1.small"/><interface client_id="n{i}:0"/></node>'
            for i in range(nodes)]
    refs = "".join(f'<interface_ref client_id="n{i}:0"/>' for i in range(nodes))
    return (f'<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">{"".join(body)}'
            f'<link client_id="lan">{refs}</link></rspec>')


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    rows = []
    for n in (1000, 10000):
        sub = substrate(n)
        lat = timed(lambda sub=sub: build_advertisement(sub, Usage(), NOW), max(1, args.repeat // (n // 1000)))
        rows.append({"bench": "rspec", "operation": "advertisement cold", "nodes": n, **summarise(lat, sum(lat))})
        cache = AdvertisementCache()
        cache.get(sub, Usage(), NOW)
        lat = timed(lambda sub=sub, cache=cache: cache.get(sub, Usage(), NOW), 1000)
        rows.append({"bench": "rspec", "operation": "advertisement cached", "nodes": n, **summarise(lat, sum(lat))})
    sub = substrate(1000)
    text = request(100)
    lat = timed(lambda: plan(sub, parse_request(text), set()), args.repeat * 4)
    rows.append({"bench": "rspec", "operation": "parse+validate+embed", "nodes": 100, **summarise(lat, sum(lat))})
    report(rows, ["operation", "nodes", "calls", "per_second", "p50_ms", "p99_ms"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
