"""The dashboard's calendar (pure): the broker's promises over the coming days, one lane per host (its cores,
or a bare-metal node whole) and per switch (its VLAN tags), each reservation a bar from its start to its end
named by its slice, and the free capacity left per lane and day. Read from the published snapshots only: the
broker's tickets (each with what it holds where, operations/snapshot.py `units_on`) and the slice manager's
slivers (which slice a ticket is for). What experimenters ask `slicex find-slot` about, drawn."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from html import escape
from typing import Any

from operations.dashboard_svg import STYLE, _box, _line, _text, vlan_total
from rspec.substrate import Substrate, urn_name
from slicex.clock import parse_time, rfc3339

KINDS = {"core": "cores", "node": "bare-metal node", "vlan": "VLAN tags"}
UNIT = {"core": "cores", "node": "node", "vlan": "tags"}  # the short word under a lane's name


@dataclass(frozen=True)
class Booking:
    """One reservation on one lane: `amount` units of the lane's kind over [start, end)."""

    label: str  # slice and sliver, or the ticket when no slice manager names it
    start: datetime
    end: datetime
    amount: int
    state: str = "active"


@dataclass(frozen=True)
class Lane:
    """One resource's row: a host's cores, a bare-metal node, a switch's VLAN tags."""

    name: str
    component_id: str
    site: str
    kind: str  # core | node | vlan
    total: int
    bookings: tuple[Booking, ...] = ()

    def held(self, start: datetime, end: datetime) -> int:
        """The most units held at any instant of [start, end)."""
        inside = [b for b in self.bookings if b.start < end and start < b.end]
        instants = {start} | {b.start for b in inside if b.start > start}
        return max((sum(b.amount for b in inside if b.start <= t < b.end) for t in instants), default=0)

    def free(self, start: datetime, end: datetime) -> int:
        """The units free over the whole of [start, end) (what a reservation of it could have)."""
        return max(0, self.total - self.held(start, end))


def ticket_labels(slices: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Ticket id → "slice/sliver", from the slice manager's snapshot (its slivers name their tickets)."""
    out: dict[str, str] = {}
    for sl in slices:
        for s in sl.get("slivers", ()):
            ticket = s.get("ticket") or {}
            if ticket.get("id"):
                out[ticket["id"]] = f"{sl.get('name') or urn_name(sl.get('urn', ''))}/{s.get('client_id', '')}"
    return out


def lanes(substrate: Substrate, tickets: Iterable[Mapping[str, Any]], labels: Mapping[str, str],
          now: datetime, until: datetime) -> list[Lane]:
    """A lane per host and switch, with the active tickets that hold any of it during [now, until)."""
    empty = [Lane(h.name, h.component_id, h.site, "node" if h.exclusive else "core", 1 if h.exclusive else h.cores)
             for h in substrate.hosts]
    empty += [Lane(sw.name, sw.component_id, sw.site, "vlan", vlan_total(sw.vlan_range)) for sw in substrate.switches]
    held: dict[str, list[Booking]] = {lane.component_id: [] for lane in empty}
    for t in tickets:
        if t.get("state", "active") != "active" or not t.get("start") or not t.get("end"):
            continue
        start, end = parse_time(t["start"]), parse_time(t["end"])
        if end <= now or start >= until:
            continue
        for where, kinds in (t.get("on") or {}).items():
            lane = next((x for x in empty if x.component_id == where), None)
            if lane is not None and kinds.get(lane.kind):
                held[where].append(Booking(labels.get(t["id"], t["id"]), start, end, int(kinds[lane.kind])))
    return [Lane(x.name, x.component_id, x.site, x.kind, x.total,
                 tuple(sorted(held[x.component_id], key=lambda b: (b.start, b.label)))) for x in empty]


def days_from(now: datetime, days: int) -> list[tuple[datetime, datetime]]:
    """The next `days` calendar days (UTC), the first from `now` to its midnight."""
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    edges = [now] + [midnight + timedelta(days=i) for i in range(1, days + 1)]
    return list(zip(edges, edges[1:], strict=False))


def free_table(all_lanes: Sequence[Lane], now: datetime, days: int) -> dict[str, Any]:
    """Free capacity per lane and day: the units free over the whole day (from now, for today)."""
    spans = days_from(now, days)
    return {"days": [f"{a:%a %d %b}" for a, _b in spans],
            "rows": [{"name": lane.name, "site": lane.site, "kind": KINDS[lane.kind], "total": lane.total,
                      "free": [lane.free(a, b) for a, b in spans]} for lane in all_lanes]}


def calendar_doc(all_lanes: Sequence[Lane], now: datetime, until: datetime) -> dict[str, Any]:
    """The calendar as JSON (/api/calendar)."""
    return {"now": rfc3339(now), "until": rfc3339(until),
            "lanes": [{"name": x.name, "component_id": x.component_id, "site": x.site, "kind": x.kind,
                       "total": x.total, "free_now": x.free(now, now + timedelta(seconds=1)),
                       "bookings": [{"label": b.label, "start": rfc3339(b.start), "end": rfc3339(b.end),
                                     "amount": b.amount} for b in x.bookings]} for x in all_lanes]}


# ---- the picture ------------------------------------------------------------------------------------------------
LABEL_W, WIDTH, ROW_H, TOP = 190, 1100, 20, 34
NOW_FILL, AHEAD_FILL = ("#cfe8cf", "#4caf50"), ("#d6e2f5", "#4a6fa5")  # (fill, stroke): running / advance


def _rows(bookings: Sequence[Booking]) -> list[list[Booking]]:
    """Bookings packed into as few rows as do not overlap (first row each fits in, by start)."""
    rows: list[list[Booking]] = []
    for b in sorted(bookings, key=lambda b: b.start):
        row = next((r for r in rows if r[-1].end <= b.start), None)
        if row is None:
            rows.append([b])
        else:
            row.append(b)
    return rows


def calendar_svg(all_lanes: Sequence[Lane], now: datetime, until: datetime) -> str:
    """A timeline from `now` to `until`: a band per lane (its name, site, what is free now), a bar per
    reservation (green: running now, blue: an advance reservation) labelled with its slice, a line per day."""
    span = (until - now).total_seconds()
    plot = WIDTH - LABEL_W - 10

    def x(t: datetime) -> float:
        return LABEL_W + plot * max(0.0, min(1.0, (t - now).total_seconds() / span))

    parts: list[str] = []
    y = TOP
    for lane in all_lanes:
        rows = _rows(lane.bookings) or [[]]
        h = ROW_H * len(rows) + 6
        parts.append(f'<g class="lane" data-lane="{escape(lane.name)}">')
        parts.append(_box(4, y, WIDTH - 8, h, "#fafafa", "#dddddd", f"{lane.name}: {lane.total} {KINDS[lane.kind]}", 2))
        parts.append(_text(10, y + 14, lane.name, "dx-b", 22))
        parts.append(_text(10, y + 26, f"{lane.site} · {lane.free(now, now + timedelta(seconds=1))}/{lane.total} "
                                        f"{UNIT[lane.kind]} free now", "dx-s", 34))
        for i, row in enumerate(rows):
            for b in row:
                fill, stroke = NOW_FILL if b.start <= now else AHEAD_FILL
                bx, bw = x(b.start), max(2.0, x(b.end) - x(b.start))
                by = y + 3 + i * ROW_H
                parts.append('<g class="booking">' + _box(bx, by, bw, ROW_H - 3, fill, stroke,
                             f"{b.label}: {rfc3339(b.start)} to {rfc3339(b.end)}, {b.amount} "
                             f"{KINDS[lane.kind]}", 2)
                             + _text(bx + 3, by + 12, f"{b.label} ({b.amount})", "dx-s", max(1, int(bw / 6)))
                             + "</g>")
        parts.append("</g>")
        y += h + 4
    grid = []
    day = now.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)
    while day < until:
        grid.append(_line(x(day), TOP - 6, x(day), y, "#bbbbbb", "3,3", 1))
        grid.append(_text(x(day) + 3, TOP - 10, f"{day:%a %d %b}", "dx-s", 12))
        day += timedelta(days=1)
    head = [_text(LABEL_W, 14, f"now {rfc3339(now)}", "dx-s", 40),
            _text(WIDTH - 10, 14, f"until {rfc3339(until)}", "dx-s", 40, "end"),
            _line(LABEL_W, TOP - 6, LABEL_W, y, "#d0453a", "", 1.5)]
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{y + 6}" '
            f'viewBox="0 0 {WIDTH} {y + 6}" role="img" aria-label="reservation calendar">{STYLE}'
            + "".join(head + grid + parts) + "</svg>")
