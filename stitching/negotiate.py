"""Path computation and VLAN tag negotiation for stitched links (DESIGN §6). Pure: plain data in, plain data
out; the time is an argument; nothing here touches a network, a store or a clock.

A path from aggregate A0 to Ak crosses cables e0..e(k-1); cable ei joins port out_i (on Ai) to in_i+1 (on
Ai+1), and its tag must lie in both ports' ranges. Inside a transit aggregate the tag stays the same unless
one of its two ports translates: a run of non-translating hops shares one tag (the intersection of their
ranges, picked by the run's first hop — the producer — and imported by the rest), and a translating hop
splits the run. Where no plain assignment exists, one Q-in-Q tunnel may be used: a port out_a that pushes
an 802.1ad S-tag (from its S-tag range) and a port in_b+1 that pops it; the cables between carry the S-tag
(runs as above, so a transit that cannot carry the customer's tag still carries the link) and the
customer's C-tag rides inside, constrained by the two tunnel ports' 802.1Q ranges and by the runs it joins
on either side. Several links are reserved all-or-nothing: a failure returns the book unchanged."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from stitching.model import Port, StitchingError, Topology, authority_of, format_vlans

WIRE, STAG = "wire", "s-tag"  # 802.1Q (C) tag space and 802.1ad S-tag space of a port
MAX_CANDIDATE_PATHS = 64  # simple paths tried per link, cheapest first, before giving up


@dataclass(frozen=True)
class LinkRequest:
    """One stitched link between two aggregates. `excluded` maps a port URN to the tags it must not use
    (None: the port must not be used at all) — geni_routing_profile's hop_exclusion_list."""

    link_id: str
    a: str
    b: str
    capacity_kbps: int = 0
    excluded: Mapping[str, frozenset[int] | None] = field(default_factory=dict)
    allow_qinq: bool = True


@dataclass(frozen=True)
class Hop:
    """One port on the chosen path with the tag on its wire. `imports` is the earlier hop (index) whose tag
    this one takes (None: it picks — a producer); `available` the run's range left to pick from."""

    port: Port
    tag: int
    available: frozenset[int]
    imports: int | None
    translation: bool
    qinq: str = ""  # "push" (S-tag pushed toward the far end) | "pop" | ""


@dataclass(frozen=True)
class Tunnel:
    c_tag: int
    s_first: int  # index of the first tunnelled cable
    s_last: int
    c_available: frozenset[int] = frozenset()


@dataclass(frozen=True)
class PathPlan:
    link_id: str
    hops: tuple[Hop, ...]
    capacity_kbps: int
    tunnel: Tunnel | None = None
    held: tuple[tuple[str, str, int], ...] = ()  # (port, space, tag): every tag this path occupies

    @property
    def aggregates(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(h.port.aggregate for h in self.hops))


# ---- what is held ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Hold:
    id: str
    link_id: str
    tags: tuple[tuple[str, str, int], ...]
    kbps: tuple[tuple[str, int], ...]
    end: datetime


@dataclass(frozen=True)
class Book:
    """Every tag and every kbps held on the topology's ports, by hold. Immutable: operations return a new Book,
    so a failed reservation leaves the caller's Book exactly as it was."""

    holds: Mapping[str, Hold] = field(default_factory=dict)

    def used_tags(self, now: datetime) -> dict[tuple[str, str], set[int]]:
        out: dict[tuple[str, str], set[int]] = {}
        for h in self.holds.values():
            if h.end > now:
                for port, space, tag in h.tags:
                    out.setdefault((port, space), set()).add(tag)
        return out

    def used_kbps(self, now: datetime) -> dict[str, int]:
        out: dict[str, int] = {}
        for h in self.holds.values():
            if h.end > now:
                for port, kbps in h.kbps:
                    out[port] = out.get(port, 0) + kbps
        return out

    def with_holds(self, holds: Iterable[Hold]) -> Book:
        new = dict(self.holds)
        for h in holds:
            if h.id in new:
                raise StitchingError(f"hold {h.id} exists already", "args", h.link_id)
            new[h.id] = h
        return Book(new)

    def release(self, ids: Iterable[str]) -> Book:
        """The book without these holds (unknown ids are ignored: releasing twice is harmless)."""
        gone = set(ids)
        return Book({k: v for k, v in self.holds.items() if k not in gone})

    def expire(self, now: datetime) -> Book:
        return Book({k: v for k, v in self.holds.items() if v.end > now})


# ---- paths -----------------------------------------------------------------------------------------------

def candidate_paths(topo: Topology, a: str, b: str, usable=lambda port: True,
                    limit: int = MAX_CANDIDATE_PATHS) -> list[tuple[tuple[Port, Port], ...]]:
    return list(iter_paths(topo, a, b, usable, limit))


def iter_paths(topo: Topology, a: str, b: str, usable=lambda port: True,
               limit: int = MAX_CANDIDATE_PATHS) -> Iterator[tuple[tuple[Port, Port], ...]]:
    """Simple paths (no aggregate twice: geni-tools #784) from a to b as cable lists, cheapest first by summed
    TE metric then hop count; at most `limit`. `usable(port)` filters ports (exclusions, capacity)."""
    src, dst = authority_of(a), authority_of(b)
    found = 0
    heap: list[tuple[int, int, int, str, tuple[str, ...], tuple[tuple[Port, Port], ...]]] = [(0, 0, 0, src, (src,), ())]
    counter = 1
    popped: dict[str, int] = {}  # each aggregate expanded at most `limit` times (k-shortest walks' bound)
    while heap and found < limit:
        cost, length, _, here, seen, cables = heapq.heappop(heap)
        if popped.get(here, 0) >= limit:
            continue
        popped[here] = popped.get(here, 0) + 1
        if here == dst and cables:
            found += 1
            yield cables
            continue
        for own, far in topo.cables_from(here):
            nxt = authority_of(far.aggregate)
            if nxt in seen or not usable(own) or not usable(far):
                continue
            heapq.heappush(heap, (cost + own.metric + far.metric, length + 1, counter, nxt, seen + (nxt,),
                                  cables + ((own, far),)))
            counter += 1


# ---- tags along one path -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Segment:
    """One tag to choose and where it is held: on a cable (each end's 802.1Q space, or S-tag space at a
    tunnel's pushing/popping end) or the C-tag (the 802.1Q space of the tunnel's two end ports)."""

    keys: tuple[tuple[Port, str], ...]


def _range(port: Port, space: str) -> frozenset[int]:
    return port.s_vlans if space == STAG else port.vlans


def _free(port: Port, space: str, used: Mapping[tuple[str, str], set[int]],
          excluded: Mapping[str, frozenset[int] | None]) -> frozenset[int]:
    return _range(port, space) - used.get((port.urn, space), set()) - (excluded.get(port.urn) or frozenset())


def _chain(cables: tuple[tuple[Port, Port], ...], tunnel: tuple[int, int] | None
           ) -> tuple[list[_Segment], list[tuple[int, int]]]:
    """The tags to choose along a path (one per cable, plus the C-tag with a tunnel) and which of them must
    be equal (the runs). Segment i is cable i; the C-tag, if any, is the last."""
    k = len(cables)
    a, b = tunnel if tunnel is not None else (-1, -1)
    segs = [_Segment(((out, STAG if i == a else WIRE), (inn, STAG if i == b else WIRE)))
            for i, (out, inn) in enumerate(cables)]
    equal: list[tuple[int, int]] = []

    def translates(i: int) -> bool:  # transit aggregate A_i may change the tag between cable i-1 and cable i
        return cables[i - 1][1].translation or cables[i][0].translation

    if tunnel is None:
        return segs, [(i - 1, i) for i in range(1, k) if not translates(i)]
    c = len(segs)
    segs.append(_Segment(((cables[a][0], WIRE), (cables[b][1], WIRE))))
    for i in range(1, k):
        if (i <= a - 1 or i >= b + 2 or a < i <= b) and not translates(i):  # both outside, or both inside
            equal.append((i - 1, i))
    if a > 0 and not translates(a):  # the tag arriving at the pushing aggregate becomes the C-tag
        equal.append((a - 1, c))
    if b + 1 < k and not translates(b + 1):  # the C-tag leaves the popping aggregate on the next cable
        equal.append((c, b + 1))
    return segs, equal


def _runs(n: int, equal: list[tuple[int, int]]) -> list[list[int]]:
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for x, y in equal:
        parent[find(x)] = find(y)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(find(i), []).append(i)
    return sorted(groups.values())


def _why(run: list[int], segs: list[_Segment], used: Mapping[tuple[str, str], set[int]],
         excluded: Mapping[str, frozenset[int] | None]) -> str:
    parts = []
    for s in run:
        for port, space in segs[s].keys:
            rng = _range(port, space)
            held = used.get((port.urn, space), set()) & rng
            ex = (excluded.get(port.urn) or frozenset()) & rng
            note = "".join([f", {len(held)} held" if held else "", f", {format_vlans(ex)} excluded" if ex else ""])
            parts.append(f"{port.urn}{' S-tags' if space == STAG else ''} {format_vlans(rng) or 'none'}{note}")
    return "no tag is free on every hop of the run " + "; ".join(dict.fromkeys(parts))


def _plan(req: LinkRequest, cables: tuple[tuple[Port, Port], ...], tunnel: tuple[int, int] | None,
          used: Mapping[tuple[str, str], set[int]]) -> PathPlan | str:
    """Tags for one path (each run takes the lowest tag free on all its hops), or why there are none."""
    segs, equal = _chain(cables, tunnel)
    runs = _runs(len(segs), equal)
    tags = [0] * len(segs)
    avail: list[frozenset[int]] = [frozenset()] * len(segs)
    for run in runs:
        common = frozenset.intersection(*(_free(p, sp, used, req.excluded) for s in run for p, sp in segs[s].keys))
        if not common:
            return _why(run, segs, used, req.excluded)
        for s in run:
            tags[s], avail[s] = min(common), common
    run_of = {s: i for i, run in enumerate(runs) for s in run}
    hops: list[Hop] = []
    producer_of_run: dict[int, int] = {}
    for i, (out, inn) in enumerate(cables):
        for port, role in ((out, "push" if tunnel and i == tunnel[0] else ""),
                           (inn, "pop" if tunnel and i == tunnel[1] else "")):
            producer = producer_of_run.setdefault(run_of[i], len(hops))
            hops.append(Hop(port, tags[i], avail[i], None if producer == len(hops) else producer,
                            port.translation or bool(role), role))
    held = tuple(dict.fromkeys((p.urn, sp, tags[s]) for s, seg in enumerate(segs) for p, sp in seg.keys))
    t = None if tunnel is None else Tunnel(tags[-1], tunnel[0], tunnel[1], avail[-1])
    return PathPlan(req.link_id, tuple(hops), req.capacity_kbps, t, held)


def tunnels(cables: tuple[tuple[Port, Port], ...]) -> list[tuple[int, int]]:
    """Every (first, last) cable span a Q-in-Q tunnel could cover: a pushing port at its start and a popping
    port at its end; widest first (the S-tag over the whole transit, the C-tag at the edges)."""
    k = len(cables)
    spans = [(a, b) for a in range(k) for b in range(a, k) if cables[a][0].qinq and cables[b][1].qinq]
    return sorted(spans, key=lambda s: (s[0] - s[1], s[0]))


def plan_link(topo: Topology, req: LinkRequest, used: Mapping[tuple[str, str], set[int]],
              used_kbps: Mapping[str, int]) -> PathPlan:
    """The cheapest path whose tags negotiate: plain (with translation) on any candidate path first, then
    Q-in-Q; raises StitchingError with the reason of the best candidate otherwise."""
    if authority_of(req.a) == authority_of(req.b):
        raise StitchingError(f"link {req.link_id}: both ends are at {req.a}; nothing to stitch", "args", req.link_id)
    for end in (req.a, req.b):
        if topo.aggregate(end) is None:
            raise StitchingError(f"link {req.link_id}: aggregate {end} is not in the stitching topology (known: "
                                 f"{', '.join(sorted(topo.aggregates)) or 'none'})", "path", req.link_id)

    def allowed(port: Port) -> bool:
        return not (port.urn in req.excluded and req.excluded[port.urn] is None)

    def fits(port: Port) -> bool:
        return allowed(port) and port.capacity_kbps - used_kbps.get(port.urn, 0) >= req.capacity_kbps

    paths: list[tuple[tuple[Port, Port], ...]] = []
    first_reason = ""
    for cables in iter_paths(topo, req.a, req.b, fits):  # lazily: the cheapest path usually negotiates
        paths.append(cables)
        got = _plan(req, cables, None, used)
        if isinstance(got, PathPlan):
            return got
        first_reason = first_reason or got
    if not paths:
        if candidate_paths(topo, req.a, req.b, allowed, 1):
            raise StitchingError(
                f"link {req.link_id}: no path from {req.a} to {req.b} has {req.capacity_kbps} kbps free on every "
                f"port", "bandwidth", req.link_id)
        raise StitchingError(f"link {req.link_id}: no path from {req.a} to {req.b} in the topology"
                             f"{' without the excluded hops' if req.excluded else ''}", "path", req.link_id)
    if req.allow_qinq:
        for cables in paths:
            for span in tunnels(cables):
                got = _plan(req, cables, span, used)
                if isinstance(got, PathPlan):
                    return got
    via = " - ".join(authority_of(c[0].aggregate) for c in paths[0]) + " - " + authority_of(paths[0][-1][1].aggregate)
    raise StitchingError(f"link {req.link_id}: no VLAN tag works on any of {len(paths)} path(s) "
                         f"{'(plain, translated or Q-in-Q)' if req.allow_qinq else '(plain or translated)'}; "
                         f"on the cheapest ({via}): {first_reason}", "vlan", req.link_id)


def reserve(topo: Topology, book: Book, requests: Iterable[LinkRequest], now: datetime, end: datetime,
            hold_prefix: str) -> tuple[Book, list[PathPlan]]:
    """Plan and hold every link or none: on any failure StitchingError is raised and `book` (immutable) is
    untouched; earlier links' tags never leak. Later links see the tags earlier ones took (no tag twice on a
    port, so no two paths get one tag through a shared hop: geni-tools #802)."""
    if end <= now:
        raise StitchingError(f"hold would end at {end:%Y-%m-%dT%H:%M:%SZ}, not after now", "args")
    used = book.used_tags(now)
    kbps = book.used_kbps(now)
    plans: list[PathPlan] = []
    holds: list[Hold] = []
    for n, req in enumerate(requests):
        p = plan_link(topo, req, used, kbps)
        tags = p.held
        for port, space, tag in tags:
            used.setdefault((port, space), set()).add(tag)
        bw = tuple((h.port.urn, req.capacity_kbps) for h in p.hops) if req.capacity_kbps else ()
        for port, k in bw:
            kbps[port] = kbps.get(port, 0) + k
        plans.append(p)
        holds.append(Hold(f"{hold_prefix}:{n}", req.link_id, tags, bw, end))
    return book.with_holds(holds), plans


def with_exclusions(req: LinkRequest, extra: Mapping[str, frozenset[int] | None]) -> LinkRequest:
    """`req` also excluding `extra` (tags add up; a whole-port exclusion wins)."""
    merged: dict[str, frozenset[int] | None] = dict(req.excluded)
    for port, tags in extra.items():
        if tags is None or merged.get(port, frozenset()) is None:
            merged[port] = None
        else:
            merged[port] = (merged.get(port) or frozenset()) | tags
    return replace(req, excluded=merged)


class SharedBook:
    """A Book shared by threads (one process's path service or SDK): plans are computed outside the lock on
    a snapshot and committed only if no one committed in between, else planned again (optimistic, so slow
    path searches do not serialise each other). The only edge in this module: it holds state."""

    def __init__(self, topo: Topology, book: Book | None = None):
        import threading

        self.topo = topo
        self._book = book or Book()
        self._lock = threading.Lock()
        self._serial = 0

    @property
    def book(self) -> Book:
        return self._book

    def reserve(self, requests: list[LinkRequest], now: datetime, end: datetime, hold_prefix: str,
                retries: int = 1000) -> list[PathPlan]:
        for _ in range(retries):
            with self._lock:
                snapshot, serial = self._book, self._serial
            new, plans = reserve(self.topo, snapshot, requests, now, end, hold_prefix)  # raises: nothing held
            with self._lock:
                if self._serial == serial:
                    self._book, self._serial = new, serial + 1
                    return plans
        raise StitchingError(f"{hold_prefix}: the book changed under this request {retries} times in a row; "
                             f"try again", "args")

    def release(self, ids: Iterable[str]) -> None:
        with self._lock:
            self._book, self._serial = self._book.release(ids), self._serial + 1
