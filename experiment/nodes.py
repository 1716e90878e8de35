"""Running commands inside a slice's nodes, and the topology a manifest describes.

NodeExec is the small seam the measurements use: `run` a command in a node and wait for it. Two
implementations: NetnsExec (`ip netns exec <ns>` on the host of a netns aggregate, as root: no login path in
the measurement) and SshExec (through the manifest's login service with the user's key: what works from
any machine, and what an experimenter on another testbed would use)."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from lxml import etree

RSPEC3 = "http://www.geni.net/resources/rspec/3"


def _q(tag: str) -> str:
    return f"{{{RSPEC3}}}{tag}"


class NodeExec(Protocol):
    name: str

    def run(self, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess: ...


class NetnsExec:
    """A node of a netns aggregate on this host, by its namespace."""

    def __init__(self, name: str, netns: str):
        self.name, self.netns = name, netns

    def run(self, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.netns, *argv], capture_output=True, text=True,
                              timeout=timeout)


class SshExec:
    """A node reached with ssh through its manifest's login service."""

    def __init__(self, name: str, host: str, port: int, user: str, key: str):
        self.name, self.host, self.port, self.user, self.key = name, host, port, user, key

    def run(self, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(["ssh", "-i", self.key, "-p", str(self.port), "-o", "BatchMode=yes",
                               "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=no",
                               "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                               "-o", "ConnectTimeout=10", f"{self.user}@{self.host}", shlex.join(argv)],
                              capture_output=True, text=True, timeout=timeout)


@dataclass(frozen=True)
class Endpoint:
    node: str  # node client_id
    interface: str
    address: str  # IPv4 address without prefix length


@dataclass(frozen=True)
class Link:
    client_id: str
    endpoints: tuple[Endpoint, ...]
    capacity_kbps: int | None

    def pairs(self) -> list[tuple[Endpoint, Endpoint]]:
        """What is measured on the link: from its first end to each other one (one pair on a point-to-point
        link, n-1 on a LAN of n)."""
        return [(self.endpoints[0], e) for e in self.endpoints[1:]]


@dataclass(frozen=True)
class ManifestNode:
    client_id: str
    sliver_id: str
    logins: tuple[tuple[str, str, int], ...]  # (username, hostname, port)


def topology(manifest: str) -> tuple[dict[str, ManifestNode], list[Link]]:
    """Nodes (with login services) and links (with their ends' addresses and capacity) of a manifest."""
    root = etree.fromstring(manifest.encode())
    nodes: dict[str, ManifestNode] = {}
    iface: dict[str, tuple[str, str]] = {}
    for n in root.iter(_q("node")):
        cid = n.get("client_id", "")
        logins = tuple((lg.get("username", ""), lg.get("hostname", ""), int(lg.get("port") or 22))
                       for lg in n.iter(_q("login")))
        nodes[cid] = ManifestNode(cid, n.get("sliver_id", ""), logins)
        for i in n.findall(_q("interface")):
            ip = i.find(_q("ip"))
            iface[i.get("client_id", "")] = (cid, ip.get("address", "") if ip is not None else "")
    links = []
    for lk in root.iter(_q("link")):
        ends = tuple(Endpoint(iface[r.get("client_id")][0], r.get("client_id"), iface[r.get("client_id")][1])
                     for r in lk.findall(_q("interface_ref")) if r.get("client_id") in iface)
        caps = [int(p.get("capacity")) for p in lk.findall(_q("property")) if (p.get("capacity") or "").isdigit()]
        links.append(Link(lk.get("client_id", ""), ends, max(caps) if caps else None))
    return nodes, links


def node_memory(manifest: str) -> dict[str, int]:
    """Bytes each node's container uses, as the manifest reports it (`sx:container memory_bytes`, netns
    container nodes); nodes that report none are left out."""
    from rspec.manifest import SERVICES_EXT

    out = {}
    for n in etree.fromstring(manifest.encode()).iter(_q("node")):
        box = n.find(f"{{{SERVICES_EXT}}}container")
        if box is not None and (box.get("memory_bytes") or "").isdigit():
            out[n.get("client_id", "")] = int(box.get("memory_bytes"))
    return out


def netns_execs(prefix: str) -> Callable[[dict[str, ManifestNode]], dict[str, NodeExec]]:
    """NodeExecs by namespace for the netns aggregate whose host objects carry `prefix`."""
    from authority.substrate.netns_plan import netns_name

    def make(nodes: dict[str, ManifestNode]) -> dict[str, NodeExec]:
        return {cid: NetnsExec(cid, netns_name(prefix, n.sliver_id)) for cid, n in nodes.items()}

    return make


def ssh_execs(user: str, key: str) -> Callable[[dict[str, ManifestNode]], dict[str, NodeExec]]:
    """NodeExecs through each node's login service for `user` (the first login if the user is not named)."""

    def make(nodes: dict[str, ManifestNode]) -> dict[str, NodeExec]:
        out: dict[str, NodeExec] = {}
        for cid, n in nodes.items():
            login = next((lg for lg in n.logins if lg[0] == user), n.logins[0] if n.logins else None)
            if login is None:
                raise ValueError(f"node {cid} has no login service in its manifest")
            out[cid] = SshExec(cid, login[1], login[2], login[0], key)
        return out

    return make
