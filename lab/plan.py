"""The lab's pure plan: from a description of simulated hosts, the fibres between them and the NATs among them,
every namespace, interface, address, route, qdisc and NAT rule the lab needs. Plain data in, plain data out;
lab/edge.py realises it with iproute2, tc and nftables.

Addressing (one /16, `network`, by default chosen by the lab's name): host i (1-based, in the order given) is
`network + i` (10.x.0.1, …), a /32
it answers on whatever interface a packet arrives; every link is point-to-point (`ip addr add A peer B`), so a
neighbour is reached by its host address and no subnet per fibre is needed. The operator's side (the root
namespace, where the tests and the `slicex lab` command run) is `network + 0xfffe` (10.x.255.254) on a
management link to every host: it reaches each host, each host reaches it (the relayed Redis lives there), and
the management links never carry traffic between hosts (hosts have no route through them).

Routes: a host reaches another along the fewest fibres. A NAT host forwards from its inside (the fibres named
in its `inside`) out, masquerading, and never from outside in: a host behind a NAT reaches every host, a
host outside reaches the NAT host but none behind it — as across a real NAT."""

from __future__ import annotations

import re
import zlib
from collections import deque
from dataclasses import dataclass, field
from ipaddress import IPv4Network

from authority.substrate.netns_plan import tbf_args

NAME = re.compile(r"[a-z][a-z0-9]{0,5}")
LAB_NAME = re.compile(r"[a-z][a-z0-9]{0,4}")


def default_network(lab: str) -> str:
    """A /16 of 10.200-10.239 chosen by the lab's name, so that labs of different names on one machine
    usually differ (lab/edge.py refuses one whose addresses are already routed)."""
    return f"10.{200 + zlib.crc32(lab.encode()) % 40}.0.0/16"


class LabSpecError(ValueError):
    """A lab description that cannot be realised, with the reason."""


@dataclass(frozen=True)
class Fibre:
    """A cable between two hosts; `rate_mbit` shapes both directions (None: as fast as the kernel goes)."""

    a: str
    b: str
    rate_mbit: float | None = None


@dataclass(frozen=True)
class Nat:
    """Host `host` masquerades traffic from the hosts behind its fibres to `inside` (they reach out, nothing
    reaches in)."""

    host: str
    inside: tuple[str, ...]


@dataclass(frozen=True)
class LabSpec:
    name: str
    hosts: tuple[str, ...]
    fibres: tuple[Fibre, ...]
    nats: tuple[Nat, ...] = ()
    network: str = ""  # "" : default_network(name)

    def __post_init__(self) -> None:
        if not self.network:
            object.__setattr__(self, "network", default_network(self.name))

    @staticmethod
    def from_document(doc: dict) -> LabSpec:
        """A spec from its YAML/JSON form: {name, hosts: [..], fibres: [[a, b, mbit|null], ..],
        nats: {host: [inside neighbour, ..]}, network}."""
        unknown = set(doc) - {"name", "hosts", "fibres", "nats", "network"}
        if unknown:
            raise LabSpecError(f"unknown keys in the lab description: {', '.join(sorted(unknown))}")
        try:
            fibres = tuple(Fibre(str(f[0]), str(f[1]), None if len(f) < 3 or f[2] is None else float(f[2]))
                           for f in doc.get("fibres", []))
            nats = tuple(Nat(str(h), tuple(str(i) for i in inside)) for h, inside in (doc.get("nats") or {}).items())
            spec = LabSpec(str(doc["name"]), tuple(str(h) for h in doc["hosts"]), fibres, nats,
                           str(doc.get("network") or ""))
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise LabSpecError(f"malformed lab description ({type(e).__name__}: {e})") from None
        validate(spec)
        return spec

    def document(self) -> dict:
        return {"name": self.name, "hosts": list(self.hosts), "network": self.network,
                "fibres": [[f.a, f.b, f.rate_mbit] for f in self.fibres],
                "nats": {n.host: list(n.inside) for n in self.nats}}


def line(name: str, hosts: int = 2, rate_mbit: float | None = None, nat: bool = False,
         network: str = "") -> LabSpec:
    """The lab most tests want: hosts h1…hN on a line of fibres; with `nat`, h1 sits behind a NAT host `nat`
    (h1 — nat — h2 — …)."""
    names = [f"h{i}" for i in range(1, hosts + 1)]
    chain = [names[0], "nat", *names[1:]] if nat else names
    fibres = tuple(Fibre(a, b, rate_mbit) for a, b in zip(chain, chain[1:], strict=False))
    if nat:
        return LabSpec(name, (*names, "nat"), fibres, (Nat("nat", (names[0],)),), network)
    return LabSpec(name, tuple(names), fibres, (), network)


def validate(spec: LabSpec) -> None:
    if not LAB_NAME.fullmatch(spec.name):
        raise LabSpecError(f"lab name {spec.name!r}: 1-5 lower-case letters and digits, a letter first (it is part "
                           f"of 15-character interface names)")
    try:
        net = IPv4Network(spec.network)
    except ValueError as e:
        raise LabSpecError(f"lab network {spec.network!r}: {e}") from None
    if net.prefixlen > 16:
        raise LabSpecError(f"lab network {spec.network}: a /16 or larger (hosts take the low addresses, the "
                           f"operator's side {net.network_address + 0xfffe})")
    if not 1 <= len(spec.hosts) <= 250:
        raise LabSpecError(f"a lab has 1 to 250 hosts, not {len(spec.hosts)}")
    for h in spec.hosts:
        if not NAME.fullmatch(h):
            raise LabSpecError(f"host name {h!r}: 1-6 lower-case letters and digits, a letter first")
    if len(set(spec.hosts)) != len(spec.hosts):
        raise LabSpecError("host names repeat")
    pairs = set()
    for f in spec.fibres:
        for end in (f.a, f.b):
            if end not in spec.hosts:
                raise LabSpecError(f"fibre {f.a}-{f.b} names host {end}, which the lab does not have")
        if f.a == f.b:
            raise LabSpecError(f"fibre {f.a}-{f.b} joins a host to itself")
        if frozenset((f.a, f.b)) in pairs:
            raise LabSpecError(f"two fibres join {f.a} and {f.b} (one per pair of hosts)")
        pairs.add(frozenset((f.a, f.b)))
        if f.rate_mbit is not None and not 0.01 <= f.rate_mbit <= 100_000:
            raise LabSpecError(f"fibre {f.a}-{f.b}: rate {f.rate_mbit} Mbit/s is outside 0.01-100000")
    for n in spec.nats:
        if n.host not in spec.hosts:
            raise LabSpecError(f"NAT host {n.host} is not a host of the lab")
        for i in n.inside:
            if frozenset((n.host, i)) not in pairs:
                raise LabSpecError(f"NAT {n.host}: no fibre joins it to {i} (its inside must be its neighbours)")
        if len(n.inside) >= len(neighbours(spec, n.host)):
            raise LabSpecError(f"NAT {n.host}: every fibre is inside; it needs at least one outside")


def neighbours(spec: LabSpec, host: str) -> list[str]:
    return [f.b if f.a == host else f.a for f in spec.fibres if host in (f.a, f.b)]


# ---- the realised plan ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Link:
    """One end of a point-to-point link inside a host: interface `ifname`, peer at `peer_address`."""

    ifname: str
    peer: str  # the neighbour host's name, or "operator"
    peer_address: str
    tbf: tuple[str, ...] | None = None


@dataclass(frozen=True)
class HostPlan:
    name: str
    namespace: str
    address: str
    links: tuple[Link, ...]
    routes: tuple[tuple[str, str], ...]  # (destination host address, via neighbour address)
    nat_outside: tuple[str, ...] = ()  # interfaces to masquerade out of (a NAT host)
    nat_inside: tuple[str, ...] = ()


@dataclass(frozen=True)
class LabPlan:
    spec: LabSpec
    operator_address: str
    hosts: tuple[HostPlan, ...]
    mgmt_links: tuple[tuple[str, str], ...] = field(default=())  # (root-side interface, host name)

    def host(self, name: str) -> HostPlan:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(f"lab {self.spec.name} has no host {name} (hosts: {', '.join(self.spec.hosts)})")


def namespace_of(lab: str, host: str) -> str:
    return f"sxlab-{lab}-{host}"


def fibre_ifname(peer: str) -> str:
    return f"f-{peer}"


MGMT_IF = "mgmt"


def mgmt_ifname(lab: str, host: str) -> str:
    """The root-namespace end of a host's management link (≤ 15 characters: sxl + 5 + - + 6)."""
    return f"sxl{lab}-{host}"


def plan(spec: LabSpec) -> LabPlan:
    """Everything the lab needs, from its description."""
    validate(spec)
    net = IPv4Network(spec.network)
    address = {h: str(net.network_address + i) for i, h in enumerate(spec.hosts, start=1)}
    operator = str(net.network_address + 0xFFFE)
    nat_inside = {n.host: set(n.inside) for n in spec.nats}
    rate = {frozenset((f.a, f.b)): f.rate_mbit for f in spec.fibres}
    hosts = []
    for h in spec.hosts:
        links = [Link(MGMT_IF, "operator", operator)]
        for peer in neighbours(spec, h):
            r = rate[frozenset((h, peer))]
            links.append(Link(fibre_ifname(peer), peer, address[peer],
                              None if r is None else tuple(tbf_args(round(r * 1000)))))
        first_hop = _first_hops(spec, h, nat_inside)
        routes = tuple((address[d], address[via]) for d, via in sorted(first_hop.items()) if via != d)
        inside = tuple(fibre_ifname(p) for p in sorted(nat_inside.get(h, ())))
        outside = tuple(fibre_ifname(p) for p in neighbours(spec, h) if p not in nat_inside.get(h, ())) \
            if h in nat_inside else ()
        hosts.append(HostPlan(h, namespace_of(spec.name, h), address[h], tuple(links), routes, outside, inside))
    return LabPlan(spec, operator, tuple(hosts), tuple((mgmt_ifname(spec.name, h), h) for h in spec.hosts))


def _first_hops(spec: LabSpec, src: str, nat_inside: dict[str, set[str]]) -> dict[str, str]:
    """Breadth-first from `src`: for each reachable host, the neighbour of `src` its shortest path starts with.
    A NAT host passes on only what came from its inside; traffic arriving from outside stops at it."""
    first: dict[str, str] = {}
    queue: deque[tuple[str, str | None, str | None]] = deque([(src, None, None)])
    seen = {src}
    while queue:
        node, came_from, hop = queue.popleft()
        if node != src and node in nat_inside and came_from not in nat_inside[node]:
            continue  # from outside, a NAT forwards nothing further
        for peer in neighbours(spec, node):
            if peer in seen:
                continue
            seen.add(peer)
            first[peer] = hop or peer
            queue.append((peer, node, hop or peer))
    return first
