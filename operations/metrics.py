"""Prometheus metrics of one deployment, served at `/metrics` on the dashboard's port.

Two kinds: what the AM API edge counts as calls happen (requests, latency, allocation failures), and what is
read from the state when scraped (reservations by state and pending operation, tickets and leases held, units
and VLAN tags in use per site). The state is read the way the slice manager already exposes it to the
dashboard and the advertisement: its reservation records and the store's claims. No actor is called and no
slice manager lock is taken, and the reading is cached for `interval` seconds so that many scrapers cost one
store scan per interval.

Each deployment has its own `CollectorRegistry` (never prometheus_client's global one), so two deployments in
one process (tests, benchmarks) never share a counter. The metric names and labels are listed in the
operator guide, §9.1."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from protocol import reservations as rs
from resources import STANDARD
from resources.compute import DISK_CHUNK_GB, MEM_CHUNK_MB
from resources.vlan import BW_CHUNK_KBPS
from rspec.substrate import Substrate

log = logging.getLogger("slicex.metrics")

AM_METHODS = ("GetVersion", "ListResources", "Describe", "Allocate", "Renew", "Provision", "Status",
              "PerformOperationalAction", "Delete", "Shutdown")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
UNIT_KINDS = ("core", "mem", "disk", "node", "bw", "vlan", "fpga", "router")  # counted per site (not stitching wires)


# ---- what a scrape reads (pure) -------------------------------------------------------------------------------
@dataclass(frozen=True)
class StateSample:
    """The state at one moment, as far as metrics need it."""

    reservations: Mapping[str, int] = field(default_factory=dict)  # state -> count
    pending_ages: Mapping[str, tuple[float, ...]] = field(default_factory=dict)  # operation -> ages in seconds
    tickets: int = 0  # reservations holding a ticket (Ticketed, Active, ActiveTicketed)
    leases: int = 0  # reservations holding a lease (Active, ActiveTicketed)
    usage_keys: frozenset[str] = frozenset()


class StateSource:
    """What metrics read of a slice manager (ActorSliceManager has both): records from the store, claims."""

    def records(self) -> list[Any]: ...

    def usage_keys(self) -> set[str]: ...


def sample_of(records: Iterable[Any], usage_keys: Iterable[str], now: datetime) -> StateSample:
    """A StateSample from slice manager records (each with `.r`, a Reservation) and claim keys."""
    states: Tally[str] = Tally()
    ages: dict[str, list[float]] = {}
    tickets = leases = 0
    for rec in records:
        r = rec.r
        states[r.state] += 1
        tickets += r.state in rs.HOLDS_TICKET
        leases += r.state in rs.HOLDS_LEASE
        if r.pending != rs.NONE:
            since = r.pending_since or now
            ages.setdefault(r.pending, []).append(max(0.0, (now - since).total_seconds()))
    return StateSample(dict(states), {op: tuple(a) for op, a in ages.items()}, tickets, leases,
                       frozenset(usage_keys))


@dataclass(frozen=True)
class Sites:
    """Where each unit's bin is: component ids and FPGA board names -> site."""

    of_bin: Mapping[str, str]
    totals: Mapping[tuple[str, str], int]  # (site, kind) -> units offered
    vlan_bins: Mapping[str, tuple[str, str, int]]  # switch / external link id -> (site, name, tags offered)

    @staticmethod
    def of(substrate: Substrate) -> Sites:
        of_bin: dict[str, str] = {}
        totals: Tally[tuple[str, str]] = Tally()
        for h in substrate.hosts:
            of_bin[h.component_id] = h.site
            if h.exclusive:
                totals[(h.site, "node")] += 1
            else:
                totals[(h.site, "core")] += h.cores
                totals[(h.site, "mem")] += h.memory_mb // MEM_CHUNK_MB
                if h.disk_gb >= DISK_CHUNK_GB:
                    totals[(h.site, "disk")] += h.disk_gb // DISK_CHUNK_GB
            for i in h.interfaces:
                of_bin[i.component_id] = h.site
                totals[(h.site, "bw")] += i.bandwidth_kbps // BW_CHUNK_KBPS
        vlan_bins: dict[str, tuple[str, str, int]] = {}
        switch_site = {sw.component_id: sw.site for sw in substrate.switches}
        for sw in substrate.switches:
            vlan_bins[sw.component_id] = (sw.site, sw.name, sum(hi - lo + 1 for lo, hi in sw.vlan_range))
        for e in substrate.external_links:
            site = switch_site.get(e.switch_id, "")
            vlan_bins[e.component_id] = (site, e.name, sum(hi - lo + 1 for lo, hi in e.vlan_range))
        for cid, (site, _name, n) in vlan_bins.items():
            of_bin[cid] = site
            totals[(site, "vlan")] += n
        for b in substrate.fpga_boards:
            of_bin[str(b.get("name"))] = str(b.get("site", ""))
        return Sites(of_bin, dict(totals), vlan_bins)


def unit_bin(key: str) -> tuple[str, str]:
    """(kind, bin) of a claim key, as its resource kind says: `core:<host>:3` -> (core, host);
    `vlan:<switch>:1001` -> (vlan, switch); `fpga:<board>/fpga0`, `router:<board>:2` -> (kind, board)."""
    return STANDARD.bin_of(key)


def state_families(sites: Sites, sample: StateSample) -> list[Metric]:
    """The gauges a scrape reports from one StateSample."""
    res = GaugeMetricFamily("slicex_reservations", "Reservations held by the slice manager, by state",
                            labels=["state"])
    for state in rs.STATES:
        res.add_metric([state], sample.reservations.get(state, 0))
    pending = GaugeMetricFamily("slicex_reservations_pending",
                                "Reservations with an operation in flight, by operation", labels=["operation"])
    oldest = GaugeMetricFamily("slicex_reservation_pending_oldest_seconds",
                               "Age of the oldest reservation waiting on each operation", labels=["operation"])
    for op in rs.PENDING:
        if op == rs.NONE:
            continue
        ages = sample.pending_ages.get(op, ())
        pending.add_metric([op], len(ages))
        oldest.add_metric([op], max(ages, default=0.0))
    tickets = GaugeMetricFamily("slicex_tickets_outstanding", "Reservations holding a broker ticket",
                                value=sample.tickets)
    leases = GaugeMetricFamily("slicex_leases_outstanding", "Reservations holding an authority lease",
                               value=sample.leases)
    in_use: Tally[tuple[str, str]] = Tally()
    tags: Tally[str] = Tally()
    for key in sample.usage_keys:
        kind, where = unit_bin(key)
        if kind not in UNIT_KINDS:
            continue
        in_use[(sites.of_bin.get(where, ""), kind)] += 1
        if kind == "vlan":
            tags[where] += 1
    units = GaugeMetricFamily("slicex_units_in_use", "Units claimed, by site and kind (core, mem = 512 MB, "
                              "node = bare metal, bw = 100 Mb/s, vlan, fpga = a whole FPGA, router = a board's router slot)",
                              labels=["site", "kind"])
    for (site, kind), n in sorted({**{k: 0 for k in sites.totals}, **in_use}.items()):
        units.add_metric([site, kind], n)
    totals = GaugeMetricFamily("slicex_units_total", "Units offered, by site and kind", labels=["site", "kind"])
    for (site, kind), n in sorted(sites.totals.items()):
        totals.add_metric([site, kind], n)
    vlan_use = GaugeMetricFamily("slicex_vlan_tags_in_use", "VLAN tags held, by site and switch or external link",
                                 labels=["site", "switch"])
    vlan_total = GaugeMetricFamily("slicex_vlan_tags_total", "VLAN tags offered, by site and switch or external "
                                   "link", labels=["site", "switch"])
    for cid, (site, name, n) in sites.vlan_bins.items():
        vlan_use.add_metric([site, name], tags.get(cid, 0))
        vlan_total.add_metric([site, name], n)
    return [res, pending, oldest, tickets, leases, units, totals, vlan_use, vlan_total]


# ---- the registry and its collectors ---------------------------------------------------------------------------
class _StateCollector:
    """Reads the state at most once per interval; a state that cannot be read is `slicex_state_readable 0`,
    never a failed scrape (the request counters still matter most when the store is down)."""

    def __init__(self, sites: Sites, read: Callable[[], StateSample], interval: float,
                 monotonic: Callable[[], float] = time.monotonic):
        self.sites = sites
        self.read = read
        self.interval = interval
        self.monotonic = monotonic
        self._lock = threading.Lock()  # this collector's cache only
        self._cached: tuple[float, StateSample] | None = None

    def _sample(self) -> StateSample:
        with self._lock:
            now = self.monotonic()
            if self._cached is None or now - self._cached[0] >= self.interval:
                self._cached = (now, self.read())
            return self._cached[1]

    def describe(self) -> list[Metric]:
        return []  # families depend on the state; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        try:
            sample = self._sample()
        except Exception as exc:  # noqa: BLE001 - report it as a metric and a log line
            log.warning("metrics: cannot read the state: %s", getattr(exc, "message", exc))
            yield GaugeMetricFamily("slicex_state_readable", "1 when the last state read succeeded", value=0)
            return
        yield GaugeMetricFamily("slicex_state_readable", "1 when the last state read succeeded", value=1)
        yield from state_families(self.sites, sample)


class _HealthCollector:
    """The last health checks, read when scraped (nothing is checked here: the store guard runs them)."""

    def __init__(self, checks: Callable[[], Mapping[str, str]]):
        self._checks = checks

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        checks = dict(self._checks())
        yield GaugeMetricFamily("slicex_serving", "1 while every health check passes (the store carries this "
                                "deployment's record and takes writes, the disk has room); 0: writes refused",
                                value=int(all(v == "ok" for v in checks.values())))
        ok = GaugeMetricFamily("slicex_health_check_ok", "1 when the health check passed, by check",
                               labels=["check"])
        for name, verdict in sorted(checks.items()):
            ok.add_metric([name], int(verdict == "ok"))
        yield ok


class Metrics:
    """One deployment's metrics: AM API calls as they happen, the state when scraped."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, substrate: Substrate, read: Callable[[], StateSample], interval: float = 5.0):
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter("slicex_am_requests", "AM API v3 calls answered, by method and GENI code",
                                ["method", "code"], registry=self.registry)
        self.latency = Histogram("slicex_am_request_duration_seconds", "AM API v3 call latency at the endpoint "
                                 "(credential checks included, TLS and XML-RPC parsing not)", ["method", "code"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.allocation_failures = Counter("slicex_allocation_failures", "Allocate calls refused, by the GENI "
                                           "error type that said why", ["reason"], registry=self.registry)
        self.registry.register(_StateCollector(Sites.of(substrate), read, interval))

    def observe(self, method: str, code: int, seconds: float, error_type: str = "") -> None:
        """Count one AM API call. Unknown method names are `other`, so callers cannot grow the label set."""
        method = method if method in AM_METHODS else "other"
        self.requests.labels(method, str(code)).inc()
        self.latency.labels(method, str(code)).observe(seconds)
        if method == "Allocate" and code != 0:
            self.allocation_failures.labels(error_type or "GeniError").inc()

    def watch_health(self, checks: Callable[[], Mapping[str, str]]) -> None:
        """Publish the process's latest health checks (`/health`'s, as the store guard last ran them):
        `slicex_serving` is 0 while any fails (the store lost its deployment record, refuses writes, a full
        disk), and `slicex_health_check_ok` says which."""
        self.registry.register(_HealthCollector(checks))

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        return generate_latest(self.registry)


def on_change(read: Callable[[], StateSample], token: Callable[[], Any]) -> Callable[[], StateSample]:
    """`read`, again only when `token` (the slice manager's version and the units in use) changed since the
    last sample, or that sample has pending operations (their ages move): a scrape of an unchanged aggregate
    reads no record."""
    last: list[tuple[Any, StateSample]] = []

    def sample() -> StateSample:
        now_token = token()
        if last and last[0][0] == now_token and not last[0][1].pending_ages:
            return last[0][1]
        taken = read()
        last[:] = [(now_token, taken)]
        return taken
    return sample


def for_slice_manager(substrate: Substrate, sm: StateSource, now: Callable[[], datetime],
                      interval: float = 5.0) -> Metrics:
    """Metrics over a slice manager's records and the store's claims (no actor calls, no slice manager lock),
    read when a scrape asks, and only when they changed (its `version` and `usage_version`, when it has them)."""
    def read() -> StateSample:
        return sample_of(sm.records(), sm.usage_keys(), now())
    if hasattr(sm, "version") and hasattr(sm, "usage_version"):
        return Metrics(substrate, on_change(read, lambda: (sm.version(), sm.usage_version())), interval)
    return Metrics(substrate, read, interval)
