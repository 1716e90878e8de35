"""Advance reservations through the AM API on both deployments (real TLS, a ManualClock): Allocate with a
future geni_start_time books the broker's calendar for that term; the sliver is geni_allocated /
geni_pending_allocation with its geni_start_time until the term starts, Provision before then is REFUSED,
and from the start it is an allocation like any other. Overlapping bookings of the last free node cannot
both succeed; ListResources with a time window answers what is free then."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

from lxml import etree

from slicex.clock import rfc3339
from tests.factories import RSPEC3, request_rspec, vm
from tests.integration.conftest import AUTHORITY, Running, start, stop
from tests.integration.test_am_api import RSPEC_V3, code, ok

BM1, BM2 = (f"urn:publicid:IDN+{AUTHORITY}+node+bm{i}" for i in (1, 2))


def bare_metal(cid: str, component: str = "") -> str:
    return request_rspec([{"client_id": cid, "sliver_type": "raw-pc", **({"component_id": component}
                                                                       if component else {})}])


def until(check: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def offered(r: Running, window: tuple | None = None, available: bool = True) -> set[str]:
    """Component ids of the nodes ListResources offers (geni_available), now or over `window`."""
    alice = r.user("alice")
    opts: dict = {"geni_rspec_version": RSPEC_V3, "geni_available": available}
    if window:
        opts["geni_start_time"], opts["geni_end_time"] = (rfc3339(w) for w in window)
    ad = ok(alice.am.ListResources(alice.user_credential(), opts))
    root = etree.fromstring(ad.encode())
    return {n.get("component_id") for n in root.iter(f"{{{RSPEC3}}}node")
            if available or next(n.iter(f"{{{RSPEC3}}}available")).get("now") == "true"}


def test_a_sliver_booked_a_minute_ahead_is_pending_until_then_then_provisioned_and_ready(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("ahead")
    now = running.clock.now()
    begin = now + timedelta(minutes=1)
    (s,) = ok(alice.am.Allocate(urn, creds, request_rspec([vm("a")]),
                                {"geni_start_time": rfc3339(begin)}))["geni_slivers"]
    assert s["geni_allocation_status"] == "geni_allocated"
    assert s["geni_operational_status"] == "geni_pending_allocation"
    assert s["geni_start_time"] == rfc3339(begin) and s["geni_error"] == ""
    assert s["geni_expires"] == rfc3339(begin + timedelta(days=1))  # a lease's length from its start
    assert running.deployment.sm.usage_keys() == set()  # booked in the calendar, nothing claimed yet

    reply = alice.am.Provision([urn], creds, {})
    assert code(reply) == 7 and rfc3339(begin) in reply["output"] and "yet" in reply["output"]
    (st,) = ok(alice.am.Status([urn], creds, {}))["geni_slivers"]
    assert (st["geni_allocation_status"], st["geni_operational_status"]) == ("geni_allocated",
                                                                            "geni_pending_allocation")
    # the slice manager's record and the broker's ticket are in the store: a restart (new AM, new actors) goes on
    stop(running)
    again = start(running.home, clock=running.clock, distributed=bool(running.actors))
    running.deployment, running.actors = again.deployment, again.actors
    alice = running.user("alice")

    running.clock.advance(timedelta(seconds=61))
    sm = running.deployment.sm

    def started() -> bool:
        sliver = sm.sliver(s["geni_sliver_urn"], running.clock.now())
        return sliver is not None and bool(sliver.details.get("started"))

    until(started, "the reaper to see the term start and the broker claim it")
    assert sm.usage_keys()  # the broker claimed the units at the start
    users = [{"urn": alice.urn, "keys": ["ssh-rsa AAAA alice@test"]}]
    (p,) = ok(alice.am.Provision([urn], creds, {"geni_users": users}))["geni_slivers"]
    assert p["geni_allocation_status"] == "geni_provisioned"
    assert p["geni_expires"] == rfc3339(begin + timedelta(days=1))  # leased for the term it booked
    ok(alice.am.PerformOperationalAction([urn], creds, "geni_start", {}))
    running.clock.advance(timedelta(seconds=10))
    (st,) = ok(alice.am.Status([urn], creds, {}))["geni_slivers"]
    assert st["geni_operational_status"] == "geni_ready" and st["geni_start_time"] == rfc3339(begin)
    ok(alice.am.Delete([urn], creds, {}))
    until(lambda: sm.usage_keys() == set(), "the units to be given back")


def test_overlapping_bookings_of_the_last_free_node_cannot_both_succeed(running):
    alice, bob = running.user("alice"), running.user("bob")
    now = running.clock.now()
    # bm2 is leased now for a day: bm1 is the last bare-metal node free over the next hours
    busy_urn, busy_creds = alice.slice_credential("busy")
    ok(alice.am.Allocate(busy_urn, busy_creds, bare_metal("held", BM2), {}))
    ok(alice.am.Provision([busy_urn], busy_creds, {}))

    a_urn, a_creds = alice.slice_credential("first")
    first = (now + timedelta(minutes=1), now + timedelta(hours=1))
    (a,) = ok(alice.am.Allocate(a_urn, a_creds, bare_metal("b"),
                                {"geni_start_time": rfc3339(first[0]), "geni_end_time": rfc3339(first[1])}))[
        "geni_slivers"]
    assert a["geni_expires"] == rfc3339(first[1])
    assert running.deployment.sm.sliver(a["geni_sliver_urn"], now).component_id == BM1

    b_urn, b_creds = bob.slice_credential("second")
    overlap = (now + timedelta(minutes=30), now + timedelta(hours=2))
    reply = bob.am.Allocate(b_urn, b_creds, bare_metal("b"),
                            {"geni_start_time": rfc3339(overlap[0]), "geni_end_time": rfc3339(overlap[1])})
    assert code(reply) == 26, reply["output"]  # INSUFFICIENT_NODES: what is short, and over which term
    assert "bare metal" in reply["output"] and "advance term" in reply["output"]
    assert f"{overlap[0]:%Y-%m-%dT%H:%M:%SZ}..{overlap[1]:%Y-%m-%dT%H:%M:%SZ}" in reply["output"]
    assert code(bob.am.Status([b_urn], b_creds, {})) == 12  # nothing held

    later = (first[1], first[1] + timedelta(hours=1))  # starts when the first booking ends
    (b,) = ok(bob.am.Allocate(b_urn, b_creds, bare_metal("b"),
                              {"geni_start_time": rfc3339(later[0]), "geni_end_time": rfc3339(later[1])}))[
        "geni_slivers"]
    assert b["geni_start_time"] == rfc3339(later[0])
    assert running.deployment.sm.sliver(b["geni_sliver_urn"], now).component_id == BM1

    # ListResources answers for the window asked: both taken during the first booking, bm1 free after both
    assert BM1 in offered(running) and BM2 not in offered(running)
    during = (now + timedelta(minutes=5), now + timedelta(minutes=10))
    assert not {BM1, BM2} & offered(running, during)
    assert not {BM1, BM2} & offered(running, during, available=False)  # the full ad flags them unavailable
    after = (later[1] + timedelta(minutes=1), later[1] + timedelta(hours=1))
    assert BM1 in offered(running, after) and BM2 not in offered(running, after)
    # the booking the second user was refused is free again once the first is deleted
    ok(alice.am.Delete([a_urn], a_creds, {}))
    c_urn, c_creds = bob.slice_credential("third")
    ok(bob.am.Allocate(c_urn, c_creds, bare_metal("b"),
                       {"geni_start_time": rfc3339(overlap[0]), "geni_end_time": rfc3339(first[1])}))


def test_bad_start_times_are_badargs_and_a_past_start_means_now(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("badtimes")
    now = running.clock.now()
    req = request_rspec([vm("a")])
    soon, later = rfc3339(now + timedelta(hours=2)), rfc3339(now + timedelta(hours=1))
    reply = alice.am.Allocate(urn, creds, req, {"geni_start_time": soon, "geni_end_time": later})
    assert code(reply) == 1 and "not before" in reply["output"]
    creds_only = alice.user_credential()
    for opts in ({"geni_start_time": "next thursday"}, {"geni_start_time": soon, "geni_end_time": later},
                 {"geni_start_time": soon, "geni_end_time": "soonish"}, {"geni_end_time": later}):
        reply = alice.am.ListResources(creds_only, {"geni_rspec_version": RSPEC_V3, "geni_available": True, **opts})
        assert code(reply) == 1 and "geni_" in reply["output"], opts
    assert code(alice.am.Status([urn], creds, {})) == 12  # nothing was allocated
    # a start in the past is now: an ordinary allocation, provisionable at once
    (s,) = ok(alice.am.Allocate(urn, creds, req, {"geni_start_time": rfc3339(now - timedelta(hours=1))}))[
        "geni_slivers"]
    assert "geni_start_time" not in s
    ok(alice.am.Provision([urn], creds, {}))
    past = (now - timedelta(hours=2), now - timedelta(hours=1))  # a window in the past is now
    assert offered(running, past) == offered(running)
