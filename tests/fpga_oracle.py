"""What the FPGA tests check the shared FIB against: random route tables, a reference longest-prefix match the
obvious way, and the addresses worth probing (every prefix's ends plus random ones)."""

from __future__ import annotations

import numpy as np

from fpga_aggregate.tables import Table


def random_table(n: int, seed: int, min_length: int = 16) -> Table:
    """n distinct routes with uniformly random addresses and lengths min_length..32, any port 0-6."""
    rng = np.random.default_rng(seed)
    out: dict[tuple[int, int], tuple[int, int]] = {}
    while len(out) < n:
        length = int(rng.integers(min_length, 33))
        addr = int(rng.integers(0, 1 << 32))
        p = addr >> (32 - length) << (32 - length) if length else 0
        out.setdefault((p, length), (int(rng.integers(0, 7)), int(rng.integers(0, 2**32))))
    return [(p, length, port, nh) for (p, length), (port, nh) in out.items()]


class ReferenceLpm:
    """Longest-prefix match the obvious way (sorted keys per length, longest first), vectorised with numpy."""

    def __init__(self, routes: Table):
        arr = np.array(routes, dtype=np.int64).reshape(-1, 4)
        self.tables = []
        for length in sorted(set(arr[:, 1].tolist()), reverse=True):
            rows = arr[arr[:, 1] == length]
            keys = rows[:, 0] >> (32 - length) if length else np.zeros(len(rows), dtype=np.int64)
            order = np.argsort(keys, kind="stable")
            self.tables.append((length, keys[order], rows[order, 2].astype(np.uint8), rows[order, 3].astype(np.uint32)))

    def lookup_many(self, addresses: np.ndarray, no_route: int = 7) -> tuple[np.ndarray, np.ndarray]:
        addr = np.asarray(addresses).astype(np.int64)
        order = np.argsort(addr)  # sorted queries make each binary search cache-friendly
        srt = addr[order]
        port = np.full(addr.shape, no_route, dtype=np.uint8)
        nh = np.zeros(addr.shape, dtype=np.uint32)
        todo = np.arange(len(srt))
        for length, keys, ports, nhs in self.tables:
            if not len(todo):
                break
            k = srt[todo] >> (32 - length) if length else np.zeros(len(todo), dtype=np.int64)
            pos = np.minimum(np.searchsorted(keys, k), len(keys) - 1)
            hit = keys[pos] == k
            port[order[todo[hit]]] = ports[pos[hit]]
            nh[order[todo[hit]]] = nhs[pos[hit]]
            todo = todo[~hit]
        return port, nh


def probe_addresses(routes: Table, extra: int, seed: int) -> np.ndarray:
    """Every prefix's first and last address, plus `extra` random addresses."""
    firsts = np.array([p for p, _, _, _ in routes], dtype=np.int64)
    lasts = np.array([p | ((1 << (32 - length)) - 1) for p, length, _, _ in routes], dtype=np.int64)
    return np.concatenate([firsts, lasts, np.random.default_rng(seed).integers(0, 2**32, extra)])
