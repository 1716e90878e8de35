"""The overlay (federation/overlay) across lab hosts: a node namespace "on" a lab host (its tap made by the
router running in that host), and a cluster's virtual router process started inside a host, listening on the
host's address and claiming on the operator's Redis through the lab's relay. Shared by the cross-host tests
and bench/overlay.py."""

from __future__ import annotations

import json
import select
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from authority.substrate import hostnet
from lab import LabHost


def node_namespace(host: LabHost, node: str) -> str:
    """A node's namespace, named under its host's (the lab removes it with the host)."""
    return f"{host.namespace}-{node}"


def add_node(host: LabHost, node: str) -> str:
    ns = node_namespace(host, node)
    hostnet.add_namespace(ns, node)
    return ns


def node_mac(host: LabHost, node: str) -> str:
    """A locally administered MAC from the host's address and the node's name (unique within a lab)."""
    last = int(host.address.rsplit(".", 1)[1])
    return f"02:5a:{last:02x}:{sum(node.encode()) & 0xFF:02x}:{len(node):02x}:{ord(node[-1]):02x}"


@dataclass
class RouterProcess:
    proc: subprocess.Popen
    log: Path
    endpoint: str
    nodes: dict[str, str]  # node -> claimed overlay address
    dataplane: str  # what the router chose: offload or plain

    def stats(self) -> dict:
        self.proc.send_signal(signal.SIGUSR1)
        return _line(self.proc, self.log, 5)

    def stop(self) -> int:
        return stop_router(self.proc)


def stop_router(proc: subprocess.Popen) -> int:
    """A router process's exit status once it is gone: asked to stop (on SIGTERM it releases its nodes'
    claims), killed if it has not within 10 s."""
    if proc.poll() is None:
        proc.terminate()
    try:
        return proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def _line(proc: subprocess.Popen, log: Path, timeout: float) -> dict:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else ""
    if not line:
        proc.kill()
        raise RuntimeError(f"overlay router gave no line in {timeout:.0f} s (exit {proc.poll()}): "
                           f"{log.read_text()[-2000:]}")
    return json.loads(line)


def start_router(host: LabHost, prefix: str, namespace: str, cluster: str, nodes: dict[str, str | None],
                 advertise: str | None = None, dataplane: str = "auto",
                 rate_kbps: int | None = None) -> RouterProcess:
    """The cluster's router inside `host` on its address (an ephemeral UDP port), serving `nodes` (node ->
    preferred overlay address or None) whose namespaces add_node made. `advertise`: see the router's
    --advertise (behind a NAT, the NAT host's address); `dataplane`: its --dataplane (auto, offload, plain);
    `rate_kbps`: the link's capacity on what each of these nodes sends (a token bucket on its tap)."""
    if host.redis_url is None:
        raise RuntimeError("the lab was made without a Redis relay (running(spec, redis_url))")
    argv = [sys.executable, "-m", "federation.overlay", "--redis", host.redis_url, "--prefix", prefix, "router",
            namespace, "--cluster", cluster, "--listen", f"{host.address}:0",
            "--dataplane", dataplane]
    if advertise:
        argv += ["--advertise", advertise]
    for n, address in nodes.items():
        spec = f"id={n},netns={node_namespace(host, n)},tap=ov{n},mac={node_mac(host, n)}"
        spec += f",rate={rate_kbps}" if rate_kbps else ""
        argv += ["--node", spec + (f",address={address}" if address else "")]
    log = host.lab_dir / f"router-{host.name}-{cluster}.log"  # goes with the lab
    with open(log, "ab") as err:
        proc = host.popen(argv, stdout=subprocess.PIPE, stderr=err, text=True)
    ready = _line(proc, log, 30)
    return RouterProcess(proc, log, ready["endpoint"], ready["nodes"], ready["dataplane"])
