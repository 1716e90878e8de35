"""Dry-run placement: will a request fit, where would each node and link go, and for what does not fit, what
is short (asked vs available, by resource and site). Nothing is claimed, booked or written.

It is the planner Allocate uses (`am.embed.plan`, in its collecting mode) over the broker's answer to "what is
unavailable for this term" (`Broker.unavailable`) and the inventory the authority reclaimed, with the broker's
host ranking; so a plan that fits is where Allocate would put the request if nothing changes in between.
The answer is plain data (XML-RPC friendly): `slicex plan` prints it, Allocate with `slicex_dry_run` returns
it as its `value`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from datetime import datetime, timedelta
from typing import Any

from am.embed import (
    BARE_METAL_TYPES,
    BW_CHUNK_KBPS,
    MEM_CHUNK_MB,
    VM_ALIASES,
    Placement,
    Shortfall,
    keys_under,
    plan,
    vm_size_for,
)
from rspec.request import Request, RequestNode
from rspec.substrate import Host, Substrate, urn_name
from slicex.term import Term


# ---- pure: what a plan says --------------------------------------------------------------------------------------
def _free_cores(h: Host, taken: Set[str]) -> int:
    return sum(1 for i in range(h.cores) if f"core:{h.component_id}:{i}" not in taken)


def _free_mb(h: Host, taken: Set[str]) -> int:
    return MEM_CHUNK_MB * sum(1 for i in range(h.memory_mb // MEM_CHUNK_MB) if f"mem:{h.component_id}:{i}" not in taken)


def _node_needs(substrate: Substrate, node: RequestNode, taken: Set[str]) -> list[dict[str, Any]]:
    """Asked vs available per resource and site for a node that did not fit. For VMs, `available` is the most
    one host of the site offers (a VM cannot span hosts); for bare metal, the free nodes of the site."""
    if node.fpga is not None:
        return _fpga_needs(substrate, node, taken)
    host = substrate.host(node.component_id) if node.component_id else None
    bare = node.sliver_type in BARE_METAL_TYPES or (node.exclusive is True and node.sliver_type is None) or \
        (host is not None and host.exclusive and node.sliver_type not in (None, *VM_ALIASES))
    candidates = [host] if host is not None else [h for h in substrate.hosts if h.exclusive == bare]
    sites = list(dict.fromkeys(h.site for h in candidates))
    if bare:
        return [{"resource": "bare-metal nodes", "site": site, "asked": 1,
                 "available": sum(1 for h in candidates if h.site == site and f"node:{h.component_id}" not in taken)}
                for site in sites]
    size = vm_size_for(substrate, node)
    out: list[dict[str, Any]] = []
    for site in sites:
        here = [h for h in candidates if h.site == site]
        out.append({"resource": "cores", "site": site, "asked": size.cores,
                    "available": max((_free_cores(h, taken) for h in here), default=0)})
        out.append({"resource": "memory_mb", "site": site, "asked": size.memory_mb,
                    "available": max((_free_mb(h, taken) for h in here), default=0)})
    return out


def _fpga_needs(substrate: Substrate, node: RequestNode, taken: Set[str]) -> list[dict[str, Any]]:
    from am.embed import SOFTWARE_PLANES_PER_BOARD
    from fpga_aggregate.boards import boards_from_config

    req = node.fpga
    assert req is not None
    site_of = {str(b.get("name")): str(b.get("site", "")) for b in substrate.fpga_boards}
    free: dict[str, int] = {}
    for b in boards_from_config(substrate.fpga_boards):
        if req.board and b.name != req.board:
            continue
        site = site_of.get(b.name, "")
        if req.kind == "fpga-bitstream":
            n = sum(1 for f in b.fpgas if f"fpga:{f.id}" not in taken
                    and not any(k.startswith(f"vplane:{f.id}:") for k in taken))
        else:
            n = sum(1 for k in range(SOFTWARE_PLANES_PER_BOARD) if f"swplane:{b.name}:{k}" not in taken) + \
                sum(1 for f in b.fpgas if f"fpga:{f.id}" not in taken
                    for k in range(f.hardware_planes) if f"vplane:{f.id}:{k}" not in taken)
        free[site] = free.get(site, 0) + n
    what = "FPGAs" if req.kind == "fpga-bitstream" else "FPGA or software planes"
    return [{"resource": what, "site": site, "asked": 1, "available": n} for site, n in free.items()] or \
        [{"resource": what, "site": "", "asked": 1, "available": 0}]


def _link_needs(substrate: Substrate, link: Any, ifaces: Mapping[str, str], taken: Set[str]) -> list[dict[str, Any]]:
    """Asked vs available for a link that did not fit: bandwidth on each endpoint interface, and VLAN tags
    (free ones common to every switch the link crosses) on each switch."""
    from am.embed import _switches_of  # the planner's own notion of which switches a link crosses

    host_ifaces = [ifaces[r] for r in link.interface_refs if r in ifaces]
    site_of_iface = {i.component_id: h.site for h in substrate.hosts for i in h.interfaces}
    out: list[dict[str, Any]] = []
    if link.capacity_kbps:
        for hi in host_ifaces:
            iface = next(i for h in substrate.hosts for i in h.interfaces if i.component_id == hi)
            free = sum(1 for i in range(iface.bandwidth_kbps // BW_CHUNK_KBPS) if f"bw:{hi}:{i}" not in taken)
            out.append({"resource": "bandwidth_kbps", "site": site_of_iface.get(hi, ""), "interface": urn_name(hi),
                        "asked": link.capacity_kbps, "available": free * BW_CHUNK_KBPS})
    switches = _switches_of(substrate, host_ifaces)
    if switches and (len(host_ifaces) > 1 or link.vlan_tag is not None):
        common = set.intersection(*({t for lo, hi in sw.vlan_range for t in range(lo, hi + 1)} for sw in switches))
        if link.vlan_tag is not None:
            common &= {link.vlan_tag}
        free = [t for t in common if all(f"vlan:{sw.component_id}:{t}" not in taken for sw in switches)]
        for sw in switches:
            out.append({"resource": "vlan tags", "site": sw.site, "switch": sw.name,
                        "asked": link.vlan_tag if link.vlan_tag is not None else 1, "available": len(free)})
    return out


def _node_entry(substrate: Substrate, p: Placement) -> dict[str, Any]:
    d = p.details
    host = substrate.host(p.component_id)
    entry: dict[str, Any] = {"client_id": p.client_id, "component_id": p.component_id,
                             "host": d.get("host") or urn_name(p.component_id),
                             "site": host.site if host else "", "sliver_type": d.get("sliver_type", "")}
    for key in ("vm_size", "cores", "memory_mb", "fpga", "placement"):
        if d.get(key) not in (None, ""):
            entry[key] = d[key]
    entry["interfaces"] = {ref: urn_name(i["component_id"]) for ref, i in d.get("interfaces", {}).items()}
    return entry


def _link_entry(substrate: Substrate, p: Placement) -> dict[str, Any]:
    d = p.details
    switches = sorted({k.split(":", 1)[1].rsplit(":", 1)[0] for k in p.keys if k.startswith("vlan:")})
    sw = substrate.switch(urn_name(p.component_id)) if p.component_id else None
    return {"client_id": p.client_id, "switch": urn_name(p.component_id) if p.component_id else "",
            "switches": [urn_name(s) for s in switches], "site": sw.site if sw else "",
            "vlan_tag": d.get("vlan_tag") if d.get("vlan_tag") is not None else "",
            "capacity_kbps": d.get("capacity_kbps", 0), "endpoints": list(d.get("endpoints", []))}


def report(substrate: Substrate, request: Request, placements: Iterable[Placement],
           shortfalls: Iterable[Shortfall]) -> dict[str, Any]:
    """The dry-run answer: `fits`, `nodes` and `links` placed (host / switch, VLAN), `short` (per element
    that did not fit: the GENI error type, the planner's reason, and `needs`: asked vs available by resource
    and site), and a one-line `summary`."""
    placements = list(placements)
    shortfalls = list(shortfalls)
    ifaces = {ref: i["component_id"] for p in placements if p.kind == "node"
              for ref, i in p.details.get("interfaces", {}).items()}
    short: list[dict[str, Any]] = []
    for s in shortfalls:
        if s.error is None:
            short.append({"client_id": s.client_id, "kind": s.kind, "error": "", "geni_code": 0,
                          "reason": f"link {s.client_id}: not planned, its node(s) {', '.join(s.blocked_by)} do "
                                    f"not fit", "needs": []})
            continue
        needs = _node_needs(substrate, request.node(s.client_id), s.taken) if s.kind == "node" else \
            _link_needs(substrate, next(lk for lk in request.links if lk.client_id == s.client_id), ifaces, s.taken)
        short.append({"client_id": s.client_id, "kind": s.kind, "error": type(s.error).__name__,
                      "geni_code": s.error.code, "reason": s.error.message, "needs": needs})
    nodes = [_node_entry(substrate, p) for p in placements if p.kind == "node"]
    links = [_link_entry(substrate, p) for p in placements if p.kind == "link"]
    if short:
        summary = "does not fit: " + "; ".join(s["reason"] for s in short)
    else:
        where = ", ".join(dict.fromkeys(n["host"] for n in nodes))
        tags = ", ".join(str(lk["vlan_tag"]) for lk in links if lk["vlan_tag"] != "")
        summary = (f"fits: {len(nodes)} node{'s' * (len(nodes) != 1)}{' on ' + where if where else ''}, "
                   f"{len(links)} link{'s' * (len(links) != 1)}{' (VLAN ' + tags + ')' if tags else ''}")
    return {"fits": not short, "summary": summary, "nodes": nodes, "links": links, "short": short}


def dry_run(substrate: Substrate, request: Request, used: Set[str], image_policy: str = "reject",
            bitstream_parts: Mapping[str, str] | None = None, policy: Any = None) -> dict[str, Any]:
    """Plan `request` over the units in `used` without taking any; the report above."""
    shortfalls: list[Shortfall] = []
    placements = plan(substrate, request, used, image_policy, bitstream_parts, policy, shortfalls=shortfalls)
    return report(substrate, request, placements, shortfalls)


# ---- edge: what is unavailable, as the slice manager asks it before Allocate --------------------------------------
def unavailable(substrate: Substrate, broker: Any, authority_name: str, start: datetime, end: datetime) -> set[str]:
    """The broker's answer for the term (its promises and every claim in the store), plus the inventory the
    authority reclaimed (hosts in maintenance): exactly what the slice manager plans around. Reads only."""
    used = set(broker.unavailable(Term(start, end)))
    reclaimed = getattr(broker, "reclaimed", None)
    if reclaimed is not None:
        used |= keys_under(substrate, set(reclaimed(authority_name)))
    return used


def for_slice_manager(sm: Any, authority_name: str) -> Any:
    """The AM's `dry_run` callable over a slice manager's substrate, broker, image policy and catalogue."""
    def run(request: Request, owner_urn: str, now: datetime, end: datetime) -> dict[str, Any]:
        parts = {b.ref: b.part for b in sm.bitstreams.list(owner_urn)} if sm.bitstreams is not None else {}
        used = unavailable(sm.substrate, sm.broker, authority_name, now, end)
        return dry_run(sm.substrate, request, used, sm.image_policy, parts, getattr(sm.broker, "policy", None))
    return run


def plan_at_home(home: Any, rspec_xml: str, now: datetime, user: str | None = None) -> dict[str, Any]:
    """`slicex plan`: the dry run against a deployment's store (running or not), as its AM would answer
    Allocate with `slicex_dry_run` now. Builds a broker over the store only to read its calendar."""
    from broker.broker import Broker
    from broker.policy import policy_named
    from fpga_aggregate.bitstreams import BitstreamCatalogue
    from rspec.request import parse_request
    from rspec.substrate import default_substrate, load_substrate
    from slicex.store import open_store

    cfg = home.config()
    substrate = load_substrate(cfg["substrate"]) if cfg["substrate"] else default_substrate(cfg["authority"])
    name = f"urn:publicid:IDN+{cfg['authority']}+authority+am"
    whole = parse_request(rspec_xml)
    request = whole.for_aggregate(name)
    if substrate.external_links:
        from stitching.am_hops import apply_hops

        request = apply_hops(substrate, request, whole)
    store = open_store(cfg["store"])
    try:
        broker = Broker("broker", store, None, policy=policy_named(cfg.get("broker_policy", "first-fit")),
                        authority=name)  # never signs: only its calendar is read
        parts: dict[str, str] = {}
        if user:
            owner = f"urn:publicid:IDN+{cfg['authority']}+user+{user}"
            parts = {b.ref: b.part for b in BitstreamCatalogue(store, home.root / "bitstreams").list(owner)}
        end = now + timedelta(minutes=float(cfg["am"]["allocation_lifetime_minutes"]))
        used = unavailable(substrate, broker, name, now, end)
        return dry_run(substrate, request, used, cfg["image_policy"], parts, broker.policy)
    finally:
        store.close()


def plan_text(answer: Mapping[str, Any]) -> str:
    """The dry-run answer for a terminal: the summary, a line per node and link placed, and per element that
    does not fit its reason and what is short."""
    lines = [str(answer["summary"])]
    for n in answer["nodes"]:
        size = f" {n['vm_size']} ({n['cores']} cores, {n['memory_mb']} MB)" if n.get("vm_size") else \
            f" {n.get('sliver_type', '')}"
        lines.append(f"  node {n['client_id']:<12} -> {n['host']}{' (site ' + n['site'] + ')' if n['site'] else ''}"
                     f"{size}")
    for lk in answer["links"]:
        tag = f" VLAN {lk['vlan_tag']}" if lk["vlan_tag"] != "" else " (no VLAN)"
        on = f"switch {', '.join(lk['switches']) or lk['switch']}" if lk["switch"] else "no switch"
        lines.append(f"  link {lk['client_id']:<12} -> {on}{tag} between {', '.join(lk['endpoints'])}")
    for s in answer["short"]:
        lines.append(f"  short {s['kind']} {s['client_id']}: {s['error'] + ': ' if s['error'] else ''}{s['reason']}")
        for need in s["needs"]:
            where = ", ".join(f"{k} {need[k]}" for k in ("site", "switch", "interface") if need.get(k))
            lines.append(f"      {need['resource']}{' at ' + where if where else ''}: asked {need['asked']}, "
                         f"available {need['available']}")
    return "\n".join(lines)
