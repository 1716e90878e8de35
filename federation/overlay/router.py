"""The per-cluster virtual router: a userspace forwarder that is the segment for its cluster's nodes and
their gateway to the other clusters.

* Frames between this cluster's nodes are switched on the segment by learned MAC (same-segment nodes talk
  directly; the router's routing part never sees them).
* An ARP request for a *remote* claimed address is answered with ROUTER_MAC (proxy ARP, core.answer_arp).
* An IPv4 frame sent to ROUTER_MAC is routed by the claim for its destination (core.route): tunnelled in a
  UDP datagram to the router named in the claim, or dropped when nobody holds the address.
* A datagram from another router is accepted only when the claim for its source address names that
  router; it is delivered to the local holder of the destination with ROUTER_MAC as source, so replies
  come back through the router.

Claims are read from the store through a LookupCache; the router also claims and renews the addresses of
the nodes it serves (IPOP's DHCP proxy on the router)."""

from __future__ import annotations

import collections
import errno
import os
import selectors
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from ipaddress import IPv4Address

from federation.overlay import core, frames
from federation.overlay.claims import RedisClaims
from federation.overlay.core import Holder, LookupCache, NamespaceConfig, Where
from slicex.errors import GeniError

BATCH = 64
READ_SIZE = 65536 + 64  # a super-frame with its offload header, or any ordinary frame
_NATIVE_OFFLOAD = struct.Struct("=BBHHHH")


def _offload_order(header: bytes) -> bytes:
    """A tap's virtio_net_hdr is in the host's byte order, the tunnel's in little-endian (virtio 1.0); the
    same swap converts either way."""
    if sys.byteorder == "little":
        return header
    return _NATIVE_OFFLOAD.pack(*frames.OFFLOAD.unpack(header))


@dataclass
class Port:
    """One node's tap, as the router sees it."""

    node: str
    fd: int
    mac: bytes
    offload: bool = False  # the tap was opened with offloads (tap.open_tap): reads and writes carry a header


class VirtualRouter:
    def __init__(self, claims: RedisClaims, config: NamespaceConfig, cluster: str, sock: socket.socket,
                 clock: Callable[[], float] = time.monotonic, negative_cache: float = 0.2,
                 advertise: str | None = None):
        """`advertise`: the address (HOST, or HOST:PORT) other routers see this one's datagrams come from and
        must send to, when that is not where it listens: behind a NAT, the NAT's outside address (a masquerade
        keeps the source port, so the port defaults to the bound one)."""
        self.claims = claims
        self.config = config
        self.cluster = cluster
        self.sock = sock
        host, port = sock.getsockname()[:2]
        if advertise:
            host, _, given = advertise.partition(":")
            port = int(given) if given else port
        self.endpoint = f"{host}:{port}"
        self.clock = clock
        self.cache = LookupCache(positive=config.renew_after, negative=min(negative_cache, config.renew_after))
        self.ports: list[Port] = []
        self.macs: dict[bytes, Port] = {}
        self.on_segment: set[IPv4Address] = set()
        self.stats: collections.Counter[str] = collections.Counter()
        self.on_port_gone: Callable[[Port], None] | None = None
        self._ns = config.name.encode()

    def add_port(self, port: Port) -> None:
        self.ports.append(port)
        self.macs[port.mac] = port

    def _remove(self, port: Port) -> None:
        """A node whose tap went away with its namespace: forget it and tell the owner (who releases its
        claim, so the address is not left routed to a node that is gone)."""
        self.ports = [p for p in self.ports if p is not port]
        self.macs = {m: p for m, p in self.macs.items() if p is not port}
        if self.on_port_gone:
            self.on_port_gone(port)

    # ---- lookups ---------------------------------------------------------------------------------------------
    def lookup(self, address: IPv4Address) -> Holder | None:
        now = self.clock()
        hit, holder = self.cache.get(address, now)
        if hit:
            return holder
        try:
            holder = self.claims.lookup(self.config.name, address)
        except GeniError:
            self.stats["store_errors"] += 1
            return None
        self.cache.put(address, holder, now)
        return holder

    # ---- output ----------------------------------------------------------------------------------------------
    def _write(self, port: Port, frame: bytes, offload: bytes = frames.NO_OFFLOAD) -> None:
        if port.offload:
            self._write_raw(port, _offload_order(offload) + frame)
            return
        plain = frames.plain_frames(frame, offload)
        if not plain:
            self.stats["drop_offload_unsupported"] += 1
        for f in plain:
            self._write_raw(port, f)

    def _write_raw(self, port: Port, data: bytes) -> None:
        try:
            os.write(port.fd, data)
        except BlockingIOError:
            self.stats["drop_tap_full"] += 1
        except OSError as exc:
            if exc.errno not in (errno.EIO, errno.EBADFD):  # EIO: the tap is down (its namespace is going)
                raise
            self.stats["drop_tap_down"] += 1

    def _switch(self, frame: bytes, came_from: Port | None, offload: bytes = frames.NO_OFFLOAD) -> None:
        dst = frame[0:6]
        port = None if frames.is_multicast(dst) else self.macs.get(dst)
        if port is not None:
            if port is not came_from:
                self._write(port, frame, offload)
            return
        for p in self.ports:
            if p is not came_from:
                self._write(p, frame, offload)

    # ---- input -----------------------------------------------------------------------------------------------
    def from_tap(self, port: Port, data: bytes) -> None:
        """`data` as read from the tap: the frame, after its offload header when the tap has offloads."""
        offload = frames.NO_OFFLOAD
        if port.offload:
            offload, frame = _offload_order(data[:frames.OFFLOAD.size]), data[frames.OFFLOAD.size:]
            if offload[1] != frames.GSO_NONE:  # gso_type: the node's kernel handed over several segments at once
                self.stats["super_frames"] += 1
        else:
            frame = data
        if len(frame) < 14:
            return
        src = frame[6:12]
        if not frames.is_multicast(src):
            self.macs[src] = port
        dst = frame[0:6]
        if dst == frames.ROUTER_MAC:
            self._route_out(frame, offload)
            return
        arp = frames.parse_arp(frame)
        if arp is not None:
            if arp.sender_ip != IPv4Address(0) and arp.sender_ip in self.config.network:
                self.on_segment.add(arp.sender_ip)
            if arp.op == frames.ARP_REQUEST and arp.target_ip in self.config.network and core.answer_arp(
                    self.config, arp.sender_ip, arp.target_ip, self.lookup(arp.target_ip), self.endpoint,
                    self.on_segment):
                self.stats["arp_proxied"] += 1
                self._write(port, frames.arp_reply(arp, frames.ROUTER_MAC))
        self.stats["switched"] += 1
        self._switch(frame, port, offload)

    def _route_out(self, frame: bytes, offload: bytes = frames.NO_OFFLOAD) -> None:
        addrs = frames.ipv4_addresses(frame)
        if addrs is None:
            self.stats["drop_not_ipv4"] += 1
            return
        r = core.route(self.config, addrs[1], self.lookup(addrs[1]), self.endpoint)
        if r.where is Where.REMOTE:
            assert r.holder is not None
            self.stats["routed_out"] += 1
            try:
                self.sock.sendto(frames.encapsulate(self._ns, frame, offload), r.holder.udp)
            except OSError:
                self.stats["drop_send_failed"] += 1
        elif r.where is Where.LOCAL:
            assert r.holder is not None
            self.stats["routed_local"] += 1
            self._switch(frames.rewrite_macs(frame, frames.mac_bytes(r.holder.mac), frames.ROUTER_MAC), None,
                         offload)
        else:
            self.stats["drop_unclaimed"] += 1

    def from_tunnel(self, datagram: bytes, sender: tuple[str, int]) -> None:
        got = frames.decapsulate(datagram)
        if got is None or got[0] != self._ns:
            self.stats["drop_not_ours"] += 1
            return
        frame, offload = got[1], got[2]
        addrs = frames.ipv4_addresses(frame)
        if addrs is None:
            self.stats["drop_not_ipv4"] += 1
            return
        src_holder = self.lookup(addrs[0])
        if src_holder is None or src_holder.udp != (sender[0], sender[1]):
            self.stats["drop_spoofed"] += 1  # the source address is not claimed by the router that sent it
            return
        r = core.route(self.config, addrs[1], self.lookup(addrs[1]), self.endpoint)
        if r.where is not Where.LOCAL or r.holder is None:
            self.stats["drop_not_here"] += 1
            return
        self.stats["routed_in"] += 1
        self._switch(frames.rewrite_macs(frame, frames.mac_bytes(r.holder.mac), frames.ROUTER_MAC), None, offload)

    # ---- the loop --------------------------------------------------------------------------------------------
    def serve(self, stop: threading.Event, tick: Callable[[], None] | None = None) -> None:
        """Forward until `stop` is set; `tick` runs between batches at most every 0.2 s (status output)."""
        sel = selectors.DefaultSelector()
        self.sock.setblocking(False)
        sel.register(self.sock, selectors.EVENT_READ, None)
        for p in self.ports:
            sel.register(p.fd, selectors.EVENT_READ, p)
        parked: dict[int, tuple[Port, float]] = {}
        try:
            while not stop.is_set():
                for key, _ in sel.select(0.2):
                    port = key.data
                    for _ in range(BATCH):
                        try:
                            if port is None:
                                data, sender = self.sock.recvfrom(65535)
                                self.from_tunnel(data, sender)
                            else:
                                self.from_tap(port, os.read(port.fd, READ_SIZE))
                        except (BlockingIOError, InterruptedError):
                            break
                        except OSError as exc:
                            if port is None or exc.errno not in (errno.EIO, errno.EBADFD):
                                raise
                            # the tap is down (EIO) or gone with its namespace (EBADFD): stop polling it
                            # (it would read as ready forever); a downed tap is polled again a second later
                            sel.unregister(port.fd)
                            self.stats[f"tap_{errno.errorcode[exc.errno].lower()}"] += 1
                            if exc.errno == errno.EIO:
                                parked[port.fd] = (port, self.clock() + 1.0)
                            else:
                                self._remove(port)
                            break
                now = self.clock()
                for fd, (p, at) in list(parked.items()):
                    if now >= at:
                        del parked[fd]
                        sel.register(fd, selectors.EVENT_READ, p)
                if tick:
                    tick()
        finally:
            sel.close()
