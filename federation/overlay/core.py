"""The overlay's pure core: namespace configuration and address pool, the claim value, the lease state
machine, and the virtual router's decisions (where a frame goes, whether to answer an ARP request).

Nothing here touches the store, the network or the clock: times are arguments (seconds on one monotonic
clock), randomness is a `random.Random` the caller passes in."""

from __future__ import annotations

import enum
import json
import random
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from ipaddress import IPv4Address, IPv4Network

from slicex.errors import BadArgs

# A namespace name is a key component in the store: no whitespace, no glob characters; slice URNs fit.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:+-]{0,199}$")
_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:+@-]{0,199}$")
_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
MIN_LEASE = 0.05
MAX_LEASE = 7 * 24 * 3600.0


def _address(text: object, what: str) -> IPv4Address:
    try:
        return IPv4Address(str(text))
    except ValueError:
        raise BadArgs(f"{what} {text!r} is not an IPv4 address") from None


@dataclass(frozen=True)
class NamespaceConfig:
    """One overlay namespace (IPOP's per-namespace DHCP config): its address range, lease time and the
    addresses no node may claim. The network and broadcast addresses are always reserved, and so is the
    lowest host address (IPOP keeps it for the virtual DNS server)."""

    name: str
    network: IPv4Network
    lease: float
    reserved: frozenset[IPv4Address] = frozenset()

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise BadArgs(f"namespace name {self.name!r}: use letters, digits and . _ : + - (at most 200)")
        if not MIN_LEASE <= self.lease <= MAX_LEASE:
            raise BadArgs(f"namespace {self.name}: lease {self.lease} s is outside {MIN_LEASE}..{MAX_LEASE:.0f} s")
        if self.network.prefixlen > 30:
            raise BadArgs(f"namespace {self.name}: {self.network} is too small (at most /30)")
        stray = sorted(a for a in self.reserved if a not in self.network)
        if stray:
            raise BadArgs(f"namespace {self.name}: reserved {stray[0]} is outside {self.network}")

    @classmethod
    def build(cls, name: str, network: str, lease: float, reserved: Iterable[str] = ()) -> NamespaceConfig:
        try:
            net = IPv4Network(network, strict=True)
        except ValueError as exc:
            raise BadArgs(f"namespace {name}: network {network!r} is not an IPv4 network: {exc}") from None
        return cls(name, net, float(lease), frozenset(_address(r, "reserved address") for r in reserved))

    @property
    def always_reserved(self) -> frozenset[IPv4Address]:
        net = self.network
        return frozenset({net.network_address, net.broadcast_address, net.network_address + 1}) | self.reserved

    def claimable(self, address: IPv4Address) -> bool:
        return address in self.network and address not in self.always_reserved

    def candidates(self) -> list[IPv4Address]:
        """Every address a node may claim, in order."""
        return [a for a in self.network.hosts() if a not in self.always_reserved]

    @property
    def renew_after(self) -> float:
        """IPOP's `_current_quarter_lifetime`: a holder renews once a quarter of the lease has passed."""
        return self.lease / 4

    def to_json(self) -> str:
        return json.dumps({"network": str(self.network), "lease": self.lease,
                           "reserved": sorted(str(a) for a in self.reserved)}, sort_keys=True)

    @classmethod
    def from_json(cls, name: str, text: str) -> NamespaceConfig:
        try:
            doc = json.loads(text)
            return cls.build(name, doc["network"], doc["lease"], doc.get("reserved", []))
        except (ValueError, KeyError, TypeError) as exc:
            raise BadArgs(f"namespace {name}: stored configuration is unreadable: {exc}") from None


@dataclass(frozen=True)
class Holder:
    """The claim's value: who holds an address and where frames for it go. `endpoint` is the UDP host:port
    of the virtual router serving the node's segment, `cluster` names that segment, `mac` is the node's
    interface. A renewal must carry exactly the same value; any other value is a different claimant."""

    node: str
    endpoint: str
    cluster: str
    mac: str

    def __post_init__(self) -> None:
        if not _NODE.match(self.node):
            raise BadArgs(f"node id {self.node!r}: use letters, digits and . _ : + @ - (at most 200)")
        if not _NODE.match(self.cluster):
            raise BadArgs(f"cluster {self.cluster!r}: use letters, digits and . _ : + @ - (at most 200)")
        if not _MAC.match(self.mac):
            raise BadArgs(f"node {self.node}: MAC {self.mac!r} is not lower-case aa:bb:cc:dd:ee:ff")
        host, _, port = self.endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise BadArgs(f"node {self.node}: endpoint {self.endpoint!r} is not host:port")

    def encode(self) -> str:
        return json.dumps({"node": self.node, "endpoint": self.endpoint, "cluster": self.cluster,
                           "mac": self.mac}, sort_keys=True, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> Holder:
        try:
            d = json.loads(text)
            return cls(d["node"], d["endpoint"], d["cluster"], d["mac"])
        except (ValueError, KeyError, TypeError) as exc:
            raise BadArgs(f"claim value {text[:80]!r} is not an overlay holder: {exc}") from None

    @property
    def udp(self) -> tuple[str, int]:
        host, _, port = self.endpoint.rpartition(":")
        return host, int(port)


class Outcome(enum.Enum):
    """What the store answered to a put-if-absent."""

    WON = "won"            # the address was free (never claimed, released, or expired): now ours
    RENEWED = "renewed"    # it already held exactly our value: the lease was extended
    TAKEN = "taken"        # another value holds it


class Phase(enum.Enum):
    UNBOUND = "unbound"    # holding nothing, looking for an address
    BOUND = "bound"        # holding `address` until `expires_at`
    LOST = "lost"          # held it, then the lease ran out or another node holds it now: stop using it
    RELEASED = "released"  # left the namespace


@dataclass(frozen=True)
class Lease:
    """What one node believes about its claim. `expires_at` counts from when the claim request was *sent*,
    so the node stops using an address no later than the store frees it."""

    phase: Phase = Phase.UNBOUND
    address: IPv4Address | None = None
    expires_at: float = 0.0
    renew_at: float = 0.0
    tried: tuple[IPv4Address, ...] = ()
    reason: str = ""

    def usable(self, now: float) -> bool:
        return self.phase is Phase.BOUND and now < self.expires_at


def on_claim(lease: Lease, config: NamespaceConfig, address: IPv4Address, outcome: Outcome,
             sent_at: float) -> Lease:
    """Apply the store's answer to a claim (first claim or renewal) sent at `sent_at`."""
    if lease.phase is Phase.RELEASED:
        return lease
    if outcome in (Outcome.WON, Outcome.RENEWED):
        return Lease(Phase.BOUND, address, sent_at + config.lease, sent_at + config.renew_after, (), "")
    if lease.phase is Phase.BOUND and lease.address == address:
        return replace(lease, phase=Phase.LOST,
                       reason=f"{address} in {config.name} is held by another node now (our lease ran out)")
    return replace(lease, tried=lease.tried + (address,))


def on_store_error(lease: Lease, now: float, error: str) -> Lease:
    """The store did not answer. A bound node keeps its address until its own lease runs out, then loses it."""
    if lease.phase is Phase.BOUND and now >= lease.expires_at:
        return replace(lease, phase=Phase.LOST,
                       reason=f"lease on {lease.address} ran out while the store was unreachable: {error}")
    return lease


def on_release(lease: Lease) -> Lease:
    return replace(lease, phase=Phase.RELEASED, reason="left the namespace")


def on_tick(lease: Lease, now: float) -> Lease:
    """A bound lease whose time passed without a renewal is lost."""
    if lease.phase is Phase.BOUND and now >= lease.expires_at:
        return replace(lease, phase=Phase.LOST, reason=f"lease on {lease.address} ran out before a renewal")
    return lease


def renew_due(lease: Lease, now: float) -> bool:
    return lease.phase is Phase.BOUND and now >= lease.renew_at


def candidate_order(config: NamespaceConfig, rng: random.Random, preferred: IPv4Address | None = None,
                    skip: Iterable[IPv4Address] = ()) -> Iterator[IPv4Address]:
    """The addresses to try, in order: the preferred one (if claimable), then the rest in random order (IPOP
    picks random addresses in the range so that concurrent joiners rarely race for the same one)."""
    skipped = set(skip)
    pool = [a for a in config.candidates() if a not in skipped and a != preferred]
    rng.shuffle(pool)
    if preferred is not None:
        if not config.claimable(preferred):
            raise BadArgs(f"{preferred} cannot be claimed in {config.name}: outside {config.network} or reserved")
        if preferred not in skipped:
            yield preferred
    yield from pool


# ---- the virtual router's decisions ---------------------------------------------------------------------------
class Where(enum.Enum):
    LOCAL = "local"    # on this router's segment: switch it there
    REMOTE = "remote"  # another cluster's router holds it: tunnel it there
    DROP = "drop"


@dataclass(frozen=True)
class Route:
    where: Where
    holder: Holder | None = None
    reason: str = ""


def route(config: NamespaceConfig, dst: IPv4Address, holder: Holder | None, self_endpoint: str) -> Route:
    """Where a frame for `dst` goes, given the store's claim for it (IPOP: a null lookup drops the packet)."""
    if dst not in config.network:
        return Route(Where.DROP, None, f"{dst} is outside {config.network}")
    if holder is None:
        return Route(Where.DROP, None, f"{dst} is not claimed in {config.name}")
    if holder.endpoint == self_endpoint:
        return Route(Where.LOCAL, holder)
    return Route(Where.REMOTE, holder)


def answer_arp(config: NamespaceConfig, sender: IPv4Address, target: IPv4Address, holder: Holder | None,
               self_endpoint: str, on_segment: Iterable[IPv4Address]) -> bool:
    """Proxy ARP: answer with the router's MAC only for a *remote* claimed address. Never for an address
    outside the namespace or unclaimed, never for a host on this segment (it answers for itself), and never
    for probes (sender 0.0.0.0, RFC 5227) or gratuitous ARP (target = sender)."""
    if sender == IPv4Address(0) or target == sender:
        return False
    if target not in config.network or target in config.always_reserved:
        return False
    if target in set(on_segment):
        return False
    return holder is not None and holder.endpoint != self_endpoint


@dataclass
class LookupCache:
    """The router's cache of claim lookups (IPOP looks up the store per packet; a router caches). A positive
    answer is kept for at most a quarter lease (a claim cannot change hands sooner without its holder's
    lease running out), a negative one briefly, so a new claim becomes reachable quickly."""

    positive: float
    negative: float
    entries: dict[IPv4Address, tuple[Holder | None, float]] = field(default_factory=dict)

    def get(self, address: IPv4Address, now: float) -> tuple[bool, Holder | None]:
        hit = self.entries.get(address)
        if hit is None:
            return False, None
        holder, at = hit
        if now - at >= (self.positive if holder is not None else self.negative):
            del self.entries[address]
            return False, None
        return True, holder

    def put(self, address: IPv4Address, holder: Holder | None, now: float) -> None:
        self.entries[address] = (holder, now)

    def forget(self, address: IPv4Address) -> None:
        self.entries.pop(address, None)
