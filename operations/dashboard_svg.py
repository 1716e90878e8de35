"""The dashboard's pictures, pure SVG text: the substrate topology (sites, switches, hosts, trunks, external
links, coloured by use), one slice's own topology (its nodes, links with their VLAN tags, stitching hops) and
the small utilisation charts. Every text from the state (client_ids come from experimenters) is escaped here,
so the templates may insert the SVG as it is."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

from fpga_aggregate.boards import MODELS, BoardError, boards_from_config
from operations.snapshot import Use
from resources.fpga import router_slots
from rspec.substrate import Host, Substrate, Switch, urn_name


def vlan_total(ranges: Iterable[tuple[int, int]]) -> int:
    return sum(hi - lo + 1 for lo, hi in ranges)


def vlan_ranges_text(ranges: Iterable[tuple[int, int]]) -> str:
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)


def board_fpga_count(board: Mapping[str, Any]) -> int:
    """User FPGAs on a board of the substrate's `fpga_boards:` list (0 if its model is unknown)."""
    model = MODELS.get(str(board.get("model", "")).lower())
    return model.fpgas if model else 0


def board_router_slots(board: Mapping[str, Any]) -> int:
    """Router slots of a board (resources/fpga.py): its FPGAs' hardware planes plus its software planes."""
    try:
        [parsed] = boards_from_config([board])
    except BoardError:
        return 0
    return len(router_slots(parsed))


def _gb(mb: int) -> str:
    return f"{mb / 1024:.1f}".removesuffix(".0")



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
    total, whole = board_fpga_count(b), len(use.fpgas.get(name, ()))
    slots, busy = board_router_slots(b), use.router_slots.get(name, 0)
    line = f"FPGAs whole {whole}/{total} · slots {busy}/{slots}"  # router slots
    return _node_box(x, y, name, str(b.get("model", "")), line, busy / slots if slots else 0.0, on_board,
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


def topology_svg(substrate: Substrate, use: Use, slivers: Iterable[tuple[str, str]] = ()) -> str:
    """The substrate as an SVG picture: sites as boxes holding one column per switch with the hosts cabled
    to it stacked below (bare-metal nodes and FPGA boards likewise), trunks as arcs between switches,
    external links as boxes above their switch. Each host shows its cores and memory in use (fill: free,
    < 50 %, < 90 %, full), each switch its VLAN tags in use; the slivers on each node are listed in it
    (`slivers`: (component id, client_id) pairs)."""
    on: dict[str, list[str]] = {}  # node or switch component id -> client_ids of the slivers on it
    for component_id, client_id in slivers:
        on.setdefault(component_id.lower(), []).append(client_id)
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



# ---- one slice's own topology (pure) ----------------------------------------------------------------------------
S_NODE_W, S_NODE_H, S_GAP, S_ROW = 170, 58, 28, 110
OP_COLOURS = {"geni_ready": ("#dcf0dc", "#4caf50"), "geni_failed": ("#f8d3cf", "#d0453a"),
              "geni_notready": ("#fff0c2", "#e09b00"), "geni_configuring": ("#fff0c2", "#e09b00")}


def _state_fill(op: str) -> tuple[str, str]:
    return OP_COLOURS.get(op, ("#f7f7f7", "#888"))


def _row_x(i: int, n: int, width: float) -> float:
    """Left x of box i of n centred in `width`."""
    used = n * S_NODE_W + (n - 1) * S_GAP
    return (width - used) / 2 + i * (S_NODE_W + S_GAP)


def slice_svg(slivers: Sequence[Mapping[str, Any]], substrate: Substrate | None = None) -> str:
    """A slice as a picture: its nodes in a row (client_id, where, state), below them its links (client_id,
    VLAN tag, capacity) joined to the nodes they connect, and below each stitched link its stitching hops
    (the external port, the tag on the wire, the aggregate beyond). Slivers are snapshot sliver documents."""
    nodes = [s for s in slivers if s.get("kind") == "node"]
    links = [s for s in slivers if s.get("kind") == "link"]
    hops = [(li, h) for li, link in enumerate(links) for h in (link.get("details") or {}).get("uplinks", [])]
    remote = {e.component_id.lower(): e for e in (substrate.external_links if substrate else ())}
    columns = max(len(nodes), len(links), len(hops), 1)
    width = columns * (S_NODE_W + S_GAP) + 2 * MARGIN
    node_y, link_y, hop_y = MARGIN, MARGIN + S_ROW + 20, MARGIN + 2 * S_ROW + 40
    height = (hop_y if hops else link_y if links else node_y) + S_NODE_H + MARGIN
    where: dict[str, tuple[float, float]] = {}  # node client_id -> centre of its bottom edge
    body: list[str] = []
    edges: list[str] = []
    for i, n in enumerate(nodes):
        x = _row_x(i, len(nodes), width)
        d = n.get("details") or {}
        place = str(d.get("host") or urn_name(str(n.get("component_id") or "")) or "not placed")
        fill, stroke = _state_fill(str(n.get("operational_state", "")))
        title = f"{n.get('client_id')}\n{n.get('urn')}\n{n.get('component_id')}\n{n.get('operational_state')}"
        body.append(_box(x, node_y, S_NODE_W, S_NODE_H, fill, stroke, title))
        body.append(_text(x + 8, node_y + 17, f"node {n.get('client_id')}", "dx-b", 22))
        body.append(_text(x + 8, node_y + 33, f"on {place}", "", 24))
        body.append(_text(x + 8, node_y + 49, str(n.get("operational_state", "")).removeprefix("geni_"), "dx-s", 26))
        where[str(n.get("client_id"))] = (x + S_NODE_W / 2, node_y + S_NODE_H)
    for i, link in enumerate(links):
        x = _row_x(i, len(links), width)
        d = link.get("details") or {}
        tag = d.get("vlan_tag")
        cap = int(d.get("capacity_kbps") or 0)
        for end in d.get("endpoints", []):
            if str(end) in where:
                nx, ny = where[str(end)]
                edges.append(_line(nx, ny, x + S_NODE_W / 2, link_y, "#4a6fa5", "", 2))
        title = f"{link.get('client_id')}\n{link.get('urn')}\nendpoints: {', '.join(map(str, d.get('endpoints', [])))}"
        body.append(_box(x, link_y, S_NODE_W, S_NODE_H, "#e3ebf7", "#4a6fa5", title))
        body.append(_text(x + 8, link_y + 17, f"link {link.get('client_id')}", "dx-b", 22))
        body.append(_text(x + 8, link_y + 33, f"VLAN {tag}" if tag is not None else "no VLAN tag", "", 24))
        body.append(_text(x + 8, link_y + 49, (f"{cap / 1000:g} Mb/s · " if cap else "")
                          + ", ".join(map(str, d.get("endpoints", []))), "dx-s", 28))
    for i, (li, hop) in enumerate(hops):
        x = _row_x(i, len(hops), width)
        lx = _row_x(li, len(links), width) + S_NODE_W / 2
        port = str(hop.get("port", ""))
        tags = ", ".join(str(t[1]) if isinstance(t, (list, tuple)) and len(t) > 1 else str(t)
                         for t in hop.get("tags", []))
        ext = remote.get(port.lower())
        beyond = _authority_of(ext.remote_aggregate) if ext else "another aggregate"
        edges.append(_line(lx, link_y + S_NODE_H, x + S_NODE_W / 2, hop_y, "#a05a2c", "6 4", 2))
        body.append(_box(x, hop_y, S_NODE_W, S_NODE_H, "#fbeee4", "#a05a2c", f"stitching hop {port}\ntags {tags}"))
        body.append(_text(x + 8, hop_y + 17, f"hop {urn_name(port)}", "dx-b", 22))
        body.append(_text(x + 8, hop_y + 33, f"tag {tags}" if tags else "no tag", "", 24))
        body.append(_text(x + 8, hop_y + 49, f"→ {beyond}", "dx-s", 26))
    if not nodes and not links:
        body.append(_text(MARGIN, node_y + 20, "no slivers", "dx-s"))
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:g}" height="{height:g}" '
            f'viewBox="0 0 {width:g} {height:g}" role="img" aria-label="slice topology">'
            f'{STYLE}<rect width="100%" height="100%" fill="#fff"/>{"".join(edges)}{"".join(body)}</svg>')


# ---- utilisation charts (pure) ------------------------------------------------------------------------------------
CHART_W, CHART_H, CHART_PAD = 260, 64, 4


@dataclass(frozen=True)
class Series:
    """One chart: a label, the samples (in use) oldest first, and the total they are out of."""

    label: str
    values: Sequence[float]
    total: float
    times: Sequence[str] = field(default_factory=tuple)


def chart_svg(series: Series) -> str:
    """A small line chart of `series` (y from 0 to its total), its latest value and share in words."""
    vals = list(series.values) or [0.0]
    top = max(series.total, max(vals), 1.0)
    n = len(vals)
    inner_w, inner_h = CHART_W - 2 * CHART_PAD, CHART_H - 24
    pts = [(CHART_PAD + (inner_w * i / (n - 1) if n > 1 else inner_w), 18 + inner_h * (1 - v / top))
           for i, v in enumerate(vals)]
    last = vals[-1]
    share = f" ({100 * last / series.total:.0f} %)" if series.total else ""
    frac = last / series.total if series.total else 0.0
    _, colour = _fills(frac) if frac > 0 else (None, "#4caf50")
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
    span = f"{series.times[0]} … {series.times[-1]}" if series.times else ""
    area = f"{CHART_PAD:g},{18 + inner_h:g} {line} {pts[-1][0]:.1f},{18 + inner_h:g}"
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{CHART_W}" height="{CHART_H}" '
            f'viewBox="0 0 {CHART_W} {CHART_H}" role="img" aria-label="{escape(series.label)}">{STYLE}'
            f"<title>{escape(series.label)}: {n} samples {escape(span)}</title>"
            f'<rect width="100%" height="100%" fill="#fff" stroke="#ddd"/>'
            + _text(CHART_PAD + 2, 12, f"{series.label}: {last:g}/{series.total:g}{share}", "dx-s", 48)
            + f'<polygon points="{area}" fill="{colour}" fill-opacity="0.15"/>'
            f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="1.5"/>'
            f'<circle cx="{pts[-1][0]:.1f}" cy="{pts[-1][1]:.1f}" r="2.5" fill="{colour}"/>'
            f'<line x1="{CHART_PAD}" y1="{18 + inner_h}" x2="{CHART_W - CHART_PAD}" y2="{18 + inner_h}" '
            f'stroke="#ccc"/></svg>')
