"""Accounting core (operations/accounting.py): amounts of placed slivers, projects from slice URNs, interval clipping,
totals per user and project, and the held-over-time steps the plot draws."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operations.accounting import (
    NO_PROJECT,
    UsageRecord,
    aggregate,
    ended_at,
    held_now,
    held_over_time,
    overlap,
    project_of,
    sliver_amounts,
)
from resources.kind import Amounts
from slicex.codec import decode, encode
from slicex.errors import BadArgs

T0 = datetime(2030, 1, 1, tzinfo=UTC)
H = timedelta(hours=1)
ALICE = "urn:publicid:IDN+t.org+user+alice"
BOB = "urn:publicid:IDN+t.org+user+bob"
P1 = "urn:publicid:IDN+t.org+project+p1"


def rec(user: str = ALICE, start: datetime = T0, end: datetime | None = T0 + H, cores: int = 1,
        project: str | None = P1, urn: str = "urn:publicid:IDN+t.org+sliver+a", **amounts: int) -> UsageRecord:
    return UsageRecord(urn, "urn:publicid:IDN+t.org:p1+slice+s", user, "node", "n1",
                       Amounts(cores=cores, nodes=1, **amounts), start, None, end, project=project)


def test_node_amounts_come_from_its_placement_and_a_link_counts_distinct_tags():
    node = sliver_amounts("node", {"cores": 2, "memory_mb": 4096, "host": "pc1"})
    assert node == Amounts(cores=2, memory_mb=4096, nodes=1)
    assert sliver_amounts("node", {"fpga": "bee2-1/fpga0"}) == Amounts(nodes=1, fpgas=1)
    link = sliver_amounts("link", {"vlan_tag": 1000, "capacity_kbps": 50000,
                                   "keys": ["vlan:urn:publicid:IDN+t.org+node+sw1:1000",
                                            "vlan:urn:publicid:IDN+t.org+node+sw2:1000", "bw:x:0"]})
    assert link == Amounts(vlans=1, bandwidth_kbps=50000)
    assert sliver_amounts("link", {"vlan_tag": 7, "keys": []}).vlans == 1
    assert sliver_amounts("link", {"vlan_tag": None}).vlans == 0


def test_project_comes_from_the_slice_authority_project_form():
    assert project_of("urn:publicid:IDN+T.org:proj1+slice+s1") == "urn:publicid:IDN+t.org+project+proj1"
    assert project_of("urn:publicid:IDN+t.org+slice+s1") is None


def test_a_record_round_trips_through_its_document_and_never_ends_before_it_starts():
    r = rec(end=None)
    assert decode(encode(r), UsageRecord, "usage record") == r and r.open
    closed = r.closed(T0 - H, "deleted")
    assert closed.end == T0 and closed.end_reason == "deleted" and not closed.open
    assert decode(encode(closed), UsageRecord, "usage record") == closed


def test_a_sliver_found_gone_ends_at_its_expiry_if_that_passed_else_now():
    r = UsageRecord("s", "sl", ALICE, "node", "n", Amounts(), T0, T0 + H)
    assert ended_at(r, T0 + 3 * H) == T0 + H
    assert ended_at(r, T0 + H / 2) == T0 + H / 2


def test_usage_is_clipped_to_the_period_and_open_records_count_until_now():
    records = [rec(cores=2, end=T0 + 4 * H),  # 2 cores for 4 h, 2 h of it in the period
               rec(user=BOB, project=None, start=T0 + 2 * H, end=None, urn="b")]  # open, 1 core
    rows = aggregate(records, "user", T0 + 2 * H, T0 + 10 * H, now=T0 + 5 * H)
    by = {r.who: r for r in rows}
    assert by[ALICE].core_hours == 4.0 and by[ALICE].node_hours == 2.0 and by[ALICE].slivers == 1
    assert by[BOB].core_hours == 3.0  # 2h..5h (now)
    projects = {r.who: r.core_hours for r in aggregate(records, "project", T0, T0 + 10 * H, T0 + 5 * H)}
    assert projects == {P1: 8.0, NO_PROJECT: 3.0}


def test_records_outside_the_period_do_not_appear_and_a_reversed_period_is_refused():
    assert aggregate([rec()], "user", T0 + 2 * H, T0 + 3 * H, T0 + 5 * H) == []
    with pytest.raises(BadArgs):
        aggregate([rec()], "user", T0 + H, T0, T0)
    with pytest.raises(BadArgs):
        aggregate([rec()], "slice", T0, T0 + H, T0)


def test_memory_bandwidth_and_vlans_are_resource_hours():
    r = UsageRecord("l", "sl", ALICE, "link", "l", Amounts(memory_mb=2048, vlans=1, bandwidth_kbps=100_000),
                    T0, None, T0 + 2 * H)
    (row,) = aggregate([r], "user", T0, T0 + 2 * H, T0 + 2 * H)
    assert (row.memory_gb_hours, row.vlan_hours, row.mbps_hours) == (4.0, 2.0, 200.0)


def test_held_now_counts_open_records_of_the_user_and_of_the_project():
    records = [rec(end=None, cores=2), rec(user=BOB, end=None, cores=3, urn="b"), rec(cores=5, urn="c")]
    mine, project = held_now(records, ALICE, P1)
    assert mine.cores == 2 and project.cores == 5
    assert held_now(records, ALICE, None)[1] == Amounts()


def test_a_replacing_link_counts_only_what_it_adds_while_the_link_it_replaces_is_held():
    """A staged Update replacing a 1,000 kbps link by 8,000: 8,000 held (not 9,000); once the old record ends
    (the commit) the new one counts whole; a smaller replacement adds nothing while both are held."""
    from msgspec.structs import replace

    old = replace(rec(end=None, cores=0, urn="old", bandwidth_kbps=1000, vlans=1), kind="link")
    new = replace(rec(end=None, cores=0, urn="new", bandwidth_kbps=8000, vlans=1), kind="link", replaces="old")
    assert held_now([old, new], ALICE, P1)[0].bandwidth_kbps == 8000
    assert held_now([old, new], ALICE, P1)[0].vlans == 1 and held_now([old, new], ALICE, P1)[1].vlans == 1
    assert held_now([replace(old, end=T0 + H), new], ALICE, P1)[0].bandwidth_kbps == 8000
    assert held_now([old, replace(new, end=T0 + H)], ALICE, P1)[0].bandwidth_kbps == 1000
    smaller = replace(new, amounts=Amounts(vlans=1, bandwidth_kbps=200))
    assert held_now([old, smaller], ALICE, P1)[0].bandwidth_kbps == 1000
    assert decode(encode(new), UsageRecord, "usage record") == new and "replaces" not in encode(old)


def test_held_over_time_steps_up_and_down_inside_the_period():
    records = [rec(cores=2, start=T0, end=T0 + 2 * H), rec(cores=1, start=T0 + H, end=None, urn="b")]
    series = held_over_time(records, "user", "cores", T0, T0 + 4 * H, now=T0 + 3 * H)
    assert series[ALICE] == [(T0, 2), (T0 + H, 3), (T0 + 2 * H, 1), (T0 + 3 * H, 0)]


intervals = st.tuples(st.integers(0, 100), st.integers(0, 100)).map(sorted)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(intervals, st.integers(1, 8), st.sampled_from([ALICE, BOB])), max_size=12),
       intervals, st.integers(0, 120))
def test_totals_equal_the_area_under_the_held_over_time_steps(spans, period, now_min):
    """Two ways to count the same thing agree: summing clipped intervals, and integrating the step function
    of cores held; and clipping never counts more than the period per record."""
    now = T0 + timedelta(minutes=now_min)
    lo, hi = T0 + timedelta(minutes=period[0]), T0 + timedelta(minutes=period[1])
    records = [rec(user=u, start=T0 + timedelta(minutes=a), end=T0 + timedelta(minutes=b) if b % 3 else None,
                   cores=c, urn=f"s{i}") for i, ((a, b), c, u) in enumerate(spans)]
    rows = {r.who: r for r in aggregate(records, "user", lo, hi, now)}
    steps = held_over_time(records, "user", "cores", lo, hi, now)
    for who in set(rows) | set(steps):
        series = steps.get(who, [])
        area = sum(level * ((series[i + 1][0] if i + 1 < len(series) else hi) - t).total_seconds() / 3600
                   for i, (t, level) in enumerate(series))
        assert rows[who].core_hours == pytest.approx(area, abs=1e-6)
        assert all(level >= 0 for _, level in series)
    for r in records:
        clipped = overlap(r.start, r.end or now, lo, hi)
        assert timedelta(0) <= clipped <= hi - lo


def test_a_nodes_disk_is_counted_and_reported_in_gb_hours():
    assert sliver_amounts("node", {"cores": 1, "memory_mb": 256, "disk_gb": 20}).disk_gb == 20
    (row,) = aggregate([rec(disk_gb=20)], "user", T0, T0 + 2 * H, T0 + 2 * H)
    assert row.disk_gb_hours == 20.0 and row.values()[-1] == 20.0
