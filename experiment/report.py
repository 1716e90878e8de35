"""Results of an experiment: CSV and JSON files, the summary (success rate, time to ready p50/p95,
per-link throughput spread) and PNG plots. Pure over the repetition records the runner makes, except the
writers.

A percentile is reported only when the sample count supports it (at least one sample above it: 2 samples
for p50, 20 for p95, as bench/stats.py): below that it is None and printed "n/a (n=…)"."""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

EXTRA = "pip install 'slicex[experiment]'"


def require(module: str, what: str) -> Any:
    """Import an optional dependency (matplotlib, tqdm: the `experiment` extra, not the core install), or
    stop with a message that says what needs it and how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise SystemExit(f"{what} needs the Python package {module!r}, which is not installed: {EXTRA}") from None

REP_FIELDS = ("rep", "slice", "ok", "failed_step", "error", "time_to_ready_s", "create_slice_s", "allocate_s",
              "provision_s", "start_s", "ready_s", "measure_s", "delete_s")
LINK_FIELDS = ("rep", "link", "src", "dst", "address", "rtt_min_ms", "rtt_avg_ms", "rtt_max_ms", "ping_loss_pct",
               "tcp_mbps", "udp_mbps", "udp_jitter_ms", "udp_loss_pct")


def percentile(samples: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile, or None when fewer than 100 / (100 - p) samples."""
    n = len(samples)
    if n == 0 or n < math.ceil(100 / (100 - p) - 1e-9):
        return None
    return sorted(samples)[max(0, math.ceil(p / 100 * n) - 1)]


def pair_label(m: dict[str, Any]) -> str:
    return f"{m['link']} {m['src']}->{m['dst']}"


def _spread(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"n": len(values), "mean": mean, "stdev": sd, "min": min(values), "max": max(values),
            "p50": percentile(values, 50), "cv_pct": 100 * sd / mean if mean else None,
            "range_pct": 100 * (max(values) - min(values)) / mean if mean else None}


def summary(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """Success rate, failures by step (each with its error), time to ready, per-link spread."""
    ok = [r for r in reps if r["ok"]]
    ready = [r["time_to_ready_s"] for r in reps if r.get("time_to_ready_s") is not None]
    booted = [r["provision_to_ready_s"] for r in reps if r.get("provision_to_ready_s") is not None]
    memory = [b / 2**20 for r in reps for b in (r.get("node_memory_bytes") or {}).values()]
    links: dict[str, dict[str, list[float]]] = {}
    for r in reps:
        for m in r.get("links", []):
            d = links.setdefault(pair_label(m), {k: [] for k in ("tcp_mbps", "udp_mbps", "udp_jitter_ms",
                                                                   "udp_loss_pct", "rtt_ms")})
            for k in ("tcp_mbps", "udp_mbps", "udp_jitter_ms", "udp_loss_pct"):
                if m.get(k) is not None:
                    d[k].append(float(m[k]))
            d["rtt_ms"].extend(m.get("rtt_ms", []))
    return {
        "repetitions": len(reps), "succeeded": len(ok),
        "success_rate": len(ok) / len(reps) if reps else None,
        "failures_by_step": dict(Counter(r["failed_step"] for r in reps if not r["ok"])),
        "failures": [{"rep": r["rep"], "step": r["failed_step"], "error": r["error"]} for r in reps if not r["ok"]],
        "time_to_ready_s": {"n": len(ready), "p50": percentile(ready, 50), "p95": percentile(ready, 95),
                            "min": min(ready) if ready else None, "max": max(ready) if ready else None},
        "provision_to_ready_s": {"n": len(booted), "p50": percentile(booted, 50), "p95": percentile(booted, 95),
                                 "min": min(booted) if booted else None, "max": max(booted) if booted else None},
        "idle_node_memory_mib": {"n": len(memory), "p50": percentile(memory, 50), "p95": percentile(memory, 95),
                                 "max": max(memory) if memory else None},
        "links": {label: {"tcp_mbps": _spread(d["tcp_mbps"]), "udp_mbps": _spread(d["udp_mbps"]),
                          "udp_jitter_ms": _spread(d["udp_jitter_ms"]), "udp_loss_pct": _spread(d["udp_loss_pct"]),
                          "rtt_ms": {"n": len(d["rtt_ms"]), "p50": percentile(d["rtt_ms"], 50),
                                     "p95": percentile(d["rtt_ms"], 95)}}
                  for label, d in sorted(links.items())},
    }


def _fmt(v: Any, n: int | None = None) -> str:
    """A figure; a percentile its sample count cannot support (`n` given) is `n/a (n=…)`, anything else
    missing `-`."""
    if v is None:
        return f"n/a (n={n})" if n is not None else "-"
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def summary_text(s: dict[str, Any]) -> str:
    t = s["time_to_ready_s"]
    rate = s["success_rate"]
    lines = [f"repetitions {s['repetitions']}, succeeded {s['succeeded']} "
             f"(success rate {'n/a' if rate is None else f'{100 * rate:.0f}%'})",
             f"time to ready (Allocate to all slivers geni_ready, s): p50 {_fmt(t['p50'], t['n'])}, "
             f"p95 {_fmt(t['p95'], t['n'])}, min {_fmt(t['min'])}, max {_fmt(t['max'])} (n={t['n']})"]
    b = s.get("provision_to_ready_s") or {"n": 0}
    if b["n"]:
        lines.append(f"provision to ready (Provision to all slivers geni_ready, s): p50 {_fmt(b['p50'], b['n'])}, "
                     f"p95 {_fmt(b['p95'], b['n'])}, min {_fmt(b['min'])}, max {_fmt(b['max'])} (n={b['n']})")
    m = s.get("idle_node_memory_mib") or {"n": 0}
    if m["n"]:
        lines.append(f"idle node memory (container cgroup, MiB): p50 {_fmt(m['p50'], m['n'])}, "
                     f"p95 {_fmt(m['p95'], m['n'])}, "
                     f"max {_fmt(m['max'])} (n={m['n']} nodes)")
    for step, count in s["failures_by_step"].items():
        lines.append(f"failed at {step}: {count}")
    for f in s["failures"][:10]:
        lines.append(f"  rep {f['rep']} {f['step']}: {f['error'][:300]}")
    if s["links"]:
        lines.append(f"{'link':<22} {'TCP Mbit/s mean':>15} {'stdev':>7} {'min':>7} {'max':>7} {'CV %':>6} "
                     f"{'UDP jitter ms':>13} {'UDP loss %':>10} {'RTT p50 ms':>10}")
    for label, d in s["links"].items():
        tcp = d["tcp_mbps"]
        if not tcp["n"]:
            continue
        lines.append(f"{label:<22} {_fmt(tcp['mean']):>15} {_fmt(tcp['stdev']):>7} {_fmt(tcp['min']):>7} "
                     f"{_fmt(tcp['max']):>7} {_fmt(tcp['cv_pct']):>6} {_fmt(d['udp_jitter_ms'].get('mean')):>13} "
                     f"{_fmt(d['udp_loss_pct'].get('mean')):>10} {_fmt(d['rtt_ms']['p50'], d['rtt_ms']['n']):>10}")
    return "\n".join(lines)


def link_rows(reps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for r in reps:
        for m in r.get("links", []):
            rtt = m.get("rtt_ms") or []
            rows.append({"rep": r["rep"], "link": m["link"], "src": m["src"], "dst": m["dst"],
                         "address": m.get("address"), "rtt_min_ms": min(rtt) if rtt else None,
                         "rtt_avg_ms": statistics.fmean(rtt) if rtt else None, "rtt_max_ms": max(rtt) if rtt else None,
                         **{k: m.get(k) for k in ("ping_loss_pct", "tcp_mbps", "udp_mbps", "udp_jitter_ms",
                                                  "udp_loss_pct")}})
    return rows


def write(out: Path, reps: list[dict[str, Any]], meta: dict[str, Any], with_plots: bool = True) -> dict[str, Any]:
    """repetitions.csv, links.csv, results.json (meta, every record, the summary), summary.txt; the plots."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "repetitions.csv", "w", newline="") as f:
        w = csv.DictWriter(f, REP_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in reps:
            w.writerow({**{f"{k}_s": v for k, v in r.get("times", {}).items()}, **r})
    with open(out / "links.csv", "w", newline="") as f:
        w = csv.DictWriter(f, LINK_FIELDS)
        w.writeheader()
        w.writerows(link_rows(reps))
    s = summary(reps)
    (out / "results.json").write_text(json.dumps({"meta": meta, "summary": s, "repetitions": reps}, indent=2) + "\n")
    (out / "summary.txt").write_text(summary_text(s) + "\n")
    if with_plots:
        plots(out, reps)
    return s


def throughput_cdf(reps: list[dict[str, Any]]) -> dict[str, tuple[list[float], list[float], float | None]]:
    """Per pair, the TCP throughput CDF as steps (x, fraction of repetitions <= x), from 0 below the smallest
    sample to 1 at the largest, and the link's capacity (Mbit/s; None when the request gave none)."""
    samples: dict[str, list[float]] = {}
    capacity: dict[str, float | None] = {}
    for r in reps:
        for m in r.get("links", []):
            if m.get("tcp_mbps") is not None:
                samples.setdefault(pair_label(m), []).append(float(m["tcp_mbps"]))
                capacity[pair_label(m)] = capacity.get(pair_label(m)) or m.get("capacity_mbps")
    out = {}
    for label, values in sorted(samples.items()):
        xs = sorted(values)
        out[label] = ([xs[0], *xs], [0.0, *((k + 1) / len(xs) for k in range(len(xs)))], capacity[label])
    return out


def plots(out: Path, reps: list[dict[str, Any]]) -> list[Path]:
    """time-to-ready.png (distribution), throughput-cdf.png (per link, TCP, with its capacity), rtt-box.png (per
    link)."""
    matplotlib = require("matplotlib", "the experiment's plots")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    ready = [r["time_to_ready_s"] for r in reps if r.get("time_to_ready_s") is not None]
    fig, ax = plt.subplots(figsize=(6, 4))
    if ready:
        ax.hist(ready, bins=min(20, max(5, len(ready) // 2)), color="tab:blue", edgecolor="black")
        ax.axvline(statistics.median(ready), color="tab:red", linestyle="--", label=f"median {statistics.median(ready):.2f} s")
        ax.legend()
    ax.set_xlabel("time to ready: Allocate to every sliver geni_ready (s)")
    ax.set_ylabel("repetitions")
    ax.set_title(f"Time to ready ({len(ready)} of {len(reps)} repetitions ready)")
    fig.tight_layout()
    fig.savefig(out / "time-to-ready.png", dpi=110)
    plt.close(fig)
    made.append(out / "time-to-ready.png")

    rtts: dict[str, list[float]] = {}
    for r in reps:
        for m in r.get("links", []):
            rtts.setdefault(pair_label(m), []).extend(m.get("rtt_ms", []))
    per_link = throughput_cdf(reps)
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, (xs, ys, capacity) in per_link.items():
        line, = ax.step(xs, ys, where="post", label=f"{label} (n={len(xs) - 1})")
        if capacity:
            ax.axvline(capacity, color=line.get_color(), linestyle="--", linewidth=1,
                       label=f"{label} capacity {capacity:g} Mbit/s")
    ax.set_xlabel("TCP throughput (Mbit/s, iperf3 receiver)")
    ax.set_ylabel("fraction of repetitions ≤ x")
    ax.set_ylim(0, 1.05)
    ax.set_title("Per-link TCP throughput CDF")
    if per_link:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "throughput-cdf.png", dpi=110)
    plt.close(fig)
    made.append(out / "throughput-cdf.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    labels = sorted(rtts)
    if labels:
        ax.boxplot([rtts[k] for k in labels], tick_labels=labels, showfliers=True)
        ax.tick_params(axis="x", labelsize=8)
    ax.set_ylabel("ping RTT (ms)")
    ax.set_title(f"RTT per link (all samples of {len(reps)} repetitions)")
    fig.tight_layout()
    fig.savefig(out / "rtt-box.png", dpi=110)
    plt.close(fig)
    made.append(out / "rtt-box.png")
    return made
