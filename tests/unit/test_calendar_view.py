"""The dashboard's calendar (operations/calendar_view.py, pure): tickets land on the lanes of the hosts and
switches they hold units of, named by slice; the free capacity per day is what no instant of the day holds;
overlapping bars get rows of their own; text from experimenters is escaped."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from operations.calendar_view import calendar_svg, free_table, lanes, ticket_labels
from operations.snapshot import units_on
from rspec.substrate import default_substrate
from slicex.clock import rfc3339

T0 = datetime(2030, 1, 1, 6, tzinfo=UTC)
H = timedelta(hours=1)
SUB = default_substrate("t.org")
PC1, BM1, SW = (f"urn:publicid:IDN+t.org+node+{n}" for n in ("pc1", "bm1", "sw1"))


def ticket(tid: str, units: list[str], start: datetime, end: datetime, state: str = "active") -> dict:
    return {"id": tid, "start": rfc3339(start), "end": rfc3339(end), "state": state, "on": units_on(units)}


def test_tickets_land_on_their_lanes_named_by_slice_and_free_capacity_is_per_day():
    tickets = [ticket("g1/r1", [f"core:{PC1}:{i}" for i in range(4)] + [f"mem:{PC1}:0"], T0, T0 + 30 * H),
               ticket("g1/r2", [f"vlan:{SW}:1000", "bw:urn:publicid:IDN+t.org+interface+pc1:eth1:0"], T0, T0 + H),
               ticket("g2/r1", [f"node:{BM1}"], T0 + 20 * H, T0 + 22 * H),
               ticket("g3/r1", [f"node:{BM1}"], T0 - 3 * H, T0 - H),  # over: not drawn
               ticket("g4/r1", [f"core:{PC1}:9"], T0, T0 + H, state="failed")]
    slices = [{"name": "exp", "slivers": [{"client_id": "n1", "ticket": {"id": "g1/r1"}},
                                          {"client_id": "l1", "ticket": {"id": "g1/r2"}}]}]
    drawn = {lane.name: lane for lane in lanes(SUB, tickets, ticket_labels(slices), T0, T0 + 72 * H)}
    assert [(b.label, b.amount) for b in drawn["pc1"].bookings] == [("exp/n1", 4)]
    assert [(b.label, b.amount) for b in drawn["sw1"].bookings] == [("exp/l1", 1)]
    assert [b.label for b in drawn["bm1"].bookings] == ["g2/r1"]  # no slice names it: the ticket
    free = free_table(list(drawn.values()), T0, 3)
    rows = {r["name"]: r["free"] for r in free["rows"]}
    assert rows["pc1"] == [12, 12, 16] and rows["bm1"] == [1, 0, 1] and rows["sw1"] == [99, 100, 100]
    assert free["days"] == ["Tue 01 Jan", "Wed 02 Jan", "Thu 03 Jan"]


def test_overlapping_bookings_get_rows_of_their_own_and_names_are_escaped():
    tickets = [ticket(f"g{i}/r", [f"core:{PC1}:{i}"], T0 + i * H, T0 + (i + 2) * H) for i in range(3)]
    labels = {"g0/r": "<script>alert(1)</script>/n"}
    (pc1,) = [lane for lane in lanes(SUB, tickets, labels, T0, T0 + 24 * H) if lane.name == "pc1"]
    assert pc1.held(T0, T0 + 24 * H) == 2 and pc1.free(T0 + 3 * H, T0 + 4 * H) == 15
    svg = calendar_svg([pc1], T0, T0 + 24 * H)
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    assert svg.count('class="booking"') == 3 and 'height="' in svg
