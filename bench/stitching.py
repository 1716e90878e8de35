"""Stitching benchmarks: path computation plus tag negotiation for 5-, 20- and 100-aggregate paths (the pure
core, and the whole ComputePath with RSpec parsing and the service RSpec and workflow written), then 1,000
concurrent link requests competing for 100 tags on one cable (threads sharing one book, optimistic commits).

Topologies are ladders: aggregates A0..A(n-1) in a chain, two cables between neighbours (so the path search
has choices), each cable's ranges overlapping in a 64-tag window that shifts along the chain, with every
fifth transit translating so runs split. Topologies and requests are built before any clock starts; each
operation runs once untimed first. Percentiles the sample count cannot support print as n/a.

Run: .venv/bin/python bench/stitching.py [--seconds S] [--min-samples N]
Prints a table, then one JSON object per measurement per line."""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import machine, report  # noqa: E402
from bench.stats import summarise  # noqa: E402
from stitching.model import Aggregate, Port, StitchingError, Topology  # noqa: E402
from stitching.negotiate import LinkRequest, SharedBook, plan_link  # noqa: E402
from stitching.scs import compute_path  # noqa: E402

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def agg(i: int) -> str:
    return f"urn:publicid:IDN+a{i}.bench+authority+am"


def ladder(n: int) -> Topology:
    ports = []
    for i in range(n - 1):
        for c in range(2):
            lo = 100 + (i % 7) * 8
            a = f"urn:publicid:IDN+a{i}.bench+interface+sw:to-a{i + 1}-{c}"
            b = f"urn:publicid:IDN+a{i + 1}.bench+interface+sw:to-a{i}-{c}"
            ports += [Port(a, agg(i), b, frozenset(range(lo, lo + 64)), translation=(i % 5 == 4), metric=10 + c),
                      Port(b, agg(i + 1), a, frozenset(range(lo + 4, lo + 68)), metric=10 + c)]
    return Topology.build([Aggregate(agg(i), f"https://127.0.0.1:{9000 + i}/") for i in range(n)], ports)


def request_xml(n: int) -> str:
    return f"""<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">
<node client_id="x" component_manager_id="{agg(0)}"><interface client_id="x:0"/></node>
<node client_id="y" component_manager_id="{agg(n - 1)}"><interface client_id="y:0"/></node>
<link client_id="l"><interface_ref client_id="x:0"/><interface_ref client_id="y:0"/>
<property source_id="x:0" dest_id="y:0" capacity="20000"/></link></rspec>"""


def timed(fn, seconds: float, min_samples: int, max_samples: int = 2000) -> tuple[list[float], float]:
    fn()
    out: list[float] = []
    start = time.perf_counter()
    while len(out) < max_samples and (len(out) < min_samples or time.perf_counter() - start < seconds):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out, time.perf_counter() - start


def paths(seconds: float, min_samples: int) -> list[dict]:
    rows = []
    for n in (5, 20, 100):
        topo = ladder(n)
        req = LinkRequest("l", agg(0), agg(n - 1), 20000)
        params = {"slice_urn": "urn:publicid:IDN+bench+slice+s", "request_rspec": request_xml(n),
                  "request_options": {"geni_workflow_paths_merged": True}}
        probe = plan_link(topo, req, {}, {})
        assert compute_path(topo, params, NOW)["code"]["geni_code"] == 0
        for what, fn in (("negotiate", lambda t=topo, r=req: plan_link(t, r, {}, {})),
                         ("ComputePath", lambda t=topo, p=params: compute_path(t, p, NOW))):
            lat, wall = timed(fn, seconds, min_samples)
            rows.append({"bench": "stitching_path", "operation": what, "aggregates": n, "hops": len(probe.hops),
                         **summarise(lat, wall, (50, 99), "paths/s")})
    return rows


def contention(requests: int = 1000, tags: int = 100, workers: int = 32) -> dict:
    a = "urn:publicid:IDN+a.bench+interface+sw:to-b"
    b = "urn:publicid:IDN+b.bench+interface+sw:to-a"
    topo = Topology.build([Aggregate("urn:publicid:IDN+a.bench+authority+am", "https://a/"),
                           Aggregate("urn:publicid:IDN+b.bench+authority+am", "https://b/")],
                          [Port(a, "urn:publicid:IDN+a.bench+authority+am", b, frozenset(range(1000, 1000 + tags))),
                           Port(b, "urn:publicid:IDN+b.bench+authority+am", a, frozenset(range(1000, 1000 + tags)))])
    shared = SharedBook(topo)
    reqs = [[LinkRequest(f"l{i}", "urn:publicid:IDN+a.bench+authority+am", "urn:publicid:IDN+b.bench+authority+am")]
            for i in range(requests)]
    lat: list[float] = [0.0] * requests
    outcome: list[object] = [None] * requests

    def one(i: int) -> None:
        t = time.perf_counter()
        try:
            outcome[i] = shared.reserve(reqs[i], NOW, NOW + timedelta(hours=1), f"r{i}")[0].hops[0].tag
        except StitchingError as err:
            outcome[i] = err
        lat[i] = time.perf_counter() - t

    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, range(requests)))
    wall = time.perf_counter() - start
    granted = [o for o in outcome if isinstance(o, int)]
    failed = [o for o in outcome if isinstance(o, StitchingError)]
    held = [t for h in shared.book.holds.values() for (port, _, t) in h.tags if port == a]
    assert len(granted) == len(set(granted)) == len(held) == len(set(held)), "a tag was given twice"
    assert len(granted) + len(failed) == requests
    assert all(f.message and f.kind == "vlan" for f in failed), "a failure without a reason"
    return {"bench": "stitching_contention", "operation": f"{requests} link requests, {tags} tags, {workers} threads",
            "granted": len(granted), "refused": len(failed), "distinct_tags": len(set(granted)),
            "refusals_with_reason": sum(1 for f in failed if f.message),
            "example_refusal": failed[0].message[:120] if failed else "",
            **summarise(lat, wall, (50, 99), "requests/s")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--min-samples", type=int, default=20)
    args = ap.parse_args()
    print(f"stitching benchmarks on {machine()}\n")
    report(paths(args.seconds, args.min_samples), ["operation", "aggregates", "hops", "samples", "rate", "mean_ms",
                                                   "p50_ms", "p99_ms"], "path computation + tag negotiation")
    row = contention()
    report([row], ["operation", "granted", "refused", "distinct_tags", "refusals_with_reason", "samples", "rate",
                   "mean_ms", "p50_ms", "p99_ms"], "concurrent requests competing for tags")
    return 0


if __name__ == "__main__":
    sys.exit(main())
