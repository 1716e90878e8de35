"""Ports for servers a test configures by number (`slicex up` reads them from slicex.yaml).

A port the kernel hands out for `bind(("127.0.0.1", 0))` is an ephemeral one: once released, any outgoing
connection on the host may take it before the server binds it, and with several pytest-xdist workers making
connections that happened. These come from below the ephemeral range instead, from a slice of it of each
worker's own, and are checked free by binding."""

from __future__ import annotations

import os
import random
import re
import socket
from pathlib import Path

_FIRST = 10000
_SLICE = 2500  # ports per worker


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _worker_range() -> range:
    index = int(re.sub(r"\D", "", os.environ.get("PYTEST_XDIST_WORKER", "")) or 0)
    low = _FIRST + index * _SLICE
    return range(low, min(low + _SLICE, _ephemeral_low()))


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(n: int, consecutive: bool = False) -> list[int]:
    """`n` distinct free ports (`consecutive`: a block, as `slicex ca init --port-base` wants)."""
    pool = _worker_range()
    rng = random.SystemRandom()
    for _ in range(500):
        if consecutive:
            start = rng.randrange(pool.start, pool.stop - n)
            ports = list(range(start, start + n))
        else:
            ports = rng.sample(pool, n)
        if all(_bindable(p) for p in ports):
            return ports
    raise RuntimeError(f"no {n} free ports in {pool.start}-{pool.stop - 1}")
