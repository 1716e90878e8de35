"""Measurements between the two ends of a link, run inside the nodes: ping RTT (every sample, and loss),
iperf3 TCP goodput, iperf3 UDP throughput, jitter and loss. The parsers are pure (tested on recorded output);
`measure_pair` runs the programs through NodeExec."""

from __future__ import annotations

import itertools
import json
import re
import time
from typing import Any

from experiment.nodes import NodeExec

RTT_RE = re.compile(r"time[=<]([\d.]+) ms")
LOSS_RE = re.compile(r"([\d.]+)% packet loss")
IPERF3_PORT = 5201


class MeasureError(Exception):
    pass


def parse_ping(out: str) -> dict[str, Any]:
    """RTT samples (ms) and the loss percentage of `ping` output."""
    loss = LOSS_RE.search(out)
    if loss is None:
        raise MeasureError(f"ping printed no summary: {out.strip()[-300:]}")
    return {"rtt_ms": [float(x) for x in RTT_RE.findall(out)], "ping_loss_pct": float(loss.group(1))}


def parse_iperf3(out: str, udp: bool) -> dict[str, Any]:
    """Throughput (Mbit/s; TCP: what the receiver got) and, for UDP, jitter (ms) and loss (%)."""
    try:
        doc = json.loads(out)
    except ValueError:
        raise MeasureError(f"iperf3 printed no JSON: {out.strip()[-300:]}") from None
    if doc.get("error"):
        raise MeasureError(f"iperf3: {doc['error']}")
    end = doc.get("end", {})
    if udp:
        s = end.get("sum", {})
        return {"udp_mbps": s.get("bits_per_second", 0.0) / 1e6, "udp_jitter_ms": s.get("jitter_ms"),
                "udp_loss_pct": s.get("lost_percent")}
    return {"tcp_mbps": end.get("sum_received", {}).get("bits_per_second", 0.0) / 1e6}


_ports = itertools.count()


def _next_port() -> int:
    """A fresh server port per test: a one-off server of the previous test may still hold its port while
    it exits, and a new server on it would fail in the background (after -D returned) while `ss` still showed
    the old one listening."""
    return IPERF3_PORT + next(_ports) % 2000


def _error_of(out: str) -> str:
    try:
        return json.loads(out).get("error") or out.strip()[-300:]
    except ValueError:
        return out.strip()[-300:]


def _iperf3(src: NodeExec, dst: NodeExec, address: str, args: list[str], duration: float) -> str:
    """One iperf3 test from src to a one-off server on dst (started as a daemon on a port of its own; waited
    for until it listens, and the client retried while the server is not accepting yet)."""
    port = _next_port()
    srv = dst.run(["iperf3", "-s", "-1", "-D", "-B", address, "-p", str(port)], timeout=15)
    if srv.returncode != 0:
        raise MeasureError(f"iperf3 server on {dst.name}: {(srv.stderr or srv.stdout).strip()}")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if f":{port}" in dst.run(["ss", "-Hltn", f"sport = :{port}"], timeout=10).stdout:
            break
        time.sleep(0.05)
    last = ""
    for _ in range(30):
        out = src.run(["iperf3", "-c", address, "-p", str(port), "-t", str(duration), "-J", *args],
                      timeout=duration + 30)
        last = _error_of(out.stdout or out.stderr) if out.returncode != 0 or '"error"' in out.stdout else ""
        refused = "unable to connect" in last or "refused" in last
        if not last:
            return out.stdout
        if not refused:
            break
        time.sleep(0.2)
    raise MeasureError(f"iperf3 {' '.join(args)} {src.name} -> {dst.name} port {port}: {last}")


def measure_pair(src: NodeExec, dst: NodeExec, address: str, duration: float = 3, pings: int = 10,
                 udp_mbps: float = 10) -> dict[str, Any]:
    """Everything measured from `src` to `dst` (at `address`)."""
    out = src.run(["ping", "-c", str(pings), "-i", "0.2", "-W", "2", address], timeout=pings + 10)
    result = parse_ping(out.stdout)
    if result["ping_loss_pct"] >= 100:
        raise MeasureError(f"{src.name} cannot reach {dst.name} at {address} (ping: 100% loss)")
    result.update(parse_iperf3(_iperf3(src, dst, address, ["-O", "1"] if duration >= 2 else [], duration),
                               udp=False))
    result.update(parse_iperf3(_iperf3(src, dst, address, ["-u", "-b", f"{udp_mbps}M"], duration), udp=True))
    return result
