"""Route tables for benchmarks, reports and tests: BGP-like tables for several virtual routers with a chosen
overlap. (The tests' random tables and reference longest-prefix match are in tests/fpga_oracle.py.)"""

from __future__ import annotations

import numpy as np

Table = list[tuple[int, int, int, int]]  # (prefix, length, port, next hop)

BGP_LENGTHS = {8: 0.00002, 9: 0.00002, 10: 0.00004, 11: 0.0001, 12: 0.0003, 13: 0.0006, 14: 0.0012, 15: 0.002,
               16: 0.016, 17: 0.01, 18: 0.016, 19: 0.03, 20: 0.05, 21: 0.065, 22: 0.11, 23: 0.09, 24: 0.55,
               25: 0.008, 26: 0.006, 27: 0.004, 28: 0.003, 29: 0.003, 30: 0.003, 31: 0.001, 32: 0.003}
"""Share of prefixes per length, after public IPv4 BGP tables: /24 ~55%, /22-/23 ~20%, /16-/21 ~20%, the
rest shorter than /16 or (in virtual routers' own tables) longer than /24."""

UNICAST_SLASH8 = tuple(b for b in range(1, 224) if b not in (10, 127))


def bgp_like(n: int, seed: int, slash8s: tuple[int, ...] = UNICAST_SLASH8, density: float = 8.0) -> Table:
    """n distinct routes with BGP's length distribution inside the given /8s. Prefixes longer than /19 come
    in /19 blocks (an allocation split into customers' prefixes), `density` per block on average: each such
    block costs the shared FIB one 2^13-entry L2 set, so density sets the L2 bank a table needs."""
    rng = np.random.default_rng(seed)
    lengths = np.array(list(BGP_LENGTHS))
    probs = np.array(list(BGP_LENGTHS.values()))
    probs /= probs.sum()
    eights = np.array(slash8s, dtype=np.int64)
    long_share = probs[lengths > 19].sum()
    blocks = _blocks(rng, eights, max(1, int(np.ceil(n * long_share / density))))
    out: dict[tuple[int, int], tuple[int, int]] = {}
    while len(out) < n:
        batch = n - len(out) + 64
        lens = rng.choice(lengths, size=batch, p=probs)
        in_block = blocks[rng.integers(0, len(blocks), size=batch)] | rng.integers(0, 1 << 13, size=batch)
        anywhere = (eights[rng.integers(0, len(eights), size=batch)] << 24) | rng.integers(0, 1 << 24, size=batch)
        addrs = np.where(lens > 19, in_block, anywhere)
        shift = 32 - lens
        prefixes = (addrs >> shift) << shift
        ports = rng.integers(0, 4, size=batch)
        nhs = rng.integers(1, 2**32 - 1, size=batch)
        before = len(out)
        for p, length, port, nh in zip(prefixes.tolist(), lens.tolist(), ports.tolist(), nhs.tolist(), strict=True):
            if len(out) >= n:
                break
            out.setdefault((p, length), (port, nh))
        if len(out) - before < batch // 10:  # the blocks are full: spread over more of them
            blocks = np.concatenate([blocks, _blocks(rng, eights, len(blocks))])
    return [(p, length, port, nh) for (p, length), (port, nh) in out.items()]


def _blocks(rng: np.random.Generator, eights: np.ndarray, count: int) -> np.ndarray:
    """`count` /19 block addresses inside the given /8s (2048 blocks per /8)."""
    picks = rng.choice(len(eights) * 2048, size=min(count, len(eights) * 2048), replace=False)
    return (eights[picks // 2048] << 24) | ((picks % 2048) << 13)


def virtual_router_tables(per_router: int, routers: int = 4, overlap: float = 0.13, seed: int = 0,
                          density: float = 8.0) -> list[Table]:
    """BGP-like tables for `routers` virtual routers, `overlap` of each table's prefixes shared with all the
    others (same destination, each router its own next hop), the rest in address space only that router
    routes. With these tables the FIB's measured overlap (prefixes with an L1 location another router
    needs) equals `overlap`, so reports can be run at the 12-15% DESIGN §8 quotes."""
    groups = [tuple(b for i, b in enumerate(UNICAST_SLASH8) if i % (routers + 1) == g) for g in range(routers + 1)]
    shared = bgp_like(int(per_router * overlap), seed, groups[routers], density) if overlap > 0 else []
    rng = np.random.default_rng(seed + 1000)
    tables = []
    for v in range(routers):
        own = bgp_like(per_router - len(shared), seed + 1 + v, groups[v], density)
        ports = rng.integers(0, 4, size=len(shared)).tolist()
        nhs = rng.integers(1, 2**32 - 1, size=len(shared)).tolist()
        tables.append(own + [(p, length, port, nh) for (p, length, _, _), port, nh in zip(shared, ports, nhs, strict=True)])
    return tables
