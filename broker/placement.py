"""The broker's placement policy: where each demanded node and link goes, chosen from the broker's own
calendar (pure; no store, no clock).

The slice manager sends *demands* (protocol/messages.py `Demands`, to broker/broker.py `Broker.place`): per
reservation a node (sliver type or size, image, bound component, FPGA kind and part, interfaces) or a link
(endpoint interfaces, bandwidth, an asked VLAN tag, stitching uplinks). The broker turns the units it cannot
promise over the term into `used` and calls `plan`, which asks each node's resource kind (resources/) for a
host or board and units, and each link part for its units and labels; the broker then books and claims
exactly those, all or nothing. The substrate the plan walks is the description the authority delegated with
its inventory (broker/delegation.py), never the slice manager's copy.

`plan` has a collecting mode (a dry run): a node or link that does not fit is recorded as a Shortfall and
skipped, and `report` turns the result into asked-vs-available by resource and site."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Set
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from resources import STANDARD, Kinds
from resources.compute import bind_interface
from resources.kind import Constraints, Placement
from rspec.request import Request, RequestLink
from rspec.substrate import Substrate, urn_name
from slicex.errors import (
    BadArgs,
    GeniError,
    InsufficientBandwidth,
    InsufficientNodes,
    PortUnavailable,
    VlanUnavailable,
)

SHORT = (InsufficientNodes, InsufficientBandwidth, VlanUnavailable, PortUnavailable)  # what a dry run collects


@dataclass(frozen=True)
class Shortfall:
    """A requested node or link that did not fit (dry run): the planner's error and the units taken when it
    was tried; `blocked_by` names the nodes that did not fit when a link was not tried because of them."""

    client_id: str
    kind: str  # node | link
    error: GeniError | None
    taken: frozenset[str]
    blocked_by: tuple[str, ...] = ()


class Taken(AbstractSet[str]):
    """The units a plan may not choose: `used` (what the broker cannot promise, possibly a view asked one unit
    at a time) plus what the plan took so far. Never copies `used`: a placement over a full aggregate reads
    the few units it tries, not every claim."""

    def __init__(self, used: Set[str]):
        self.used = used
        self.added: set[str] = set()

    def __contains__(self, unit: object) -> bool:
        return unit in self.added or unit in self.used

    def __iter__(self) -> Iterator[str]:
        yield from self.added
        yield from (u for u in self.used if u not in self.added)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def update(self, units: Iterable[str]) -> None:
        self.added.update(units)

    def leading_full(self, hosts):
        """`used`'s run of leading full hosts for first-fit (broker/claims.py `LeadingFull`), None without one."""
        leading_full = getattr(self.used, "leading_full", None)
        return leading_full(hosts) if leading_full is not None else None

    def free_in(self, counter: str, total: int) -> int | None:
        """Free units of a pool as the broker's counters have them (None: `used` keeps none), less what
        this plan took of it: what a policy ranks hosts by without asking every unit."""
        free_in = getattr(self.used, "free_in", None)
        free = free_in(counter, total) if free_in is not None else None
        if free is None:
            return None
        return free - sum(1 for u in self.added if u.rpartition(":")[0] == counter)


def plan(substrate: Substrate, request: Request, used: Set[str], image_policy: str = "reject",
         bitstream_parts: Mapping[str, str] | None = None, policy: Any = None,
         shortfalls: list[Shortfall] | None = None, kinds: Kinds = STANDARD,
         kept: Mapping[str, Mapping[str, Any]] | None = None, subnets: Iterable[str] = ()) -> list[Placement]:
    """Place every node and link of `request` given the keys already claimed; raise a GeniError naming what
    was short. `bitstream_parts` maps the requester's bitstream refs to the FPGA part they were built for;
    `policy` ranks hosts (broker/policy.py). With `shortfalls` (a dry run), a node or link short of capacity
    is recorded there and skipped instead, so one answer names everything that does not fit; request errors
    (BADARGS) still raise. An Update places only its difference: `kept` names the slice's nodes placed before
    that new links attach to (their host and interface bindings; an interface they did not have yet is bound
    on their host as a new node's would be, and the link's placement says so under `bindings`), `subnets`
    the link subnets the slice already uses."""
    given = Constraints(image_policy, dict(bitstream_parts or {}), policy)
    taken = Taken(used)
    placements: list[Placement] = []
    iface_on: dict[str, str] = {}  # request iface client_id -> the host interface it was bound to
    owner: dict[str, str] = {}  # request iface client_id -> its node
    short_iface: dict[str, str] = {}  # request iface client_id -> its node, which did not fit
    bindings: dict[str, dict[str, Any]] = {}  # kept node's new iface -> its binding (reported with the link)
    for cid, k in (kept or {}).items():
        host = substrate.host(str(k["component_id"]))
        bound = dict(k.get("interfaces") or {})
        new = [i for i in k.get("wanted") or () if i not in bound]
        if new and host is None:
            raise BadArgs(f"node {cid}: its host {k['component_id']} is not in this aggregate's substrate")
        for i in new:
            bound[i] = bind_interface(host, i, None, len(bound)).component_id
            bindings[i] = {"node": cid, "component_id": bound[i]}
        for ref, hi in bound.items():
            iface_on[ref] = hi
            owner[ref] = cid
    free_subnets = (s for s in (subnet_of(n) for n in range(250 * 100)) if s not in set(subnets))
    for node in request.nodes:
        try:
            p = kinds.place_node(substrate, node, taken, given)
        except SHORT as err:
            if shortfalls is None:
                raise
            shortfalls.append(Shortfall(node.client_id, "node", err, frozenset(taken)))
            short_iface.update((ri.client_id, node.client_id) for ri in node.interfaces)
            continue
        taken.update(p.keys)
        placements.append(p)
        for ref, bound in (p.details.get("interfaces") or {}).items():
            iface_on[ref] = bound["component_id"]
            owner[ref] = node.client_id
    for index, link in enumerate(request.links):
        blocked = tuple(dict.fromkeys(short_iface[r] for r in link.interface_refs if r in short_iface))
        if blocked:
            assert shortfalls is not None
            shortfalls.append(Shortfall(link.client_id, "link", None, frozenset(taken), blocked))
            continue
        try:
            p = _place_link(substrate, link, index if not subnets else None, iface_on, owner, taken, kinds,
                            next(free_subnets) if subnets else None, bindings)
        except SHORT as err:
            if shortfalls is None:
                raise
            shortfalls.append(Shortfall(link.client_id, "link", err, frozenset(taken)))
            continue
        taken.update(p.keys)
        placements.append(p)
    return placements


def subnet_of(index: int) -> str:
    """The /24 of a slice's index-th link (its interfaces get .1, .2, ... in interface_refs order)."""
    return f"10.{10 + (index // 250)}.{index % 250}"


def _place_link(substrate: Substrate, link: RequestLink, index: int | None, iface_on: Mapping[str, str],
                owner: Mapping[str, str], taken: Set[str], kinds: Kinds, subnet: str | None = None,
                bindings: Mapping[str, Mapping[str, Any]] | None = None) -> Placement:
    host_ifaces = [iface_on[r] for r in link.interface_refs if r in iface_on]
    keys: list[str] = []
    labels: dict[str, int] = {}
    details: dict[str, Any] = {}
    for part in kinds.links:
        got, said, chosen = part.place(substrate, link, host_ifaces, taken, keys)
        keys += got
        details.update(said)
        labels.update(chosen)
    component = details.pop("switch", "")
    subnet = subnet or subnet_of(index or 0)
    bound = {r: dict(bindings[r]) for r in link.interface_refs if bindings and r in bindings}
    return Placement(link.client_id, "link", component, tuple(keys),
                     {"vlan_tag": details.pop("vlan_tag", None), "capacity_kbps": link.capacity_kbps or 0,
                      "subnet": subnet, "endpoints": [owner[r] for r in link.interface_refs if r in owner],
                      "interface_refs": list(link.interface_refs), **details,
                      # asked-for link properties a real driver must enforce or refuse (netns: netem)
                      **({"latency_ms": link.latency_ms} if link.latency_ms else {}),
                      **({"packet_loss": link.packet_loss} if link.packet_loss else {}),
                      **({"mirror_to": link.mirror_to} if link.mirror_to else {}),
                      **({"bindings": bound} if bound else {})},
                     labels)


# ---- pure: what a plan says --------------------------------------------------------------------------------------
def _node_entry(substrate: Substrate, p: Placement) -> dict[str, Any]:
    d = p.details
    host = substrate.host(p.component_id)
    entry: dict[str, Any] = {"client_id": p.client_id, "component_id": p.component_id,
                             "host": d.get("host") or urn_name(p.component_id),
                             "site": host.site if host else "", "sliver_type": d.get("sliver_type", "")}
    for key in ("vm_size", "cores", "memory_mb", "fpga", "board"):
        if d.get(key) not in (None, ""):
            entry[key] = d[key]
    entry["interfaces"] = {ref: urn_name(i["component_id"]) for ref, i in d.get("interfaces", {}).items()}
    return entry


def _link_entry(substrate: Substrate, p: Placement) -> dict[str, Any]:
    d = p.details
    switches = sorted(name.split(":", 1)[1] for name in p.labels if name.startswith("vlan:"))
    sw = substrate.switch(urn_name(p.component_id)) if p.component_id else None
    return {"client_id": p.client_id, "switch": urn_name(p.component_id) if p.component_id else "",
            "switches": [urn_name(s) for s in switches], "site": sw.site if sw else "",
            "vlan_tag": d.get("vlan_tag") if d.get("vlan_tag") is not None else "",
            "capacity_kbps": d.get("capacity_kbps", 0), "endpoints": list(d.get("endpoints", []))}


def report(substrate: Substrate, request: Request, placements: Iterable[Placement],
           shortfalls: Iterable[Shortfall], kinds: Kinds = STANDARD) -> dict[str, Any]:
    """The dry-run answer: `fits`, `nodes` and `links` placed (host / switch, VLAN), `short` (per element
    that did not fit: the GENI error type, the planner's reason, and `needs`: asked vs available by resource
    and site, as its resource kind says), and a one-line `summary`."""
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
        if s.kind == "node":
            node = request.node(s.client_id)
            assert node is not None
            needs = kinds.node_needs(substrate, node, s.taken)
        else:
            link = next(lk for lk in request.links if lk.client_id == s.client_id)
            host_ifaces = [ifaces[r] for r in link.interface_refs if r in ifaces]
            needs = [n for part in kinds.links for n in part.needs(substrate, link, host_ifaces, s.taken)]
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
            bitstream_parts: Mapping[str, str] | None = None, policy: Any = None,
            kinds: Kinds = STANDARD) -> dict[str, Any]:
    """Plan `request` over the units in `used` without taking any; the report above."""
    shortfalls: list[Shortfall] = []
    placements = plan(substrate, request, used, image_policy, bitstream_parts, policy, shortfalls, kinds)
    return report(substrate, request, placements, shortfalls, kinds)
