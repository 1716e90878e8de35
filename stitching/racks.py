"""Links between the racks of one aggregate (ExoGENI's ExoSM case): a link whose two ends sit on different
switches crosses the aggregate's own trunks, and its tags are negotiated exactly as between aggregates — a
common tag, else VLAN translation at a trunk port that can, else Q-in-Q over the trunks — by the stitching
core (stitching/negotiate.py), not by a second implementation.

How the substrate becomes a stitching topology: every switch is a pseudo-aggregate (the sub-authority
`<authority>:<switch>`, as ExoGENI named its racks), each endpoint interface another, joined by its access
cable; each trunk is a cable between two switch ports. A port's 802.1Q range is the tags a frame may carry
on its wire: at an access port and at a trunk port that does not translate, the wire tag is the switch's own
(its `vlan_range`, cut to the trunk's range); a translating trunk port carries any tag of the trunk's range
and maps it to one of its switch's. Q-in-Q ports push/pop S-tags from the trunk's `s_vlan_range`.

What a link holds (resources/vlan.py takes them as units): on every switch of the path its local tag
(`vlan:<switch>:<tag>`), on every trunk port the outermost tag on its wire (`wire:<port>:<tag>`), and its
capacity on every trunk port (`bw:<port>:<i>`, TRUNK_BW_CHUNK_KBPS each). Pure: plain data in and out;
`taken` is the set of unit keys other links hold."""

from __future__ import annotations

import re
from collections.abc import Mapping, Set
from dataclasses import dataclass, replace

from rspec.substrate import Substrate, Switch, Trunk, urn_name
from stitching.model import Aggregate, Port, StitchingError, Topology, format_vlans
from stitching.negotiate import STAG, WIRE, LinkRequest, PathPlan, plan_link

TPID_8021Q, TPID_8021AD = 0x8100, 0x88A8
TRUNK_BW_CHUNK_KBPS = 100_000  # one unit of a trunk port's capacity (as of a host interface's)


@dataclass(frozen=True)
class RackHop:
    """One switch port the link crosses, with the tags on its wire (outermost first: ((0x8100, tag),) or
    ((0x88a8, S-tag), (0x8100, C-tag))). `trunk` is the trunk's component id ('' at an access port)."""

    switch: str
    port: str
    tags: tuple[tuple[int, int], ...]
    trunk: str = ""
    translation: bool = False
    qinq: str = ""  # "push" | "pop" | "" (the port pushes or pops the S-tag)

    def to_doc(self) -> dict:
        return {"switch": self.switch, "port": self.port, "tags": [list(t) for t in self.tags], "trunk": self.trunk,
                "translation": self.translation, "qinq": self.qinq}


@dataclass(frozen=True)
class RackPath:
    """A link across racks: each switch's local tag (in path order) and every port it crosses."""

    link_id: str
    labels: tuple[tuple[str, int], ...]  # (switch component id, its local tag), path order
    hops: tuple[RackHop, ...]
    capacity: tuple[str, ...] = ()  # the trunk ports' bandwidth units it holds

    @property
    def kind(self) -> str:
        """"common" (one tag everywhere), "translated" or "qinq": how the tags were negotiated."""
        if any(h.qinq for h in self.hops):
            return "qinq"
        return "common" if len({t for h in self.hops for _tpid, t in h.tags}) == 1 else "translated"

    def units(self) -> tuple[str, ...]:
        """The unit keys it holds: each switch's local tag, each trunk port's outermost wire tag."""
        return tuple(dict.fromkeys([vlan_key(sw, tag) for sw, tag in self.labels] +
                                   [wire_key(h.port, h.tags[0][1]) for h in self.hops if h.trunk] +
                                   list(self.capacity)))


def vlan_key(switch: str, tag: int) -> str:
    return f"vlan:{switch}:{tag}"


def wire_key(port: str, tag: int) -> str:
    return f"wire:{port}:{tag}"


def trunk_bw(t: Trunk) -> dict[str, tuple[str, ...]]:
    """The bandwidth units of each end of a trunk (its capacity in TRUNK_BW_CHUNK_KBPS units)."""
    n = t.bandwidth_kbps // TRUNK_BW_CHUNK_KBPS
    return {p: tuple(f"bw:{p}:{i}" for i in range(n)) for p in (t.port_a, t.port_b)}


def tags_of(ranges) -> frozenset[int]:
    return frozenset(t for lo, hi in ranges for t in range(lo, hi + 1))


def trunk_wire(sub: Substrate, t: Trunk) -> frozenset[int]:
    """The tags a trunk's wire carries: its `vlan_range`, else those either switch hands out (never a static
    VLAN's tag of either switch: those are configured on the trunk by hand)."""
    if t.vlan_range:
        return tags_of(t.vlan_range)
    ends = [_switch_of(sub, p) for p in (t.port_a, t.port_b)]
    statics = {v.tag for v in sub.static_vlans if v.switch in {sw.component_id for sw in ends}}
    return frozenset().union(*(tags_of(sw.vlan_range) for sw in ends)) - statics


def _switch_of(sub: Substrate, port: str) -> Switch:
    return next(sw for sw in sub.switches if any(p.component_id == port for p in sw.ports))


def _agg(sub: Substrate, name: str) -> str:
    """The pseudo-aggregate of a switch or an endpoint: the sub-authority `<authority>:<name>`."""
    return f"urn:publicid:IDN+{sub.authority}:{name}+authority+am"


def rack_topology(sub: Substrate, endpoints: Mapping[str, str]) -> Topology:
    """The substrate's switches and trunks, plus an access cable per endpoint (endpoint pseudo-aggregate ->
    host interface component id), as the stitching core's topology."""
    ports: list[Port] = []
    for t in sub.trunks:
        wire = trunk_wire(sub, t)
        s_tags = tags_of(t.s_vlan_range) if t.s_vlan_range else wire
        for here, there in ((t.port_a, t.port_b), (t.port_b, t.port_a)):
            sw = _switch_of(sub, here)
            translates = here in t.translation
            ports.append(Port(here, _agg(sub, sw.name), there, wire if translates else wire & tags_of(sw.vlan_range),
                              translates, here in t.qinq, s_tags if here in t.qinq else frozenset(),
                              t.bandwidth_kbps))
    cabled = {i.component_id: i for h in sub.hosts for i in h.interfaces}
    for agg, iface in endpoints.items():
        access = cabled[iface].switch_port
        assert access is not None
        sw = _switch_of(sub, access)
        own = tags_of(sw.vlan_range)
        line = cabled[iface].bandwidth_kbps
        ports.append(Port(f"{agg}#{iface}", agg, access, own, capacity_kbps=line))
        ports.append(Port(access, _agg(sub, sw.name), f"{agg}#{iface}", own, capacity_kbps=line))
    aggs = [Aggregate(_agg(sub, sw.name)) for sw in sub.switches] + [Aggregate(a) for a in endpoints]
    return Topology.build(aggs, ports)


def _used(topo: Topology, sub: Substrate, taken: Set[str]) -> dict[tuple[str, str], set[int]]:
    """The tags other links hold, per (port, tag space) as the core reads them: a switch's tags at every port
    whose wire tag is the switch's own, a trunk port's wire tags in both its spaces."""
    by_switch: dict[str, set[int]] = {}
    by_port: dict[str, set[int]] = {}
    for key in taken:
        kind, _, rest = key.partition(":")
        owner, _, tag = rest.rpartition(":")
        if kind in ("vlan", "wire") and tag.isdigit():
            (by_switch if kind == "vlan" else by_port).setdefault(owner, set()).add(int(tag))
    switch_of_agg = {_agg(sub, sw.name): sw.component_id for sw in sub.switches}
    used: dict[tuple[str, str], set[int]] = {}
    for p in topo.ports.values():
        sw = switch_of_agg.get(p.aggregate)
        own = by_switch.get(sw, set()) if sw and not p.translation else set()
        wire = by_port.get(p.urn, set())
        used[(p.urn, WIRE)] = own | wire
        used[(p.urn, STAG)] = set(wire)
    return used


def plan_rack_link(sub: Substrate, link_id: str, iface_a: str, iface_b: str, taken: Set[str],
                   capacity_kbps: int = 0, allow_qinq: bool = True) -> RackPath:
    """The path of a link between two host interfaces cabled to different switches, and its tags; a
    StitchingError saying which racks, which ranges and which trunk ports lack translation or Q-in-Q when
    none exists."""
    a, b = _agg(sub, "a." + urn_name(iface_a)), _agg(sub, "b." + urn_name(iface_b))
    topo = rack_topology(sub, {a: iface_a, b: iface_b})
    units = {p: u for t in sub.trunks for p, u in trunk_bw(t).items()}
    used_kbps = {p: TRUNK_BW_CHUNK_KBPS * sum(1 for k in u if k in taken) for p, u in units.items()}
    try:
        plan = plan_link(topo, LinkRequest(link_id, a, b, capacity_kbps, allow_qinq=allow_qinq),
                         _used(topo, sub, taken), used_kbps)
    except StitchingError as exc:
        raise StitchingError(_why(sub, link_id, iface_a, iface_b, exc), exc.kind, link_id) from None
    need = -(-capacity_kbps // TRUNK_BW_CHUNK_KBPS)
    capacity = tuple(k for h in plan.hops if h.port.urn in units
                     for k in [u for u in units[h.port.urn] if u not in taken][:need])
    return replace(_rack_path(sub, plan, taken), capacity=capacity)


def _rack_path(sub: Substrate, plan: PathPlan, taken: Set[str]) -> RackPath:
    """Turn the core's hops (two per cable: out, in) into switch ports with tag stacks and each switch's
    local tag: the tag at one of its ports that does not translate, else its lowest free tag."""
    switch_of_agg = {_agg(sub, sw.name): sw for sw in sub.switches}
    trunk_of = {p: t.component_id for t in sub.trunks for p in (t.port_a, t.port_b)}
    tunnel = plan.tunnel
    hops: list[RackHop] = []
    local: dict[str, int | None] = {}
    for n, h in enumerate(plan.hops):
        sw = switch_of_agg.get(h.port.aggregate)
        if sw is None:
            continue  # the endpoint's own end of its access cable
        cable = n // 2
        inside = tunnel is not None and tunnel.s_first <= cable <= tunnel.s_last
        if h.qinq:
            assert tunnel is not None
            tags: tuple[tuple[int, int], ...] = ((TPID_8021AD, h.tag), (TPID_8021Q, tunnel.c_tag))
            inner = tunnel.c_tag
        else:
            tags = ((TPID_8021AD if inside else TPID_8021Q, h.tag),)
            inner = h.tag
        hops.append(RackHop(sw.component_id, h.port.urn, tags, trunk_of.get(h.port.urn, ""), h.port.translation,
                            h.qinq))
        if not h.port.translation and local.get(sw.component_id) is None:
            local[sw.component_id] = inner
        else:
            local.setdefault(sw.component_id, None)
    labels = []
    for sw_id, tag in local.items():
        if tag is None:  # a transit switch translating at both of its ports: any free tag of its own
            sw = next(s for s in sub.switches if s.component_id == sw_id)
            free = sorted(t for t in tags_of(sw.vlan_range) if vlan_key(sw_id, t) not in taken)
            if not free:
                raise StitchingError(f"link {plan.link_id}: switch {sw.name} has no free tag of its own "
                                     f"({format_vlans(tags_of(sw.vlan_range))}) for the link", "vlan", plan.link_id)
            tag = free[0]
        labels.append((sw_id, tag))
    return RackPath(plan.link_id, tuple(labels), tuple(hops))


def _why(sub: Substrate, link_id: str, iface_a: str, iface_b: str, exc: StitchingError) -> str:
    """The core's reason, led by what an operator or experimenter can act on: which racks, their ranges, and
    which trunk ports could translate or tunnel and do not."""
    ends = []
    for iface in (iface_a, iface_b):
        sw = _switch_of(sub, next(i.switch_port for h in sub.hosts for i in h.interfaces if i.component_id == iface))
        ends.append(f"rack {sw.site or sw.name} (switch {sw.name}, VLANs {format_vlans(tags_of(sw.vlan_range))})")
    ports = [p for t in sub.trunks for p in (t.port_a, t.port_b)]
    no_translation = [urn_name(p) for t in sub.trunks for p in (t.port_a, t.port_b) if p not in t.translation]
    no_qinq = [urn_name(p) for t in sub.trunks for p in (t.port_a, t.port_b) if p not in t.qinq]
    trunks = "; ".join(f"trunk {t.name} carries {format_vlans(trunk_wire(sub, t)) or 'no tag'}, "
                       f"{t.bandwidth_kbps} kbps" for t in sub.trunks)
    lacking = (f"; trunk ports without VLAN translation: {', '.join(no_translation) or 'none'}; without Q-in-Q: "
               f"{', '.join(no_qinq) or 'none'}") if ports else "; the substrate has no trunks"
    detail = exc.message.split(": ", 1)[1] if exc.message.startswith(f"link {link_id}: ") else exc.message
    detail = re.sub(r"urn:publicid:IDN\+\S*?\+interface\+", "", detail)  # ports by SWITCH:PORT / HOST:IFACE
    for sw in sub.switches:  # the core names pseudo-aggregates; an operator knows switches and hosts
        detail = detail.replace(f"{sub.authority}:{sw.name}", f"switch {sw.name}")
    detail = detail.replace(f"{sub.authority}:a.", "").replace(f"{sub.authority}:b.", "")
    return (f"link {link_id}: no path between {ends[0]} and {ends[1]} over the aggregate's trunks "
            f"({trunks or 'none'}){lacking}: {detail}")

