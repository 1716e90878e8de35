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

# Tunnel header: magic, version, namespace length, namespace (UTF-8), then the Ethernet frame.
MAGIC = b"SXOV"
VERSION = 1
_HEAD = struct.Struct("!4sBB")


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


def encapsulate(namespace: bytes, frame: bytes) -> bytes:
    return _HEAD.pack(MAGIC, VERSION, len(namespace)) + namespace + frame


def decapsulate(datagram: bytes) -> tuple[bytes, bytes] | None:
    """(namespace, frame) from a tunnel datagram, or None when it is not one of ours."""
    if len(datagram) < _HEAD.size:
        return None
    magic, version, n = _HEAD.unpack_from(datagram)
    if magic != MAGIC or version != VERSION or len(datagram) < _HEAD.size + n + 14:
        return None
    return datagram[_HEAD.size:_HEAD.size + n], datagram[_HEAD.size + n:]
