"""Federation peers: other testbeds whose users may use this deployment's aggregates, each by name, with the
root that vouches for its namespace(s) and a policy saying how much of us it may use.

Configuration (slicex.yaml, read by `load_peers`; `slicex peer add|list` write and show it):

    peers:
      testbed-a:                          # the peer's name: letters, digits, '.', '_', '-'
        root: peers/testbed-a.pem         # its root CA (PEM; relative paths are under $SLICEX_HOME); required
        namespaces: [a.example]           # URN authorities its root may vouch for (or `namespace: a.example`);
                                          #   default: the authority in the root's own URN (…+a.example+authority+ca)
        trust_roots_url: https://a.example/roots.pem   # optional: its root bundle (PEM) over HTTP(S), refreshed
        ch_url: https://a.example:8007/CH # optional: its CH API; `get_trust_roots` refreshes the roots
        refresh_seconds: 3600             # how often to fetch them (default 3600)
        am_urls: {urn:publicid:IDN+a.example+authority+am: https://a.example:8001/}   # optional: its aggregates
        policy:                           # what its users may do here (every key optional)
          aggregates: ["*"]               # our aggregate URNs it may use ("*": all; default all)
          sliver_types: ["*"]             # node sliver types it may ask for ("*": all; default all)
          max_lease_hours: 24             # latest sliver expiry it may ask for, from now (default: no extra limit)
          max_slivers: 10                 # live slivers (nodes + links) of its users at once (default: no limit)
          max_nodes: 4                    # live nodes of its users at once
          max_cores: 16                   # cores those nodes hold at once

Who is "a peer's user": a caller whose user URN (the spoken-for user's with speaks-for) lies in the peer's
namespace, or a call on a slice in the peer's namespace. Everyone else is local and no peer policy applies.
Whether the caller's certificate and credentials are genuine is the credential verifier's business
(slicex/credentials.py with the namespace-bound trust store of slicex/pki.py); this module only decides what
a verified peer caller may do. `decide` is pure: the request, the time and the peer's current usage in, an
`allow`/`deny` with the rule and the reason out. `PeerGate` applies it at the AM edge (am/api.py)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from slicex import pki
from slicex.errors import BadArgs, Forbidden, OutOfRange, Refused
from slicex.urn import parse_urn

PEER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
NAMESPACE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(:[A-Za-z0-9][A-Za-z0-9._-]*)*$")
DEFAULT_REFRESH_SECONDS = 3600
PEER_KEYS = {"root", "namespace", "namespaces", "trust_roots_url", "ch_url", "refresh_seconds", "am_urls", "policy"}
POLICY_KEYS = {"aggregates", "sliver_types", "max_lease_hours", "max_slivers", "max_nodes", "max_cores"}
ANY = "*"


class PeerConfigError(BadArgs):
    """A mistake in the `peers:` section of slicex.yaml; the message names the peer and the key."""


@dataclass(frozen=True)
class PeerPolicy:
    """What a peer's users may do here. Empty limits (None) mean "only the aggregate's own limits"."""

    aggregates: tuple[str, ...] = (ANY,)
    sliver_types: tuple[str, ...] = (ANY,)
    max_lease: timedelta | None = None
    max_slivers: int | None = None
    max_nodes: int | None = None
    max_cores: int | None = None

    @property
    def limits_usage(self) -> bool:
        """Whether what the peer's users hold is limited (so admitting an Allocate must count it)."""
        return any(limit is not None for limit in (self.max_slivers, self.max_nodes, self.max_cores))

    def to_config(self) -> dict[str, Any]:
        out: dict[str, Any] = {"aggregates": list(self.aggregates), "sliver_types": list(self.sliver_types)}
        if self.max_lease is not None:
            out["max_lease_hours"] = self.max_lease.total_seconds() / 3600
        for name in ("max_slivers", "max_nodes", "max_cores"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


@dataclass(frozen=True)
class Peer:
    name: str
    root: Path
    namespaces: tuple[str, ...]
    policy: PeerPolicy = field(default_factory=PeerPolicy)
    trust_roots_url: str | None = None
    ch_url: str | None = None
    refresh: timedelta = timedelta(seconds=DEFAULT_REFRESH_SECONDS)
    am_urls: Mapping[str, str] = field(default_factory=dict)

    def covers(self, urn: str | None) -> bool:
        """Whether `urn` (any GENI URN) lies in one of this peer's namespaces."""
        if not urn:
            return False
        try:
            authority = parse_urn(urn).authority
        except BadArgs:
            return False
        return any(pki.namespace_covers(ns, authority) for ns in self.namespaces)

    @property
    def fetches(self) -> bool:
        return bool(self.trust_roots_url or self.ch_url)


# ---- parsing ---------------------------------------------------------------------------------------------------
def _where(name: str, key: str = "") -> str:
    return f"slicex.yaml peers.{name}{'.' + key if key else ''}"


def _limit(name: str, policy: Mapping[str, Any], key: str) -> int | None:
    value = policy.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PeerConfigError(f"{_where(name, 'policy.' + key)}: a whole number ≥ 0 (or leave it out for no "
                              f"limit), got {value!r}")
    return value


def _names(name: str, value: Any, key: str, check: Callable[[str], None] | None = None) -> tuple[str, ...]:
    if value is None:
        return (ANY,)
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise PeerConfigError(f"{_where(name, key)}: a non-empty list of strings (\"*\" for any), got {value!r}")
    for v in value:
        if v != ANY and check is not None:
            check(v)
    return tuple(value)


def _aggregate_urn(name: str, key: str = "policy.aggregates") -> Callable[[str], None]:
    def check(text: str) -> None:
        try:
            urn = parse_urn(text)
        except BadArgs as exc:
            raise PeerConfigError(f"{_where(name, key)}: {exc.message}") from None
        if urn.type != "authority":
            raise PeerConfigError(f"{_where(name, key)}: {text} is a {urn.type} URN; name "
                                  f"aggregates by their authority URN (…+authority+am)")
    return check


def parse_policy(name: str, raw: Any) -> PeerPolicy:
    if raw is None:
        return PeerPolicy()
    if not isinstance(raw, dict):
        raise PeerConfigError(f"{_where(name, 'policy')}: a mapping of {', '.join(sorted(POLICY_KEYS))}, "
                              f"got {raw!r}")
    unknown = set(raw) - POLICY_KEYS
    if unknown:
        raise PeerConfigError(f"{_where(name, 'policy')}: unknown key(s) {', '.join(sorted(map(str, unknown)))}; "
                              f"known: {', '.join(sorted(POLICY_KEYS))}")
    hours = raw.get("max_lease_hours")
    if hours is not None and (isinstance(hours, bool) or not isinstance(hours, (int, float)) or hours <= 0):
        raise PeerConfigError(f"{_where(name, 'policy.max_lease_hours')}: a positive number of hours, got {hours!r}")
    return PeerPolicy(aggregates=_names(name, raw.get("aggregates"), "policy.aggregates", _aggregate_urn(name)),
                      sliver_types=_names(name, raw.get("sliver_types"), "policy.sliver_types"),
                      max_lease=timedelta(hours=hours) if hours is not None else None,
                      max_slivers=_limit(name, raw, "max_slivers"), max_nodes=_limit(name, raw, "max_nodes"),
                      max_cores=_limit(name, raw, "max_cores"))


def _url(name: str, key: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not re.match(r"^https?://[^/\s]+", value):
        raise PeerConfigError(f"{_where(name, key)}: an http:// or https:// URL, got {value!r}")
    return value


def root_namespace(root: Path, name: str) -> str:
    """The authority in the root certificate's own URN (the default namespace of a peer)."""
    certs = pki.load_certs(root.read_bytes())
    if not certs:
        raise PeerConfigError(f"{_where(name, 'root')}: {root} holds no PEM certificate")
    own = pki.urn_authority(certs[0])
    if not own:
        raise PeerConfigError(f"{_where(name, 'namespaces')}: the root {root} names no GENI authority in its URN, "
                              f"so say which namespace(s) it vouches for")
    return own


def parse_peer(name: Any, raw: Any, home_root: Path, own_authority: str) -> Peer:
    """One peer from its slicex.yaml entry; PeerConfigError naming the peer and key on any mistake."""
    if not isinstance(name, str) or not PEER_NAME.match(name):
        raise PeerConfigError(f"slicex.yaml peers: {name!r} is not a peer name (letters, digits, '.', '_', '-'; "
                              f"at most 63)")
    if not isinstance(raw, dict):
        raise PeerConfigError(f"{_where(name)}: a mapping with at least `root`, got {raw!r}")
    unknown = set(raw) - PEER_KEYS
    if unknown:
        raise PeerConfigError(f"{_where(name)}: unknown key(s) {', '.join(sorted(map(str, unknown)))}; known: "
                              f"{', '.join(sorted(PEER_KEYS))}")
    if not isinstance(raw.get("root"), str) or not raw["root"]:
        raise PeerConfigError(f"{_where(name, 'root')}: the path of the peer's root certificate (PEM) is required")
    root = Path(raw["root"]).expanduser()
    root = root if root.is_absolute() else home_root / root
    if not root.is_file():
        raise PeerConfigError(f"{_where(name, 'root')}: {root} does not exist (copy the peer's root there, e.g. "
                              f"from its `slicex ca export-root`)")
    if not pki.load_certs(root.read_bytes()):
        raise PeerConfigError(f"{_where(name, 'root')}: {root} holds no PEM certificate")
    if "namespace" in raw and "namespaces" in raw:
        raise PeerConfigError(f"{_where(name)}: give `namespace` or `namespaces`, not both")
    given = raw.get("namespaces", raw.get("namespace"))
    spaces = (given,) if isinstance(given, str) else tuple(given) if isinstance(given, list) else None
    if given is None:
        spaces = (root_namespace(root, name),)
    if not spaces or not all(isinstance(ns, str) and NAMESPACE.match(ns) for ns in spaces):
        raise PeerConfigError(f"{_where(name, 'namespaces')}: URN authorities such as a.example or a.example:site, "
                              f"got {given!r}")
    spaces = tuple(ns.lower() for ns in spaces)
    for ns in spaces:
        if pki.namespace_covers(ns, own_authority) or pki.namespace_covers(own_authority, ns):
            raise PeerConfigError(f"{_where(name, 'namespaces')}: {ns} overlaps this deployment's own namespace "
                                  f"{own_authority}; a peer may only vouch for its own names")
    refresh = raw.get("refresh_seconds", DEFAULT_REFRESH_SECONDS)
    if isinstance(refresh, bool) or not isinstance(refresh, (int, float)) or refresh <= 0:
        raise PeerConfigError(f"{_where(name, 'refresh_seconds')}: a positive number of seconds, got {refresh!r}")
    am_urls = raw.get("am_urls") or {}
    if not isinstance(am_urls, dict):
        raise PeerConfigError(f"{_where(name, 'am_urls')}: a mapping of aggregate URN to AM API URL, got {am_urls!r}")
    for urn, url in am_urls.items():
        if not isinstance(urn, str):
            raise PeerConfigError(f"{_where(name, 'am_urls')}: keys are aggregate URNs, got {urn!r}")
        _aggregate_urn(name, 'am_urls')(urn)
        _url(name, f"am_urls[{urn}]", url)
    return Peer(name, root, spaces, parse_policy(name, raw.get("policy")),
                _url(name, "trust_roots_url", raw.get("trust_roots_url")), _url(name, "ch_url", raw.get("ch_url")),
                timedelta(seconds=refresh), dict(am_urls))


def load_peers(raw: Any, authority: str, home_root: Path) -> list[Peer]:
    """Every peer of a deployment's `peers:` section (None or empty: none), namespaces checked not to
    overlap ours (`authority`) or each other's."""
    raw = raw or {}
    if not isinstance(raw, dict):
        raise PeerConfigError(f"slicex.yaml peers: a mapping of peer name to settings, got {raw!r}")
    peers = [parse_peer(name, entry, home_root, authority) for name, entry in raw.items()]
    for i, a in enumerate(peers):
        for b in peers[i + 1:]:
            for x in a.namespaces:
                for y in b.namespaces:
                    if pki.namespace_covers(x, y) or pki.namespace_covers(y, x):
                        raise PeerConfigError(f"slicex.yaml peers: {a.name} ({x}) and {b.name} ({y}) claim "
                                              f"overlapping namespaces; each name must have one voucher")
    return peers


def peer_config(peer: Peer, home_root: Path) -> dict[str, Any]:
    """A peer as slicex.yaml holds it (the inverse of `parse_peer`; root relative to the home when inside it)."""
    try:
        root = str(peer.root.relative_to(home_root))
    except ValueError:
        root = str(peer.root)
    out: dict[str, Any] = {"root": root, "namespaces": list(peer.namespaces)}
    if peer.trust_roots_url:
        out["trust_roots_url"] = peer.trust_roots_url
    if peer.ch_url:
        out["ch_url"] = peer.ch_url
    if peer.fetches or peer.refresh != timedelta(seconds=DEFAULT_REFRESH_SECONDS):
        out["refresh_seconds"] = int(peer.refresh.total_seconds())
    if peer.am_urls:
        out["am_urls"] = dict(peer.am_urls)
    out["policy"] = peer.policy.to_config()
    return out


def peer_of(peers: Iterable[Peer], caller_urn: str | None, slice_urn: str | None = None) -> Peer | None:
    """The peer a call belongs to: the caller's, else the slice's; None for local callers on local slices."""
    peers = list(peers)
    for urn in (caller_urn, slice_urn):
        for p in peers:
            if p.covers(urn):
                return p
    return None


# ---- deciding --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Wanted:
    """One node asked for: its client id, sliver type (as the aggregate will name it) and cores."""

    client_id: str
    sliver_type: str
    cores: int


@dataclass(frozen=True)
class Usage:
    """What a peer's users hold here now (live slivers, nodes among them, cores those nodes hold)."""

    slivers: int = 0
    nodes: int = 0
    cores: int = 0


@dataclass(frozen=True)
class Decision:
    allowed: bool
    rule: str = ""  # "aggregates" | "sliver_types" | "max_lease_hours" | "max_slivers" | "max_nodes" | "max_cores"
    reason: str = ""

    @staticmethod
    def allow() -> Decision:
        return Decision(True)


def _deny(peer: Peer, rule: str, why: str) -> Decision:
    return Decision(False, rule, f"peer {peer.name}: {why} (policy.{rule} in this aggregate's slicex.yaml)")


def _hours(d: timedelta) -> str:
    h = d.total_seconds() / 3600
    return f"{h:g} hour{'s' if h != 1 else ''}"


def decide(peer: Peer, operation: str, aggregate_urn: str, now: datetime, end: datetime | None = None,
           nodes: Iterable[Wanted] = (), links: int = 0, usage: Usage = Usage()) -> Decision:
    """May `peer`'s user do `operation` ("Allocate", "Provision", "Renew") at `aggregate_urn`, for slivers
    ending at `end`, adding `nodes` and `links` (Allocate only) to what the peer holds (`usage`)?"""
    policy = peer.policy
    nodes = list(nodes)
    if ANY not in policy.aggregates and aggregate_urn.lower() not in {a.lower() for a in policy.aggregates}:
        return _deny(peer, "aggregates", f"may not use aggregate {aggregate_urn}; allowed: "
                                         f"{', '.join(policy.aggregates)}")
    if ANY not in policy.sliver_types:
        for n in nodes:
            if n.sliver_type not in policy.sliver_types:
                return _deny(peer, "sliver_types", f"node {n.client_id} asks for sliver type {n.sliver_type}; "
                                                   f"allowed: {', '.join(policy.sliver_types)}")
    if policy.max_lease is not None and end is not None and end > now + policy.max_lease:
        latest = now + policy.max_lease
        return _deny(peer, "max_lease_hours", f"{operation} to {end:%Y-%m-%dT%H:%M:%SZ} is past "
                                              f"{latest:%Y-%m-%dT%H:%M:%SZ}, the latest allowed (at most "
                                              f"{_hours(policy.max_lease)} ahead)")
    if operation == "Allocate":
        asked = Usage(len(nodes) + links, len(nodes), sum(n.cores for n in nodes))
        for rule, limit, held, more, what in (
                ("max_slivers", policy.max_slivers, usage.slivers, asked.slivers, "slivers"),
                ("max_nodes", policy.max_nodes, usage.nodes, asked.nodes, "nodes"),
                ("max_cores", policy.max_cores, usage.cores, asked.cores, "cores")):
            if limit is not None and held + more > limit:
                return _deny(peer, rule, f"its users hold {held} {what} here and this request adds {more}; at "
                                         f"most {limit} at once. Delete some first")
    return Decision.allow()


# ---- the AM edge -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Held:
    """One live sliver as the quota counts it."""

    owner_urn: str
    slice_urn: str
    kind: str  # node | link
    cores: int = 0


ERRORS = {"aggregates": Forbidden, "sliver_types": Forbidden, "max_lease_hours": OutOfRange,
          "max_slivers": Refused, "max_nodes": Refused, "max_cores": Refused}
"""Refusal → GENI error: what a peer may never do is FORBIDDEN (3); a lease past the peer's limit is
OUTOFRANGE (19), as a lease past the aggregate's own limit is; a quota is REFUSED (7): the request is valid
and authorised and would be granted once the peer's users hold less."""


class PeerGate:
    """Applies peers' policies to AM API calls: `admit` raises the GENI error of a refusal, naming the peer
    and the rule; local callers pass untouched. `peers` is read on every call, so a reloaded list applies at
    once; `held` lists a peer's live slivers (for quotas: those of its namespaces only, read from an index),
    `wanted` turns a request's nodes into `Wanted`."""

    def __init__(self, peers: Callable[[], list[Peer]], aggregate_urn: str, held: Callable[[Peer], Iterable[Held]],
                 wanted: Callable[[Any], list[Wanted]]):
        self.peers = peers
        self.aggregate_urn = aggregate_urn
        self.held = held
        self.wanted = wanted

    def usage(self, peer: Peer) -> Usage:
        mine = [h for h in self.held(peer) if peer.covers(h.owner_urn) or peer.covers(h.slice_urn)]
        nodes = [h for h in mine if h.kind == "node"]
        return Usage(len(mine), len(nodes), sum(h.cores for h in nodes))

    def counted_as(self, caller_urn: str, slice_urn: str) -> str | None:
        """The name under which the call's peer usage is counted (`peer:<name>`), None when no peer limits what
        its users hold. Admitting an Allocate and making it must not interleave with another under that name,
        or both count the same free quota (operations/ledger.py holds a store claim on it)."""
        peer = peer_of(self.peers(), caller_urn, slice_urn)
        return f"peer:{peer.name}" if peer is not None and peer.policy.limits_usage else None

    def admit(self, operation: str, caller_urn: str, slice_urn: str, now: datetime, end: datetime,
              request: Any = None, asked: bool = True) -> datetime:
        """The end the call may use, or raise the refusal. An end the caller did not ask for (the aggregate's
        default, or geni_extend_alap) is cut to the peer's maximum lease rather than refused."""
        peer = peer_of(self.peers(), caller_urn, slice_urn)
        if peer is None:
            return end
        if not asked and peer.policy.max_lease is not None:
            end = min(end, now + peer.policy.max_lease)
        nodes = self.wanted(request) if request is not None else []
        links = len(getattr(request, "links", ())) if request is not None else 0
        usage = self.usage(peer) if operation == "Allocate" and request is not None else Usage()
        decision = decide(peer, operation, self.aggregate_urn, now, end, nodes, links, usage)
        if not decision.allowed:
            raise ERRORS[decision.rule](decision.reason)
        return end
