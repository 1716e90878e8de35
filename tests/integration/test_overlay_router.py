"""The virtual router's forwarding on real bytes, without root: each node's "tap" is one end of a datagram
socketpair (the router writes frames to it as it would to a tap), the remote cluster's router is a plain
UDP socket, claims are in a real Redis (SLICEX_REDIS_URL, default db 6, a fresh key prefix)."""

from __future__ import annotations

import os
import socket
import uuid
from ipaddress import IPv4Address

import pytest

from federation.overlay import frames
from federation.overlay.claims import RedisClaims
from federation.overlay.core import Holder, NamespaceConfig
from federation.overlay.router import Port, VirtualRouter
from slicex.errors import Unavailable

REDIS_URL = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/6")
A = IPv4Address
MAC = {n: bytes.fromhex(f"0200000000{i:02x}") for i, n in enumerate(["a1", "a2", "b1"], 1)}
IP = {"a1": A("10.60.0.11"), "a2": A("10.60.0.12"), "b1": A("10.60.0.21")}


class Rig:
    def __init__(self):
        self.claims = RedisClaims(REDIS_URL, prefix=f"test-ovr-{uuid.uuid4().hex[:8]}")
        try:
            self.claims.ping()
        except Unavailable as exc:
            pytest.fail(f"Redis is required for these tests and is not answering ({exc}); run `make redis`")
        cfg = self.claims.define(NamespaceConfig.build("s1", "10.60.0.0/24", 30))
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        self.router = VirtualRouter(self.claims, cfg, "A", sock)
        self.remote = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # cluster B's router
        self.remote.bind(("127.0.0.1", 0))
        self.remote.settimeout(2)
        b_endpoint = f"127.0.0.1:{self.remote.getsockname()[1]}"
        self.taps: dict[str, socket.socket] = {}
        self.ports: dict[str, Port] = {}
        for n in ("a1", "a2"):
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
            ours.setblocking(False)
            self.taps[n] = ours
            self.ports[n] = Port(n, theirs.detach(), MAC[n])
            self.router.add_port(self.ports[n])
        for n, endpoint in (("a1", self.router.endpoint), ("a2", self.router.endpoint), ("b1", b_endpoint)):
            self.claims.claim("s1", IP[n], Holder(n, endpoint, "A" if n[0] == "a" else "B",
                                                  frames.mac_text(MAC[n])), 30)

    def received(self, node: str) -> list[bytes]:
        out = []
        while True:
            try:
                out.append(self.taps[node].recv(65535))
            except BlockingIOError:
                return out

    def close(self) -> None:
        for s in self.taps.values():
            s.close()
        for p in self.ports.values():
            os.close(p.fd)
        self.router.sock.close()
        self.remote.close()
        self.claims.undefine("s1")
        self.claims.close()


@pytest.fixture
def rig():
    r = Rig()
    yield r
    r.close()


def ipv4(src: str, dst: str, dst_mac: bytes) -> bytes:
    header = bytes([0x45, 0, 0, 28, 0, 0, 0, 0, 64, 1, 0, 0]) + IP[src].packed + IP[dst].packed
    return dst_mac + MAC[src] + b"\x08\x00" + header + bytes(8)


def test_arp_for_a_remote_claim_is_answered_with_the_router_mac_and_for_a_local_one_is_not(rig):
    rig.router.from_tap(rig.ports["a1"], frames.arp_request(MAC["a1"], IP["a1"], IP["b1"]))
    reply = frames.parse_arp(rig.received("a1")[0])
    assert reply.op == frames.ARP_REPLY and reply.sender_mac == frames.ROUTER_MAC and reply.sender_ip == IP["b1"]
    assert len(rig.received("a2")) == 1  # the request itself is broadcast on the segment
    rig.router.from_tap(rig.ports["a1"], frames.arp_request(MAC["a1"], IP["a1"], IP["a2"]))
    assert rig.received("a1") == []  # a2 answers for itself
    assert frames.parse_arp(rig.received("a2")[0]).target_ip == IP["a2"]
    assert rig.router.stats["arp_proxied"] == 1


def test_a_frame_for_a_remote_address_is_tunnelled_to_the_router_holding_its_claim(rig):
    frame = ipv4("a1", "b1", frames.ROUTER_MAC)
    rig.router.from_tap(rig.ports["a1"], frame)
    datagram, sender = rig.remote.recvfrom(65535)
    assert frames.decapsulate(datagram) == (b"s1", frame, frames.NO_OFFLOAD)
    assert f"{sender[0]}:{sender[1]}" == rig.router.endpoint
    rig.router.from_tap(rig.ports["a1"], ipv4("a1", "a2", frames.ROUTER_MAC)[:30] + A("10.60.0.99").packed
                        + bytes(8))
    assert rig.router.stats["drop_unclaimed"] == 1


def test_a_tunnelled_frame_is_delivered_to_its_local_holder_from_the_router_mac(rig):
    rig.remote.sendto(frames.encapsulate(b"s1", ipv4("b1", "a2", frames.ROUTER_MAC)), rig.router.sock.getsockname())
    rig.router.from_tunnel(*rig.router.sock.recvfrom(65535))
    got = rig.received("a2")
    assert got == [frames.rewrite_macs(ipv4("b1", "a2", frames.ROUTER_MAC), MAC["a2"], frames.ROUTER_MAC)]
    assert rig.received("a1") == []  # a2's MAC is known: not flooded


def test_a_tunnelled_frame_from_a_router_not_holding_its_source_is_dropped(rig):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stranger:
        stranger.sendto(frames.encapsulate(b"s1", ipv4("b1", "a2", frames.ROUTER_MAC)),
                        rig.router.sock.getsockname())
        rig.router.from_tunnel(*rig.router.sock.recvfrom(65535))
    # a1's address is held by this very router, not by the sender either
    rig.remote.sendto(frames.encapsulate(b"s1", ipv4("a1", "a2", frames.ROUTER_MAC)), rig.router.sock.getsockname())
    rig.router.from_tunnel(*rig.router.sock.recvfrom(65535))
    assert rig.router.stats["drop_spoofed"] == 2 and rig.received("a2") == []


def test_unicast_on_the_segment_goes_to_the_one_port_with_that_mac(rig):
    rig.router.from_tap(rig.ports["a2"], frames.arp_request(MAC["a2"], IP["a2"], IP["a1"]))  # learns a2
    rig.received("a1")
    rig.router.from_tap(rig.ports["a1"], ipv4("a1", "a2", MAC["a2"]))
    assert rig.received("a2") == [ipv4("a1", "a2", MAC["a2"])] and rig.received("a1") == []
    assert rig.router.stats.get("routed_out", 0) == 0


def test_a_router_behind_a_nat_claims_the_endpoint_it_advertises(rig):
    """Behind a NAT the others see the NAT's address: --advertise names it, with the bound port unless given."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        bound = sock.getsockname()[1]
        cfg = rig.claims.namespace("s1")
        assert VirtualRouter(rig.claims, cfg, "C", sock, advertise="192.0.2.7").endpoint == f"192.0.2.7:{bound}"
        assert VirtualRouter(rig.claims, cfg, "C", sock, advertise="192.0.2.7:4789").endpoint == "192.0.2.7:4789"
        assert VirtualRouter(rig.claims, cfg, "C", sock).endpoint == f"127.0.0.1:{bound}"


# ---- the fast data plane: taps with offloads (a virtio_net_hdr before each frame) -------------------------------
ICMP_CSUM = frames.OFFLOAD.pack(frames.NEEDS_CSUM, frames.GSO_NONE, 0, 0, 34, 2)  # checksum left to the receiver


def test_a_frame_from_a_tap_with_offloads_crosses_the_tunnel_with_its_offload_header(rig):
    rig.ports["a1"].offload = True
    frame = ipv4("a1", "b1", frames.ROUTER_MAC)
    rig.router.from_tap(rig.ports["a1"], ICMP_CSUM + frame)
    datagram, _ = rig.remote.recvfrom(65535)
    assert datagram[4] == frames.VERSION_OFFLOADED and frames.decapsulate(datagram) == (b"s1", frame, ICMP_CSUM)
    rig.router.from_tap(rig.ports["a1"], frames.NO_OFFLOAD + frame)  # nothing left undone: version 1
    assert frames.decapsulate(rig.remote.recvfrom(65535)[0]) == (b"s1", frame, frames.NO_OFFLOAD)


def test_a_tunnelled_offloaded_frame_reaches_a_tap_with_offloads_as_it_came(rig):
    rig.ports["a2"].offload = True
    rig.remote.sendto(frames.encapsulate(b"s1", ipv4("b1", "a2", frames.ROUTER_MAC), ICMP_CSUM),
                      rig.router.sock.getsockname())
    rig.router.from_tunnel(*rig.router.sock.recvfrom(65535))
    assert rig.received("a2") == [ICMP_CSUM + frames.rewrite_macs(ipv4("b1", "a2", frames.ROUTER_MAC), MAC["a2"],
                                                                  frames.ROUTER_MAC)]


def test_a_router_without_offloads_finishes_the_checksum_an_offloading_router_left_undone(rig):
    """Routers of one namespace may differ (the fast path is chosen per host): the plain one completes what the
    other's tap left to hardware, so its node gets a frame its kernel accepts."""
    rig.remote.sendto(frames.encapsulate(b"s1", ipv4("b1", "a2", frames.ROUTER_MAC), ICMP_CSUM),
                      rig.router.sock.getsockname())
    rig.router.from_tunnel(*rig.router.sock.recvfrom(65535))
    [got] = rig.received("a2")
    icmp = got[34:]
    total = sum(int.from_bytes(icmp[i:i + 2], "big") for i in range(0, len(icmp), 2))
    assert (total & 0xFFFF) + (total >> 16) == 0xFFFF and got[:34] == frames.rewrite_macs(
        ipv4("b1", "a2", frames.ROUTER_MAC), MAC["a2"], frames.ROUTER_MAC)[:34]
