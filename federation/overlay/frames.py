"""Ethernet, ARP and IPv4 header reading and writing the virtual router needs, and the UDP encapsulation
of Ethernet frames between routers. Pure functions over bytes."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from ipaddress import IPv4Address

# IPOP's virtual router answers ARP for remote hosts with this fixed, locally administered unicast MAC.
ROUTER_MAC = bytes.fromhex("fefd00000000")
BROADCAST = b"\xff" * 6
ETH_IP = 0x0800
ETH_ARP = 0x0806
ARP_REQUEST = 1
ARP_REPLY = 2

# Tunnel header: magic, version, namespace length, namespace (UTF-8), then the Ethernet frame. Version 2
# puts the frame's offload header (a virtio_net_hdr, little-endian as virtio 1.0 defines it) between the
# namespace and the frame: a GSO super-frame of up to 64 KiB with its checksum left to the receiving kernel.
MAGIC = b"SXOV"
VERSION = 1
VERSION_OFFLOADED = 2
_HEAD = struct.Struct("!4sBB")

# virtio_net_hdr: flags, gso_type, hdr_len, gso_size, csum_start, csum_offset.
OFFLOAD = struct.Struct("<BBHHHH")
NO_OFFLOAD = bytes(OFFLOAD.size)
NEEDS_CSUM = 1
GSO_NONE, GSO_TCPV4, GSO_ECN = 0, 1, 0x80


def mac_text(mac: bytes) -> str:
    return ":".join(f"{b:02x}" for b in mac)


def mac_bytes(text: str) -> bytes:
    return bytes(int(p, 16) for p in text.split(":"))


def ethertype(frame: bytes) -> int:
    return int.from_bytes(frame[12:14], "big") if len(frame) >= 14 else -1


def is_multicast(mac: bytes) -> bool:
    """Broadcast and multicast destinations (the group bit of the first octet)."""
    return bool(mac[0] & 1)


@dataclass(frozen=True)
class Arp:
    op: int
    sender_mac: bytes
    sender_ip: IPv4Address
    target_mac: bytes
    target_ip: IPv4Address


def parse_arp(frame: bytes) -> Arp | None:
    """An Ethernet/IPv4 ARP packet, or None for anything else (other hardware or protocol types, short)."""
    if ethertype(frame) != ETH_ARP or len(frame) < 42:
        return None
    htype, ptype, hlen, plen, op = struct.unpack_from("!HHBBH", frame, 14)
    if (htype, ptype, hlen, plen) != (1, ETH_IP, 6, 4):
        return None
    return Arp(op, frame[22:28], IPv4Address(frame[28:32]), frame[32:38], IPv4Address(frame[38:42]))


def arp_reply(request: Arp, mac: bytes) -> bytes:
    """The answer to `request` saying `request.target_ip` is at `mac`, addressed to the asker."""
    return (request.sender_mac + mac + ETH_ARP.to_bytes(2, "big")
            + struct.pack("!HHBBH", 1, ETH_IP, 6, 4, ARP_REPLY)
            + mac + request.target_ip.packed + request.sender_mac + request.sender_ip.packed)


def arp_request(sender_mac: bytes, sender_ip: IPv4Address, target_ip: IPv4Address) -> bytes:
    return (BROADCAST + sender_mac + ETH_ARP.to_bytes(2, "big")
            + struct.pack("!HHBBH", 1, ETH_IP, 6, 4, ARP_REQUEST)
            + sender_mac + sender_ip.packed + b"\x00" * 6 + target_ip.packed)


def ipv4_addresses(frame: bytes) -> tuple[IPv4Address, IPv4Address] | None:
    """(source, destination) of an IPv4 frame, or None when it is not one."""
    if ethertype(frame) != ETH_IP or len(frame) < 34 or frame[14] >> 4 != 4:
        return None
    return IPv4Address(frame[26:30]), IPv4Address(frame[30:34])


def rewrite_macs(frame: bytes, dst: bytes, src: bytes) -> bytes:
    return dst + src + frame[12:]


def encapsulate(namespace: bytes, frame: bytes, offload: bytes = NO_OFFLOAD) -> bytes:
    """A tunnel datagram: version 1 for an ordinary frame (what every router reads), version 2 only when the
    frame carries offload work (a super-frame or a checksum left undone)."""
    if offload == NO_OFFLOAD:
        return _HEAD.pack(MAGIC, VERSION, len(namespace)) + namespace + frame
    return _HEAD.pack(MAGIC, VERSION_OFFLOADED, len(namespace)) + namespace + offload + frame


def decapsulate(datagram: bytes) -> tuple[bytes, bytes, bytes] | None:
    """(namespace, frame, offload header) from a tunnel datagram, or None when it is not one of ours."""
    if len(datagram) < _HEAD.size:
        return None
    magic, version, n = _HEAD.unpack_from(datagram)
    extra = OFFLOAD.size if version == VERSION_OFFLOADED else 0
    if magic != MAGIC or version not in (VERSION, VERSION_OFFLOADED) or len(datagram) < _HEAD.size + n + extra + 14:
        return None
    at = _HEAD.size + n
    return datagram[_HEAD.size:at], datagram[at + extra:], datagram[at:at + extra] if extra else NO_OFFLOAD


def _checksum(data: bytes, start: int = 0) -> int:
    """The Internet checksum (RFC 1071) of `data`, folded into `start`'s running sum."""
    if len(data) % 2:
        data += b"\x00"
    total = start + sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


def plain_frames(frame: bytes, offload: bytes) -> list[bytes]:
    """What a tap without offloads must be given for `frame`: the frame with its checksum completed, or a
    TCP/IPv4 super-frame cut into `gso_size` segments (what the kernel's GSO would do). Empty when the
    offload is one this router cannot finish (the frame is dropped, as a NIC without the feature would)."""
    if offload == NO_OFFLOAD:
        return [frame]
    flags, gso_type, _, gso_size, csum_start, csum_offset = OFFLOAD.unpack(offload)
    if gso_type & ~GSO_ECN == GSO_NONE:
        if not flags & NEEDS_CSUM:
            return [frame]
        at = csum_start + csum_offset
        if at + 2 > len(frame):
            return []
        # the field holds the pseudo-header's sum already (CHECKSUM_PARTIAL): sum the rest over it
        total = _checksum(frame[csum_start:])
        return [frame[:at] + struct.pack("!H", ~total & 0xFFFF) + frame[at + 2:]]
    if gso_type & ~GSO_ECN != GSO_TCPV4 or ethertype(frame) != ETH_IP or gso_size == 0:
        return []
    ihl = (frame[14] & 0x0F) * 4
    tcp_at = 14 + ihl
    doff = (frame[tcp_at + 12] >> 4) * 4
    body_at = tcp_at + doff
    head, ip, tcp, body = frame[:14], frame[14:tcp_at], frame[tcp_at:body_at], frame[body_at:]
    ident = struct.unpack_from("!H", ip, 4)[0]
    seq = struct.unpack_from("!I", tcp, 4)[0]
    out = []
    for k, off in enumerate(range(0, len(body), gso_size)):
        chunk = body[off:off + gso_size]
        last = off + gso_size >= len(body)
        seg_ip = bytearray(ip)
        struct.pack_into("!HH", seg_ip, 2, ihl + doff + len(chunk), (ident + k) & 0xFFFF)
        struct.pack_into("!H", seg_ip, 10, 0)
        struct.pack_into("!H", seg_ip, 10, ~_checksum(bytes(seg_ip)) & 0xFFFF)
        seg_tcp = bytearray(tcp)
        struct.pack_into("!I", seg_tcp, 4, (seq + off) & 0xFFFFFFFF)
        if not last:
            seg_tcp[13] &= ~0x09 & 0xFF  # FIN and PSH only on the last segment
        if k:
            seg_tcp[13] &= ~0x80 & 0xFF  # CWR only on the first
        struct.pack_into("!H", seg_tcp, 16, 0)
        pseudo = ip[12:20] + struct.pack("!BBH", 0, 6, doff + len(chunk))
        struct.pack_into("!H", seg_tcp, 16, ~_checksum(bytes(seg_tcp) + chunk, _checksum(pseudo)) & 0xFFFF)
        out.append(head + bytes(seg_ip) + bytes(seg_tcp) + chunk)
    return out
