"""The operator dashboard: a Flask app with Jinja2 templates (operations/templates/, autoescaped) over the snapshots
the actors publish (operations/snapshot.py). A page load reads the store's `snapshots` table and nothing else of the
state: it takes no slice manager lock and makes no actor call, so it costs the same with one sliver or ten
thousand, and it renders while the slice manager is stopped (showing how old its last snapshot is). A view
asks for snapshots (`want_snapshots`): a deployment's actors publish only while someone looks, and this
process's own publishers (`publishers`) publish at once, so the page shows the state as it is now.

Pages: `/` the substrate topology and use, reservation counts and utilisation charts; `/slices` every slice
drawn as its own topology (nodes, links and VLAN tags, stitching hops) with its slivers; `/reservations` the
tickets and leases with their terms and states; `/calendar` the broker's promises over the coming days per host
and switch (advance reservations included) and the free capacity per day (operations/calendar_view.py); `/actors` each actor's health (last heartbeat, pending
reservations by state and age); `/federation` the configured peers. `/topology.svg`, `/api/state` and `/api/calendar` (JSON),
`/health` (this process) and `/metrics` (Prometheus) serve scripts and monitors.

Access: plain HTTP by default, read-only, bound to the deployment's `host`; bound to loopback it answers only
requests whose Host header names loopback (no DNS rebinding). With `dashboard_tls: true` it is served over
TLS with the AM's certificate and asks for an optional client certificate issued by the deployment CA; a
caller whose certificate names a user listed under `operators:` in slicex.yaml may shut a slice down from
the slices page (the AM API's operator Shutdown). Everyone else only reads."""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import socket
import ssl
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from flask import Flask, Response, abort, g, jsonify, render_template, request
from markupsafe import Markup
from werkzeug.serving import ThreadedWSGIServer, WSGIRequestHandler

from operations.calendar_view import calendar_doc, calendar_svg, free_table, ticket_labels
from operations.calendar_view import lanes as calendar_lanes
from operations.dashboard_svg import (
    Series,
    board_fpga_count,
    chart_svg,
    slice_svg,
    topology_svg,
    vlan_ranges_text,
    vlan_total,
)
from operations.metrics import Sites
from operations.snapshot import HEARTBEAT_SECONDS, WANTED_WRITE_SECONDS, Use, read_snapshots, want_snapshots
from protocol import reservations as rs
from rspec.substrate import Substrate, urn_name
from slicex.clock import parse_time, rfc3339
from slicex.errors import GeniError
from slicex.store import Store

log = logging.getLogger("slicex.dashboard")

REFRESH_SECONDS = 5
CALENDAR_DAYS = 3  # how far ahead /calendar looks by default (?days=N, at most 14)
HERE = Path(__file__).resolve().parent
CSP = ("default-src 'none'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; script-src 'self'; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
UNIT_LABELS = {"core": "cores", "mem": "memory (512 MB units)", "node": "bare-metal nodes",
               "disk": "disk (10 GB units)", "bw": "bandwidth (100 Mb/s units)", "vlan": "VLAN tags"}


@dataclass(frozen=True)
class Aggregate:
    """Who the dashboard speaks for (its header)."""

    urn: str
    url: str
    driver: str = ""  # the substrate driver's own description (e.g. "emulated ...")


# ---- the view: snapshots merged for the pages (pure) ---------------------------------------------------------
@dataclass
class View:
    """What the pages show, from the published snapshots alone."""

    now: datetime
    sm: dict[str, Any] | None = None  # the newest slice manager snapshot
    slices: list[dict[str, Any]] = field(default_factory=list)
    use: Use = field(default_factory=Use)
    tickets: list[dict[str, Any]] = field(default_factory=list)
    leases: list[dict[str, Any]] = field(default_factory=list)
    actors: list[dict[str, Any]] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def reservations(self) -> dict[str, int]:
        counts = (self.sm or {}).get("state", {}).get("reservations", {})
        return {state: int(counts.get(state, 0)) for state in rs.STATES}

    @property
    def slivers(self) -> list[dict[str, Any]]:
        return [s for sl in self.slices for s in sl["slivers"]]


def _age(now: datetime, when: str) -> float:
    return max(0.0, (now - parse_time(when)).total_seconds()) if when else 0.0


def view_of(snapshots: Sequence[Mapping[str, Any]], now: datetime, stale_after: float) -> View:
    """Merge the snapshots: slivers from the newest slice manager's, each leased one with the operational state
    its authority published; tickets from the brokers', leases from the authorities'; one health row each."""
    view = View(now)
    ops: dict[str, tuple[str, str]] = {}
    for doc in snapshots:
        state = doc.get("state", {})
        age = _age(now, doc.get("published_at", ""))
        row = {"name": doc.get("name", ""), "role": doc.get("role", ""), "published_at": doc.get("published_at", ""),
               "age": age, "stale": age > stale_after, "summary": "", "pending": []}
        if doc.get("role") == "slice-manager":
            if view.sm is None:
                view.sm = dict(doc)
            res = state.get("reservations", {})
            row["summary"] = (f"{sum(res.values())} reservations, {state.get('tickets_held', 0)} holding tickets, "
                              f"{state.get('leases_held', 0)} holding leases")
            row["pending"] = state.get("pending", [])
        elif doc.get("role") == "broker":
            view.tickets += [{**t, "broker": doc.get("name", "")} for t in state.get("tickets", [])]
            states = state.get("ticket_states", {})
            row["summary"] = (", ".join(f"{n} tickets {s}" for s, n in sorted(states.items())) or "no tickets") \
                + f"; policy {state.get('policy', '?')}"
        elif doc.get("role") == "authority":
            for lease in state.get("leases", []):
                view.leases.append({**lease, "authority": doc.get("name", "")})
                ops.setdefault(lease["id"], (lease.get("operational_state", ""), lease.get("error", "")))
            row["summary"] = f"{len(state.get('leases', []))} active leases"
        view.actors.append(row)
    if view.sm is not None:
        st = view.sm.get("state", {})
        view.use = Use.from_doc(st.get("use", {}))
        view.history = list(view.sm.get("history", []))
        for urn, sl in sorted(st.get("slices", {}).items()):
            slivers = []
            for s in sl.get("slivers", []):
                s = dict(s)
                error = s.get("reason", "")
                if s.get("lease") and s.get("state") in rs.HOLDS_LEASE:
                    op, err = ops.get(s.get("lease_id", ""), ("", ""))
                    if op:
                        s["operational_state"] = op
                        error = err or error
                    else:
                        error = error or "operational state unknown: its authority has published no state for it"
                if s.get("shutdown"):
                    error = error or "slice shut down by operator"
                s["error"] = error
                slivers.append(s)
            view.slices.append({"urn": urn, "name": urn_name(urn), "owner": sl.get("owner", ""),
                                "shut_down": bool(sl.get("shut_down")), "slivers": slivers})
    view.tickets.sort(key=lambda t: t.get("end", ""), reverse=True)
    view.leases.sort(key=lambda t: t.get("end", ""), reverse=True)
    return view


def charts(substrate: Substrate, history: Sequence[Mapping[str, Any]]) -> list[Series]:
    """Utilisation over time: units by kind (of what the substrate offers) and VLAN tags per switch."""
    sites = Sites.of(substrate)
    totals: dict[str, int] = {}
    for (_site, kind), n in sites.totals.items():
        totals[kind] = totals.get(kind, 0) + n
    times = [p.get("at", "") for p in history]
    out = [Series(UNIT_LABELS.get(kind, kind), [float(p.get("units", {}).get(kind, 0)) for p in history],
                  float(total), times)
           for kind, total in sorted(totals.items(), key=lambda kv: list(UNIT_LABELS).index(kv[0])
                                     if kv[0] in UNIT_LABELS else 99) if total]
    for cid, (_site, name, total) in sites.vlan_bins.items():
        out.append(Series(f"VLAN tags on {name}", [float(p.get("vlans", {}).get(cid, 0)) for p in history],
                          float(total), times))
    return out


def state_dict(substrate: Substrate, aggregate: Aggregate, view: View) -> dict[str, Any]:
    """The JSON of /api/state: the substrate, what is used of each host, switch, external link and board,
    the slivers of each slice, reservation counts, and when the snapshot it is read from was published."""
    use = view.use
    slivers_on: dict[str, list[str]] = {}
    for s in view.slivers:
        slivers_on.setdefault(str(s.get("component_id", "")).lower(), []).append(s["client_id"])
    hosts = [{"name": h.name, "component_id": h.component_id, "site": h.site, "exclusive": h.exclusive,
              "cores": {"used": h.cores if h.component_id in use.taken else use.cores.get(h.component_id, 0),
                        "total": h.cores},
              "memory_mb": {"used": h.memory_mb if h.component_id in use.taken
                            else use.memory_mb.get(h.component_id, 0), "total": h.memory_mb},
              "taken": h.component_id in use.taken, "slivers": slivers_on.get(h.component_id.lower(), [])}
             for h in substrate.hosts]
    switches = [{"name": sw.name, "component_id": sw.component_id, "site": sw.site,
                 "vlan_range": vlan_ranges_text(sw.vlan_range), "vlans_total": vlan_total(sw.vlan_range),
                 "vlans_in_use": sorted(use.vlans.get(sw.component_id, ()))} for sw in substrate.switches]
    external = [{"name": e.name, "component_id": e.component_id, "switch": e.switch_id,
                 "remote_aggregate": e.remote_aggregate, "vlan_range": vlan_ranges_text(e.vlan_range),
                 "vlans_total": vlan_total(e.vlan_range), "vlans_in_use": sorted(use.vlans.get(e.component_id, ()))}
                for e in substrate.external_links]
    boards = [{"name": str(b.get("name")), "model": str(b.get("model", "")), "fpgas": board_fpga_count(b),
               "fpgas_busy": sorted(use.fpgas.get(str(b.get("name")), ())),
               "router_slots_busy": use.router_slots.get(str(b.get("name")), 0)}
              for b in substrate.fpga_boards]
    slices = {sl["urn"]: [{"client_id": s["client_id"], "urn": s["urn"], "kind": s["kind"],
                           "component_id": s.get("component_id", ""), "allocation_state": s["allocation_state"],
                           "operational_state": s["operational_state"], "expires": s.get("end", ""),
                           "vlan_tag": (s.get("details") or {}).get("vlan_tag"), "error": s.get("error", "")}
                          for s in sl["slivers"]] for sl in view.slices}
    return {"now": rfc3339(view.now), "snapshot_published_at": (view.sm or {}).get("published_at"),
            "aggregate": {"urn": aggregate.urn, "url": aggregate.url, "driver": aggregate.driver},
            "substrate": {"authority": substrate.authority, "description": substrate.description,
                          "sites": [s.name for s in substrate.all_sites], "hosts": len(substrate.hosts),
                          "switches": len(substrate.switches), "trunks": [t.name for t in substrate.trunks],
                          "external_links": len(substrate.external_links),
                          "fpga_boards": len(substrate.fpga_boards)},
            "hosts": hosts, "switches": switches, "external_links": external, "fpga_boards": boards,
            "slices": slices, "reservations": view.reservations, "tickets": len(view.tickets), "leases": len(view.leases),
            "actors": [{k: a[k] for k in ("name", "role", "published_at", "stale")} for a in view.actors]}


def peer_rows(peers: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The `peers:` section of slicex.yaml as table rows (as configured; nothing is fetched from a peer)."""
    rows = []
    for name, raw in sorted((peers or {}).items()):
        raw = raw if isinstance(raw, Mapping) else {}
        spaces = raw.get("namespaces") or ([raw["namespace"]] if raw.get("namespace") else [])
        policy = raw.get("policy") if isinstance(raw.get("policy"), Mapping) else {}
        rows.append({"name": str(name), "root": str(raw.get("root", "")), "namespaces": [str(s) for s in spaces],
                     "ch_url": str(raw.get("ch_url") or ""), "trust_roots_url": str(raw.get("trust_roots_url") or ""),
                     "am_urls": {str(k): str(v) for k, v in (raw.get("am_urls") or {}).items()},
                     "policy": {str(k): v for k, v in policy.items()}})
    return rows


# ---- the web app -------------------------------------------------------------------------------------------------
@dataclass
class Dashboard:
    """What the app needs: the substrate (static), where snapshots are, the time, and the operator hooks."""

    substrate: Substrate
    aggregate: Aggregate
    store: Store
    now: Callable[[], datetime]
    health: Callable[[], dict[str, Any]] | None = None
    metrics: Any = None  # operations.metrics.Metrics: /metrics reads its own cached sample
    peers: Mapping[str, Any] = field(default_factory=dict)  # the `peers:` section of slicex.yaml
    operators: frozenset[str] = frozenset()  # canonical user URNs (`operators:`)
    shutdown: Callable[[str, str], None] | None = None  # (slice URN, operator URN): the AM's operator Shutdown
    stale_after: float = 3 * HEARTBEAT_SECONDS
    loopback_only: bool = False
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))  # operator form tokens
    publishers: Sequence[Any] = ()  # operations.snapshot.Publisher of the actors this process runs
    _asked_at: list[datetime] = field(default_factory=list)  # when this dashboard last wrote `wanted`

    def view(self) -> View:
        self.ask()
        return view_of(read_snapshots(self.store), self.now(), self.stale_after)

    def ask(self) -> None:
        """Ask the actors for snapshots (`wanted`, written at most every WANTED_WRITE_SECONDS) and let this
        process's publishers publish now; a store refusing writes leaves the page to show what is there."""
        now = self.now()
        try:
            if not self._asked_at or not 0 <= (now - self._asked_at[0]).total_seconds() < WANTED_WRITE_SECONDS:
                want_snapshots(self.store, now)
                self._asked_at[:] = [now]
        except GeniError as exc:
            log.warning("could not ask for snapshots: %s", exc.message)
            return
        for p in self.publishers:
            p.tick(now)

    def operator_of(self, pem: str | None) -> str | None:
        """The canonical URN of a verified client certificate's user when it is a configured operator."""
        if not pem:
            return None
        from slicex import pki
        from slicex.errors import BadArgs
        from slicex.urn import canonical_urn

        try:
            urn = canonical_urn(pki.cert_urn(pem), "user")
        except (BadArgs, ValueError):
            return None
        return urn if urn in {canonical_urn(o, "user") for o in self.operators} else None

    def token(self, operator: str) -> str:
        """The form token an operator's page carries: a cross-site form cannot know it (CSRF)."""
        return hmac.new(self.secret, operator.encode(), "sha256").hexdigest()


LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def _host_name(header: str) -> str:
    """The name in a Host header, without the port: `127.0.0.1:8004` -> `127.0.0.1`, `[::1]:80` -> `[::1]`."""
    name = header.strip().lower()
    return name.rsplit(":", 1)[0] if ":" in name.rsplit("]", 1)[-1] else name


def _fmt_age(seconds: float) -> str:
    s = int(seconds)
    return f"{s} s" if s < 120 else f"{s // 60} min" if s < 7200 else f"{s // 3600} h"


def create_app(dash: Dashboard) -> Flask:
    """The Flask app of one deployment's dashboard."""
    app = Flask("slicex-dashboard", template_folder=str(HERE / "templates"), static_folder=str(HERE / "static"))
    app.jinja_env.globals.update(refresh=REFRESH_SECONDS, short=urn_name, fmt_age=_fmt_age, states=rs.STATES)

    @app.before_request
    def _guard() -> Response | None:
        if dash.loopback_only and _host_name(request.host) not in LOOPBACK:
            return Response("this dashboard answers loopback names only\n", 403, mimetype="text/plain")
        g.operator = dash.operator_of(request.environ.get("SSL_CLIENT_CERT"))
        return None

    @app.after_request
    def _headers(resp: Response) -> Response:
        resp.headers["Cache-Control"] = "no-store"
        resp.headers["X-Content-Type-Options"] = "nosniff"
        resp.headers["Content-Security-Policy"] = CSP
        resp.headers["Referrer-Policy"] = "no-referrer"
        return resp

    @app.errorhandler(Exception)
    def _error(exc: Exception) -> Any:
        from werkzeug.exceptions import HTTPException

        if isinstance(exc, HTTPException):
            return exc
        log.exception("dashboard could not read the snapshots")  # a store outage is a 503, not a dead server
        return Response(f"cannot read the state now: {exc}\n", 503, mimetype="text/plain")

    def page(template: str, view: View, **extra: Any) -> str:
        return render_template(template, view=view, agg=dash.aggregate, substrate=dash.substrate,
                               operator=g.operator, now=rfc3339(view.now), **extra)

    @app.get("/")
    def overview() -> str:
        view = dash.view()
        svg = topology_svg(dash.substrate, view.use, [(s.get("component_id", ""), s["client_id"])
                                                      for s in view.slivers])
        return page("overview.html", view, topology=Markup(svg),
                    charts=[Markup(chart_svg(c)) for c in charts(dash.substrate, view.history)])

    @app.get("/slices")
    def slices() -> str:
        view = dash.view()
        drawn = [(sl, Markup(slice_svg(sl["slivers"], dash.substrate))) for sl in view.slices]
        return page("slices.html", view, drawn=drawn, token=dash.token(g.operator) if g.operator else "",
                    can_shutdown=dash.shutdown is not None)

    @app.get("/reservations")
    def reservations() -> str:
        return page("reservations.html", dash.view())

    def calendar_of(view: View) -> tuple[list[Any], datetime, int]:
        days = min(14, max(1, request.args.get("days", CALENDAR_DAYS, type=int) or CALENDAR_DAYS))
        until = view.now + timedelta(days=days)
        labels = ticket_labels(view.slices)
        return calendar_lanes(dash.substrate, view.tickets, labels, view.now, until), until, days

    @app.get("/calendar")
    def calendar() -> str:
        """The broker's promises over the coming days, per host and switch, and the free capacity per day."""
        view = dash.view()
        lanes, until, days = calendar_of(view)
        return page("calendar.html", view, picture=Markup(calendar_svg(lanes, view.now, until)),
                    free=free_table(lanes, view.now, days), days=days)

    @app.get("/api/calendar")
    def api_calendar() -> Response:
        view = dash.view()
        lanes, until, _days = calendar_of(view)
        return jsonify(calendar_doc(lanes, view.now, until))

    @app.get("/actors")
    def actors() -> str:
        return page("actors.html", dash.view(), stale_after=dash.stale_after)

    @app.get("/federation")
    def federation() -> str:
        return page("federation.html", dash.view(), peers=peer_rows(dash.peers))

    @app.get("/topology.svg")
    def topology() -> Response:
        view = dash.view()
        svg = topology_svg(dash.substrate, view.use, [(s.get("component_id", ""), s["client_id"])
                                                      for s in view.slivers])
        return Response('<?xml version="1.0" encoding="UTF-8"?>\n' + svg, content_type="image/svg+xml")

    @app.get("/api/state")
    def api_state() -> Response:
        return jsonify(state_dict(dash.substrate, dash.aggregate, dash.view()))

    @app.get("/health")
    def health() -> Response:
        """Whether this process can serve (200) or not (503), and why: for monitoring and `slicex status`."""
        if dash.health is None:
            abort(404)
        try:
            report = dash.health()
        except Exception as exc:  # noqa: BLE001 - a health check that breaks is itself a failed check
            log.exception("health check failed")
            report = {"serving": False, "checks": {"health": f"the check itself failed: {type(exc).__name__}: {exc}"}}
        return Response(json.dumps(report), 200 if report.get("serving") else 503,
                        mimetype="application/json")

    @app.get("/metrics")
    def metrics() -> Response:
        if dash.metrics is None:
            abort(404)
        return Response(dash.metrics.exposition(), content_type=dash.metrics.content_type)

    @app.post("/operator/shutdown")
    def operator_shutdown() -> Any:
        """An operator's emergency stop of one slice (the AM API's Shutdown), from the slices page."""
        operator = g.operator
        if operator is None or dash.shutdown is None:
            return Response("operators only: present a client certificate of a user listed under `operators:` "
                            "in slicex.yaml, over https\n", 403, mimetype="text/plain")
        if not hmac.compare_digest(request.form.get("token", ""), dash.token(operator)) \
                or request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
            return Response("refused: this form did not come from the dashboard\n", 403, mimetype="text/plain")
        slice_urn = request.form.get("slice_urn", "")
        try:
            dash.shutdown(slice_urn, operator)
        except Exception as exc:  # noqa: BLE001 - the operator sees why (GENI errors carry a message)
            return Response(f"shutdown of {slice_urn} failed: {getattr(exc, 'message', exc)}\n", 400,
                            mimetype="text/plain")
        log.warning("operator %s shut down slice %s from the dashboard", operator, slice_urn)
        return render_template("done.html", message=f"slice {slice_urn} shut down by {operator}", now="",
                               view=None, agg=dash.aggregate, substrate=dash.substrate, operator=operator)

    return app


# ---- the server ---------------------------------------------------------------------------------------------------
class _Handler(WSGIRequestHandler):
    timeout = 30  # a client that sends nothing does not hold its thread for ever

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        log.debug("%s %s %s", self.address_string(), self.requestline, code)


class DashboardServer:
    """The app on a threaded WSGI server: plain HTTP, or TLS (the handshake in the request's own thread, so a
    client that never finishes it holds no other)."""

    def __init__(self, host: str, port: int, app: Flask, context: ssl.SSLContext | None = None):
        # bound here, so a port in use is an OSError for the caller (werkzeug would exit the process)
        sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
        try:
            self._server = ThreadedWSGIServer(host, port, app, _Handler, False, context, fd=sock.fileno())
        finally:
            sock.close()  # the server holds its own duplicate
        if context is not None:
            self._server.socket.do_handshake_on_connect = False  # accepted sockets shake hands on first read
        self.tls = context is not None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{'https' if self.tls else 'http'}://{f'[{host}]' if ':' in host else host}:{port}/"

    def start(self) -> str:
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="dashboard",
                         daemon=True).start()
        return self.url

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def tls_context(cert: str, key: str, client_ca: str) -> ssl.SSLContext:
    """Server TLS with the AM's certificate; a client certificate is optional and, when given, must be issued
    by `client_ca` (the deployment CA only: a federation peer's root never vouches for an operator)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    ctx.load_verify_locations(client_ca)
    ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def start_dashboard(host: str, port: int, dashboard: Dashboard,
                    context: ssl.SSLContext | None = None) -> DashboardServer | None:
    """Serve the dashboard on host:port (0: a free port). A port already in use is a warning, not a failed
    deployment: the aggregate runs on without its dashboard."""
    dashboard.loopback_only = host in LOOPBACK
    try:
        server = DashboardServer(host, port, create_app(dashboard), context)
    except OSError as exc:
        log.warning("dashboard not started: cannot listen on %s:%d: %s", host, port, exc)
        return None
    server.start()
    log.info("dashboard at %s", server.url)
    if not dashboard.loopback_only:
        log.warning("the dashboard at %s has no login for readers: whoever reaches it sees every slice and sliver; "
                    "keep it on loopback or set dashboard_port: null", server.url)
    return server
