"""OpenFlow 1.3 rules for the netns substrate's bridge, as plain data (pure).

The bridge runs in secure fail mode with no NORMAL action: a frame moves only where a rule sends it, so
slices are isolated by construction (a port's frames reach the ports of its own VLAN segment and nothing
else; the table-miss rule drops). Each segment (one link or LAN sliver, keyed by its VLAN label) joins:

- access ports: untagged veth ends of node interfaces. Unicast to a MAC of the segment goes to that port
  only (the driver knows every MAC: it sets them); broadcast, multicast and unknown unicast go to every
  other port of the segment;
- uplinks (the stitching hooks): a trunk port on which the segment is carried under a stack of tags,
  outermost first. One 802.1Q tag different from the local label is VLAN translation; an 802.1ad S-tag
  (TPID 0x88a8) over a C-tag is Q-in-Q push/pop.

Rules carry COOKIE so the controller removes only its own. The same rule set is rendered for os-ken
(`to_doc`) and for `ovs-ofctl` (`to_ofctl`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

COOKIE = 0x51CE5
TPID_8021Q = 0x8100
TPID_8021AD = 0x88A8
VID_PRESENT = 0x1000
MULTICAST = ("01:00:00:00:00:00", "01:00:00:00:00:00")


@dataclass(frozen=True)
class AccessPort:
    ofport: int
    mac: str


@dataclass(frozen=True)
class Uplink:
    """A trunk port carrying the segment under `tags`: ((tpid, vid), ...) outermost first."""

    ofport: int
    tags: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        if not 1 <= len(self.tags) <= 2:
            raise ValueError("an uplink carries one tag (802.1Q, maybe translated) or two (Q-in-Q)")
        for tpid, vid in self.tags:
            if tpid not in (TPID_8021Q, TPID_8021AD) or not 1 <= vid <= 4094:
                raise ValueError(f"bad tag {tpid:#x}/{vid}")


@dataclass(frozen=True)
class Segment:
    label: int  # the local VLAN label of the link or LAN
    ports: tuple[AccessPort, ...] = ()
    uplinks: tuple[Uplink, ...] = ()


@dataclass(frozen=True)
class Flow:
    priority: int
    match: tuple[tuple[str, object], ...]  # ("in_port", 3), ("eth_dst", mac or (value, mask)), ("vlan_vid", 0x1000|v)
    actions: tuple[tuple[str, object], ...]  # ("output", n) ("push_vlan", tpid) ("set_vlan_vid", v) ("pop_vlan", 0)
    table: int = 0
    goto: int | None = None

    def to_doc(self) -> dict:
        return {"table": self.table, "priority": self.priority, "cookie": COOKIE,
                "match": [[k, list(v) if isinstance(v, tuple) else v] for k, v in self.match],
                "actions": [list(a) for a in self.actions], "goto": self.goto}

    @staticmethod
    def from_doc(d: dict) -> Flow:
        return Flow(int(d["priority"]), tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in d["match"]),
                    tuple((a[0], a[1]) for a in d["actions"]), int(d.get("table", 0)), d.get("goto"))

    def to_ofctl(self) -> str:
        """The rule in ovs-ofctl syntax (OpenFlow 1.3)."""
        m = [f"table={self.table}", f"priority={self.priority}", f"cookie={COOKIE:#x}"]
        for k, v in self.match:
            if k == "eth_dst":
                m.append(f"dl_dst={v[0]}/{v[1]}" if isinstance(v, tuple) else f"dl_dst={v}")
            elif k == "vlan_vid":
                m.append(f"dl_vlan={int(v) & 0xFFF}")  # type: ignore[call-overload]
            else:
                m.append(f"{k}={v}")
        acts = []
        for a, v in self.actions:
            if a == "output":
                acts.append(f"output:{v}")
            elif a == "push_vlan":
                acts.append(f"push_vlan:{int(v):#06x}")  # type: ignore[call-overload]
            elif a == "set_vlan_vid":
                acts.append(f"set_field:{int(v) | VID_PRESENT}->vlan_vid")  # type: ignore[call-overload]
            elif a == "pop_vlan":
                acts.append("pop_vlan")
        if self.goto is not None:
            acts.append(f"goto_table:{self.goto}")
        return ",".join(m) + " actions=" + (",".join(acts) or "drop")


@dataclass
class _Builder:
    flows: list[Flow] = field(default_factory=list)

    def add(self, priority: int, match: Iterable[tuple[str, object]], actions: Iterable[tuple[str, object]],
            table: int = 0, goto: int | None = None) -> None:
        self.flows.append(Flow(priority, tuple(match), tuple(actions), table, goto))


def _to_uplinks(uplinks: Iterable[Uplink]) -> list[tuple[str, object]]:
    """Send a copy out of every uplink: push its tags (innermost first), output, pop them again."""
    out: list[tuple[str, object]] = []
    for u in uplinks:
        for tpid, vid in reversed(u.tags):
            out += [("push_vlan", tpid), ("set_vlan_vid", vid)]
        out.append(("output", u.ofport))
        out += [("pop_vlan", 0)] * len(u.tags)
    return out


def segment_flows(segments: Iterable[Segment]) -> list[Flow]:
    """Every rule for the given segments, plus the table-miss drops. Deterministic order."""
    b = _Builder()
    for table in (0, 1):
        b.add(0, (), (), table=table)  # table miss: drop (isolation does not depend on the fail mode)
    seen_ports: dict[int, int] = {}
    for seg in sorted(segments, key=lambda s: s.label):
        for p in seg.ports:
            if seen_ports.setdefault(p.ofport, seg.label) != seg.label:
                raise ValueError(f"port {p.ofport} is in two segments ({seen_ports[p.ofport]} and {seg.label})")
        ports = sorted(seg.ports, key=lambda p: p.ofport)
        for p in ports:
            others = [q for q in ports if q.ofport != p.ofport]
            for q in others:
                b.add(200, (("in_port", p.ofport), ("eth_dst", q.mac)), (("output", q.ofport),))
            flood = [("output", q.ofport) for q in others] + _to_uplinks(seg.uplinks)
            if flood:
                b.add(100, (("in_port", p.ofport),), flood)
        for u in seg.uplinks:
            local = [("output", q.ofport) for q in ports] + _to_uplinks(x for x in seg.uplinks if x != u)
            outer_tpid, outer = u.tags[0]
            del outer_tpid
            if len(u.tags) == 1:
                b.add(150, (("in_port", u.ofport), ("vlan_vid", VID_PRESENT | outer)), [("pop_vlan", 0)] + local)
            else:
                inner = u.tags[1][1]
                b.add(150, (("in_port", u.ofport), ("vlan_vid", VID_PRESENT | outer)), (("pop_vlan", 0),), goto=1)
                b.add(150, (("in_port", u.ofport), ("vlan_vid", VID_PRESENT | inner)), [("pop_vlan", 0)] + local,
                      table=1)
    return b.flows
