"""Overlay benchmarks: address claims against a real Redis, and traffic through the overlay's data plane.

Claims (the Lua put-if-absent of federation/overlay/claims.py, one round trip each):
  claim     a free address (WON): latency per call, one client
  renew     the same holder again (RENEWED)
  contested another holder's address (TAKEN)
  release   compare-and-delete
  claim/s   free addresses claimed by 1, 4 and 16 client processes at once (each its own connection, its own
            addresses), calls/s over the common timed window and per-call latency
Data plane (root, network namespaces and tap devices; skipped with the reason otherwise):
  RTT (ping, one echo every 10 ms) and TCP throughput (iperf3, receiver's figure, one run = one sample)
  between two namespaces over
    veth            a direct veth pair (the kernel path, offloads as the kernel sets them)
    overlay-segment two nodes of one cluster, switched by the cluster's virtual router (userspace)
    overlay-routed  nodes in two clusters: proxy ARP, router A, UDP tunnel, router B (two userspace hops)

Across lab hosts (docs/lab.md; also needs nft and socat): a lab of hosts a—b joined by a fibre, and c behind
a NAT host n joined to b, every fibre shaped to --lab-rate Mbit/s (default 1000), the overlay's routers on
the hosts' addresses claiming on this Redis through the lab's relay:
    lab-direct       host a to host b over their fibre (the kernel path)
    lab-overlay      a node on a to a node on b: router on a, UDP over the fibre, router on b
    lab-direct-nat   host c to host b through the NAT host (masquerade)
    lab-overlay-nat  a node on c to a node on b, the routers' datagrams through the NAT (c's router
                     advertising n's address)
  and the share of the direct path's throughput each overlay path carries.

Setup is outside every timed window: the namespace definition, connections, client processes (started and
connected before a shared start signal), namespaces, taps, routers, address claims and ARP (three
untimed pings first). Percentiles the sample count cannot support print as n/a.

The routers' data plane (--router-dataplane) is auto by default: taps passing TCP super-frames with their
offload header where the host can (docs/federation.md), else one frame per system call; each row names it.

Run: .venv/bin/python bench/overlay.py [--claims N] [--seconds S] [--pings N] [--iperf-runs N]
     [--iperf-seconds S] [--dataplane host,lab] [--lab-rate MBIT] [--router-dataplane auto|offload|plain]
     [--json PATH]
Redis: SLICEX_REDIS_URL (default redis://127.0.0.1:6379/0); keys go under a fresh prefix, removed at the
end. Prints tables, then one JSON object per measurement per line (and all of them to --json PATH)."""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import select
import signal
import statistics
import subprocess
import sys
import time
import uuid
from ipaddress import IPv4Address
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from authority.substrate import hostnet  # noqa: E402
from bench._common import emit, machine, report  # noqa: E402
from bench.stats import summarise  # noqa: E402
from federation.overlay import tap  # noqa: E402
from federation.overlay.claims import RedisClaims  # noqa: E402
from federation.overlay.core import Holder, NamespaceConfig, Outcome  # noqa: E402
from slicex.store.redis_store import redact  # noqa: E402

NS = "bench"
LEASE = 300.0


def holder(i: int, endpoint: str = "127.0.0.1:4789") -> Holder:
    return Holder(f"n{i}", endpoint, "bench", f"02:{i >> 24 & 0xFF:02x}:{i >> 16 & 0xFF:02x}:"
                  f"{i >> 8 & 0xFF:02x}:{i & 0xFF:02x}:01")


# ---- claims ----------------------------------------------------------------------------------------------------
def _timed(fn, items) -> tuple[list[float], float]:
    out = []
    start = time.perf_counter()
    for x in items:
        t = time.perf_counter()
        fn(x)
        out.append(time.perf_counter() - t)
    return out, time.perf_counter() - start


def claim_latency(url: str, prefix: str, n: int) -> list[dict]:
    c = RedisClaims(url, prefix)
    cfg = c.namespace(NS)
    base = int(cfg.network.network_address) + 2
    addrs = [IPv4Address(base + i) for i in range(n)]
    me, other = holder(1), holder(2)
    c.claim(NS, IPv4Address(base + n + 10), me, LEASE)  # warm: connection and script cache
    rows = []

    def expect(outcome):
        def call(a):
            got, _ = c.claim(NS, a, me if outcome is not Outcome.TAKEN else other, LEASE)
            if got is not outcome:
                raise SystemExit(f"claim of {a} answered {got.value}, expected {outcome.value}")
        return call

    def release(a):
        if not c.release(NS, a, me):
            raise SystemExit(f"release of {a} found it not held by the claimant")

    for op, fn in (("claim", expect(Outcome.WON)), ("renew", expect(Outcome.RENEWED)),
                   ("contested", expect(Outcome.TAKEN)),
                   ("release", release)):
        lat, wall = _timed(fn, addrs)
        rows.append({"bench": "overlay_claims", "operation": op, "clients": 1, **summarise(lat, wall)})
    c.close()
    return rows


def _client(url: str, prefix: str, k: int, stride: int, seconds: float, ready, go, out) -> None:
    c = RedisClaims(url, prefix)
    cfg = c.namespace(NS)
    base = int(cfg.network.network_address) + 2 + k
    me = holder(100 + k)
    c.ping()
    ready.put(k)
    go.wait()
    lat: list[float] = []
    i, won = 0, 0
    t0 = time.perf_counter()
    stop = t0 + seconds
    while True:
        t = time.perf_counter()
        if t >= stop:
            break
        outcome, _ = c.claim(NS, IPv4Address(base + i * stride), me, LEASE)
        lat.append(time.perf_counter() - t)
        won += outcome is Outcome.WON
        i += 1
    out.put((k, t0, time.perf_counter(), lat, won))
    c.close()


def claim_throughput(url: str, prefix: str, clients: list[int], seconds: float) -> list[dict]:
    ctx = mp.get_context("fork")
    rows = []
    for n in clients:
        c = RedisClaims(url, prefix)  # each cell starts from an empty namespace (untimed)
        cfg = c.namespace(NS)
        c.undefine(NS)
        c.define(cfg)
        c.close()
        ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
        procs = [ctx.Process(target=_client, args=(url, prefix, k, n, seconds, ready, go, out)) for k in range(n)]
        for p in procs:
            p.start()
        for _ in procs:
            ready.get(timeout=30)
        go.set()
        got = [out.get(timeout=seconds + 60) for _ in procs]
        for p in procs:
            p.join(10)
        lat = [x for g in got for x in g[3]]
        wall = max(g[2] for g in got) - min(g[1] for g in got)
        won = sum(g[4] for g in got)
        row = {"bench": "overlay_claims", "operation": "claim/s", "clients": n, **summarise(lat, wall)}
        if won != len(lat):
            row["not_won"] = len(lat) - won  # every address was fresh and each client's own: should be 0
        rows.append(row)
    return rows


# ---- data plane ------------------------------------------------------------------------------------------------
class Router:
    def __init__(self, url: str, prefix: str, cluster: str, nodes: dict[str, str], dataplane: str = "auto"):
        argv = [sys.executable, "-m", "federation.overlay", "--redis", url, "--prefix", prefix, "router", "dp",
                "--cluster", cluster, "--dataplane", dataplane]
        for n, address in nodes.items():
            argv += ["--node", f"id={n},netns={prefix}-{n},tap={prefix}{n},mac={mac(n)},address={address}"]
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        r, _, _ = select.select([self.proc.stdout], [], [], 30)
        line = self.proc.stdout.readline() if r else ""
        if not line:
            self.proc.kill()
            raise SystemExit(f"router {cluster} did not start: {self.proc.stderr.read()}")
        self.ready = json.loads(line)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def mac(node: str) -> str:
    return f"02:00:00:00:{ord(node[0]):02x}:{int(node[1:]):02x}"


def ping_rtts(ns: str, address: str, count: int) -> list[float]:
    hostnet.exec_in(ns, ["ping", "-c", "3", "-i", "0.2", "-W", "1", address], timeout=10)  # ARP, caches: untimed
    out = hostnet.exec_in(ns, ["ping", "-c", str(count), "-i", "0.01", "-W", "1", address], timeout=count + 30)
    rtts = [float(m) / 1000 for m in re.findall(r"time=([\d.]+) ms", out.stdout)]
    if not rtts:
        raise SystemExit(f"no ping answers from {address} in {ns}: {out.stdout}{out.stderr}")
    return rtts


def iperf3(server_ns: str, server_ip: str, client_ns: str, seconds: float) -> float:
    srv = subprocess.Popen(["ip", "netns", "exec", server_ns, "iperf3", "-s", "-1", "-B", server_ip],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if ":5201" in hostnet.exec_in(server_ns, ["ss", "-ltn"]).stdout:
                break
            time.sleep(0.05)
        out = hostnet.exec_in(client_ns, ["iperf3", "-c", server_ip, "-t", str(seconds), "-O", "1", "-J"],
                              timeout=seconds + 30)
        return json.loads(out.stdout)["end"]["sum_received"]["bits_per_second"] / 1e6
    finally:
        srv.kill()
        srv.wait(5)


def dataplane(url: str, prefix: str, pings: int, runs: int, seconds: float,
              router_dataplane: str = "auto") -> tuple[list[dict], list[dict]]:
    rtt_rows, tput_rows = [], []
    routers: list[Router] = []
    c = RedisClaims(url, prefix)
    try:
        for n in ("d1", "d2", "a1", "a2", "b1"):
            hostnet.add_namespace(f"{prefix}-{n}", n)
        hostnet.run(["ip", "link", "add", f"{prefix}d1", "netns", f"{prefix}-d1", "type", "veth", "peer", "name",
                     f"{prefix}d2", "netns", f"{prefix}-d2"])
        for n, a in (("d1", "10.99.0.1"), ("d2", "10.99.0.2")):
            hostnet.set_address(f"{prefix}-{n}", f"{prefix}{n}", f"{a}/24")
            hostnet.set_up(f"{prefix}-{n}", f"{prefix}{n}", True)
        c.define(NamespaceConfig.build("dp", "10.98.0.0/24", 30))
        routers.append(Router(url, prefix, "A", {"a1": "10.98.0.11", "a2": "10.98.0.12"}, router_dataplane))
        routers.append(Router(url, prefix, "B", {"b1": "10.98.0.21"}, router_dataplane))
        chosen = ",".join(sorted({r.ready["dataplane"] for r in routers}))
        paths = [("veth", "d1", "d2", "10.99.0.2"), ("overlay-segment", "a1", "a2", "10.98.0.12"),
                 ("overlay-routed", "a1", "b1", "10.98.0.21")]
        for path, src, _dst, address in paths:
            rtts = ping_rtts(f"{prefix}-{src}", address, pings)
            rtt_rows.append({"bench": "overlay_rtt", "path": path,
                             "dataplane": chosen if "overlay" in path else "kernel", **summarise(rtts, None, (50, 90, 99))})
        for path, src, dst, address in paths:
            mbps = [iperf3(f"{prefix}-{dst}", address, f"{prefix}-{src}", seconds) for _ in range(runs)]
            tput_rows.append({"bench": "overlay_throughput", "path": path,
                              "dataplane": chosen if "overlay" in path else "kernel", "samples": len(mbps),
                              "seconds_each": seconds, "mbit_s_mean": statistics.fmean(mbps),
                              "mbit_s_min": min(mbps), "mbit_s_max": max(mbps)})
    finally:
        for r in routers:
            r.stop()
        hostnet.remove_prefixed(prefix)
        c.undefine("dp")
        c.close()
    return rtt_rows, tput_rows


def lab_dataplane(url: str, prefix: str, rate_mbit: float | None, pings: int, runs: int,
                  seconds: float, router_dataplane: str = "auto") -> tuple[list[dict], list[dict]]:
    """RTT and TCP throughput between lab hosts, direct and over the overlay, with and without a NAT."""
    from lab import Fibre, LabSpec, Nat, running
    from lab.overlay import add_node, node_namespace, start_router

    spec = LabSpec("ob", ("a", "b", "c", "n"),
                   (Fibre("a", "b", rate_mbit), Fibre("c", "n", rate_mbit), Fibre("n", "b", rate_mbit)),
                   (Nat("n", ("c",)),))
    rtt_rows, tput_rows = [], []
    c = RedisClaims(url, prefix)
    routers = []
    try:
        with running(spec, url) as lab:
            a, b, cc, n = (lab.hosts[x] for x in ("a", "b", "c", "n"))
            c.define(NamespaceConfig.build("lab", "10.97.0.0/24", 30))
            for host, node in ((a, "x1"), (b, "y1"), (b, "y2"), (cc, "z1")):
                add_node(host, node)
            routers.append(start_router(b, prefix, "lab", "B", {"y1": "10.97.0.21", "y2": "10.97.0.22"},
                                        dataplane=router_dataplane))
            routers.append(start_router(a, prefix, "lab", "A", {"x1": "10.97.0.11"}, dataplane=router_dataplane))
            routers.append(start_router(cc, prefix, "lab", "C", {"z1": "10.97.0.31"}, advertise=n.address,
                                        dataplane=router_dataplane))
            chosen = ",".join(sorted({r.dataplane for r in routers}))
            # (path, client namespace, server namespace, server address); the NAT paths start inside
            paths = [("lab-direct", a.namespace, b.namespace, b.address),
                     ("lab-overlay", node_namespace(a, "x1"), node_namespace(b, "y1"), "10.97.0.21"),
                     ("lab-direct-nat", cc.namespace, b.namespace, b.address),
                     ("lab-overlay-nat", node_namespace(cc, "z1"), node_namespace(b, "y2"), "10.97.0.22")]
            for path, src, _dst, address in paths:
                rtts = ping_rtts(src, address, pings)
                rtt_rows.append({"bench": "overlay_rtt", "path": path, "fibre_mbit_s": rate_mbit,
                                 "dataplane": chosen if "overlay" in path else "kernel", **summarise(rtts, None, (50, 90, 99))})
            for path, src, dst, address in paths:
                mbps = [iperf3(dst, address, src, seconds) for _ in range(runs)]
                tput_rows.append({"bench": "overlay_throughput", "path": path, "fibre_mbit_s": rate_mbit,
                                  "dataplane": chosen if "overlay" in path else "kernel", "samples": len(mbps), "seconds_each": seconds, "mbit_s_mean": statistics.fmean(mbps),
                                  "mbit_s_min": min(mbps), "mbit_s_max": max(mbps)})
            for r in routers:
                r.stop()
    finally:
        c.undefine("lab")
        c.close()
    mean = {r["path"]: r["mbit_s_mean"] for r in tput_rows}
    for r in tput_rows:
        if "overlay" in r["path"]:
            r["share_of_direct"] = r["mbit_s_mean"] / mean[r["path"].replace("overlay", "direct")]
    return rtt_rows, tput_rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--claims", type=int, default=2000, help="sequential calls per claim operation (default 2000)")
    p.add_argument("--clients", default="1,4,16", help="client processes for claim/s (default 1,4,16)")
    p.add_argument("--seconds", type=float, default=3.0, help="timed window per claim/s cell (default 3)")
    p.add_argument("--pings", type=int, default=200, help="timed pings per path (default 200, for p99)")
    p.add_argument("--iperf-runs", type=int, default=3, help="iperf3 runs per path (default 3)")
    p.add_argument("--iperf-seconds", type=float, default=5.0, help="seconds per iperf3 run (default 5)")
    p.add_argument("--dataplane", default="host,lab", help="data-plane sections: host (namespaces on this host), "
                                                         "lab (across lab hosts), both (default) or none")
    p.add_argument("--lab-rate", type=float, default=1000.0, help="the lab's fibres in Mbit/s (default 1000; 0: "
                                                                  "unshaped)")
    p.add_argument("--router-dataplane", default="auto", choices=("auto", "offload", "plain"),
                   help="the routers' --dataplane (default auto: super-frames where taps can pass them; plain: "
                        "the portable one frame per system call)")
    p.add_argument("--json", type=Path, help="also write every row (and the machine) to this file")
    args = p.parse_args()
    url = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/0")
    prefix = "ov" + uuid.uuid4().hex[:4]
    where = machine()
    print(f"machine: {where}; Redis {redact(url)}\n")
    c = RedisClaims(url, prefix)
    c.ping()
    try:
        c.define(NamespaceConfig.build(NS, "10.0.0.0/8", LEASE))
        claims = claim_latency(url, prefix, args.claims)
        claims += claim_throughput(url, prefix, [int(x) for x in args.clients.split(",")], args.seconds)
    finally:
        c.undefine(NS)
        c.close()
    report(claims, ["operation", "clients", "samples", "rate", "rate_unit", "mean_ms", "p50_ms", "p99_ms"],
           title="Overlay address claims against Redis (Lua put-if-absent, one round trip)", json_lines=False)
    rows = list(claims)
    sections = {x for x in args.dataplane.split(",") if x and x != "none"}
    if sections - {"host", "lab"}:
        p.error(f"--dataplane: unknown {', '.join(sorted(sections - {'host', 'lab'}))} (host, lab, none)")
    skipped = {}
    if sections and tap.missing():
        skipped = {x: "this host lacks: " + "; ".join(tap.missing()) for x in sections}
    if "lab" in sections and "lab" not in skipped:
        from lab.edge import missing_capabilities

        if missing_capabilities():
            skipped["lab"] = "the lab needs: " + "; ".join(missing_capabilities())
    for section, why in skipped.items():
        print(f"data plane ({section}) not measured: {why}\n")
    rtt, tput = [], []
    if "host" in sections and "host" not in skipped:
        got = dataplane(url, prefix, args.pings, args.iperf_runs, args.iperf_seconds, args.router_dataplane)
        rtt, tput = rtt + got[0], tput + got[1]
    if "lab" in sections and "lab" not in skipped:
        got = lab_dataplane(url, prefix, args.lab_rate or None, args.pings, args.iperf_runs, args.iperf_seconds,
                            args.router_dataplane)
        rtt, tput = rtt + got[0], tput + got[1]
    if rtt:
        report(rtt, ["path", "dataplane", "samples", "mean_ms", "p50_ms", "p90_ms", "p99_ms"],
               title="RTT, ping every 10 ms (ms)", json_lines=False)
        report(tput, ["path", "dataplane", "fibre_mbit_s", "samples", "seconds_each", "mbit_s_mean", "mbit_s_min", "mbit_s_max",
                      "share_of_direct"],
               title="TCP throughput, iperf3 receiver (Mbit/s; one sample = one run)", json_lines=False)
        rows += rtt + tput
    emit(rows)
    if args.json:
        args.json.write_text(json.dumps({"machine": where, "redis": redact(url), "rows": rows,
                                         "dataplane_skipped": skipped or None}, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
