"""The pure core of AM API Update (slice_manager/update.py): what an Update changes, what it refuses, and the
life of a pending update; and the broker placing only the difference (broker/placement.py with `kept`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from broker.placement import plan
from rspec.fpga_ext import FpgaRequest
from rspec.request import Request, RequestNode, parse_request
from rspec.substrate import default_substrate
from slice_manager import update as up
from slicex.codec import decode, encode
from slicex.errors import BadArgs, Expired, Unsupported
from tests.factories import request_rspec, vm

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def pair(capacity: int | None = None, extra_nodes=(), extra_links=(), n2_ifaces=("n2:if0",)) -> str:
    return request_rspec([vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=list(n2_ifaces)), *extra_nodes],
                         [{"client_id": "l1", "ifaces": ["n1:if0", "n2:if0"],
                           **({"capacity": capacity} if capacity else {})}, *extra_links])


def existing(xml: str) -> list[up.Existing]:
    req = parse_request(xml)
    return [up.Existing(f"s-{e.client_id}", e.client_id, "node" if e in req.nodes else "link", e)
            for e in (*req.nodes, *req.links)]


def test_adding_a_node_and_a_link_places_only_them_and_rewires_the_node_they_attach_to():
    desired = parse_request(pair(extra_nodes=[vm("n3", ifaces=["n3:if0"])],
                                 extra_links=[{"client_id": "l2", "ifaces": ["n2:if1", "n3:if0"]}],
                                 n2_ifaces=("n2:if0", "n2:if1")))
    c = up.diff(existing(pair()), desired)
    assert [n.client_id for n in c.added.nodes] == ["n3"] and [lk.client_id for lk in c.added.links] == ["l2"]
    assert c.removed == () and set(c.rewired) == {"s-n2"} and set(c.kept.values()) == {"n1", "l1"}


def test_leaving_out_a_node_and_its_link_removes_them():
    c = up.diff(existing(pair(extra_nodes=[vm("n3", ifaces=["n3:if0"])],
                              extra_links=[{"client_id": "l2", "ifaces": ["n2:if1", "n3:if0"]}],
                              n2_ifaces=("n2:if0", "n2:if1"))), parse_request(pair()))
    assert set(c.removed) == {"s-n3", "s-l2"} and not c.added.nodes and not c.added.links
    assert set(c.rewired) == {"s-n2"}


def test_a_capacity_change_replaces_the_link_and_rewires_its_nodes():
    c = up.diff(existing(pair(capacity=100000)), parse_request(pair(capacity=200000)))
    assert c.removed == ("s-l1",) and [lk.capacity_kbps for lk in c.added.links] == [200000]
    assert set(c.rewired) == {"s-n1", "s-n2"}


def test_the_same_rspec_changes_nothing():
    assert up.diff(existing(pair()), parse_request(pair())).empty


def test_a_kept_node_cannot_change_type_in_place():
    retyped = request_rspec([vm("n1", ifaces=["n1:if0"], sliver_type="XOLarge"), vm("n2", ifaces=["n2:if0"])],
                            [{"client_id": "l1", "ifaces": ["n1:if0", "n2:if0"]}])
    with pytest.raises(BadArgs, match="n1 cannot change sliver_type"):
        up.diff(existing(pair()), parse_request(retyped))


def test_a_link_to_an_interface_no_node_has_is_refused_naming_it():
    stray = request_rspec([vm("n1", ifaces=["n1:if0"])], [{"client_id": "l1", "ifaces": ["n1:if0", "zz:if0"]}])
    with pytest.raises(BadArgs, match="zz:if0"):
        up.diff(existing(pair()), parse_request(stray))


def test_a_node_cannot_become_a_link():
    swapped = request_rspec([vm("l1", ifaces=["x"]), vm("n2", ifaces=["n2:if0"])], [])
    with pytest.raises(BadArgs, match="l1 is a link sliver"):
        up.diff(existing(pair()), parse_request(swapped))


def test_fpga_and_stitched_slivers_are_refused_with_the_reason():
    base = parse_request(pair())
    fpga = Request((*base.nodes, RequestNode("f1", fpga=FpgaRequest("bitstream", "b1"))), base.links)
    with pytest.raises(Unsupported, match="f1: it is an FPGA sliver"):
        up.diff(existing(pair()), fpga)
    old = existing(pair())
    stitched = [e if e.client_id != "l1" else up.Existing(e.sliver_id, "l1", "link", type(e.element)(
        "l1", e.element.interface_refs, uplinks=(("urn:publicid:IDN+x+interface+p", ((0x8100, 10),)),)))
        for e in old]
    with pytest.raises(Unsupported, match="link l1: it is a stitched link"):
        up.diff(stitched, parse_request(pair(capacity=5000)))


def test_pending_update_commit_revert_and_what_the_clock_does():
    u = up.PendingUpdate("s", up.STAGED, T0 + timedelta(minutes=10), ("a",), ("r",), {}, ("a", "r"), "<rspec/>",
                         request_key="s#k")
    assert decode(encode(u), up.PendingUpdate, "update") == u
    assert up.due(u, T0, caller_gone=True) is None
    assert up.due(u, T0 + timedelta(minutes=10), caller_gone=False) == "revert"  # its expiry reverts it
    c = up.begin_commit(u, T0, "sm1", T0 + timedelta(days=1), [{"urn": "x", "keys": []}])
    assert c.phase == up.COMMITTING and decode(encode(c), up.PendingUpdate, "update") == c
    assert up.due(c, T0 + timedelta(hours=1), caller_gone=False) is None  # its caller finishes it
    assert up.due(c, T0 + timedelta(hours=1), caller_gone=True) == "complete"  # a crashed commit completes
    with pytest.raises(BadArgs, match="being committed"):
        up.begin_revert(c, "cancelled", T0, "sm1")
    assert up.commit_failed(c, "redeem failed", T0, "sm1").phase == up.REVERTING
    with pytest.raises(Expired, match="expired"):
        up.begin_commit(u, T0 + timedelta(minutes=10), "sm1", T0 + timedelta(days=1), [])
    staging = up.PendingUpdate("s", up.STAGING, T0 + timedelta(minutes=10))
    assert up.due(staging, T0, caller_gone=True) is None
    assert up.due(staging, T0 + timedelta(minutes=11), caller_gone=True) == "revert"
    r = up.begin_revert(u, "cancelled", T0, "sm1")
    assert r.request_key == "s#k" and r.reason == "cancelled"  # the revert still finds the update's request
    assert up.due(r, T0, caller_gone=True) == "revert" and up.due(r, T0, caller_gone=False) is None


def test_best_effort_places_nodes_before_links_one_at_a_time():
    added = parse_request(pair(extra_nodes=[vm("n3", ifaces=["n3:if0"])]))
    assert [(len(r.nodes), len(r.links)) for r in up.one_by_one(added)] == [(1, 0), (1, 0), (1, 0), (0, 1)]


def test_the_broker_places_a_new_link_on_a_kept_node_without_placing_the_node_again():
    sub = default_substrate("t.org")
    first = plan(sub, parse_request(pair()), set())
    where = {p.client_id: p for p in first}
    desired = parse_request(pair(extra_nodes=[vm("n3", ifaces=["n3:if0"])],
                                 extra_links=[{"client_id": "l2", "ifaces": ["n2:if1", "n3:if0"]}],
                                 n2_ifaces=("n2:if0", "n2:if1")))
    changes = up.diff(existing(pair()), desired)
    kept = up.bound_interfaces(changes.desired, changes.added.links, {c: {"component_id": p.component_id,
                                             "interfaces": p.details.get("interfaces") or {}}
                                         for c, p in where.items() if p.kind == "node"})
    assert set(kept) == {"n2"}
    used = {k for p in first for k in p.keys}
    second = plan(sub, changes.added, used, kept=kept, subnets=[where["l1"].details["subnet"]])
    assert sorted(p.client_id for p in second) == ["l2", "n3"]  # n2 is not placed again
    l2 = next(p for p in second if p.client_id == "l2")
    assert l2.details["subnet"] != where["l1"].details["subnet"]
    assert l2.details["bindings"]["n2:if1"]["node"] == "n2"
    assert l2.details["endpoints"] == ["n2", "n3"]
    assert not set(l2.keys) & used


def test_the_dashboard_shows_a_staged_updates_slivers_updating():
    from operations.snapshot import sliver_states
    from slice_manager import reservation as rs
    from slice_manager.records import Record

    def rec(state: str, update: str) -> Record:
        return Record("s1", "slice", "o", "n3", "node", "", "g", rs.Reservation("s1", state=state), {},
                      update=update)

    assert sliver_states(rec(rs.TICKETED, "added")) == ("geni_updating", "geni_pending_allocation")
    assert sliver_states(rec(rs.ACTIVE, "kept")) == ("geni_updating", "geni_notready")
    assert sliver_states(rec(rs.ACTIVE, "")) == ("geni_provisioned", "geni_notready")
