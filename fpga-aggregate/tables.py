"""Route tables for tests and benchmarks: random and BGP-like, and a reference longest-prefix match."""

from __future__ import annotations

import numpy as np

# Share of prefixes per length in a BGP-like table (peaks at /24, as public BGP tables do).
BGP_LENGTHS = {8: 0.00002, 9: 0.00002, 10: 0.00005, 11: 0.00012, 12: 0.0004, 13: 0.0007, 14: 0.0015,
               15: 0.0026, 16: 0.016, 17: 0.01, 18: 0.017, 19: 0.031, 20: 0.054, 21: 0.06, 22: 0.14, 23: 0.1,
               24: 0.565}
"""Share of prefixes per length, after public IPv4 BGP tables (the /24 peak, few short prefixes)."""


def bgp_like(n: int, seed: int, regions: int | None = None, shared: list[tuple[int, int]] | None = None,
             overlap: float = 0.0) -> list[tuple[int, int, int, int]]:
    """n (prefix, length, port, next hop) routes. Long prefixes cluster in /16 regions like real allocations;
    `overlap` of them are taken from `shared` (another router's table)."""
    rng = np.random.default_rng(seed)
    lengths = np.array(list(BGP_LENGTHS))
    probs = np.array(list(BGP_LENGTHS.values()))
    probs = probs / probs.sum()
    regions = regions or max(16, n // 60)
    bases = rng.integers(1 << 13, (1 << 19) - 1, size=regions, dtype=np.int64) << 13  # /19 blocks
    out: dict[tuple[int, int], tuple[int, int]] = {}
    if shared and overlap:
        picks = rng.choice(len(shared), size=min(len(shared), int(n * overlap)), replace=False)
        for k in picks:
            p, length = shared[k]
            out[(p, length)] = (int(rng.integers(0, 4)), int(rng.integers(1, 2**32 - 1)))
    while len(out) < n:
        batch = n - len(out) + 64
        lens = rng.choice(lengths, size=batch, p=probs)
        region = bases[rng.integers(0, regions, size=batch)] | rng.integers(0, 1 << 13, size=batch)
        anywhere = rng.integers(1 << 24, 1 << 32, size=batch, dtype=np.int64)
        addrs = np.where(lens > 19, region, anywhere)
        shift = 32 - lens
        prefixes = (addrs >> shift) << shift
        ports = rng.integers(0, 4, size=batch)
        nhs = rng.integers(1, 2**32 - 1, size=batch)
        for p, length, port, nh in zip(prefixes.tolist(), lens.tolist(), ports.tolist(), nhs.tolist(), strict=True):
            if len(out) >= n:
                break
            out.setdefault((p, length), (port, nh))
    return [(p, length, port, nh) for (p, length), (port, nh) in out.items()]


def random_table(n: int, seed: int) -> list[tuple[int, int, int, int]]:
    rng = np.random.default_rng(seed)
    out: dict[tuple[int, int], tuple[int, int]] = {}
    while len(out) < n:
        length = int(rng.integers(16, 33))  # short prefixes each claim many shared L1 locations
        addr = int(rng.integers(0, 1 << 32))
        p = addr >> (32 - length) << (32 - length)
        out.setdefault((p, length), (int(rng.integers(0, 7)), int(rng.integers(0, 2**32))))
    return [(p, length, port, nh) for (p, length), (port, nh) in out.items()]


class ReferenceLpm:
    """Longest-prefix match the obvious way (sorted keys per length), vectorised with numpy."""

    def __init__(self, routes: list[tuple[int, int, int, int]]):
        by_len: dict[int, dict[int, tuple[int, int]]] = {}
        for p, length, port, nh in routes:
            by_len.setdefault(length, {})[p >> (32 - length) if length else 0] = (port, nh)
        self.tables = []
        for length in sorted(by_len, reverse=True):
            keys = np.array(sorted(by_len[length]), dtype=np.int64)
            vals = [by_len[length][int(k)] for k in keys]
            self.tables.append((length, keys, np.array([v[0] for v in vals], dtype=np.uint8),
                                np.array([v[1] for v in vals], dtype=np.uint32)))

    def lookup_many(self, addresses: np.ndarray, no_route: int = 7) -> tuple[np.ndarray, np.ndarray]:
        addr = addresses.astype(np.int64)
        port = np.full(addr.shape, no_route, dtype=np.uint8)
        nh = np.zeros(addr.shape, dtype=np.uint32)
        done = np.zeros(addr.shape, dtype=bool)
        for length, keys, ports, nhs in self.tables:
            k = addr >> (32 - length) if length else np.zeros_like(addr)
            pos = np.clip(np.searchsorted(keys, k), 0, len(keys) - 1)
            hit = (keys[pos] == k) & ~done
            port[hit] = ports[pos[hit]]
            nh[hit] = nhs[pos[hit]]
            done |= hit
        return port, nh
