"""VLAN links inside the aggregate: bandwidth on each endpoint's host interface and the tags of the switches
the link crosses. A link on one switch (or a LAN, or one asking for a tag) takes one tag common to every
switch of its endpoints; a link between two racks' switches takes the path stitching/racks.py negotiates over
the aggregate's trunks (a common tag, else translation, else Q-in-Q at the trunk ports that can).

Units: `bw:<iface>:<i>` one BW_CHUNK_KBPS of a host interface (a pool per interface, on its host), the label
`vlan:<switch>:<tag>` (a label set per switch: its VLAN range) and `wire:<trunk port>:<tag>`, the outermost
tag on a trunk port's wire (a label set per trunk port: the trunk's tags and S-tags)."""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import Any

from protocol.delegation import LabelSet, Pool
from resources.kind import Amounts, Offer
from rspec.request import RequestLink
from rspec.substrate import Substrate, Switch, urn_name
from slicex.errors import InsufficientBandwidth, VlanUnavailable
from stitching.model import StitchingError
from stitching.racks import RackPath, plan_rack_link, trunk_bw, trunk_wire
from stitching.racks import tags_of as tags_in

BW_CHUNK_KBPS = 100_000


def bw(iface: str, i: int) -> str:
    return f"bw:{iface}:{i}"


def vlan(switch: str, tag: int) -> str:
    return f"vlan:{switch}:{tag}"


def switches_of(substrate: Substrate, host_ifaces: list[str]) -> list[Switch]:
    """The switches a set of host interfaces are cabled to, in substrate order (the first if none is cabled)."""
    ports = {i.component_id: i.switch_port for h in substrate.hosts for i in h.interfaces}
    used = {ports.get(hi) for hi in host_ifaces}
    found = [sw for sw in substrate.switches if any(p.component_id in used for p in sw.ports)]
    return found or list(substrate.switches[:1])


def ranges_text(ranges) -> str:
    return ",".join(f"{lo}-{hi}" if lo != hi else str(lo) for lo, hi in ranges)


def tags_of(sw: Switch) -> set[int]:
    return {t for lo, hi in sw.vlan_range for t in range(lo, hi + 1)}


class VlanLinks:
    name = "vlan"
    unit_kinds = ("bw", "vlan")

    def offer(self, substrate: Substrate) -> Offer:
        pools = [Pool(f"bw:{i.component_id}", "bw",
                      tuple(bw(i.component_id, k) for k in range(i.bandwidth_kbps // BW_CHUNK_KBPS)), h.component_id)
                 for h in substrate.hosts for i in h.interfaces]
        pools += [Pool(f"bw:{port}", "bw", units, f"bw:{port}")
                  for t in substrate.trunks for port, units in trunk_bw(t).items()]
        labels = [LabelSet(f"vlan:{sw.component_id}", tuple(sw.vlan_range)) for sw in substrate.switches]
        labels += [LabelSet(f"wire:{port}", _ranges_of(trunk_wire(substrate, t) | tags_in(t.s_vlan_range)))
                   for t in substrate.trunks for port in (t.port_a, t.port_b)]
        return Offer(tuple(pools), tuple(labels))

    def place(self, substrate: Substrate, link: RequestLink, host_ifaces: list[str], taken: Set[str],
              keys: list[str]) -> tuple[list[str], dict[str, Any], dict[str, int]]:
        out: list[str] = []
        if link.capacity_kbps:
            chunks = -(-link.capacity_kbps // BW_CHUNK_KBPS)
            for hi in host_ifaces:
                iface = next(i for h in substrate.hosts for i in h.interfaces if i.component_id == hi)
                free = [bw(hi, i) for i in range(iface.bandwidth_kbps // BW_CHUNK_KBPS)
                        if bw(hi, i) not in taken and bw(hi, i) not in out and bw(hi, i) not in keys]
                if len(free) < chunks:
                    raise InsufficientBandwidth(
                        f"link {link.client_id}: asked for {link.capacity_kbps} kbps on {hi}; "
                        f"{len(free) * BW_CHUNK_KBPS} kbps free of {iface.bandwidth_kbps}")
                out.extend(free[:chunks])
        tag = None
        labels: dict[str, int] = {}
        switches = switches_of(substrate, host_ifaces)
        if across_racks(link, switches, host_ifaces):
            path = _rack_path(substrate, link, host_ifaces, taken, [*keys, *out])
            units = path.units()
            tags = dict(path.labels)
            if len(set(tags.values())) == 1:  # one tag everywhere: the broker books it as the switches' label
                labels = {f"vlan:{sw}": t for sw, t in tags.items()}
            else:  # the ticket carries the first rack's tag (the link's key for drivers); the rest are units
                labels = {f"vlan:{path.labels[0][0]}": path.labels[0][1]}
            out.extend(units)
            ends = list(link.interface_refs[:2])  # host_ifaces are in interface_refs order
            return out, {"vlan_tag": path.labels[0][1], "switch": path.labels[0][0], "rack_path": path.kind,
                         "switch_tags": {sw: t for sw, t in path.labels},
                         "interface_tags": {ends[0]: path.labels[0][1], ends[1]: path.labels[-1][1]},
                         "hops": [h.to_doc() for h in path.hops]}, labels
        if len(host_ifaces) > 1 or link.vlan_tag is not None:
            if not switches:
                raise VlanUnavailable(f"link {link.client_id}: its endpoints are not cabled to any switch here")
            common = set.intersection(*(tags_of(sw) for sw in switches))
            where = " and ".join(f"{sw.name} ({ranges_text(sw.vlan_range)})" for sw in switches)
            if link.vlan_tag is not None:
                if link.vlan_tag not in common:
                    raise VlanUnavailable(f"link {link.client_id}: VLAN {link.vlan_tag} is not in the range of {where}")
                common = {link.vlan_tag}
            free = sorted(t for t in common if all(vlan(sw.component_id, t) not in taken for sw in switches))
            if not free:
                asked = f"VLAN {link.vlan_tag}" if link.vlan_tag is not None else "a VLAN"
                reason = "no tag is in every range" if not common else "none free"
                raise VlanUnavailable(f"link {link.client_id}: asked for {asked} across {where}; {reason}")
            tag = free[0]
            out.extend(vlan(sw.component_id, tag) for sw in switches)
            labels = {f"vlan:{sw.component_id}": tag for sw in switches}
        details = {"vlan_tag": tag, "switch": switches[0].component_id if (switches and tag) else ""}
        return out, details, labels

    def needs(self, substrate: Substrate, link: RequestLink, host_ifaces: list[str],
              taken: Set[str]) -> list[dict[str, Any]]:
        """Bandwidth on each endpoint interface, and VLAN tags (free ones common to every switch the link
        crosses) on each switch."""
        site_of_iface = {i.component_id: h.site for h in substrate.hosts for i in h.interfaces}
        out: list[dict[str, Any]] = []
        if link.capacity_kbps:
            for hi in host_ifaces:
                iface = next(i for h in substrate.hosts for i in h.interfaces if i.component_id == hi)
                free = sum(1 for i in range(iface.bandwidth_kbps // BW_CHUNK_KBPS) if bw(hi, i) not in taken)
                out.append({"resource": "bandwidth_kbps", "site": site_of_iface.get(hi, ""),
                            "interface": urn_name(hi), "asked": link.capacity_kbps,
                            "available": free * BW_CHUNK_KBPS})
        switches = switches_of(substrate, host_ifaces)
        if across_racks(link, switches, host_ifaces):
            try:
                _rack_path(substrate, link, host_ifaces, taken, [])
                available = 1
            except VlanUnavailable:
                available = 0
            out.extend({"resource": "vlan tags", "site": sw.site, "switch": sw.name, "asked": 1,
                        "available": available} for sw in switches)
        elif switches and (len(host_ifaces) > 1 or link.vlan_tag is not None):
            common = set.intersection(*(tags_of(sw) for sw in switches))
            if link.vlan_tag is not None:
                common &= {link.vlan_tag}
            free = [t for t in common if all(vlan(sw.component_id, t) not in taken for sw in switches)]
            for sw in switches:
                out.append({"resource": "vlan tags", "site": sw.site, "switch": sw.name,
                            "asked": link.vlan_tag if link.vlan_tag is not None else 1, "available": len(free)})
        return out

    def held(self, details: Mapping[str, Any]) -> Amounts:
        """Its VLAN tags (distinct tags among its `vlan:<switch>:<tag>` units, or its one tag) and the capacity
        asked."""
        tags = {k.rsplit(":", 1)[1] for k in details.get("keys", ()) if isinstance(k, str) and k.startswith("vlan:")}
        vlans = len(tags) or (1 if details.get("vlan_tag") is not None else 0)
        return Amounts(vlans=vlans, bandwidth_kbps=int(details.get("capacity_kbps") or 0))

    def bin_of(self, key: str) -> str:
        return key.partition(":")[2].rsplit(":", 1)[0]


def across_racks(link: RequestLink, switches: list[Switch], host_ifaces: list[str]) -> bool:
    """Whether a link is a point-to-point link between two switches of the aggregate (carried over its
    trunks): not a LAN, not a stitched link (its tags are its hops'), not one asking for a tag."""
    return len(switches) == 2 and len(host_ifaces) == 2 and not link.uplinks and link.vlan_tag is None


def _rack_path(substrate: Substrate, link: RequestLink, host_ifaces: list[str], taken: Set[str],
               keys: list[str]) -> RackPath:
    try:
        path = plan_rack_link(substrate, link.client_id, host_ifaces[0], host_ifaces[1], set(taken) | set(keys),
                              link.capacity_kbps or 0)
    except StitchingError as exc:
        if exc.kind == "bandwidth":
            raise InsufficientBandwidth(exc.message) from None
        raise VlanUnavailable(exc.message) from None
    return path


def _ranges_of(tags: Set[int]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    for t in sorted(tags):
        if out and out[-1][1] == t - 1:
            out[-1] = (out[-1][0], t)
        else:
            out.append((t, t))
    return tuple(out)
