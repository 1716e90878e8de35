"""Tap devices for the overlay: the forwarder opens a tap in its own network namespace (so it keeps the
file descriptor) and moves the device into the node's namespace, where the node sees an ordinary Ethernet
interface. Everything else goes through iproute2 via the netns substrate's host edge."""

from __future__ import annotations

import fcntl
import functools
import os
import struct
import uuid

from authority.substrate import hostnet
from authority.substrate.netns_plan import tbf_args
from slicex.errors import ServerError

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
IFF_VNET_HDR = 0x4000
TUNSETOFFLOAD = 0x400454D0
TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6, TUN_F_TSO_ECN = 0x01, 0x02, 0x04, 0x08
# A super-frame must fit one tunnel datagram (65507 bytes of UDP payload) with its headers and the longest
# namespace name (200 bytes): the tap never hands the router a bigger one.
GSO_MAX_SIZE = 65000


def open_tap(name: str, offload: bool = False) -> int:
    """Create tap `name` (no packet-info header) and return its non-blocking file descriptor. The device
    lives as long as the descriptor. `offload`: every read and write carries a virtio_net_hdr, and the node's
    kernel may hand over TCP super-frames (TSO) with checksums left undone, so the router moves up to 64 KiB
    per system call instead of one 1500-byte frame."""
    if len(name.encode()) > 15:
        raise ServerError(f"interface name {name!r} is longer than 15 bytes")
    try:
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    except OSError as exc:
        raise ServerError(f"cannot open /dev/net/tun: {exc.strerror}; tap devices need the tun module and "
                          f"CAP_NET_ADMIN") from None
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(),
                                                IFF_TAP | IFF_NO_PI | (IFF_VNET_HDR if offload else 0)))
        if offload:
            fcntl.ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN)
    except OSError as exc:
        os.close(fd)
        raise ServerError(f"cannot create tap {name}{' with offloads' if offload else ''}: {exc.strerror}") from None
    if offload:
        try:
            hostnet.run(["ip", "link", "set", "dev", name, "gso_max_size", str(GSO_MAX_SIZE)])
        except ServerError:
            os.close(fd)
            raise
    return fd


def place(name: str, netns: str, mac: str, mtu: int = 1500) -> None:
    """Move tap `name` into namespace `netns` with the node's MAC, bring it up, IPv6 off (its neighbour
    discovery would only be noise on the overlay)."""
    hostnet.run(["ip", "link", "set", "dev", name, "netns", netns])
    hostnet.run(["ip", "-n", netns, "link", "set", "dev", name, "address", mac, "mtu", str(mtu)])
    hostnet.exec_in(netns, ["sysctl", "-q", "-w", f"net.ipv6.conf.{name}.disable_ipv6=1"])
    hostnet.run(["ip", "-n", netns, "link", "set", "dev", name, "up"])


def shape(netns: str, name: str, rate_kbps: int) -> None:
    """A token bucket on the tap's egress inside the node's namespace: what the node sends into the overlay,
    at the link's capacity (as the netns driver shapes a veth). The router at the other end shapes its node
    the same way, so both directions of the link are held to it."""
    hostnet.shape(netns, name, tbf_args(rate_kbps))


def set_address(netns: str, name: str, address: str, prefixlen: int) -> None:
    hostnet.run(["ip", "-n", netns, "addr", "replace", f"{address}/{prefixlen}", "dev", name])


def drop_address(netns: str, name: str, address: str, prefixlen: int) -> None:
    hostnet.run(["ip", "-n", netns, "addr", "del", f"{address}/{prefixlen}", "dev", name], check=False)


@functools.cache
def capabilities() -> dict[str, str]:
    """Whether this host can run the overlay's data plane: "ok" or why not, per feature (probed once)."""
    caps = {k: v for k, v in hostnet.capabilities().items() if k in ("root", "ip", "netns", "veth")}
    if caps.get("root") != "ok" or caps.get("netns") != "ok":
        return caps
    ns = f"ovprobe-{uuid.uuid4().hex[:6]}"
    name = f"ovp{uuid.uuid4().hex[:6]}"
    try:
        fd = open_tap(name)
    except ServerError as exc:
        caps["tap"] = exc.message
        return caps
    try:  # the fast data plane: super-frames (virtio_net_hdr, TSO) through the tap
        os.close(open_tap(f"{name}o", offload=True))
        caps["offload"] = "ok"
    except ServerError as exc:
        caps["offload"] = exc.message
    try:
        hostnet.run(["ip", "netns", "add", ns])
        moved = hostnet.run(["ip", "link", "set", "dev", name, "netns", ns], check=False)
        caps["tap"] = "ok" if moved.returncode == 0 else f"a tap cannot move into a namespace: {moved.stderr.strip()}"
        if moved.returncode == 0:  # a link's capacity is a token bucket on the tap: can this host put one there?
            try:
                tbf = hostnet.run(["tc", "-n", ns, "qdisc", "replace", "dev", name, "root", *tbf_args(1000)],
                                  check=False)
                caps["tbf"] = "ok" if tbf.returncode == 0 else (
                    f"no token bucket (sch_tbf) on a tap: {(tbf.stderr or tbf.stdout).strip() or 'tc failed'}")
            except ServerError as exc:  # tc itself is missing
                caps["tbf"] = exc.message
    finally:
        os.close(fd)
        hostnet.run(["ip", "netns", "del", ns], check=False)
    return caps


def shaping() -> str:
    """"ok" when this host can hold an overlay link to its capacity (a token bucket on each tap), else why not."""
    caps = capabilities()
    if caps.get("tap") != "ok":
        return "; ".join(missing())
    return caps.get("tbf", "not probed")


def offload() -> str:
    """"ok" when taps here can pass super-frames (the fast data plane), else why not (the router then moves
    one frame per system call)."""
    return capabilities().get("offload", "; ".join(missing()) or "not probed")


def missing() -> list[str]:
    """What the data plane lacks on this host (empty when it can run)."""
    caps = capabilities()
    return [f"{k}: {caps.get(k, 'not probed')}" for k in ("root", "ip", "netns", "veth", "tap") if caps.get(k) != "ok"]
