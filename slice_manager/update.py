"""AM API Update and Cancel (the GENI change set C, adopted for AM API v4 and offered here on v3), as pure
functions over plain data: what an Update changes, and the life of a pending update.

Update takes the complete desired RSpec for the slivers it names. Elements are matched by client_id:

* a node or link of the desired RSpec that no named sliver is: *added* (the broker places only these);
* a named sliver the desired RSpec leaves out: *removed* (released when the change is committed);
* a link whose endpoints or capacity change is *replaced*: removed and added under the same client_id, so its
  new bandwidth is placed while the old one still holds until the commit;
* a kept node whose interfaces change (a link added to or removed from it) is *rewired* on commit: the
  driver adds or removes the node's ports in place, the node keeps running and keeps its units.

Anything else about a kept node (sliver type, image, bound host, FPGA) cannot change in place: Update refuses
it, naming the node, rather than replace a running machine behind its user's back. Stitched links (they
involve other aggregates' hops and the path service) and FPGA slivers (programming is the FPGA model's) are
refused with the reason, never half-applied.

On allocated slivers the change applies at once. When a named sliver is provisioned, the change is *staged*:
the added slivers are ticketed for a short term, every sliver of the change shows `geni_updating`, and the
change waits for Provision (commit) or Cancel or its expiry (revert). `PendingUpdate` is that record, stored
before any message is sent, so a slice manager restarted anywhere either completes a commit it began or
reverts a change that was never committed (`due`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec

from protocol import slice_manager as sm_protocol
from protocol.slice_manager import UPDATING  # noqa: E402,F401 - the allocation state of a staged update's slivers
from rspec.request import Request, RequestLink, RequestNode
from slicex.clock import rfc3339
from slicex.errors import BadArgs, Expired, Unsupported

STAGING, STAGED, COMMITTING, REVERTING = "staging", "staged", "committing", "reverting"
"""Phases of a pending update. staging: the broker is being asked (a crash here reverts); staged: placed,
waiting for Provision or Cancel or expiry; committing: Provision began (a crash here completes);
reverting: Cancel or expiry began (a crash here completes the revert)."""

ACTIONS = sm_protocol.UPDATE_ACTIONS
"""What the commit of a staged Update does to each sliver it concerns, as Status (`sx_update_action`) and the
manifest (`update:action`) say it: kept as it is; rewired (kept, its ports added or removed in place); added;
removed; replaced (a link whose endpoints or capacity change: this sliver goes at the commit) and replacing (the
new sliver of that link, under the same client_id, placed now and provisioned at the commit)."""

NODE_FIXED = ("component_id", "sliver_type", "disk_image", "hardware_type", "exclusive", "fpga", "execute",
              "install", "blockstores")
"""What a kept node cannot change in place."""


@dataclass(frozen=True)
class Existing:
    """One named sliver as the slice manager holds it: its id, client_id, kind and the request element it was
    allocated from (None when the stored request no longer names it)."""

    sliver_id: str
    client_id: str
    kind: str
    element: RequestNode | RequestLink | None


@dataclass(frozen=True)
class ChangeSet:
    """What an Update does. `added`: the part of the desired request the broker places (new nodes, and new or
    replaced links); `removed`: sliver ids released on commit; `rewired`: kept node sliver id -> its desired
    element (new interface list); `kept`: sliver id -> client_id of what stays as it is."""

    desired: Request
    added: Request
    removed: tuple[str, ...]
    rewired: Mapping[str, RequestNode]
    kept: Mapping[str, str]

    @property
    def empty(self) -> bool:
        return not self.added.nodes and not self.added.links and not self.removed and not self.rewired


def _iface_ids(node: RequestNode) -> tuple[str, ...]:
    return tuple(i.client_id for i in node.interfaces)


def _link_shape(link: RequestLink) -> tuple[Any, ...]:
    return (tuple(sorted(link.interface_refs)), link.capacity_kbps or 0, link.latency_ms or 0,
            link.packet_loss or 0, link.vlan_tag, link.shared_vlan)


def _refuse_special(what: str, element: RequestNode | RequestLink) -> None:
    if isinstance(element, RequestNode) and element.fpga is not None:
        raise Unsupported(f"Update cannot {what} node {element.client_id}: it is an FPGA sliver, which this "
                          f"aggregate does not change in place; Delete it and Allocate again")
    if isinstance(element, RequestLink) and (element.uplinks or element.shared_vlan):
        how = "a stitched link (it crosses other aggregates' hops)" if element.uplinks else "a shared VLAN"
        raise Unsupported(f"Update cannot {what} link {element.client_id}: it is {how}, which this aggregate "
                          f"does not change in place; Delete it and Allocate again")


def _before(e: Existing | None, wanted: Any, added: list[Any]) -> Any:
    """The request element a named sliver was allocated from, to compare with the desired `wanted`; None when
    `wanted` is new (then it is appended to `added`, unless it is of a kind Update refuses)."""
    if e is None:
        _refuse_special("add", wanted)
        added.append(wanted)
        return None
    if not isinstance(e.element, type(wanted)):
        raise BadArgs(f"{e.kind} {e.client_id} ({e.sliver_id}): its request is not known here, so it cannot be "
                      f"compared")
    return e.element


def diff(existing: Iterable[Existing], desired: Request) -> ChangeSet:
    """The change from the named slivers to `desired` (pure). BADARGS for a desired RSpec that contradicts
    itself or changes a kept node in a way that cannot be done in place; UNSUPPORTED for stitched links and
    FPGA slivers, naming them."""
    have = {e.client_id: e for e in existing}
    want_nodes = {n.client_id: n for n in desired.nodes}
    want_links = {lk.client_id: lk for lk in desired.links}
    ifaces = {i.client_id: n.client_id for n in desired.nodes for i in n.interfaces}
    for lk in desired.links:
        stray = [r for r in lk.interface_refs if r not in ifaces]
        if stray:
            raise BadArgs(f"link {lk.client_id} names interface(s) {', '.join(stray)} that no node of the desired "
                          f"RSpec has")
    removed: list[str] = []
    kept: dict[str, str] = {}
    rewired: dict[str, RequestNode] = {}
    add_nodes: list[RequestNode] = []
    add_links: list[RequestLink] = []
    for cid, e in have.items():
        if e.kind == "node" and cid in want_links or e.kind == "link" and cid in want_nodes:
            raise BadArgs(f"{cid} is a {e.kind} sliver; the desired RSpec makes it a "
                          f"{'link' if e.kind == 'node' else 'node'}: remove it and add one under another client_id")
    for cid, node in want_nodes.items():
        old = _before(have.get(cid), node, add_nodes)
        if old is None:
            continue
        changed = [f for f in NODE_FIXED if getattr(old, f) != getattr(node, f) and getattr(node, f) is not None]
        if changed:
            raise BadArgs(f"node {cid} cannot change {', '.join(changed)} in place; remove it and add a node under "
                          f"another client_id")
        if set(_iface_ids(old)) != set(_iface_ids(node)):
            _refuse_special("rewire", old)
            rewired[have[cid].sliver_id] = node
        else:
            kept[have[cid].sliver_id] = cid
    for cid, link in want_links.items():
        old = _before(have.get(cid), link, add_links)
        if old is None:
            continue
        if _link_shape(old) != _link_shape(link):
            _refuse_special("change", old)
            _refuse_special("change", link)
            removed.append(have[cid].sliver_id)
            add_links.append(link)
        else:
            kept[have[cid].sliver_id] = cid
    for cid, e in have.items():
        if cid not in want_nodes and cid not in want_links:
            if e.element is not None:
                _refuse_special("remove", e.element)
            removed.append(e.sliver_id)
    # a node whose link is replaced keeps its interface but is rewired onto the new link's segment
    replaced = {r for lk in add_links if lk.client_id in have for r in lk.interface_refs}
    for cid, node in want_nodes.items():
        e = have.get(cid)
        if e is not None and e.sliver_id in kept and replaced & set(_iface_ids(node)):
            del kept[e.sliver_id]
            rewired[e.sliver_id] = node
    return ChangeSet(desired, Request(tuple(add_nodes), tuple(add_links)), tuple(removed), rewired, kept)


def bound_interfaces(desired: Request, links: Iterable[RequestLink],
                     placed: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """What the broker must know of the nodes placed before (`placed`: client_id -> {component_id: its host,
    interfaces: {iface: {component_id: host interface}}}) that `links` attach to: node client_id -> its host,
    its bound interfaces, and the interfaces the desired node has (new ones are bound on its host)."""
    wanted = {r for lk in links for r in lk.interface_refs}
    out: dict[str, dict[str, Any]] = {}
    for node in desired.nodes:
        d = placed.get(node.client_id)
        if d is None or not wanted & set(_iface_ids(node)):
            continue
        out[node.client_id] = {"component_id": d["component_id"],
                               "interfaces": {i: b["component_id"] for i, b in (d.get("interfaces") or {}).items()},
                               "wanted": list(_iface_ids(node))}
    return out


def one_by_one(added: Request) -> list[Request]:
    """geni_best_effort: the added part as requests of one element each, nodes first (a link is placed after
    the nodes it attaches to), so what does not fit is left out alone."""
    return [Request((n,), ()) for n in added.nodes] + [Request((), (lk,)) for lk in added.links]


# ---- the pending update -----------------------------------------------------------------------------------------
class PendingUpdate(msgspec.Struct, frozen=True, omit_defaults=True):
    """A staged change of one slice: what it adds (sliver ids), removes and rewires, the slice's request
    before and after, until when it waits, and its phase."""

    slice_urn: str
    phase: str
    expires: datetime
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    rewired: Mapping[str, dict[str, Any]] = {}  # node id -> {"before", "after"} details
    members: tuple[str, ...] = ()  # every sliver the change concerns (shown geni_updating)
    request_xml: str = ""  # the desired RSpec, the slice's request once committed
    reason: str = ""  # why it is being reverted
    request_key: str = ""  # where the desired RSpec is stored (sm-requests) while the update is pending
    since: datetime | None = None  # when its phase began
    owner: str = ""  # the slice manager whose call began the phase (a commit under way is left to it while it lives)
    lease_end: datetime | None = None  # a commit: the lease end Provision asked for the added slivers
    users: tuple[Mapping[str, Any], ...] = ()  # a commit: Provision's geni_users


def begin_commit(u: PendingUpdate, now: datetime, owner: str, lease_end: datetime,
                 users: Iterable[Mapping[str, Any]]) -> PendingUpdate:
    """Provision commits a staged update that has not expired (its added slivers leased until `lease_end`)."""
    if u.phase != STAGED:
        raise BadArgs(f"the update of {u.slice_urn} is {u.phase}; only a staged update is committed")
    if now >= u.expires:
        raise Expired(f"the update of {u.slice_urn} expired at {rfc3339(u.expires)} and is being reverted; "
                      f"Update again")
    return msgspec.structs.replace(u, phase=COMMITTING, since=now, owner=owner, lease_end=lease_end, users=tuple(users))


def begin_revert(u: PendingUpdate, reason: str, now: datetime, owner: str) -> PendingUpdate:
    """Cancel or expiry reverts an update not yet committing; a commit under way is completed instead."""
    if u.phase == COMMITTING:
        raise BadArgs(f"the update of {u.slice_urn} is being committed; it cannot be cancelled now")
    return msgspec.structs.replace(u, phase=REVERTING, reason=reason, since=now, owner=owner)


def commit_failed(u: PendingUpdate, reason: str, now: datetime, owner: str) -> PendingUpdate:
    """A commit that failed (an added sliver could not be provisioned, a node not rewired) is reverted whole."""
    if u.phase != COMMITTING:
        raise BadArgs(f"the update of {u.slice_urn} is {u.phase}, not being committed")
    return msgspec.structs.replace(u, phase=REVERTING, reason=reason, since=now, owner=owner)


def due(u: PendingUpdate, now: datetime, caller_gone: bool) -> str | None:
    """What the clock (or a restarted slice manager) must do about a pending update: "complete" a commit that
    began and whose caller is gone (`caller_gone`: the slice manager that began it died, or it is this one and
    no call of it holds the slice), "revert" one whose revert began likewise, or that expired unprovisioned
    (staging or staged); else None."""
    if u.phase == COMMITTING:
        return "complete" if caller_gone else None
    if u.phase == REVERTING:
        return "revert" if caller_gone else None
    return "revert" if now >= u.expires else None
