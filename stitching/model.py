"""The multi-aggregate topology stitching works on: aggregates, their ports toward other aggregates, and what
each port can carry (VLAN ranges, translation, Q-in-Q, capacity). Plain frozen data; readers in
stitching.topology build it from substrate files, advertisements or the operator's topology file."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

MIN_TAG, MAX_TAG = 1, 4094
ALL_TAGS = frozenset(range(MIN_TAG, MAX_TAG + 1))


class StitchingError(Exception):
    """A stitching request that cannot be met, with the reason the user needs to change it.

    `kind` says which GENI code it maps to at an edge: "vlan" (VLAN_UNAVAILABLE 24), "bandwidth"
    (INSUFFICIENT_BANDWIDTH 25), "path" (no route: SEARCHFAILED 12) or "args" (BADARGS 1)."""

    def __init__(self, message: str, kind: str = "vlan", link: str = ""):
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.link = link


def parse_vlans(text: str | None) -> frozenset[int]:
    """`100-110,120` -> the tags; `any` or empty means every tag (as the stitching extension reads it).
    Raises ValueError naming the bad part."""
    if text is None or text.strip().lower() in ("", "any"):
        return ALL_TAGS
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ValueError(f"VLAN range {text!r}: {part!r} is not a tag or a-b range") from None
        if not MIN_TAG <= a <= b <= MAX_TAG:
            raise ValueError(f"VLAN range {text!r}: {part!r} is outside {MIN_TAG}-{MAX_TAG} or reversed")
        out.update(range(a, b + 1))
    return frozenset(out)


def format_vlans(tags: Iterable[int]) -> str:
    """The tags as `100-110,120` (the stitching extension's range syntax); empty set -> ''."""
    ordered = sorted(set(tags))
    out: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def authority_of(urn: str) -> str:
    """The authority of a GENI URN, lower-cased: how aggregates are matched (`+cm` and `+am` name one AM)."""
    parts = urn.split("+")
    return parts[1].lower() if len(parts) > 2 else urn.lower()


@dataclass(frozen=True)
class Port:
    """One end of a cable between two aggregates: a stitching hop. `vlans` are the 802.1Q tags it carries
    (the aggregate's own VLANs through that port); a `qinq` port can also push/pop an 802.1ad S-tag from
    `s_vlans` toward the far end, carrying one of `vlans` inside as the C-tag; `translation` means the
    aggregate may change the tag at this port."""

    urn: str
    aggregate: str
    remote: str
    vlans: frozenset[int]
    translation: bool = False
    qinq: bool = False
    s_vlans: frozenset[int] = frozenset()
    capacity_kbps: int = 10_000_000
    mtu: int = 1500
    metric: int = 10


@dataclass(frozen=True)
class Aggregate:
    urn: str
    url: str = ""


@dataclass(frozen=True)
class Topology:
    """Aggregates (keyed by authority, see `authority_of`) and their ports (keyed by URN). A cable is a pair
    of ports naming each other as `remote`; a port whose far end is unknown leads nowhere."""

    aggregates: Mapping[str, Aggregate]
    ports: Mapping[str, Port]
    _adjacency: dict[str, tuple[tuple[Port, Port], ...]] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        adj: dict[str, list[tuple[Port, Port]]] = {}
        for p in sorted(self.ports.values(), key=lambda p: (p.metric, p.urn)):
            far = self.ports.get(p.remote)
            if far is None or far.remote != p.urn or authority_of(far.aggregate) == authority_of(p.aggregate):
                continue
            adj.setdefault(authority_of(p.aggregate), []).append((p, far))
        self._adjacency.update({k: tuple(v) for k, v in adj.items()})

    def aggregate(self, urn: str) -> Aggregate | None:
        return self.aggregates.get(authority_of(urn))

    def cables_from(self, aggregate_urn: str) -> tuple[tuple[Port, Port], ...]:
        """(own port, far port) for every cable leaving the aggregate, cheapest first."""
        return self._adjacency.get(authority_of(aggregate_urn), ())

    @staticmethod
    def build(aggregates: Iterable[Aggregate], ports: Iterable[Port]) -> Topology:
        return Topology({authority_of(a.urn): a for a in aggregates}, {p.urn: p for p in ports})

    def merged(self, other: Topology) -> Topology:
        """This topology with `other`'s aggregates and ports added (later sources win on a clash)."""
        return Topology({**self.aggregates, **other.aggregates}, {**self.ports, **other.ports})
