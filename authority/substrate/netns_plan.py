"""The netns substrate's host plan, as plain data (pure: no commands, no clock).

From a sliver spec the authority hands the driver, compute what must exist on the host: a node is a network
namespace with one veth pair per interface (one end inside, the other an Open vSwitch port on the link's
VLAN); a link is a VLAN on the bridge with a rate. Every name starts with the deployment's prefix, so the
reconciler can tell this deployment's objects from anyone else's, and derives from the sliver id, so the same
spec always yields the same names (create twice = one set of objects; a restart finds them again).

Linux limits interface names to 15 characters (IFNAMSIZ - 1): prefix (≤ 5) + 8 hex + one side letter."""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from slicex.errors import BadArgs
from slicex.inventory import mac_for

IFNAME_MAX = 15
PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,4}$")
NS_SIDE, HOST_SIDE = "n", "h"


def _h(*parts: str, n: int = 8) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:n]


def deployment_prefix(deployment_id: str) -> str:
    """The prefix of every host object of one deployment: 'x' + 4 hex of its id (5 characters)."""
    return "x" + _h(deployment_id, n=4)


def check_prefix(prefix: str) -> str:
    if not PREFIX_RE.match(prefix):
        raise BadArgs(f"netns object prefix {prefix!r} must be 1-5 lowercase letters/digits starting with a letter")
    return prefix


def netns_name(prefix: str, sliver_id: str) -> str:
    return f"{prefix}-{_h(sliver_id, n=12)}"


def veth_names(prefix: str, sliver_id: str, iface: str) -> tuple[str, str]:
    """(namespace end, host end) of one interface's veth pair."""
    base = f"{prefix}{_h(sliver_id, iface)}"
    return base + NS_SIDE, base + HOST_SIDE


def trunk_name(prefix: str, port_urn: str) -> str:
    """The host device of an external port's trunk: prefix + 8 hex of the port URN + 't' (not a sliver's
    object: reconcile leaves it; whoever joined the aggregates removes it)."""
    return f"{prefix}{_h(port_urn.lower())}t"


def shared_trunk_name(switch_dir: str, port_urn: str) -> str:
    """The host device of an external port's trunk when aggregates share one Open vSwitch (`netns.switch_dir`):
    'sxc' + 8 hex of the switch directory and the port URN + 't'. Unlike `trunk_name` it needs no deployment
    prefix, so each side of a cable knows both ends' names (its own port's and the remote port's) and
    whichever starts a stitched link over the cable first creates the veth pair. Never a deployment's
    object (`owned` is false): reconcile and Delete leave it; it is the cable."""
    return f"sxc{_h(str(switch_dir), port_urn.lower())}t"


def hostname_for(client_id: str) -> str:
    """A valid host name from a request client_id (letters, digits, '-'; at most 63)."""
    name = re.sub(r"[^a-zA-Z0-9-]", "-", client_id).strip("-")[:63]
    return name or "node"


Tags = tuple[tuple[int, int], ...]  # ((TPID, VID), ...) outermost first


@dataclass(frozen=True)
class RackLayout:
    """The substrate's switches as the driver builds them: one bridge per switch (the first is the
    deployment's own bridge), which switch each host interface and external port is cabled to, and the trunks
    joining switches (each a veth pair between two bridges). One switch (or none): everything on one bridge."""

    switches: tuple[str, ...] = ()
    cabled: Mapping[str, str] = field(default_factory=dict)  # host interface / external port -> switch
    trunks: tuple[tuple[str, str, str, str], ...] = ()  # (port a, switch a, port b, switch b)
    hosts: Mapping[str, str] = field(default_factory=dict)  # switch -> network namespace it runs in (not here)

    @staticmethod
    def of(substrate, hosts: Mapping[str, str] | None = None) -> RackLayout:
        """From a substrate (rspec.substrate.Substrate); `hosts` places switches (by name or component id) in
        other network namespaces (lab hosts, docs/lab.md)."""
        switch_of = {p.component_id: sw.component_id for sw in substrate.switches for p in sw.ports}
        cabled = {i.component_id: switch_of[i.switch_port] for h in substrate.hosts for i in h.interfaces
                  if i.switch_port in switch_of}
        cabled.update({e.local_port: switch_of[e.local_port] for e in substrate.external_links
                       if e.local_port in switch_of})
        where = {sw.component_id: (hosts or {}).get(sw.name) or (hosts or {}).get(sw.component_id)
                 for sw in substrate.switches}
        return RackLayout(tuple(sw.component_id for sw in substrate.switches), cabled,
                          tuple((t.port_a, switch_of[t.port_a], t.port_b, switch_of[t.port_b]) for t in substrate.trunks),
                          {sw: ns for sw, ns in where.items() if ns})

    def bridge(self, prefix: str, switch: str) -> str:
        """The bridge of a switch: the deployment's own for the first (or an unknown) one, `<prefix>-br<k>`
        for the k-th."""
        k = self.switches.index(switch) if switch in self.switches else 0
        return f"{prefix}-br" + (str(k) if k else "")

    def bridges(self, prefix: str) -> dict[str, str]:
        """Switch -> bridge, for every switch ('' -> the deployment's bridge when there is none)."""
        return {sw: self.bridge(prefix, sw) for sw in self.switches} or {"": f"{prefix}-br"}


@dataclass(frozen=True)
class LinkPlan:
    """A link or LAN: the VLAN its interfaces' ports share on the bridge and the rate of each of them. A link
    between racks has a local tag per switch and the trunk ports it crosses there (`racks`)."""

    sliver_id: str
    client_id: str
    vlan: int | None
    capacity_kbps: int
    subnet: str
    interface_refs: tuple[str, ...]
    # stitching: (external port URN, ((TPID, VID), ...) outermost first) per own hop: the trunk rules
    uplinks: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = ()
    mirror_to: str = ""  # the capture interface (client_id, of a node of `slice_urn`) its packets are copied to
    slice_urn: str = ""
    # across racks: (switch, its local tag, ((trunk port, tags on its wire), ...)) per switch of the path
    racks: tuple[tuple[str, int, tuple[tuple[str, Tags], ...]], ...] = ()

    def tag_on(self, switch: str) -> int | None:
        """The link's tag inside a switch (its one tag unless it crosses racks)."""
        return next((tag for sw, tag, _hops in self.racks if sw == switch), self.vlan)

    def trunk_hops(self, switch: str) -> tuple[tuple[str, Tags], ...]:
        return next((hops for sw, _tag, hops in self.racks if sw == switch), ())

    def to_doc(self) -> dict:
        return {"sliver_id": self.sliver_id, "client_id": self.client_id, "vlan": self.vlan,
                "capacity_kbps": self.capacity_kbps, "subnet": self.subnet, "interface_refs": list(self.interface_refs)}


@dataclass(frozen=True)
class IfacePlan:
    client_id: str
    ns_if: str
    host_if: str
    mac: str
    vlan: int | None  # None: on no link of this aggregate (nothing to reach); the host end stays off the bridge
    address: str  # "10.10.0.1/24", or "" when neither the request nor a link gives one
    rate_kbps: int  # 0: unshaped
    switch: str = ""  # the switch (bridge) its host interface is cabled to; '' the deployment's bridge


@dataclass(frozen=True)
class NodePlan:
    sliver_id: str
    client_id: str
    netns: str
    hostname: str
    interfaces: tuple[IfacePlan, ...]
    machine: str = "container"  # or "qemu": a VM node (its sliver type's `machine`, authority/substrate/vm.py)

    def names(self) -> set[str]:
        return {self.netns} | {i.ns_if for i in self.interfaces} | {i.host_if for i in self.interfaces}


def _vlan_of(labels: Iterable[tuple[str, int]]) -> int | None:
    tags = [v for k, v in labels if k == "vlan"]
    return tags[0] if tags else None


def link_plan(sliver_id: str, client_id: str, labels: Iterable[tuple[str, int]], details: Mapping,
              netem: bool = False) -> LinkPlan:
    """The plan of one link sliver. Latency and loss need the kernel's netem qdisc; without it they are
    refused rather than silently ignored."""
    if not netem:
        for key, what in (("latency_ms", "latency"), ("packet_loss", "packet_loss")):
            if details.get(key):
                raise BadArgs(f"link {client_id or sliver_id}: {what} {details[key]} cannot be enforced on this "
                              f"host: the kernel has no netem qdisc (sch_netem); request the link without {what}")
    vlan = _vlan_of(labels)
    if vlan is None and details.get("vlan_tag") is not None:
        vlan = int(details["vlan_tag"])
    if vlan is not None and not 1 <= vlan <= 4094:
        raise BadArgs(f"link {client_id or sliver_id}: VLAN {vlan} is outside 1-4094")
    uplinks = tuple((str(u["port"]), tuple((int(t), int(v)) for t, v in u["tags"]))
                    for u in details.get("uplinks") or ())
    hops = [h for h in details.get("hops") or () if h.get("trunk")]
    racks = tuple((str(sw), int(tag), tuple((str(h["port"]), tuple((int(t), int(v)) for t, v in h["tags"]))
                                           for h in hops if h["switch"] == sw))
                  for sw, tag in (details.get("switch_tags") or {}).items())
    return LinkPlan(sliver_id, client_id, vlan, int(details.get("capacity_kbps") or 0),
                    str(details.get("subnet") or ""), tuple(details.get("interface_refs") or ()), uplinks,
                    str(details.get("mirror_to") or ""), str(details.get("slice_urn") or ""), racks)


def _address(iface: str, info: Mapping, link: LinkPlan | None) -> str:
    """The request's address if it gave one, else the one the manifest shows (subnet + position on the link)."""
    ip, mask = str(info.get("ip") or ""), str(info.get("netmask") or "")
    if ip:
        try:
            return str(ipaddress.ip_interface(f"{ip}/{mask or '24'}"))
        except ValueError:
            raise BadArgs(f"interface {iface}: address {ip}/{mask} is not an IPv4/IPv6 address") from None
    if link is not None and link.subnet and iface in link.interface_refs:
        return f"{link.subnet}.{link.interface_refs.index(iface) + 1}/24"
    return ""


def node_plan(prefix: str, sliver_id: str, client_id: str, labels: Iterable[tuple[str, int]], details: Mapping,
              links: Mapping[int, LinkPlan], layout: RackLayout | None = None) -> NodePlan:
    """The plan of one node sliver. `labels` are the VLAN tags of the links its interfaces are on (what the
    slice manager hands a node); `links` maps live link VLANs to their plans. An interface is matched to the
    link among its own tags whose interface_refs name it: a tag is held by one link at a time, so the match
    is unambiguous even when two slices reuse client ids. An interface whose details name its link's tag
    (`vlan_tag`: a node an Update rewired onto a new link, while the link it replaces still exists) is on
    that link when the link names the interface."""
    check_prefix(prefix)
    mine = [links[v] for k, v in labels if k == "vlan" and v in links]
    ifaces = []
    for cid, info in (details.get("interfaces") or {}).items():
        own = info.get("vlan_tag")  # an Update rewired the node: the interface names its (new) link's tag
        link = links.get(int(own)) if own not in (None, "") else None
        if link is None or cid not in link.interface_refs:
            link = next((lk for lk in mine if cid in lk.interface_refs), None)
        ns_if, host_if = veth_names(prefix, sliver_id, cid)
        switch = (layout or RackLayout()).cabled.get(str(info.get("component_id") or ""), "")
        ifaces.append(IfacePlan(cid, ns_if, host_if, mac_for(sliver_id, cid), link.vlan if link else None,
                                _address(cid, info, link), link.capacity_kbps if link else 0, switch))
    plan = NodePlan(sliver_id, client_id, netns_name(prefix, sliver_id), hostname_for(client_id), tuple(ifaces),
                    str(details.get("machine") or "container"))
    names = [i.ns_if for i in ifaces] + [i.host_if for i in ifaces]
    if len(set(names)) != len(names):
        raise BadArgs(f"node {client_id}: two interfaces hash to one device name; rename an interface")
    return plan


def owned(prefix: str, name: str) -> bool:
    """Whether a host object name belongs to the deployment with this prefix."""
    rest = name[len(prefix):]
    return name.startswith(prefix) and (rest.startswith("-") or bool(re.fullmatch(r"[0-9a-f]{8}[nh]", rest)))


ETH_FRAME, IP_PACKET = 1514, 1500


def tbf_args(rate_kbps: int) -> list[str]:
    """tc arguments of an egress token bucket giving IP packets `rate_kbps`. The bucket counts Ethernet
    frames, so its rate is the capacity scaled by 1514/1500 (a full-size packet's frame). The burst is
    about 12 ms of the rate (at least two full frames), the queue about 50 ms: a TCP flow then measures close
    to the rate instead of backing off from drops."""
    frame_kbps = -(-rate_kbps * ETH_FRAME // IP_PACKET)
    rate_bytes = frame_kbps * 1000 // 8
    burst = max(2 * ETH_FRAME, rate_bytes // 80)
    limit = max(burst + 3 * ETH_FRAME, rate_bytes // 20)
    return ["tbf", "rate", f"{frame_kbps}kbit", "burst", str(burst), "limit", str(limit)]


def wanted_mirrors(prefix: str, enabled: Iterable[int], links: Mapping[int, LinkPlan],
                   ports: Mapping[str, tuple[int, int | None, str]],
                   capture_ports: Mapping[tuple[str, str], str]) -> dict[str, tuple[tuple[str, ...], str]]:
    """The mirrors the switch should have: per started link that asks for one, its name, the ports whose
    packets it copies (the link's segment) and the port it copies them to, the capture interface of the
    link's own slice (`capture_ports` is keyed by slice URN and interface client_id, so a same-named
    interface of another slice never receives them), once that port is on the bridge."""
    out: dict[str, tuple[tuple[str, ...], str]] = {}
    for vlan in sorted(enabled):
        lk = links[vlan]
        target = capture_ports.get((lk.slice_urn, lk.mirror_to)) if lk.mirror_to else None
        copied = tuple(sorted(p for p, (_of, v, _mac) in ports.items() if v == vlan))
        if target is not None and target in ports and ports[target][1] is None and copied:
            out[f"{prefix}-m{vlan}"] = (copied, target)
    return out
