"""Public ports: TCP ports of the aggregate's gateway (its public address), each forwarded to a port of one node
(the netns driver forwards with the login relay, authority/substrate/login.py).

Units: `pport:<port>`, one pool `pport` of the operator's ranges (the substrate's `public_ports`). A node asks
for them in its request (`public:port`, rspec/schemas/public-1.xsd): a particular public port, or any free one.
The ports are booked, ticketed, leased and released with the node's sliver like its cores, so two slices never
hold the same one. A node part: it adds units to a node another kind placed."""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import Any

from protocol.delegation import Pool
from resources.kind import Amounts, Offer, Placement
from rspec.request import RequestNode
from rspec.substrate import Substrate
from slicex.errors import BadArgs, PortUnavailable

GATEWAY = "gateway"  # the bin every public port lives on (metrics, dashboard)


def pport(port: int) -> str:
    return f"pport:{port}"


def offered_ports(substrate: Substrate) -> list[int]:
    return [p for lo, hi in substrate.public_ports for p in range(lo, hi + 1)]


FIRST_UNPRIVILEGED = 1024
"""Ports below are the host's own services (sshd's 22 first of all): never a node's public port."""


def host_ports_offered(substrate: Substrate, own: Mapping[int, str]) -> list[str]:
    """What the operator's public range would hand to nodes that belongs to the host: privileged ports and
    `own` (port -> what listens there: the deployment's servers, its Redis). A node's relay bound there
    first (the service restarting, or the aggregate starting after its nodes were adopted) would answer that
    service's clients; so such a range is refused at start, naming each."""
    out = [f"{lo}-{hi} (ports below {FIRST_UNPRIVILEGED} are the host's services, sshd's 22 among them)"
           for lo, hi in substrate.public_ports if lo < FIRST_UNPRIVILEGED]
    out += [f"{port} ({what})" for port, what in sorted(own.items())
            if port and any(lo <= port <= hi for lo, hi in substrate.public_ports)]
    return out


def ranges_text(substrate: Substrate) -> str:
    return ", ".join(f"{lo}-{hi}" if lo != hi else str(lo) for lo, hi in substrate.public_ports) or "none"


class PublicPorts:
    """The gateway's TCP ports, handed to nodes that ask (every node kind's)."""

    name = "public_port"
    unit_kinds = ("pport",)

    def offer(self, substrate: Substrate) -> Offer:
        ports = offered_ports(substrate)
        return Offer((Pool("pport", "pport", tuple(pport(p) for p in ports), GATEWAY),) if ports else ())

    def place(self, substrate: Substrate, node: RequestNode, placed: Placement,
              taken: Set[str]) -> tuple[list[str], dict[str, Any]]:
        """(unit keys, details) of `node`'s public ports: those it asked for if in the operator's ranges and
        free (BADARGS outside them, UNAVAILABLE when held), else the lowest free ones."""
        if not node.public_ports:
            return [], {}
        offered = offered_ports(substrate)
        if not offered:
            raise BadArgs(f"node {node.client_id}: asks for public ports; this aggregate offers none")
        keys: list[str] = []
        given: list[dict[str, int]] = []
        asked = {want for _port, want in node.public_ports if want}
        for port, want in node.public_ports:
            if want:
                if not any(lo <= want <= hi for lo, hi in substrate.public_ports):
                    raise BadArgs(f"node {node.client_id}: public port {want} is outside the operator's range "
                                  f"({ranges_text(substrate)})")
                if pport(want) in taken or pport(want) in keys:
                    raise PortUnavailable(f"node {node.client_id}: public port {want} is held by another sliver")
                chosen = want
            else:
                chosen = next((p for p in offered if pport(p) not in taken and pport(p) not in keys
                               and p not in asked), 0)
                if not chosen:
                    free = sum(1 for p in offered if pport(p) not in taken)
                    raise PortUnavailable(f"node {node.client_id}: asked for {len(node.public_ports)} public ports; "
                                          f"{free} of {len(offered)} free ({ranges_text(substrate)})")
            keys.append(pport(chosen))
            given.append({"port": port, "public_port": chosen})
        return keys, {"public_ports": given}

    def needs(self, substrate: Substrate, node: RequestNode, taken: Set[str]) -> list[dict[str, Any]]:
        if not node.public_ports:
            return []
        offered = offered_ports(substrate)
        return [{"resource": "public ports", "site": GATEWAY, "asked": len(node.public_ports),
                 "available": sum(1 for p in offered if pport(p) not in taken)}]

    def asked(self, node: RequestNode) -> Amounts:
        return Amounts(public_ports=len(node.public_ports))

    def held(self, details: Mapping[str, Any]) -> Amounts:
        return Amounts(public_ports=len(details.get("public_ports") or ()))

    def bin_of(self, key: str) -> str:
        return GATEWAY
