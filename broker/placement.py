"""The broker's placement policy: where each demanded node and link goes, chosen from the broker's own
calendar (pure; no store, no clock).

The slice manager sends *demands* (protocol/messages.py `Demands`, to broker/broker.py `Broker.place`): per reservation a node (sliver type or
size, image, bound component, FPGA kind and part, interfaces) or a link (endpoint interfaces, bandwidth, an
asked VLAN tag, stitching uplinks). The broker turns the units it cannot promise over the term into `used`
and calls `plan`, which picks hosts, unit keys (slicex/inventory.py) and labels; the broker then books and
claims exactly those, all or nothing. The substrate the plan walks is the description the authority
delegated with its inventory (broker/delegation.py), never the slice manager's copy.

`plan` has a collecting mode (a dry run): a node or link that does not fit is recorded as a Shortfall and
skipped, and `report` turns the result into asked-vs-available by resource and site."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field
from typing import Any

from protocol.sizing import BARE_METAL_TYPES, VM_ALIASES, vm_size_for
from rspec.request import Request, RequestNode
from rspec.substrate import Host, Substrate, VmSize, urn_name
from slicex.errors import BadArgs, GeniError, InsufficientBandwidth, InsufficientNodes, VlanUnavailable
from slicex.inventory import BW_CHUNK_KBPS, MEM_CHUNK_MB, SOFTWARE_PLANES_PER_BOARD


@dataclass(frozen=True)
class Placement:
    client_id: str
    kind: str  # node | link
    component_id: str
    keys: tuple[str, ...]
    details: Mapping[str, Any] = field(default_factory=dict)


SHORT = (InsufficientNodes, InsufficientBandwidth, VlanUnavailable)  # capacity errors a dry run collects


@dataclass(frozen=True)
class Shortfall:
    """A requested node or link that did not fit (dry run): the planner's error and the units taken when it
    was tried; `blocked_by` names the nodes that did not fit when a link was not tried because of them."""

    client_id: str
    kind: str  # node | link
    error: GeniError | None
    taken: frozenset[str]
    blocked_by: tuple[str, ...] = ()


def host_keys(host: Host, size: VmSize, used: Set[str]) -> tuple[str, ...] | None:
    """Free core and memory keys for one VM of `size` on `host`, or None if it does not fit."""
    cores = [f"core:{host.component_id}:{i}" for i in range(host.cores) if f"core:{host.component_id}:{i}" not in used]
    chunks = -(-size.memory_mb // MEM_CHUNK_MB)
    mem = [f"mem:{host.component_id}:{i}" for i in range(host.memory_mb // MEM_CHUNK_MB)
           if f"mem:{host.component_id}:{i}" not in used]
    if len(cores) < size.cores or len(mem) < chunks:
        return None
    return tuple(cores[: size.cores] + mem[:chunks])


def plan(substrate: Substrate, request: Request, used: Set[str], image_policy: str = "reject",
         bitstream_parts: Mapping[str, str] | None = None, policy: Any = None,
         shortfalls: list[Shortfall] | None = None) -> list[Placement]:
    """Place every node and link of `request` given the keys already claimed; raise a GeniError naming what
    was short. `bitstream_parts` maps the requester's bitstream refs to the FPGA part they were built for.
    With `shortfalls` (a dry run), a node or link short of capacity is recorded there and skipped instead,
    so one answer names everything that does not fit; request errors (BADARGS) still raise."""
    taken: set[str] = set(used)
    placements: list[Placement] = []
    node_host: dict[str, Host] = {}
    iface_owner: dict[str, tuple[str, str]] = {}  # request iface client_id -> (node client_id, host iface cid)
    short_iface: dict[str, str] = {}  # request iface client_id -> its node, which did not fit
    for node in request.nodes:
        try:
            p = place_fpga(substrate, node, taken, bitstream_parts or {}) if node.fpga is not None \
                else _place_node(substrate, node, taken, image_policy, policy)
        except SHORT as err:
            if shortfalls is None:
                raise
            shortfalls.append(Shortfall(node.client_id, "node", err, frozenset(taken)))
            short_iface.update((ri.client_id, node.client_id) for ri in node.interfaces)
            continue
        if node.fpga is not None:
            taken.update(p.keys)
            placements.append(p)
            continue
        taken.update(p.keys)
        host = substrate.host(p.component_id)
        assert host is not None
        node_host[node.client_id] = host
        ifaces = {}
        for n, ri in enumerate(node.interfaces):
            if not host.interfaces:
                raise BadArgs(f"node {node.client_id}: host {host.name} has no interfaces for {ri.client_id}")
            hi = host.interfaces[n % len(host.interfaces)]
            if ri.component_id and ri.component_id.lower() not in {i.component_id.lower() for i in host.interfaces}:
                raise BadArgs(f"interface {ri.client_id}: component_id {ri.component_id} is not an interface of "
                              f"{host.component_id}")
            if ri.component_id:
                hi = next(i for i in host.interfaces if i.component_id.lower() == ri.component_id.lower())
            iface_owner[ri.client_id] = (node.client_id, hi.component_id)
            ifaces[ri.client_id] = {"component_id": hi.component_id, "ip": ri.ip or "", "netmask": ri.netmask or ""}
        execute = {"execute": [{"shell": sh, "command": c} for sh, c in node.execute]} if node.execute else {}
        placements.append(Placement(p.client_id, "node", p.component_id, p.keys,
                                    {**p.details, "interfaces": ifaces, **execute}))
    for index, link in enumerate(request.links):
        blocked = tuple(dict.fromkeys(short_iface[r] for r in link.interface_refs if r in short_iface))
        if blocked:
            assert shortfalls is not None
            shortfalls.append(Shortfall(link.client_id, "link", None, frozenset(taken), blocked))
            continue
        try:
            p = _place_link(substrate, link, index, iface_owner, taken)
        except SHORT as err:
            if shortfalls is None:
                raise
            shortfalls.append(Shortfall(link.client_id, "link", err, frozenset(taken)))
            continue
        taken.update(p.keys)
        placements.append(p)
    return placements


def place_fpga(substrate: Substrate, node: RequestNode, taken: set[str], parts: Mapping[str, str]) -> Placement:
    """A whole FPGA for a user bitstream, or a virtual router: a hardware plane on a shared FPGA when it needs
    more than a software plane delivers, else a software plane (first fit)."""
    from fpga_aggregate.boards import boards_from_config
    from fpga_aggregate.placement import Capacity
    from fpga_aggregate.programming import programming_seconds

    req = node.fpga
    boards = [b for b in boards_from_config(substrate.fpga_boards) if not req.board or b.name == req.board]
    if not boards:
        raise InsufficientNodes(f"node {node.client_id}: no FPGA board{' ' + req.board if req.board else ''} here")
    urn = f"urn:publicid:IDN+{substrate.authority}+node+"
    if req.kind == "fpga-bitstream":
        part = parts.get(req.bitstream)
        if part is None:
            raise BadArgs(f"node {node.client_id}: bitstream {req.bitstream} is not in your catalogue; upload it "
                          f"first (slicex fpga upload)")
        norm = part.lower().removeprefix("xc")
        for b in boards:
            for f in b.fpgas:
                busy = any(k.startswith(f"vplane:{f.id}:") for k in taken) or f"fpga:{f.id}" in taken
                if f.model.device == norm and not busy:
                    return Placement(node.client_id, "node", urn + b.name, (f"fpga:{f.id}",),
                                     {"fpga": f.id, "board_model": f.model.name, "bitstream": req.bitstream,
                                      "sliver_type": "fpga-bitstream", "exclusive": True,
                                      "boot_seconds": programming_seconds(1)})
        models = sorted({f.model.device for b in boards for f in b.fpgas})
        raise InsufficientNodes(f"node {node.client_id}: no free FPGA of part {part} (boards here have "
                                f"{', '.join(models)}; matching ones are all in use)")
    sw_rate = Capacity((), 0).software_mbps_per_plane
    # the authority's FPGA model places the router on the board of its unit (hardware or software plane) and
    # compiles these routes; the unit is the board's plane count the broker keeps
    router = {"demand_mbps": req.bandwidth_mbps, "table_size": req.table_size, "routes": list(req.routes)}
    if req.bandwidth_mbps > sw_rate:
        for b in boards:
            for f in b.fpgas:
                if f"fpga:{f.id}" in taken:
                    continue
                for k in range(f.hardware_planes):
                    key = f"vplane:{f.id}:{k}"
                    if key not in taken:
                        return Placement(node.client_id, "node", urn + b.name, (key,),
                                         {**router, "board": b.name, "fpga": f.id, "board_model": f.model.name,
                                          "placement": "hardware",
                                          "bandwidth_mbps": min(req.bandwidth_mbps, f.line_rate_mbps),
                                          "sliver_type": "virtual-router", "exclusive": False,
                                          "boot_seconds": 5.0})
    for b in boards:
        for k in range(SOFTWARE_PLANES_PER_BOARD):
            key = f"swplane:{b.name}:{k}"
            if key not in taken:
                return Placement(node.client_id, "node", urn + b.name, (key,),
                                 {**router, "board": b.name, "fpga": f"{b.name}/software",
                                  "board_model": b.model.name, "placement": "software",
                                  "bandwidth_mbps": min(req.bandwidth_mbps, sw_rate), "sliver_type": "virtual-router",
                                  "exclusive": False, "boot_seconds": 1.0})
    raise InsufficientNodes(f"node {node.client_id}: asked for a virtual router of {req.bandwidth_mbps} Mbps; no "
                            f"hardware plane or software plane is free on {', '.join(b.name for b in boards)}")


def _place_node(substrate: Substrate, node: RequestNode, taken: set[str], image_policy: str,
                policy: Any = None) -> Placement:
    image = None
    if node.disk_image:
        img = substrate.image(node.disk_image)
        if img is None and image_policy == "reject":
            offered = ", ".join(i.urn for i in substrate.images)
            raise BadArgs(f"node {node.client_id}: disk image {node.disk_image} is not offered here "
                          f"(offered: {offered})")
        image = img.urn if img else node.disk_image
    bare = (node.sliver_type in BARE_METAL_TYPES) or (node.exclusive is True and node.sliver_type is None)
    if node.component_id:
        host = substrate.host(node.component_id)
        if host is None:
            raise InsufficientNodes(f"node {node.client_id}: component {node.component_id} does not exist at "
                                    f"{substrate.component_manager_id}")
        candidates = [host]
        bare = bare or host.exclusive
        if bare and not host.exclusive:
            raise BadArgs(f"node {node.client_id}: {host.name} is a shared VM host; bare metal needs one of "
                          f"{', '.join(h.name for h in substrate.hosts if h.exclusive) or 'none offered'}")
        if not bare and host.exclusive and node.sliver_type not in (None, *VM_ALIASES):
            bare = True
    else:
        candidates = [h for h in substrate.hosts if h.exclusive == bare]
    if bare:
        for h in candidates:
            if h.exclusive and f"node:{h.component_id}" not in taken:
                return Placement(node.client_id, "node", h.component_id, (f"node:{h.component_id}",),
                                 {"exclusive": True, "sliver_type": "raw-pc", "disk_image": image or "",
                                  "host": h.name, "cores": h.cores, "memory_mb": h.memory_mb})
        total = sum(1 for h in substrate.hosts if h.exclusive)
        what = candidates[0].name if node.component_id else f"any of {total} bare-metal nodes"
        raise InsufficientNodes(f"node {node.client_id}: asked for bare metal on {what}; none free "
                                f"({sum(1 for h in substrate.hosts if h.exclusive and f'node:{h.component_id}' in taken)}"
                                f" of {total} held by slivers)")
    size = vm_size_for(substrate, node)
    if policy is not None:
        candidates = policy.order(candidates, taken)
    for h in candidates:
        keys = host_keys(h, size, taken)
        if keys is not None:
            return Placement(node.client_id, "node", h.component_id, keys,
                             {"exclusive": False, "sliver_type": node.sliver_type or size.name, "vm_size": size.name,
                              "disk_image": image or (substrate.images[0].urn if substrate.images else ""),
                              "host": h.name, "cores": size.cores, "memory_mb": size.memory_mb})
    free = ", ".join(
        f"{h.name}: {sum(1 for i in range(h.cores) if f'core:{h.component_id}:{i}' not in taken)} cores free"
        for h in candidates)
    raise InsufficientNodes(f"node {node.client_id}: asked for a {size.name} VM ({size.cores} cores, "
                            f"{size.memory_mb} MB) on {'host ' + node.component_id if node.component_id else 'any host'}; "
                            f"nothing fits ({free or 'no VM hosts'})")


def _place_link(substrate: Substrate, link, index: int, iface_owner: Mapping[str, tuple[str, str]],
                taken: set[str]) -> Placement:
    endpoints = [iface_owner[r] for r in link.interface_refs if r in iface_owner]
    keys: list[str] = []
    if link.capacity_kbps:
        chunks = -(-link.capacity_kbps // BW_CHUNK_KBPS)
        for _node, hi in endpoints:
            iface = next(i for h in substrate.hosts for i in h.interfaces if i.component_id == hi)
            free = [f"bw:{hi}:{i}" for i in range(iface.bandwidth_kbps // BW_CHUNK_KBPS)
                    if f"bw:{hi}:{i}" not in taken and f"bw:{hi}:{i}" not in keys]
            if len(free) < chunks:
                raise InsufficientBandwidth(
                    f"link {link.client_id}: asked for {link.capacity_kbps} kbps on {hi}; "
                    f"{len(free) * BW_CHUNK_KBPS} kbps free of {iface.bandwidth_kbps}")
            keys.extend(free[:chunks])
    tag = None
    switches = _switches_of(substrate, [hi for _n, hi in endpoints])
    if len(endpoints) > 1 or link.vlan_tag is not None:
        if not switches:
            raise VlanUnavailable(f"link {link.client_id}: its endpoints are not cabled to any switch here")
        common = set.intersection(*({t for lo, hi in sw.vlan_range for t in range(lo, hi + 1)} for sw in switches))
        where = " and ".join(f"{sw.name} ({_ranges(sw.vlan_range)})" for sw in switches)
        if link.vlan_tag is not None:
            if link.vlan_tag not in common:
                raise VlanUnavailable(f"link {link.client_id}: VLAN {link.vlan_tag} is not in the range of {where}")
            common = {link.vlan_tag}
        free = sorted(t for t in common if all(f"vlan:{sw.component_id}:{t}" not in taken for sw in switches))
        if not free:
            asked = f"VLAN {link.vlan_tag}" if link.vlan_tag is not None else "a VLAN"
            reason = "no tag is in every range" if not common else "none free"
            raise VlanUnavailable(f"link {link.client_id}: asked for {asked} across {where}; {reason}")
        tag = free[0]
        keys.extend(f"vlan:{sw.component_id}:{tag}" for sw in switches)
    for port, wire in link.uplinks:  # stitching: the outer tag on each own external port's wire (broker: wire:<port>)
        key = f"wire:{port}:{wire[0][1]}"
        if key in taken or key in keys:
            raise VlanUnavailable(f"link {link.client_id}: tag {wire[0][1]} on the wire of port {port} is held by "
                                  f"another link")
        keys.append(key)
    from stitching.am_hops import port_bw_keys  # stitching: the external ports' capacity, summed over slices

    keys.extend(port_bw_keys(substrate, link, taken, keys))
    subnet = f"10.{10 + (index // 250)}.{index % 250}"
    return Placement(link.client_id, "link", switches[0].component_id if (switches and tag) else "", tuple(keys),
                     {"vlan_tag": tag, "capacity_kbps": link.capacity_kbps or 0, "subnet": subnet,
                      "endpoints": [n for n, _ in endpoints], "interface_refs": list(link.interface_refs),
                      **({"uplinks": [{"port": p, "tags": [list(t) for t in w]} for p, w in link.uplinks]}
                         if link.uplinks else {}),
                      # asked-for link properties a real driver must enforce or refuse (netns: netem)
                      **({"latency_ms": link.latency_ms} if link.latency_ms else {}),
                      **({"packet_loss": link.packet_loss} if link.packet_loss else {})})


def _switches_of(substrate: Substrate, host_ifaces: list[str]) -> list:
    """The switches a set of host interfaces are cabled to, in substrate order (the first if none is cabled)."""
    ports = {i.component_id: i.switch_port for h in substrate.hosts for i in h.interfaces}
    used = {ports.get(hi) for hi in host_ifaces}
    found = [sw for sw in substrate.switches if any(p.component_id in used for p in sw.ports)]
    return found or list(substrate.switches[:1])


def _ranges(ranges) -> str:
    return ",".join(f"{lo}-{hi}" if lo != hi else str(lo) for lo, hi in ranges)



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
