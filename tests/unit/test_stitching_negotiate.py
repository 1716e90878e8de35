"""Path computation and tag negotiation (stitching/negotiate.py): worked cases, then properties over random
topologies checked against a brute-force oracle written straight from the constraints."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stitching.model import Aggregate, Port, StitchingError, Topology, authority_of
from stitching.negotiate import (
    STAG,
    WIRE,
    Book,
    LinkRequest,
    PathPlan,
    plan_link,
    reserve,
    tunnels,
)

NOW = datetime(2030, 1, 1, tzinfo=UTC)
END = NOW + timedelta(hours=1)


def agg(name: str) -> str:
    return f"urn:publicid:IDN+{name}+authority+am"


def port(a: str, b: str, n: int = 0) -> str:
    return f"urn:publicid:IDN+{a}+interface+sw:to-{b}{'' if n == 0 else n}"


def cable(a: str, b: str, va, vb=None, *, ta=False, tb=False, qa=False, qb=False, sa=frozenset(),
          sb=frozenset(), cap=1000, n=0) -> list[Port]:
    """Two ports joined by a cable from aggregate a to aggregate b (sa/sb: S-tag ranges of Q-in-Q ends)."""
    vb = va if vb is None else vb
    return [Port(port(a, b, n), agg(a), port(b, a, n), frozenset(va), ta, qa, frozenset(sa), cap),
            Port(port(b, a, n), agg(b), port(a, b, n), frozenset(vb), tb, qb, frozenset(sb), cap)]


def topo(names, *cables) -> Topology:
    return Topology.build([Aggregate(agg(n), f"https://{n}/") for n in names], [p for c in cables for p in c])


def test_two_aggregates_share_the_lowest_common_tag_and_the_consumer_imports():
    t = topo("ab", cable("a", "b", range(100, 111), range(105, 120)))
    p = plan_link(t, LinkRequest("l", agg("a"), agg("b")), {}, {})
    assert [h.tag for h in p.hops] == [105, 105]
    assert [h.imports for h in p.hops] == [None, 0]
    assert p.hops[0].available == frozenset(range(105, 111))


def test_translating_transit_splits_the_run():
    t = topo("atb", cable("a", "t", {10}), cable("t", "b", {20}, ta=True))
    p = plan_link(t, LinkRequest("l", agg("a"), agg("b")), {}, {})
    assert [h.tag for h in p.hops] == [10, 10, 20, 20]
    assert [h.imports for h in p.hops] == [None, 0, None, 2]


def test_without_translation_or_qinq_no_common_tag_is_vlan_unavailable_with_ranges_named():
    t = topo("atb", cable("a", "t", {10}), cable("t", "b", {20}))
    with pytest.raises(StitchingError) as err:
        plan_link(t, LinkRequest("l", agg("a"), agg("b")), {}, {})
    assert err.value.kind == "vlan" and "10" in err.value.message and "20" in err.value.message


def test_qinq_carries_the_c_tag_inside_an_s_tag_over_a_transit_that_cannot_carry_it():
    # the edges use 100-101 (802.1Q), the transit carries only 3000; the edge ports push/pop S-tag 3000
    t = topo("atb", cable("a", "t", {100, 101}, {3000}, qa=True, sa={3000}),
             cable("t", "b", {3000}, {100}, qb=True, sb={3000, 3001}))
    p = plan_link(t, LinkRequest("l", agg("a"), agg("b")), {}, {})
    assert p.tunnel is not None and p.tunnel.c_tag == 100
    assert [h.tag for h in p.hops] == [3000] * 4
    assert [h.qinq for h in p.hops] == ["push", "", "", "pop"]
    assert {(port("a", "t"), STAG, 3000), (port("a", "t"), WIRE, 100), (port("b", "t"), WIRE, 100)} <= set(p.held)


def test_qinq_is_only_a_fallback():
    t = topo("ab", cable("a", "b", {5}, qa=True, qb=True, sa={7}, sb={7}))
    assert plan_link(t, LinkRequest("l", agg("a"), agg("b")), {}, {}).tunnel is None


def test_excluded_tags_and_hops_are_avoided():
    t = topo("ab", cable("a", "b", {1, 2}), cable("a", "b", {3}, n=1))
    first = port("a", "b")
    p = plan_link(t, LinkRequest("l", agg("a"), agg("b"), excluded={first: frozenset({1})}), {}, {})
    assert (p.hops[0].port.urn, p.hops[0].tag) == (first, 2)
    p = plan_link(t, LinkRequest("l", agg("a"), agg("b"), excluded={first: None}), {}, {})
    assert (p.hops[0].port.urn, p.hops[0].tag) == (port("a", "b", 1), 3)


def test_capacity_short_everywhere_is_insufficient_bandwidth():
    t = topo("ab", cable("a", "b", {1}, cap=100))
    with pytest.raises(StitchingError) as err:
        plan_link(t, LinkRequest("l", agg("a"), agg("b"), capacity_kbps=200), {}, {})
    assert err.value.kind == "bandwidth"


def test_unknown_aggregate_is_a_path_error_naming_the_known_ones():
    with pytest.raises(StitchingError, match="not in the stitching topology") as err:
        plan_link(topo("ab", cable("a", "b", {1})), LinkRequest("l", agg("a"), agg("zz")), {}, {})
    assert err.value.kind == "path"


def test_reserve_is_all_or_nothing_and_release_restores_the_book():
    t = topo("ab", cable("a", "b", {1, 2}))
    book, plans = reserve(t, Book(), [LinkRequest("x", agg("a"), agg("b"))], NOW, END, "h1")
    assert plans[0].hops[0].tag == 1
    with pytest.raises(StitchingError):
        reserve(t, book, [LinkRequest(f"l{i}", agg("a"), agg("b")) for i in range(2)], NOW, END, "h2")
    assert book.used_tags(NOW) == {(port("a", "b"), WIRE): {1}, (port("b", "a"), WIRE): {1}}
    assert book.release(["h1:0"]).used_tags(NOW) == {}


def test_holds_lapse_at_their_end():
    t = topo("ab", cable("a", "b", {1}))
    book, _ = reserve(t, Book(), [LinkRequest("x", agg("a"), agg("b"))], NOW, END, "h")
    with pytest.raises(StitchingError):
        reserve(t, book, [LinkRequest("y", agg("a"), agg("b"))], NOW, END, "g")
    book2, plans = reserve(t, book, [LinkRequest("y", agg("a"), agg("b"))], END, END + timedelta(1), "g")
    assert plans[0].hops[0].tag == 1 and book.expire(END).holds == {}


# ---- properties ---------------------------------------------------------------------------------------------

TAGS = range(1, 6)
NAMES = "abcd"


@st.composite
def topologies(draw):
    names = NAMES[: draw(st.integers(2, 4))]
    pairs = [(x, y) for x, y in itertools.combinations(names, 2)]
    chosen = draw(st.lists(st.sampled_from(pairs), min_size=1, max_size=5))
    cables = []
    seen: dict[tuple[str, str], int] = {}
    for x, y in chosen:
        n = seen[(x, y)] = seen.get((x, y), -1) + 1
        tags = st.frozensets(st.sampled_from(TAGS), max_size=4)
        cables.append(cable(x, y, draw(tags), draw(tags), ta=draw(st.booleans()), tb=draw(st.booleans()),
                            qa=draw(st.booleans()), qb=draw(st.booleans()), sa=draw(tags), sb=draw(tags),
                            cap=draw(st.sampled_from([50, 100])), n=n))
    return topo(names, *cables), names


def _simple_paths(t: Topology, a: str, b: str, usable):
    """Every simple aggregate path as cable lists, by plain depth-first search (the oracle's own)."""
    out = []

    def walk(here, seen, cables):
        if here == authority_of(b) and cables:
            out.append(tuple(cables))
            return
        for p in t.ports.values():
            far = t.ports.get(p.remote)
            if authority_of(p.aggregate) != here or far is None or far.remote != p.urn:
                continue
            nxt = authority_of(far.aggregate)
            if nxt in seen or not usable(p) or not usable(far):
                continue
            walk(nxt, seen | {nxt}, cables + [(p, far)])

    walk(authority_of(a), {authority_of(a)}, [])
    return out


def _ok(p: Port, space: str, tag: int, used, excluded) -> bool:
    rng = p.vlans if space == WIRE else p.s_vlans
    return tag in rng and tag not in used.get((p.urn, space), set()) and tag not in (excluded.get(p.urn) or ())


def _valid(cables, tunnel, wire, c, used, excluded) -> bool:
    """The constraints, written out directly: each cable's tag fits both ports (the S-tag range at a tunnel's
    pushing and popping port); a transit aggregate keeps the tag unless a port of it translates; the C-tag
    fits both tunnel ends' 802.1Q ranges and continues the tags around the tunnel."""
    k = len(cables)
    a, b = tunnel if tunnel is not None else (-1, -1)
    if not all(_ok(o, STAG if n == a else WIRE, t, used, excluded) and _ok(i, STAG if n == b else WIRE, t, used,
                                                                            excluded)
               for n, ((o, i), t) in enumerate(zip(cables, wire, strict=True))):
        return False

    def same_or_translated(i, x, y):  # aggregate i sits between tag x and tag y
        return x == y or cables[i - 1][1].translation or cables[i][0].translation

    if tunnel is None:
        return all(same_or_translated(i, wire[i - 1], wire[i]) for i in range(1, k))
    push, pop = cables[a][0], cables[b][1]
    if not (push.qinq and pop.qinq and _ok(push, WIRE, c, used, excluded) and _ok(pop, WIRE, c, used, excluded)):
        return False
    for i in range(1, k):
        if i == a:
            if not same_or_translated(i, wire[i - 1], c):
                return False
        elif i == b + 1:
            if not same_or_translated(i, c, wire[i]):
                return False
        elif not same_or_translated(i, wire[i - 1], wire[i]):
            return False
    return True


def oracle(t: Topology, req: LinkRequest, used, kbps) -> bool:
    def fits(p):
        return not (p.urn in req.excluded and req.excluded[p.urn] is None) and \
            p.capacity_kbps - kbps.get(p.urn, 0) >= req.capacity_kbps

    for cables in _simple_paths(t, req.a, req.b, fits):
        spans = [None] + [(a, b) for a in range(len(cables)) for b in range(a, len(cables))]
        for span in spans:
            for wire in itertools.product(TAGS, repeat=len(cables)):
                for c in (TAGS if span else [0]):
                    if _valid(cables, span, wire, c, used, excluded=req.excluded):
                        return True
    return False


def _plan_is_valid(p: PathPlan, used, excluded) -> bool:
    cables = tuple((p.hops[i].port, p.hops[i + 1].port) for i in range(0, len(p.hops), 2))
    wire = [p.hops[i].tag for i in range(0, len(p.hops), 2)]
    if any(p.hops[i].tag != p.hops[i + 1].tag for i in range(0, len(p.hops), 2)):
        return False
    span = None if p.tunnel is None else (p.tunnel.s_first, p.tunnel.s_last)
    return _valid(cables, span, wire, p.tunnel.c_tag if p.tunnel else 0, used, excluded)


@st.composite
def situations(draw):
    t, names = draw(topologies())
    a, b = draw(st.sampled_from(list(itertools.permutations(names, 2))))
    ports = sorted(t.ports)
    used = {(pt, sp): set(draw(st.frozensets(st.sampled_from(TAGS), max_size=2)))
            for pt in draw(st.lists(st.sampled_from(ports), max_size=3)) for sp in (WIRE, STAG)}
    excluded = {pt: draw(st.one_of(st.none(), st.frozensets(st.sampled_from(TAGS), max_size=2)))
                for pt in draw(st.lists(st.sampled_from(ports), max_size=2))}
    req = LinkRequest("l", agg(a), agg(b), draw(st.sampled_from([0, 60])), excluded)
    kbps = {pt: draw(st.sampled_from([0, 50])) for pt in draw(st.lists(st.sampled_from(ports), max_size=2))}
    return t, req, used, kbps


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(situations())
def test_a_solution_is_found_iff_one_exists_and_it_satisfies_every_constraint(s):
    t, req, used, kbps = s
    exists = oracle(t, req, used, kbps)
    try:
        p = plan_link(t, req, used, kbps)
    except StitchingError as err:
        assert not exists, f"solver refused ({err.message}) but the oracle found a solution"
        assert err.message
        return
    assert exists
    assert _plan_is_valid(p, used, req.excluded)
    assert all(port.capacity_kbps - kbps.get(port.urn, 0) >= req.capacity_kbps for port in (h.port for h in p.hops))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topologies(), st.data())
def test_no_tag_twice_on_a_port_and_a_failed_batch_changes_nothing(tn, data):
    t, names = tn
    pairs = list(itertools.permutations(names, 2))
    book = Book()
    for round_ in range(3):
        reqs = [LinkRequest(f"r{round_}l{i}", agg(a), agg(b))
                for i, (a, b) in enumerate(data.draw(st.lists(st.sampled_from(pairs), min_size=1, max_size=4)))]
        before = book
        try:
            book, plans = reserve(t, book, reqs, NOW, END, f"r{round_}")
        except StitchingError as err:
            assert err.message and err.link
            assert book is before and book.used_tags(NOW) == before.used_tags(NOW)
            continue
        assert len(plans) == len(reqs)
    held: dict[tuple[str, str], list[int]] = {}
    for h in book.holds.values():
        for pt, sp, tag in h.tags:
            held.setdefault((pt, sp), []).append(tag)
    for key, tags in held.items():
        assert len(tags) == len(set(tags)), f"{key} given {tags}"
    assert book.release(list(book.holds)).used_tags(NOW) == {}


def test_tunnel_spans_are_widest_first():
    t = topo("atb", cable("a", "t", {1}, qa=True, qb=True), cable("t", "b", {1}, qa=True, qb=True))
    cables = tuple((p, t.ports[p.remote]) for p in (t.ports[port("a", "t")], t.ports[port("t", "b")]))
    assert tunnels(cables)[0] == (0, 1)
