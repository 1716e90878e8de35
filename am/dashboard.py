"""A read-only operator dashboard: the substrate as a topology picture, what is allocated on it, and the
slivers of every slice, served as HTML, SVG and JSON.

It is plain HTTP, with no authentication, bound to the deployment's `host` (127.0.0.1 by default). That is
acceptable for a development deployment on loopback only: anyone who can reach the port sees every slice's
URN and client_ids. So that no web page can read it through a rebound DNS name, a dashboard bound to
loopback answers only requests whose Host header names loopback. It changes no state; the one call it makes
that may write is `SliceManager.slivers`, which first applies the actor clock's tick that the reaper applies
anyway.

Layout: the pure part (a `Snapshot` of the state → `Use`, the `state_dict` JSON, the `topology_svg` picture,
the `page_html` page) is separate from the HTTP edge (`Dashboard.respond` routes, `DashboardServer` serves)."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from html import escape
from http.server import BaseHTTPRequestHandler, HTTPServer
from socketserver import ThreadingMixIn
from typing import Any, Protocol
from urllib.parse import urlsplit

from am import reservation as rs
from am.embed import usage_counts
from am.slice_manager import Sliver
from fpga_aggregate.boards import MODELS
from rspec.substrate import Host, Substrate, Switch, urn_name
from slicex.clock import rfc3339

log = logging.getLogger("slicex.dashboard")

REFRESH_SECONDS = 5


# ---- the state the dashboard shows -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Aggregate:
    """Who the dashboard speaks for (its header)."""

    urn: str
    url: str
    driver: str = ""  # the substrate driver's own description (e.g. "emulated ...")


@dataclass(frozen=True)
class Snapshot:
    """What is allocated at one moment: claimed units, live slivers, reservations per state."""

    now: datetime
    usage_keys: frozenset[str] = frozenset()
    slivers: tuple[Sliver, ...] = ()
    reservations: Mapping[str, int] = field(default_factory=dict)


class SliceManagerView(Protocol):
    def records(self) -> list[Any]: ...

    def slivers(self, slice_urn: str, now: datetime) -> list[Sliver]: ...

    def usage_keys(self) -> set[str]: ...


def take_snapshot(sm: SliceManagerView, now: datetime) -> Snapshot:
    """Read the slice manager's state (reservation records, claims, slivers of each slice)."""
    records = sm.records()
    slivers = [s for urn in sorted({rec.slice_urn for rec in records}) for s in sm.slivers(urn, now)]
    return Snapshot(now, frozenset(sm.usage_keys()), tuple(slivers), dict(Counter(rec.r.state for rec in records)))


@dataclass(frozen=True)
class Use:
    """Units in use, per thing drawn: cores and MB per host, bare-metal nodes taken, VLAN tags per switch or
    external link, busy FPGAs and software planes per board."""

    cores: Mapping[str, int] = field(default_factory=dict)
    memory_mb: Mapping[str, int] = field(default_factory=dict)
    taken: frozenset[str] = frozenset()
    vlans: Mapping[str, frozenset[int]] = field(default_factory=dict)
    fpgas: Mapping[str, frozenset[str]] = field(default_factory=dict)
    software_planes: Mapping[str, int] = field(default_factory=dict)


def use_of(keys: Iterable[str]) -> Use:
    """Use from claim keys (`core:…`, `vlan:…`, `fpga:<board>/fpgaN`, `vplane:<board>/fpgaN:k`, `swplane:…`)."""
    keys = set(keys)
    cores, mem, taken, vlans = usage_counts(keys)
    fpgas: dict[str, set[str]] = {}
    planes: Counter[str] = Counter()
    for key in keys:
        kind, _, rest = key.partition(":")
        if kind in ("fpga", "vplane"):
            fpga = rest.split(":", 1)[0]
            fpgas.setdefault(fpga.split("/", 1)[0], set()).add(fpga)
        elif kind == "swplane":
            planes[rest.rsplit(":", 1)[0]] += 1
    return Use(cores, mem, taken, vlans, {b: frozenset(f) for b, f in fpgas.items()}, dict(planes))


def vlan_total(ranges: Iterable[tuple[int, int]]) -> int:
    return sum(hi - lo + 1 for lo, hi in ranges)


def vlan_ranges_text(ranges: Iterable[tuple[int, int]]) -> str:
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)


def board_fpga_count(board: Mapping[str, Any]) -> int:
    """User FPGAs on a board of the substrate's `fpga_boards:` list (0 if its model is unknown)."""
    model = MODELS.get(str(board.get("model", "")).lower())
    return model.fpgas if model else 0


def _gb(mb: int) -> str:
    return f"{mb / 1024:.1f}".removesuffix(".0")


def state_dict(substrate: Substrate, aggregate: Aggregate, snap: Snapshot) -> dict[str, Any]:
    """The JSON of /api/state: the substrate, what is used of each host, switch, external link and board,
    the slivers of each slice and the reservation counts."""
    use = use_of(snap.usage_keys)
    slivers_on: dict[str, list[str]] = {}
    for s in snap.slivers:
        slivers_on.setdefault(s.component_id.lower(), []).append(s.client_id)
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
               "software_planes_busy": use.software_planes.get(str(b.get("name")), 0)}
              for b in substrate.fpga_boards]
    slices: dict[str, list[dict[str, Any]]] = {}
    for s in snap.slivers:
        slices.setdefault(s.slice_urn, []).append(
            {"client_id": s.client_id, "urn": s.urn, "kind": s.kind, "component_id": s.component_id,
             "allocation_state": s.allocation_state, "operational_state": s.operational_state,
             "expires": rfc3339(s.expires), "error": s.error})
    return {"now": rfc3339(snap.now),
            "aggregate": {"urn": aggregate.urn, "url": aggregate.url, "driver": aggregate.driver},
            "substrate": {"authority": substrate.authority, "description": substrate.description,
                          "sites": [s.name for s in substrate.all_sites], "hosts": len(substrate.hosts),
                          "switches": len(substrate.switches), "trunks": [t.name for t in substrate.trunks],
                          "external_links": len(substrate.external_links),
                          "fpga_boards": len(substrate.fpga_boards)},
            "hosts": hosts, "switches": switches, "external_links": external, "fpga_boards": boards,
            "slices": slices, "reservations": {state: snap.reservations.get(state, 0) for state in rs.STATES}}


# ---- the topology picture (pure) ---------------------------------------------------------------------------------
MARGIN, COL_W, BOX_W, INDENT = 20, 230, 210, 18
SWITCH_H, NODE_H, NODE_GAP, SITE_PAD, SITE_TITLE, SITE_GAP = 56, 62, 12, 12, 24, 28
EXT_H, LANE = 54, 18
FILLS = ((0.0, "#f7f7f7", "#bbbbbb"), (0.5, "#dcf0dc", "#4caf50"), (0.9, "#fff0c2", "#e09b00"),
         (2.0, "#f8d3cf", "#d0453a"))  # (use below, box fill, bar fill)
STYLE = ("<style>.dx{font-family:DejaVu Sans,Helvetica,Arial,sans-serif;font-size:11px;fill:#222}"
         ".dx-b{font-weight:bold;font-size:12px}.dx-s{font-size:10px;fill:#555}.dx-h{font-size:13px;font-weight:bold}"
         ".dx-halo{paint-order:stroke;stroke:#fff;stroke-width:3px}</style>")


def _fills(fraction: float) -> tuple[str, str]:
    if fraction <= 0:
        return FILLS[0][1], FILLS[0][2]
    return next((box, bar) for limit, box, bar in FILLS[1:] if fraction < limit)


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "…"


def _text(x: float, y: float, text: str, cls: str = "", chars: int = 34, anchor: str = "") -> str:
    a = f' text-anchor="{anchor}"' if anchor else ""
    return f'<text x="{x:g}" y="{y:g}" class="dx {cls}"{a}>{escape(_clip(text, chars))}</text>'


def _box(x: float, y: float, w: float, h: float, fill: str, stroke: str, title: str, rx: int = 4) -> str:
    return (f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="{h:g}" rx="{rx}" fill="{fill}" stroke="{stroke}">'
            f"<title>{escape(title)}</title></rect>")


def _line(x1: float, y1: float, x2: float, y2: float, stroke: str = "#777", dash: str = "", width: float = 1.5) -> str:
    d = f' stroke-dasharray="{dash}"' if dash else ""
    return f'<line x1="{x1:g}" y1="{y1:g}" x2="{x2:g}" y2="{y2:g}" stroke="{stroke}" stroke-width="{width:g}"{d}/>'


def _authority_of(urn: str) -> str:
    """`urn:publicid:IDN+transit.example.net+authority+am` -> `transit.example.net` (else the text as it is)."""
    parts = urn.split("+")
    return parts[1] if len(parts) == 4 else urn


def _switch_of_port(substrate: Substrate) -> Callable[[str], str | None]:
    """Port component id → its switch's component id (declared ports, else the name before ':')."""
    ports = {p.component_id.lower(): sw.component_id for sw in substrate.switches for p in sw.ports}

    def switch_of(port: str) -> str | None:
        if port.lower() in ports:
            return ports[port.lower()]
        sw = substrate.switch(urn_name(port).split(":", 1)[0])
        return sw.component_id if sw else None
    return switch_of


@dataclass
class _Column:
    site: str
    switch: Switch | None
    nodes: list[Host | Mapping[str, Any]] = field(default_factory=list)


def _columns(substrate: Substrate) -> list[_Column]:
    """One column per switch (its cabled hosts under it) and one per site for what is cabled to no switch
    (and FPGA boards), sites in declaration order, '' (no site) last."""
    switch_of = _switch_of_port(substrate)
    by_switch = {sw.component_id: _Column(sw.site, sw) for sw in substrate.switches}
    loose: dict[str, _Column] = {}
    for h in substrate.hosts:
        cabled = [s for i in h.interfaces if i.switch_port and (s := switch_of(i.switch_port)) in by_switch]
        (by_switch[cabled[0]] if cabled else loose.setdefault(h.site, _Column(h.site, None))).nodes.append(h)
    for b in substrate.fpga_boards:
        site = str(b.get("site", ""))
        loose.setdefault(site, _Column(site, None)).nodes.append(b)
    order = [s.name for s in substrate.all_sites] + [""]
    cols = [*by_switch.values(), *loose.values()]
    return sorted(cols, key=lambda c: (order.index(c.site) if c.site in order else len(order), c.switch is None))


def _node_box(x: float, y: float, name: str, kind: str, line: str, frac: float, on_node: list[str],
              title: str, stroke: str = "#888") -> str:
    """A host or board: name and kind, what is used of it in words and as a bar, the slivers on it."""
    w = BOX_W - INDENT
    box, bar = _fills(frac)
    slivers = f"{len(on_node)} sliver{'s' if len(on_node) != 1 else ''}: {', '.join(on_node)}" if on_node \
        else "no slivers"
    return "".join([
        _box(x, y, w, NODE_H, box, stroke, f"{title}\n{line}\n{slivers}"),
        _text(x + 8, y + 16, name, "dx-b", int((BOX_W - INDENT - 24 - 6 * len(kind[:10])) / 7.6)), _text(x + w - 8, y + 16, kind, "dx-s", 10, "end"),
        _text(x + 8, y + 31, line, "", 32),
        f'<rect x="{x + 8:g}" y="{y + 37:g}" width="{w - 16:g}" height="6" fill="#fff" stroke="#ccc"/>',
        f'<rect x="{x + 8:g}" y="{y + 37:g}" width="{(w - 16) * min(frac, 1.0):g}" height="6" fill="{bar}"/>',
        _text(x + 8, y + 56, slivers, "dx-s", 36)])


def _host_box(h: Host, x: float, y: float, use: Use, on_host: list[str]) -> str:
    if h.exclusive:
        frac = 1.0 if h.component_id in use.taken else 0.0
        line = f"{'in use' if frac else 'free'} · {h.cores} cores, {_gb(h.memory_mb)} GB"
    else:
        cores, mem = use.cores.get(h.component_id, 0), use.memory_mb.get(h.component_id, 0)
        frac = max(cores / h.cores if h.cores else 0, mem / h.memory_mb if h.memory_mb else 0)
        line = f"cores {cores}/{h.cores} · mem {_gb(mem)}/{_gb(h.memory_mb)} GB"
    return _node_box(x, y, h.name, h.hardware_type, line, frac, on_host, h.component_id)


def _board_box(b: Mapping[str, Any], x: float, y: float, use: Use, on_board: list[str]) -> str:
    name = str(b.get("name"))
    total, busy = board_fpga_count(b), len(use.fpgas.get(name, ()))
    planes = use.software_planes.get(name, 0)
    line = f"FPGAs busy {busy}/{total}" + (f" · sw planes {planes}" if planes else "")
    return _node_box(x, y, name, str(b.get("model", "")), line, busy / total if total else 0.0, on_board,
                     f"FPGA board {name}", "#7a5")


def _switch_box(sw: Switch, x: float, y: float, use: Use, links: list[str]) -> str:
    used, total = len(use.vlans.get(sw.component_id, ())), vlan_total(sw.vlan_range)
    line = f"VLANs {used}/{total} in use"
    more = f"tags {vlan_ranges_text(sw.vlan_range)} · " + (f"links: {', '.join(links)}" if links else "no links")
    return (_box(x, y, BOX_W, SWITCH_H, "#e3ebf7", "#4a6fa5", f"{sw.component_id}\n{line}\n{more}")
            + _text(x + 8, y + 16, f"switch {sw.name}", "dx-b", 26) + _text(x + 8, y + 32, line, "", 32)
            + _text(x + 8, y + 48, more, "dx-s", 38))


def _trunk_arcs(substrate: Substrate, where: Mapping[str, float], top: float, switch_y: float) -> list[str]:
    """Trunks as arcs above the sites, shorter ones in lower lanes and ending inside longer ones so they nest;
    each ends at its own point on top of its switches, leaving the right end to external links. Labels come
    last, so their halo keeps them readable where lines cross."""
    switch_of = _switch_of_port(substrate)
    trunks = [(t, switch_of(t.port_a) or "", switch_of(t.port_b) or "") for t in substrate.trunks]
    trunks = [(t, a, b) for t, a, b in trunks if a in where and b in where and a != b]
    ends: dict[str, list[tuple[bool, float, str]]] = {}  # switch -> (goes right, -partner's x, trunk id)
    for t, a, b in trunks:
        ends.setdefault(a, []).append((where[b] > where[a], -where[b], t.component_id))
        ends.setdefault(b, []).append((where[a] > where[b], -where[a], t.component_id))

    def end_x(switch: str, trunk: str) -> float:
        order = sorted(ends[switch])  # leftward ends nearest first, then rightward ends farthest first
        k = next(i for i, (_, _, tid) in enumerate(order) if tid == trunk)
        return where[switch] + 20 + (k + 0.5) * (BOX_W - 64) / len(order)

    out, labels = [], []
    trunks.sort(key=lambda tab: abs(where[tab[1]] - where[tab[2]]))
    for lane, (t, a, b) in enumerate(trunks):
        xa, xb = sorted((end_x(a, t.component_id), end_x(b, t.component_id)))
        apex = top - 6 - lane * LANE
        ctrl = switch_y + (apex - switch_y) * 4 / 3  # a cubic's apex is 3/4 of the way to its control points
        out.append(f'<path d="M{xa:g},{switch_y:g} C{xa:g},{ctrl:g} {xb:g},{ctrl:g} {xb:g},{switch_y:g}" '
                   f'fill="none" stroke="#4a6fa5" stroke-width="3"><title>{escape(t.component_id)}</title></path>')
        labels.append(_text((xa + xb) / 2, apex - 3, f"trunk {t.name} · {t.bandwidth_kbps / 1e6:g} Gb/s",
                            "dx-s dx-halo", 40, "middle"))
    return out + labels


def _external_links(substrate: Substrate, use: Use, where: Mapping[str, float],
                    switch_y: float) -> tuple[list[str], float]:
    """External links as boxes in a row above their switches, a dashed line down to the switch's right end;
    returns them and the x where the row ends."""
    out, next_x = [], float(MARGIN)
    for e in sorted(substrate.external_links, key=lambda e: where.get(e.switch_id, 0)):
        sx = where.get(e.switch_id)
        if sx is None:
            continue
        ex = max(sx, next_x)
        next_x = ex + BOX_W + 12
        used = len(use.vlans.get(e.component_id, ()))
        line = f"VLANs {used}/{vlan_total(e.vlan_range)} in use"
        tip = f"{e.component_id} → {e.remote_aggregate}\n{e.remote_port}\n{line} ({vlan_ranges_text(e.vlan_range)})"
        out.append(_line(ex + BOX_W - 24, MARGIN + EXT_H, sx + BOX_W - 24, switch_y, "#a05a2c", "6 4", 2))
        out.append(_box(ex, MARGIN, BOX_W, EXT_H, "#fbeee4", "#a05a2c", tip))
        out.append(_text(ex + 8, MARGIN + 16, f"external link {e.name}", "dx-b", 28))
        out.append(_text(ex + 8, MARGIN + 31, f"→ {_authority_of(e.remote_aggregate)}", "", 32))
        out.append(_text(ex + 8, MARGIN + 46, f"{line} · {vlan_ranges_text(e.vlan_range)}", "dx-s", 38))
    return out, next_x


LEGEND_W = MARGIN + 46 + 4 * 64 + MARGIN


def _legend(y: float) -> str:
    out = [_text(MARGIN, y, "in use:", "dx-s")]
    for i, (label, (_, box, _bar)) in enumerate(zip(("free", "< 50 %", "< 90 %", "≥ 90 %"), FILLS, strict=True)):
        lx = MARGIN + 46 + i * 64
        out.append(_box(lx, y - 10, 14, 12, box, "#888", label, rx=2) + _text(lx + 18, y, label, "dx-s"))
    out.append(_text(MARGIN, y + 18, "lines: cables (grey), trunks (blue), external links (dashed)", "dx-s", 70))
    return "".join(out)


def topology_svg(substrate: Substrate, use: Use, slivers: Iterable[Sliver] = ()) -> str:
    """The substrate as an SVG picture: sites as boxes holding one column per switch with the hosts cabled
    to it stacked below (bare-metal nodes and FPGA boards likewise), trunks as arcs between switches,
    external links as boxes above their switch. Each host shows its cores and memory in use (fill: free,
    < 50 %, < 90 %, full), each switch its VLAN tags in use; the slivers on each node are listed in it."""
    on: dict[str, list[str]] = {}  # node or switch component id -> client_ids of the slivers on it
    for s in slivers:
        on.setdefault(s.component_id.lower(), []).append(s.client_id)
    cols = _columns(substrate)
    sites = list(dict.fromkeys(c.site for c in cols))
    has_ext = bool(substrate.external_links)
    lanes = len(substrate.trunks)
    top = MARGIN + (EXT_H + 24 if has_ext else 0) + lanes * LANE
    switch_y = top + SITE_TITLE + SITE_PAD
    nodes_y = switch_y + SWITCH_H + 18
    body: list[str] = []
    where: dict[str, float] = {}  # switch component id -> column x
    placed: dict[str, tuple[float, float, str | None]] = {}  # host component id -> x, y, its column's switch
    x = MARGIN
    bottom = nodes_y
    for site in sites:
        site_cols = [c for c in cols if c.site == site]
        cabled = any(c.switch is not None for c in site_cols)
        first_y = nodes_y if cabled else switch_y  # a site without switches has no switch row
        width = len(site_cols) * COL_W - (COL_W - BOX_W) + 2 * SITE_PAD
        height = max(len(c.nodes) for c in site_cols) * (NODE_H + NODE_GAP) + (first_y - top) + SITE_PAD
        declared = substrate.site(site)
        label = _clip((f"site {site}" if site else "no site") + (f" — {declared.description}" if declared and
                                                                 declared.description else ""), int(width / 8.5))
        body.append(_box(x, top, width, height, "none", "#999", label, rx=8))
        # a plate under the title: trunks and external links pass behind it instead of through its letters
        body.append(f'<rect x="{x + 6:g}" y="{top + 3:g}" width="{min(len(label) * 8.2 + 8, width - 12):g}" '
                    f'height="19" fill="#fff"/>' + _text(x + 10, top + 17, label, "dx-h", len(label)))
        bottom = max(bottom, top + height)
        cx = x + SITE_PAD
        for c in site_cols:
            if c.switch is not None:
                where[c.switch.component_id] = cx
                body.append(_switch_box(c.switch, cx, switch_y, use, on.get(c.switch.component_id.lower(), [])))
            elif cabled:
                body.append(_text(cx, switch_y + 28, "not cabled to a switch", "dx-s"))
            for i, node in enumerate(c.nodes):
                ny = first_y + i * (NODE_H + NODE_GAP)
                if c.switch is not None:  # the cable: a bus down the column's left edge, a tick to each node
                    body.append(_line(cx + 8, switch_y + SWITCH_H, cx + 8, ny + NODE_H / 2))
                    body.append(_line(cx + 8, ny + NODE_H / 2, cx + INDENT, ny + NODE_H / 2))
                if isinstance(node, Host):
                    placed[node.component_id] = (cx + INDENT, ny, c.switch.component_id if c.switch else None)
                    body.append(_host_box(node, cx + INDENT, ny, use, on.get(node.component_id.lower(), [])))
                else:
                    urn = substrate.fpga_board_id(node).lower()
                    body.append(_board_box(node, cx + INDENT, ny, use, on.get(urn, [])))
            cx += COL_W
        x += width + SITE_GAP
    switch_of = _switch_of_port(substrate)
    edges: list[str] = []
    for h in substrate.hosts:  # cables to a switch other than the host's column's: curves, under the boxes
        hx, hy, own = placed[h.component_id]
        for sw in dict.fromkeys(switch_of(i.switch_port) for i in h.interfaces if i.switch_port):
            if sw is not None and sw != own and sw in where:
                x1, y1, x2, y2 = hx + BOX_W - INDENT, hy + NODE_H / 2, where[sw] + BOX_W / 2, switch_y + SWITCH_H
                edges.append(f'<path d="M{x1:g},{y1:g} C{x2:g},{y1:g} {x2:g},{y1:g} {x2:g},{y2:g}" fill="none" '
                             f'stroke="#777" stroke-width="1.5" stroke-dasharray="2 3"/>')
    ext, next_x = _external_links(substrate, use, where, switch_y)
    edges += ext + _trunk_arcs(substrate, where, top, switch_y)
    width = max(x - SITE_GAP + MARGIN, next_x + MARGIN, LEGEND_W)
    height = bottom + 40 + MARGIN
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:g}" height="{height:g}" '
            f'viewBox="0 0 {width:g} {height:g}" role="img" aria-label="substrate topology">'
            f'{STYLE}<rect width="100%" height="100%" fill="#fff"/>{"".join(edges)}{"".join(body)}'
            f"{_legend(bottom + 22)}</svg>")


# ---- the page (pure) -------------------------------------------------------------------------------------------
REFRESH_JS = ("setInterval(async()=>{try{const r=await fetch(location.pathname,{cache:'no-store'});"
              "if(!r.ok)return;const d=new DOMParser().parseFromString(await r.text(),'text/html');"
              "document.querySelector('main').replaceWith(d.querySelector('main'));}catch(e){}},"
              f"{REFRESH_SECONDS * 1000});")
CSP = ("default-src 'none'; style-src 'unsafe-inline'; connect-src 'self'; "
       f"script-src 'sha256-{base64.b64encode(hashlib.sha256(REFRESH_JS.encode()).digest()).decode()}'")
PAGE_CSS = ("body{font-family:sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;margin:.5em 0 1.5em}"
            "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;font-size:13px;vertical-align:top}"
            "th{background:#eee}.err{color:#b00}.muted{color:#777}code{font-size:12px}"
            ".topo{overflow-x:auto;border:1px solid #ddd;padding:4px}")


def page_html(substrate: Substrate, aggregate: Aggregate, snap: Snapshot) -> str:
    """The dashboard page: header, topology picture, reservation counts, slivers per slice."""
    e = escape
    counts = "".join(f"<th>{e(state)}</th>" for state in rs.STATES)
    values = "".join(f"<td>{snap.reservations.get(state, 0)}</td>" for state in rs.STATES)
    rows = []
    for s in sorted(snap.slivers, key=lambda s: (s.slice_urn, s.client_id)):
        rows.append(f"<tr><td><code>{e(s.slice_urn)}</code></td><td>{e(s.client_id)}</td><td><code>{e(s.urn)}"
                    f"</code></td><td>{e(s.kind)}</td><td>{e(urn_name(s.component_id))}</td>"
                    f"<td>{e(s.allocation_state)}</td><td>{e(s.operational_state)}</td><td>{rfc3339(s.expires)}"
                    f'</td><td class="err">{e(s.error)}</td></tr>')
    slivers = ("<table><tr><th>slice</th><th>client_id</th><th>sliver</th><th>kind</th><th>on</th>"
               "<th>allocation</th><th>operational</th><th>expires</th><th>geni_error</th></tr>"
               + "".join(rows) + "</table>") if rows else '<p class="muted">No slivers.</p>'
    svg = topology_svg(substrate, use_of(snap.usage_keys), snap.slivers)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>slicex · {e(substrate.authority)}'
            f"</title><style>{PAGE_CSS}</style><noscript><meta http-equiv=\"refresh\" content=\"{REFRESH_SECONDS}\">"
            f"</noscript><script>{REFRESH_JS}</script></head><body><main>"
            f"<h1>slicex aggregate {e(substrate.authority)}</h1>"
            f"<p>AM <code>{e(aggregate.urn)}</code> at <code>{e(aggregate.url)}</code><br>"
            f"substrate: {e(substrate.description or '(no description)')}"
            f"{' · ' + e(aggregate.driver) if aggregate.driver else ''}<br>"
            f'<span class="muted">as of {rfc3339(snap.now)}, refreshed every {REFRESH_SECONDS} s · '
            f'<a href="/topology.svg">topology.svg</a> · <a href="/api/state">api/state</a></span></p>'
            f'<h2>Topology</h2><div class="topo">{svg}</div>'
            f"<h2>Reservations</h2><table><tr>{counts}</tr><tr>{values}</tr></table>"
            f"<h2>Slivers</h2>{slivers}</main></body></html>")


# ---- the HTTP edge -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Response:
    status: int
    content_type: str
    body: bytes


class Dashboard:
    """Routes a request to the page, the picture or the JSON, taking a fresh snapshot each time."""

    def __init__(self, substrate: Substrate, aggregate: Aggregate, state: Callable[[], Snapshot],
                 health: Callable[[], dict[str, Any]] | None = None, metrics: Any = None):
        self.substrate = substrate
        self.aggregate = aggregate
        self.state = state
        self.health = health
        self.metrics = metrics  # am.metrics.Metrics: /metrics, which reads its own cached sample, not state()

    def respond(self, method: str, target: str) -> Response:
        path = urlsplit(target).path
        routes = {"/": self._page, "/topology.svg": self._svg, "/api/state": self._json}
        if path not in routes and not (path == "/health" and self.health is not None) \
                and not (path == "/metrics" and self.metrics is not None):
            return Response(404, "text/plain; charset=utf-8", f"not found: {path}\n".encode())
        if method != "GET":
            return Response(405, "text/plain; charset=utf-8", b"read-only dashboard: GET only\n")
        if path == "/health":
            return self._health()
        if path == "/metrics":
            return Response(200, self.metrics.content_type, self.metrics.exposition())
        try:
            return routes[path](self.state())
        except Exception as exc:  # noqa: BLE001 - a store outage is a 503 page, not a dead server
            log.exception("dashboard could not read the state")
            return Response(503, "text/plain; charset=utf-8", f"cannot read the state now: {exc}\n".encode())

    def _health(self) -> Response:
        """Whether this process can serve (200) or not (503), and why: for monitoring and `slicex status`."""
        assert self.health is not None
        try:
            report = self.health()
        except Exception as exc:  # noqa: BLE001 - a health check that breaks is itself a failed check
            log.exception("health check failed")
            report = {"serving": False, "checks": {"health": f"the check itself failed: {type(exc).__name__}: {exc}"}}
        return Response(200 if report.get("serving") else 503, "application/json", json.dumps(report).encode())

    def _page(self, snap: Snapshot) -> Response:
        return Response(200, "text/html; charset=utf-8", page_html(self.substrate, self.aggregate, snap).encode())

    def _svg(self, snap: Snapshot) -> Response:
        svg = topology_svg(self.substrate, use_of(snap.usage_keys), snap.slivers)
        return Response(200, "image/svg+xml", ('<?xml version="1.0" encoding="UTF-8"?>\n' + svg).encode())

    def _json(self, snap: Snapshot) -> Response:
        body = json.dumps(state_dict(self.substrate, self.aggregate, snap), indent=1)
        return Response(200, "application/json", body.encode())


LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def _host_name(header: str) -> str:
    """The name in a Host header, without the port: `127.0.0.1:8004` -> `127.0.0.1`, `[::1]:80` -> `[::1]`."""
    name = header.strip().lower()
    return name.rsplit(":", 1)[0] if ":" in name.rsplit("]", 1)[-1] else name


class _Handler(BaseHTTPRequestHandler):
    server: DashboardServer
    server_version = "slicex-dashboard"
    timeout = 30  # a client that sends nothing does not hold its thread for ever

    def __getattr__(self, name: str) -> Any:
        if name.startswith("do_"):  # every method reaches respond(): GET is served, the others get 405
            return self._serve
        raise AttributeError(name)

    def _serve(self) -> None:
        if self.server.loopback_only and _host_name(self.headers.get("Host") or "") not in LOOPBACK:
            resp = Response(403, "text/plain; charset=utf-8", b"this dashboard answers loopback names only\n")
        else:
            resp = self.server.dashboard.respond(self.command, self.path)
        self.send_response(resp.status)
        self.send_header("Content-Type", resp.content_type)
        self.send_header("Content-Length", str(len(resp.body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", CSP)
        if resp.status == 405:
            self.send_header("Allow", "GET")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(resp.body)

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), fmt % args)


class DashboardServer(ThreadingMixIn, HTTPServer):
    """The dashboard on plain HTTP, one thread per request."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], dashboard: Dashboard):
        self.dashboard = dashboard
        self.loopback_only = address[0] in LOOPBACK
        super().__init__(address, _Handler)

    @property
    def url(self) -> str:
        host = self.server_address[0]
        return f"http://{f'[{host}]' if ':' in host else host}:{self.server_address[1]}/"

    def start(self) -> str:
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, name="dashboard",
                         daemon=True).start()
        return self.url

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A browser that went away mid-answer is a log line, not a traceback on stderr."""
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            log.info("dashboard request from %s ended early", client_address)
        else:
            log.exception("dashboard request from %s failed", client_address)

    def close(self) -> None:
        self.shutdown()
        self.server_close()


def start_dashboard(host: str, port: int, dashboard: Dashboard) -> DashboardServer | None:
    """Serve the dashboard on host:port (0: a free port). A port already in use is a warning, not a failed
    deployment: the aggregate runs on without its dashboard."""
    try:
        server = DashboardServer((host, port), dashboard)
    except OSError as exc:
        log.warning("dashboard not started: cannot listen on %s:%d: %s", host, port, exc)
        return None
    server.start()
    log.info("dashboard at %s", server.url)
    if not server.loopback_only:
        log.warning("the dashboard at %s is plain HTTP without authentication: whoever reaches it sees every "
                    "slice and sliver; keep it on loopback or set dashboard_port: null", server.url)
    return server
