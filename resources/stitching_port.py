"""Stitching ports: an aggregate's external ports toward other aggregates or transit networks. A stitched
link takes the outer tag on each of its own ports' wires (802.1Q tags, and the S-tags of a Q-in-Q port)
and its capacity on each port, summed over slices.

Units: the label `wire:<port>:<tag>` (a label set per external port) and `bw:<port>:<i>`, one unit of the
port's capacity: 1/PORT_BW_UNITS of it, or its `granularity_kbps` when coarser (a link's capacity is
rounded up to units; a shortage is INSUFFICIENT_BANDWIDTH, 25)."""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import Any

from protocol.delegation import LabelSet, Pool
from resources.kind import Amounts, Offer
from rspec.request import RequestLink
from rspec.substrate import ExternalLink, Substrate, urn_name
from slicex.errors import InsufficientBandwidth, VlanUnavailable

PORT_BW_UNITS = 100


def wire(port: str, tag: int) -> str:
    return f"wire:{port}:{tag}"


def port_bw_unit(ext: ExternalLink) -> int:
    """kbps per bandwidth unit of an external port."""
    return max(1, ext.granularity_kbps, -(-ext.capacity_kbps // PORT_BW_UNITS))


def port_bw(ext: ExternalLink) -> tuple[str, ...]:
    return tuple(f"bw:{ext.local_port}:{k}" for k in range(ext.capacity_kbps // port_bw_unit(ext)))


class StitchingPorts:
    name = "stitching port"
    unit_kinds = ("wire", "bw")

    def offer(self, substrate: Substrate) -> Offer:
        pools = [Pool(f"bw:{e.local_port}", "bw", port_bw(e), f"bw:{e.local_port}") for e in substrate.external_links]
        labels = [LabelSet(f"wire:{e.local_port}", tuple(sorted(set(e.vlan_range) | set(e.s_vlan_range))))
                  for e in substrate.external_links]
        return Offer(tuple(pools), tuple(labels))

    def place(self, substrate: Substrate, link: RequestLink, host_ifaces: list[str], taken: Set[str],
              keys: list[str]) -> tuple[list[str], dict[str, Any], dict[str, int]]:
        """The outer tag the aggregate's own hops chose on each uplink's wire (`link.uplinks`, from
        stitching/am_hops.py), and the link's capacity on each of those ports."""
        out: list[str] = []
        for port, tags in link.uplinks:
            key = wire(port, tags[0][1])
            if key in taken or key in keys or key in out:
                raise VlanUnavailable(f"link {link.client_id}: tag {tags[0][1]} on the wire of port {port} is held "
                                      f"by another link")
            out.append(key)
        out.extend(self.capacity_keys(substrate, link, taken, [*keys, *out]))
        details = {"uplinks": [{"port": p, "tags": [list(t) for t in w]} for p, w in link.uplinks]} \
            if link.uplinks else {}
        # the wire tags are taken as units: the aggregate's hops chose them, the broker only checks them
        return out, details, {}

    @staticmethod
    def capacity_keys(substrate: Substrate, link: Any, taken: Set[str], keys: list[str] | tuple[str, ...] = ()
                      ) -> list[str]:
        """The units a stitched link holds on each of its own external ports for its capacity, from those not
        `taken` by other links (nor in `keys`); INSUFFICIENT_BANDWIDTH naming the port, what was asked and
        what is left when they do not suffice."""
        if not link.capacity_kbps or not link.uplinks:
            return []
        ports = {e.local_port.lower(): e for e in substrate.external_links}
        mine = set(keys)
        out: list[str] = []
        for port in dict.fromkeys(p for p, _wire in link.uplinks):
            ext = ports.get(port.lower())
            if ext is None:
                continue
            unit = port_bw_unit(ext)
            need = -(-link.capacity_kbps // unit)
            free = [k for k in port_bw(ext) if k not in taken and k not in mine]
            if len(free) < need:
                raise InsufficientBandwidth(
                    f"link {link.client_id}: asked for {link.capacity_kbps} kbps over port {ext.local_port} toward "
                    f"{ext.remote_aggregate}; other links hold {ext.capacity_kbps - len(free) * unit} of its "
                    f"{ext.capacity_kbps} kbps, {len(free) * unit} kbps are left")
            out.extend(free[:need])
        return out

    def needs(self, substrate: Substrate, link: RequestLink, host_ifaces: list[str],
              taken: Set[str]) -> list[dict[str, Any]]:
        ports = {e.local_port.lower(): e for e in substrate.external_links}
        out: list[dict[str, Any]] = []
        for port in dict.fromkeys(p for p, _wire in link.uplinks):
            ext = ports.get(port.lower())
            if ext is None or not link.capacity_kbps:
                continue
            free = sum(1 for k in port_bw(ext) if k not in taken)
            out.append({"resource": "bandwidth_kbps", "site": "", "port": urn_name(ext.local_port),
                        "asked": link.capacity_kbps, "available": free * port_bw_unit(ext)})
        return out

    def held(self, details: Mapping[str, Any]) -> Amounts:
        return Amounts()  # its tags and capacity are the link's, counted once by the VLAN kind

    def bin_of(self, key: str) -> str:
        return key.partition(":")[2].rsplit(":", 1)[0]
