"""The Slice Exchange Point's pure core: splitting a request by domain (hypothesis over random topologies),
the allocate/provision/rollback state machine (every outcome of every domain, and recovery after a crash),
and merging the domains' manifests into one."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lxml import etree

from federation.sep import txn as tx
from federation.sep.merge import merge_rspecs
from federation.sep.split import domain_key, link_capacities, split_request
from slicex.codec import decode, encode
from slicex.errors import BadArgs, SearchFailed

RSPEC3 = "http://www.geni.net/resources/rspec/3"
STITCH = "http://www.geni.net/resources/rspec/ext/stitch/2/"
DOMAINS = {f"d{i}.test": f"urn:publicid:IDN+d{i}.test+authority+am" for i in range(4)}


def rspec(nodes: list[tuple[str, str | None]], links: list[tuple[str, list[str]]], kind: str = "request",
          extra: str = "") -> str:
    body = []
    for cid, cm in nodes:
        attr = f' component_manager_id="{cm}"' if cm else ""
        body.append(f'<node client_id="{cid}"{attr}><sliver_type name="default-vm"/>'
                    f'<interface client_id="{cid}:if0"/></node>')
    for lid, ends in links:
        refs = "".join(f'<interface_ref client_id="{n}:if0"/>' for n in ends)
        body.append(f'<link client_id="{lid}">{refs}</link>')
    return f'<rspec xmlns="{RSPEC3}" type="{kind}">{"".join(body)}{extra}</rspec>'


def children(xml: str, kind: str) -> set[str]:
    return {el.get("client_id") for el in etree.fromstring(xml.encode()) if etree.QName(el).localname == kind}


# ---- splitting ---------------------------------------------------------------------------------------------------

topologies = st.integers(1, 6).flatmap(lambda n: st.tuples(
    st.lists(st.sampled_from(sorted(DOMAINS)), min_size=n, max_size=n),
    st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=6)))


@settings(max_examples=200, deadline=None)
@given(topologies, st.booleans())
def test_every_node_goes_to_its_domain_and_every_link_to_the_domains_of_its_ends(topo, cm_spelling):
    where, pairs = topo
    spell = (lambda d: DOMAINS[d].replace("+am", "+cm")) if cm_spelling else DOMAINS.get
    nodes = [(f"n{i}", spell(d)) for i, d in enumerate(where)]
    links = [(f"l{j}", [f"n{a}", f"n{b}"] if a != b else [f"n{a}"]) for j, (a, b) in enumerate(pairs)]
    split = split_request(rspec(nodes, links), {k: v for k, v in DOMAINS.items()})
    assert set(split.domains) == set(where)
    for d in split.domains:
        part = split.part(d)
        own = {f"n{i}" for i, w in enumerate(where) if w == d}
        mine = {lid for lid, ends in links if any(where[int(n[1:])] == d for n in ends)}
        assert set(split.nodes[d]) == own
        assert children(part, "link") == mine
        far = {n for lid, ends in links if lid in mine for n in ends if where[int(n[1:])] != d}
        assert children(part, "node") == own | far  # the far ends of cross-domain links, nothing else
        assert set(split.client_ids(d)) == own | mine
    expected_cross = {lid for lid, ends in links if len({where[int(n[1:])] for n in ends}) == 2}
    assert {c.link_id for c in split.cross} == expected_cross
    for c in split.cross:
        assert c.domains[0] != c.domains[1]
        managers = [el for el in etree.fromstring(split.part(c.domains[0]).encode()).iter(f"{{{RSPEC3}}}link")
                    if el.get("client_id") == c.link_id][0].findall(f"{{{RSPEC3}}}component_manager")
        assert {domain_key(m.get("name")) for m in managers} == set(c.domains)


def test_a_node_without_a_manager_is_bad_args():
    with pytest.raises(BadArgs, match="n0 has no component_manager_id"):
        split_request(rspec([("n0", None)], []), DOMAINS)


def test_a_node_at_an_unknown_domain_is_search_failed_naming_the_domains():
    with pytest.raises(SearchFailed, match="not a domain of this exchange point.*d0.test"):
        split_request(rspec([("n0", "urn:publicid:IDN+elsewhere+authority+am")], []), DOMAINS)


def test_a_link_over_three_domains_is_refused():
    nodes = [(f"n{i}", DOMAINS[f"d{i}.test"]) for i in range(3)]
    with pytest.raises(BadArgs, match="spans 3 domains"):
        split_request(rspec(nodes, [("lan", ["n0", "n1", "n2"])]), DOMAINS)


def test_a_manifest_or_a_link_to_nowhere_is_refused():
    with pytest.raises(BadArgs, match="type="):
        split_request(rspec([("n0", DOMAINS["d0.test"])], [], kind="manifest"), DOMAINS)
    with pytest.raises(BadArgs, match="not an interface"):
        split_request(rspec([("n0", DOMAINS["d0.test"])], [("l", ["n0", "ghost"])]), DOMAINS)


def test_a_tunnel_typed_link_is_for_the_overlay_and_can_be_left_out_of_the_parts():
    xml = rspec([("a", DOMAINS["d0.test"]), ("b", DOMAINS["d1.test"])], []).replace(
        "</rspec>", '<link client_id="t"><link_type name="gre-tunnel"/><interface_ref client_id="a:if0"/>'
                    '<interface_ref client_id="b:if0"/></link></rspec>')
    split = split_request(xml, DOMAINS)
    assert [(c.link_id, c.stitchable) for c in split.cross] == [("t", False)]
    assert children(split.part("d0.test", {"t"}), "link") == set()
    assert children(split.part("d0.test", {"t"}), "node") == {"a"}


# ---- the two-phase state machine -----------------------------------------------------------------------------------

def two(op: str = tx.ALLOCATE) -> tx.Txn:
    slivers = {"a": ("urn:publicid:IDN+a+sliver+1",), "b": ("urn:publicid:IDN+b+sliver+2",)} if op == tx.PROVISION \
        else {"a": (), "b": ()}
    return tx.begin("t1", "urn:publicid:IDN+a+slice+s", op, {d: ((f"{d}-node",), s) for d, s in slivers.items()},
                    "2030-01-01T00:00:00Z")


def test_all_domains_done_commits_with_nothing_to_undo():
    t = tx.answered(tx.answered(two(), "a", ("sa",)), "b", ("sb",))
    t, steps = tx.decide(t)
    assert t.status == tx.COMMITTED and steps == []


def test_a_refusal_undoes_the_others_and_not_the_refusing_domain():
    t = tx.refused(tx.answered(two(), "a", ("sa",)), "b", 24, "tag taken")
    t, steps = tx.decide(t)
    assert t.status == tx.ROLLING_BACK and "tag taken" in t.reason
    assert steps == [tx.Step("delete", "a", ("sa",))]
    t, left = tx.undone(t, "a")
    assert t.status == tx.ROLLED_BACK and left == []


def test_no_answer_means_the_domain_is_swept_by_client_id():
    t = tx.lost(tx.answered(two(), "a", ("sa",)), "b", 11, "connection reset")
    _, steps = tx.decide(t)
    assert steps == [tx.Step("delete", "a", ("sa",)), tx.Step("sweep", "b", (), ("b-node",))]


def test_a_failed_provision_deletes_every_domains_slivers():
    t = tx.refused(tx.answered(two(tx.PROVISION), "a", ()), "b", 2, "boot failed")
    _, steps = tx.decide(t)
    assert {(s.kind, s.domain, s.slivers) for s in steps} == {
        ("delete", "a", ("urn:publicid:IDN+a+sliver+1",)), ("delete", "b", ("urn:publicid:IDN+b+sliver+2",))}


def test_deciding_while_a_domain_has_not_answered_is_a_bug():
    with pytest.raises(tx.TxnError, match="has not answered"):
        tx.decide(tx.answered(two(), "a", ("sa",)))
    with pytest.raises(tx.TxnError):
        tx.answered(tx.answered(two(), "a", ("sa",)), "a", ("again",))


def test_a_crash_while_running_rolls_back_everything_even_what_was_done():
    t = tx.answered(two(), "a", ("sa",))  # b still pending when the exchange point died
    t, steps = tx.recover(decode(encode(t), tx.Txn, "transaction"))
    assert t.status == tx.ROLLING_BACK
    assert steps == [tx.Step("delete", "a", ("sa",)), tx.Step("sweep", "b", (), ("b-node",))]
    t = tx.answered(tx.answered(two(), "a", ("sa",)), "b", ("sb",))  # all done, but never committed
    _, steps = tx.recover(t)
    assert [s.domain for s in steps] == ["a", "b"]


def test_recovery_continues_a_rollback_and_leaves_finished_ones_alone():
    t, _ = tx.decide(tx.lost(tx.answered(two(), "a", ("sa",)), "b", 11, "x"))
    t, _ = tx.undone(t, "a")
    again, steps = tx.recover(decode(encode(t), tx.Txn, "transaction"))
    assert again.status == tx.ROLLING_BACK and steps == [tx.Step("sweep", "b", (), ("b-node",))]
    done, _ = tx.decide(tx.answered(tx.answered(two(), "a", ("sa",)), "b", ("sb",)))
    assert tx.recover(done) == (done, [])


outcomes = st.lists(st.sampled_from(["done", "refused", "lost", "pending"]), min_size=1, max_size=5)


@settings(max_examples=300, deadline=None)
@given(outcomes, st.booleans(), st.sampled_from([tx.ALLOCATE, tx.PROVISION]))
def test_every_domain_that_may_hold_something_is_undone_and_none_other(states, crash, op):
    doms = [f"d{i}" for i in range(len(states))]
    t = tx.begin("t", "urn:publicid:IDN+a+slice+s", op,
                 {d: ((f"{d}-n",), (f"{d}-s0",) if op == tx.PROVISION else ()) for d in doms}, "")
    for d, s in zip(doms, states, strict=True):
        if s == "done":
            t = tx.answered(t, d, (f"{d}-s1",) if op == tx.ALLOCATE else ())
        elif s == "refused":
            t = tx.refused(t, d, 24, "no")
        elif s == "lost":
            t = tx.lost(t, d, 11, "gone")
    if crash or "pending" in states:
        t, steps = tx.recover(decode(encode(t), tx.Txn, "transaction"))
    else:
        t, steps = tx.decide(t)
    if t.status == tx.COMMITTED:
        assert all(s == "done" for s in states) and not crash and steps == []
        return
    touched = {s.domain for s in steps}
    if op == tx.PROVISION:
        assert touched == set(doms)  # all or nothing: every domain's slivers go
    else:
        assert touched == {d for d, s in zip(doms, states, strict=True) if s != "refused"}
    for _ in range(len(steps)):  # undoing every step finishes the rollback
        t, steps = tx.undone(t, steps[0].domain)
        if not steps:
            break
    assert t.status == tx.ROLLED_BACK and not t.open


# ---- merging -------------------------------------------------------------------------------------------------------

def manifest(dom: str, node: str, tag: str, other_tag: str) -> str:
    hops = "".join(
        f'<hop id="{i}"><link id="urn:publicid:IDN+{d}+interface+sw1:x"><switchingCapabilityDescriptor>'
        f'<switchingCapabilitySpecificInfo><switchingCapabilitySpecificInfo_L2sc><suggestedVLANRange>{t}'
        f'</suggestedVLANRange></switchingCapabilitySpecificInfo_L2sc></switchingCapabilitySpecificInfo>'
        f'</switchingCapabilityDescriptor></link></hop>'
        for i, d, t in ((1, "a.test", tag if dom == "a.test" else other_tag),
                        (2, "b.test", tag if dom == "b.test" else other_tag)))
    return (f'<rspec xmlns="{RSPEC3}" type="manifest"><node client_id="{node}" '
            f'component_manager_id="urn:publicid:IDN+{dom}+authority+am"/>'
            f'<link client_id="x" sliver_id="urn:publicid:IDN+{dom}+sliver+l">'
            f'<component_manager name="urn:publicid:IDN+{dom}+authority+am"/>'
            f'<interface_ref client_id="{node}:if0"/></link>'
            f'<stitching xmlns="{STITCH}"><path id="x">{hops}</path></stitching></rspec>')


def test_merged_manifest_has_both_halves_one_link_and_each_hop_from_its_owner():
    merged = etree.fromstring(merge_rspecs([("a.test", manifest("a.test", "na", "100", "any")),
                                            ("b.test", manifest("b.test", "nb", "100", "100-103"))]).encode())
    assert merged.get("type") == "manifest"
    assert {n.get("client_id") for n in merged.iter(f"{{{RSPEC3}}}node")} == {"na", "nb"}
    (link,) = merged.findall(f"{{{RSPEC3}}}link")
    assert {r.get("client_id") for r in link.iter(f"{{{RSPEC3}}}interface_ref")} == {"na:if0", "nb:if0"}
    assert len(link.findall(f"{{{RSPEC3}}}component_manager")) == 2
    hops = merged.findall(f".//{{{STITCH}}}hop")
    assert [h.get("id") for h in hops] == ["1", "2"]
    assert [h.findtext(f".//{{{STITCH}}}suggestedVLANRange") for h in hops] == ["100", "100"]


def test_nothing_to_merge_is_an_empty_manifest():
    root = etree.fromstring(merge_rspecs([]).encode())
    assert root.get("type") == "manifest" and len(root) == 0


# ---- how cross-domain links are joined (the endpoint's planning step, over a given topology) ------------------------

def planner(topology):
    """An exchange point over domains d0, d1 (and d2) whose stitching topology is `topology` (no network)."""
    from federation.sep.relay import Domain
    from federation.sep.service import ExchangePoint
    from slicex.clock import SystemClock

    domains = [Domain(urn, f"https://{key}/") for key, urn in DOMAINS.items()]
    return ExchangePoint("urn:publicid:IDN+d0.test+tool+sep", "https://sep/", domains, None, None, None, None,
                         SystemClock(), topology=lambda *_a, **_k: (topology, []))


def cables(*pairs: tuple[str, str]):
    from stitching.model import Aggregate, Port, Topology, parse_vlans

    ports = []
    for a, b in pairs:
        for x, y in ((a, b), (b, a)):
            ports.append(Port(f"urn:publicid:IDN+{x}.test+interface+sw:to-{y}", DOMAINS[f"{x}.test"],
                              f"urn:publicid:IDN+{y}.test+interface+sw:to-{x}", parse_vlans("100-103")))
    return Topology.build([Aggregate(u, f"https://{k}/") for k, u in DOMAINS.items()], ports)


def two_node_request() -> str:
    return rspec([("a", DOMAINS["d0.test"]), ("b", DOMAINS["d1.test"])], [("x", ["a", "b"])])


def test_a_direct_cable_stitches_the_link_and_each_part_carries_the_agreed_tag():
    split, joins = planner(cables(("d0", "d1")))._join_plan("urn:publicid:IDN+d0.test+slice+s",
                                                             split_request(two_node_request(), DOMAINS), [], {})
    assert joins["x"]["mode"] == "stitched"
    for d in ("d0.test", "d1.test"):
        tags = {e.text for e in etree.fromstring(split.part(d).encode()).iter(f"{{{STITCH}}}suggestedVLANRange")}
        assert tags == {"100"}


def advertised(topology):
    """What the exchange point reads: only the advertisements of the domains it asks (aggregates and ports)."""
    from stitching.model import Topology

    def read(domains, *_a, **_k):
        asked = {d.urn for d in domains}
        return Topology({k: a for k, a in topology.aggregates.items() if a.urn in asked},
                        {u: p for u, p in topology.ports.items() if p.aggregate in asked}), []
    return read


def test_a_path_through_a_testbed_without_nodes_gives_that_testbed_the_link_so_it_is_not_half_made():
    """The transit (a domain of the exchange point holding no node of the request) has its advertisement read
    when the request's own domains have no path, and gets the link whole, with its hops, and neither end's
    node; it was refused, and its advertisement never read (issue 25: Q-in-Q across a transit host)."""
    sep = planner(None)
    sep.topology = advertised(cables(("d0", "d2"), ("d2", "d1")))
    split, joins = sep._join_plan("urn:publicid:IDN+d0.test+slice+s", split_request(two_node_request(), DOMAINS),
                                  [], {})
    assert joins["x"]["mode"] == "stitched" and joins["x"]["transit"] == ["d2.test"]
    assert split.domains == ("d0.test", "d1.test", "d2.test")
    assert split.nodes["d2.test"] == () and split.client_ids("d2.test") == ("x",)
    part = etree.fromstring(split.part("d2.test").encode())
    assert {lk.get("client_id") for lk in part.iter(f"{{{RSPEC3}}}link")} == {"x"}
    managers = {c.get("name") for c in part.iter(f"{{{RSPEC3}}}component_manager")}
    assert DOMAINS["d2.test"] in managers
    hops = {h.findtext(f".//{{{STITCH}}}suggestedVLANRange") for h in part.iter(f"{{{STITCH}}}hop")}
    assert len(hops) == 1  # one tag on every hop, the transit's two included
    assert {n.get("client_id"): n.get("component_manager_id") for n in part.iter(f"{{{RSPEC3}}}node")} == {
        "a": DOMAINS["d0.test"], "b": DOMAINS["d1.test"]}  # the ends name their own managers: no node at d2


def test_a_path_through_an_aggregate_that_is_not_a_domain_is_refused_not_half_made():
    from federation.sep.relay import Domain
    from federation.sep.service import ExchangePoint
    from slicex.clock import SystemClock
    from slicex.errors import Unsupported

    sep = ExchangePoint("urn:publicid:IDN+d0.test+tool+sep", "https://sep/",
                        [Domain(DOMAINS[k], f"https://{k}/") for k in ("d0.test", "d1.test")], None, None, None,
                        None, SystemClock(), topology=lambda *_a, **_k: (cables(("d0", "d2"), ("d2", "d1")), []))
    with pytest.raises(Unsupported, match="crosses urn:publicid:IDN\\+d2.test.*not a domain.*Nothing was allocated"):
        sep._join_plan("urn:publicid:IDN+d0.test+slice+s", split_request(two_node_request(), {
            k: DOMAINS[k] for k in ("d0.test", "d1.test")}), [], {})


def test_no_layer2_path_and_no_overlay_is_unsupported_saying_so():
    from slicex.errors import Unsupported

    with pytest.raises(Unsupported, match="no layer-2 path.*no overlay is configured.*Nothing was allocated"):
        planner(cables())._join_plan("urn:publicid:IDN+d0.test+slice+s",
                                     split_request(two_node_request(), DOMAINS), [], {})


def test_link_capacities_are_the_largest_each_link_asks_for_and_links_without_one_are_absent():
    """What the SEP hands its overlay to shape each end of a cross-domain link with (issue 22: overlay links
    carried no token bucket)."""
    rspec = """<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">
      <link client_id="fast"><property source_id="a" dest_id="b" capacity="10000"/>
        <property source_id="b" dest_id="a" capacity="20000"/></link>
      <link client_id="free"><property source_id="a" dest_id="b" latency="5"/></link>
      <link client_id="odd"><property source_id="a" dest_id="b" capacity="lots"/></link></rspec>"""
    assert link_capacities(rspec) == {"fast": 20000}


def test_undo_steps_side_by_side_yield_each_as_it_ends_so_a_hung_domain_holds_up_no_other():
    from federation.sep.service import side_by_side

    gate = threading.Event()
    steps = side_by_side([lambda: gate.wait(10) and "hung domain", lambda: "quick domain"])
    assert next(steps) == (1, "quick domain")  # while the first still waits
    gate.set()
    assert next(steps) == (0, "hung domain")
    with pytest.raises(ValueError, match="refused"):
        list(side_by_side([lambda: (_ for _ in ()).throw(ValueError("refused"))]))
