"""Accounting (VANI): who held what, and for how long. Pure: records, amounts, interval clipping, per-user and
per-project totals over a period. No store and no clock: the times are arguments (operations/ledger.py is the edge
that keeps the records in the store; `slicex usage` reports them).

A usage record is one sliver's life here: who (the owner's user URN), the project (from a slice URN whose
authority is `<authority>:<project>`, as CH API slice authorities name them), the slice, the sliver, the
resources it holds, its start (Allocate) and end (Delete, Shutdown, or expiry found by the reaper; open while
live)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import msgspec

from resources import STANDARD
from resources.kind import RESOURCES, Amounts
from slicex.clock import rfc3339
from slicex.codec import encode
from slicex.errors import BadArgs
from slicex.urn import canonical_urn, parse_urn

HOUR = timedelta(hours=1)
NO_PROJECT = "(no project)"


def total(amounts: Iterable[Amounts]) -> Amounts:
    out = Amounts()
    for a in amounts:
        out = out + a
    return out


def sliver_amounts(kind: str, details: Mapping[str, Any]) -> Amounts:
    """What a placed sliver holds, from the details the slice manager reports (the manifest's source), as its
    resource kind counts it (resources/)."""
    return STANDARD.held(kind, details)


def project_of(slice_urn: str) -> str | None:
    """The project URN of a slice named `urn:publicid:IDN+<authority>:<project>+slice+<name>` (the CH API form:
    `urn:publicid:IDN+<authority>+project+<project>`), None for a slice outside any project."""
    urn = parse_urn(slice_urn)
    authority, sep, project = urn.authority.rpartition(":")
    if not sep or not authority or not project:
        return None
    return f"urn:publicid:IDN+{authority.lower()}+project+{project}"


def user_key(urn: str) -> str:
    """The one spelling of an owner's URN used as a key (authority case-folded), the text itself when it is not
    a URN (never refuse to account for a sliver over its owner's spelling)."""
    try:
        return canonical_urn(urn)
    except BadArgs:
        return urn


class UsageRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    """One sliver's use, as the ledger stores it (defaults left out: no amount that is zero, no end or reason
    while unset)."""

    sliver_urn: str
    slice_urn: str
    user: str
    kind: str  # node | link
    client_id: str
    amounts: Amounts
    start: datetime
    expires: datetime | None = None  # the sliver's current end (Allocate, Provision, Renew): its end if it expires
    end: datetime | None = None  # None while the sliver lives
    end_reason: str = ""  # deleted | shut down | expired | ended (failed or released by the aggregate)
    replaces: str = ""  # an Update's new link: the sliver it replaces at commit (counted beyond it meanwhile)
    replaced_by: str = ""  # the link an Update placed to replace this one: it counts whole once this one ends
    project: str | None = None  # its slice's project (`project_of`); left out while None, as main stored it

    @property
    def open(self) -> bool:
        return self.end is None

    def closed(self, end: datetime, reason: str) -> UsageRecord:
        """The record ended at `end` (never before it started)."""
        return msgspec.structs.replace(self, end=max(end, self.start), end_reason=reason)


def ended_at(rec: UsageRecord, now: datetime) -> datetime:
    """When a sliver that is found gone ended: its expiry if that has passed (the reaper may notice a tick
    late), else now (failed, or released by the aggregate)."""
    return min(now, rec.expires) if rec.expires is not None else now


def overlap(start: datetime, end: datetime, period_from: datetime, period_to: datetime) -> timedelta:
    """How much of [start, end) lies inside [period_from, period_to); zero when they do not meet."""
    lo, hi = max(start, period_from), min(end, period_to)
    return hi - lo if hi > lo else timedelta(0)


def held_span(rec: UsageRecord, period_from: datetime, period_to: datetime, now: datetime) -> timedelta:
    """The part of a record's life inside the period; an open record counts until now."""
    return overlap(rec.start, rec.end if rec.end is not None else now, period_from, period_to)


@dataclass(frozen=True)
class UsageRow:
    """One user's or project's use over a period, in resource-hours."""

    who: str
    slivers: int
    core_hours: float
    memory_gb_hours: float
    node_hours: float
    vlan_hours: float
    mbps_hours: float
    fpga_hours: float
    disk_gb_hours: float = 0.0

    COLUMNS = ("who", "slivers", "core_hours", "memory_gb_hours", "node_hours", "vlan_hours", "mbps_hours",
               "fpga_hours", "disk_gb_hours")

    def values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, c) for c in self.COLUMNS)


def group_of(rec: UsageRecord, by: str) -> str:
    if by == "user":
        return rec.user
    if by == "project":
        return rec.project or NO_PROJECT
    raise BadArgs(f"usage is reported by user or project, not {by!r}")


def aggregate(records: Iterable[UsageRecord], by: str, period_from: datetime, period_to: datetime,
              now: datetime) -> list[UsageRow]:
    """Per user or project: the slivers that lived within the period and what they held, in resource-hours
    (each record clipped to the period; open ones count until now). Sorted by core-hours, most first."""
    if period_to < period_from:
        raise BadArgs(f"the period ends ({rfc3339(period_to)}) before it starts ({rfc3339(period_from)})")
    sums: dict[str, list[float]] = {}
    for rec in records:
        key = group_of(rec, by)
        hours = held_span(rec, period_from, period_to, now) / HOUR
        if hours <= 0:
            continue
        a = rec.amounts
        row = sums.setdefault(key, [0.0] * 8)
        for i, value in enumerate((1, a.cores * hours, a.memory_mb / 1024 * hours, a.nodes * hours,
                                   a.vlans * hours, a.bandwidth_kbps / 1000 * hours, a.fpgas * hours,
                                   a.disk_gb * hours)):
            row[i] += value
    rows = [UsageRow(who, int(v[0]), *(round(x, 6) for x in v[1:])) for who, v in sums.items()]
    return sorted(rows, key=lambda r: (-r.core_hours, -r.node_hours, r.who))


def held_over_time(records: Iterable[UsageRecord], by: str, resource: str, period_from: datetime,
                   period_to: datetime, now: datetime) -> dict[str, list[tuple[datetime, int]]]:
    """Per user or project, a step function of how much of `resource` was held: (time, amount from then on)
    at the period's start and at every change inside the period."""
    if resource not in RESOURCES:
        raise BadArgs(f"unknown resource {resource!r}; one of {', '.join(RESOURCES)}")
    changes: dict[str, dict[datetime, int]] = {}
    for rec in records:
        amount = getattr(rec.amounts, resource)
        end = rec.end if rec.end is not None else now
        lo, hi = max(rec.start, period_from), min(end, period_to)
        if hi <= lo or amount == 0:
            continue
        steps = changes.setdefault(group_of(rec, by), {})
        steps[lo] = steps.get(lo, 0) + amount
        if hi < period_to:
            steps[hi] = steps.get(hi, 0) - amount
    out: dict[str, list[tuple[datetime, int]]] = {}
    for who, steps in changes.items():
        level, series = 0, [(period_from, 0)]
        for when in sorted(steps):
            level += steps[when]
            if when == period_from:
                series[0] = (when, level)
            else:
                series.append((when, level))
        out[who] = series
    return out


def beyond(amounts: Amounts, base: Amounts) -> Amounts:
    """What `amounts` holds past `base`, resource by resource (never below zero): the charge of a link an
    Update replaces by a larger one, or nothing for a smaller one."""
    return Amounts(*(max(0, getattr(amounts, r) - getattr(base, r)) for r in RESOURCES))


def tally_of(table: str, rec: UsageRecord, replaced: UsageRecord | None) -> dict[str, dict[str, int]]:
    """What an open record adds to its user's and its project's usage counters (`Store.put` tally, named
    `<table>|user:<user>` and `<table>|project:<project>`): what it counts against limits (`counted`), with
    `replaced` the open record it replaces, if any."""
    amounts = counted(rec, {replaced.sliver_urn: replaced} if replaced is not None else {})
    fields = {r: n for r, n in encode(amounts).items() if n}
    out = {f"{table}|user:{rec.user}": fields}
    if rec.project is not None:
        out[f"{table}|project:{rec.project}"] = fields
    return out


def counted(rec: UsageRecord, open_by_urn: Mapping[str, UsageRecord]) -> Amounts:
    """What an open record counts against limits: all it holds, except a link an Update placed to replace one
    still held (a staged Update), which counts only what it adds to the one it replaces. Once the commit
    ends the replaced record it counts whole; a revert ends it and the replaced one counts as before."""
    old = open_by_urn.get(rec.replaces) if rec.replaces else None
    return beyond(rec.amounts, old.amounts) if old is not None else rec.amounts


def held_now(records: Iterable[UsageRecord], user: str, project: str | None) -> tuple[Amounts, Amounts]:
    """What a user, and the project, hold in the open records (the slivers live now)."""
    live = {rec.sliver_urn: rec for rec in records if rec.open}
    mine, theirs = Amounts(), Amounts()
    for rec in live.values():
        amounts = counted(rec, live)
        if rec.user == user:
            mine = mine + amounts
        if project is not None and rec.project == project:
            theirs = theirs + amounts
    return mine, theirs
