"""AM API Update and Cancel in the slice manager (a mixin of ActorSliceManager); what they mean and the pure
part are slice_manager/update.py.

Update asks the broker to place only the difference (the added nodes and links, with the kept nodes that new
links attach to named as placed), as one ticket group, all or nothing. On allocated slivers the change applies
at once: removed slivers are given back, kept nodes are rewired in their record. When a named sliver is
provisioned the change is staged: a `PendingUpdate` is written (phase staging) before the broker is asked, the
added slivers are ticketed until the update's short expiry, and every sliver of the change shows
`geni_updating`. Provision commits it (phase committing, written first): the added slivers are provisioned,
kept nodes are rewired at the authority (action `slicex_rewire`: the driver adds and removes their ports in
place), the removed slivers are closed, and the desired RSpec becomes the slice's request. Cancel, the
update's expiry (the reaper) or a failed commit revert it: the added slivers are closed and rewired nodes put
back. A slice manager restarted anywhere completes a commit that began and reverts anything else (`recover`
calls `_settle_updates`).

Usage (operations/ledger.py, when the deployment gives one as `ledger`): the records of what an Update adds
are opened before the update is marked staged (a replacing link's record names the link it replaces, and
counts only what it adds to it meanwhile); a commit ends the records of what it removed, a revert those of
what it added, each before the pending update is deleted, so a slice manager restarted after a crash that
completes the commit or the revert leaves the ledger whole."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime
from typing import Any

from lxml import etree
from msgspec import structs

from protocol import slice_manager as sm
from protocol.messages import REWIRE
from protocol.slice_manager import Sliver
from rspec.request import Request, RequestNode, parse_request
from slice_manager import reservation as rs
from slice_manager import update as up
from slice_manager.records import REQUESTS, UPDATES, Record, _error
from slicex.clock import rfc3339
from slicex.codec import decode, encode
from slicex.errors import BadArgs, GeniError, InProgress, SearchFailed
from slicex.xmlsafe import parse_xml

log = logging.getLogger("slicex.sm")


class Updates:
    """Update, Cancel, and the commit and revert of a pending update."""

    ledger: Any = None  # operations.ledger.Ledger: usage records of what an Update adds and removes (or None)

    # ---- the pending update record ---------------------------------------------------------------------------
    def pending_update(self, slice_urn: str) -> up.PendingUpdate | None:
        doc = self.store.get(UPDATES, slice_urn)
        return decode(doc, up.PendingUpdate, "update") if doc else None

    def _put_update(self, u: up.PendingUpdate) -> None:
        self.store.put(UPDATES, u.slice_urn, encode(u))

    # ---- Update ------------------------------------------------------------------------------------------------
    def update(self, slice_urn: str, sliver_urns: list[str], request: Request, alloc_end: datetime,
               update_end: datetime, now: datetime, best_effort: bool = False, requester: str = "") -> list[Sliver]:
        """Change the named slivers (all of the slice's when none are named) to `request`, the complete desired
        RSpec for them. Allocated slivers change at once (added ones are allocated until `alloc_end`); when
        one is provisioned the change is staged until `update_end` (Provision commits it, Cancel reverts it).
        Added slivers are the `requester`'s (the caller), as an Allocate's are: they boot his images, mount
        his datasets, never the slice creator's private ones, and are charged to him in the ledger (none given:
        the slivers' owner)."""
        with self._on_slices([slice_urn]):
            live = [rec for rec in self._settle_slice(slice_urn, now) if not rec.discard
                    and rec.r.state not in (rs.CLOSE_WAIT, rs.CLOSED)]
            named = set(sliver_urns) or {rec.id for rec in live}
            with self._holding(sorted(named), now):  # another AM worker's Update of these waits or is Busy
                self._settle(sorted(named), now)
                pending = self.pending_update(slice_urn)
                if pending is not None:
                    raise InProgress(f"slice {slice_urn} has an Update pending until {rfc3339(pending.expires)} "
                                     f"({pending.phase}); Provision to commit it or Cancel it before another "
                                     f"Update")
                recs = {u: self._require(u, now) for u in sorted(named)}
                return self._update(slice_urn, recs, request, alloc_end, update_end, now, best_effort, requester)

    def _update(self, slice_urn: str, recs: dict[str, Record], request: Request, alloc_end: datetime,
                update_end: datetime, now: datetime, best_effort: bool, requester: str = "") -> list[Sliver]:
        failed = [rec for rec in recs.values() if rec.r.state == rs.FAILED or rec.r.pending != rs.NONE]
        if failed:
            rec = failed[0]
            raise BadArgs(f"cannot update {rec.client_id} ({rec.id}): it is {rec.r.state}"
                          f"{' (' + rec.r.pending + ')' if rec.r.pending != rs.NONE else ''}"
                          f"{': ' + rec.r.reason if rec.r.reason else ''}")
        early = [rec for rec in recs.values() if rs.awaiting_start(rec.r, now)]
        if early:  # its term is booked in the broker's calendar: an Update would place the difference for now
            raise BadArgs(f"cannot update {early[0].client_id} ({early[0].id}): it is an advance reservation from "
                          f"{rfc3339(early[0].r.start)}; Delete it and Allocate the new request for that term")
        elements = self._requested_elements(slice_urn)
        changes = up.diff([up.Existing(rec.id, rec.client_id, rec.kind, elements.get(rec.client_id))
                           for rec in recs.values()], request)
        if changes.empty:
            return [self._sliver(rec, now) for rec in recs.values()]
        staged = any(rec.provisioned or rec.r.state in rs.HOLDS_LEASE for rec in recs.values())
        owner = requester or next(iter(recs.values())).owner_urn
        request_key = f"{slice_urn}#{rfc3339(now)}-update-{uuid.uuid4().hex[:8]}"
        pending = up.PendingUpdate(slice_urn, up.STAGING, update_end, (), changes.removed, {}, tuple(recs),
                                   request.xml, since=now, owner=self.name)
        added, refused = self._place_added(pending if staged else None, changes, recs, owner,
                                           update_end if staged else alloc_end, best_effort, now)
        with self._holding(added, now):
            self.store.put(REQUESTS, request_key, {"key": request_key, "slice_urn": slice_urn, "xml": request.xml,
                                                   "client_ids": [rec.client_id for rec in added.values()]})
            rewired = {rid: {"before": dict(recs[rid].details.get("interfaces") or {}),
                             "after": self._interfaces_after(recs[rid], node, added),
                             "depends_on": self._links_of(node, recs, added, changes.removed)}
                       for rid, node in changes.rewired.items()}
            replaces = self._replacements(recs, added, changes.removed)
            if not staged:  # allocated slivers change at once (the removed ones answer geni_unallocated)
                self._apply(slice_urn, recs, added, changes.removed, rewired, request, request_key, now)
                self._charge(owner, slice_urn, added, replaces, now)
                self._discharge(changes.removed, now, "removed by Update")
                return [self._sliver(rec, now) for rec in [*recs.values(), *added.values()]] + refused
            pending = structs.replace(pending, phase=up.STAGED, added=tuple(added), rewired=rewired,
                              members=tuple(dict.fromkeys([*recs, *added])), request_xml=request.xml,
                              request_key=request_key)
            replaced = set(replaces.values())
            for rid, rec in recs.items():
                rec.update = ("replaced" if rid in replaced else "removed" if rid in changes.removed
                              else "rewired" if rid in rewired else "kept")
                self._save(rec)
            for rec in added.values():
                rec.update = "replacing" if rec.id in replaces else "added"
                self._save(rec)
            self._charge(owner, slice_urn, added, replaces, now)  # before staged: a crash reverts
            self.fault("update:charged")
            self._put_update(pending)
            self.fault("update:staged")
            return [self._sliver(rec, now) for rec in [*recs.values(), *added.values()]] + refused

    @staticmethod
    def _replacements(recs: dict[str, Record], added: dict[str, Record], removed: tuple[str, ...]) -> dict[str, str]:
        """Each added link that replaces a removed one (same client_id: its endpoints or capacity changed) ->
        the sliver it replaces."""
        gone = {recs[rid].client_id: rid for rid in removed if rid in recs and recs[rid].kind == "link"}
        return {rec.id: gone[rec.client_id] for rec in added.values() if rec.kind == "link" and rec.client_id in gone}

    def _charge(self, user: str, slice_urn: str, added: dict[str, Record], replaces: dict[str, str],
                now: datetime) -> None:
        """Open the usage records of what an Update adds (a no-op without a ledger)."""
        if self.ledger is not None and added:
            self.ledger.began(user, slice_urn, [self._sliver(rec, now) for rec in added.values()], now, replaces)

    def _discharge(self, sliver_ids: Iterable[str], now: datetime, reason: str) -> None:
        """End the usage records of slivers an Update's commit removed or its revert gave back (ending one
        already ended does nothing, so a commit or revert completed after a crash may end them again)."""
        if self.ledger is not None:
            self.ledger.ended(list(sliver_ids), now, reason)

    def _place_added(self, pending: up.PendingUpdate | None, changes: up.ChangeSet, recs: dict[str, Record],
                     owner: str, end: datetime, best_effort: bool,
                     now: datetime) -> tuple[dict[str, Record], list[Sliver]]:
        """Ask the broker for the added part only, as one ticket group (all or nothing), or with
        `best_effort` one element at a time when the whole does not fit: (the records granted, a sliver
        struct with geni_error for each element left out). A staged update's record names every reservation
        before it is asked for (`pending`), so a crash anywhere here is reverted."""
        some = next(iter(recs.values()))
        slice_urn, identity = some.slice_urn, some.slice_uuid
        parts = [changes.added] if changes.added.nodes or changes.added.links else []
        first = True
        granted: dict[str, Record] = {}
        refused: list[Sliver] = []
        while parts:
            part = parts.pop(0)
            placed = {**recs, **granted}
            orphan = self._orphan(part, changes.desired, {rec.client_id for rec in placed.values()})
            if orphan:  # best effort: a link whose new node was left out is left out too
                never = f"urn:publicid:IDN+{self.substrate.authority}+sliver+{uuid.uuid4().hex[:16]}"
                refused.append(Sliver(never, slice_urn, part.links[0].client_id, "link", sm.UNALLOCATED, sm.FAILED,
                                      now, f"not added: {orphan}"))
                continue
            kept = up.bound_interfaces(changes.desired, part.links,
                                       {rec.client_id: {"component_id": rec.component_id,
                                                        "interfaces": rec.details.get("interfaces") or {}}
                                        for rec in placed.values() if rec.kind == "node"})
            subnets = sorted({str(rec.details["subnet"]) for rec in [*self.records(slice_urn), *granted.values()]
                              if rec.kind == "link" and rec.details.get("subnet")})
            batch = self._records(part, slice_urn, owner, f"ticket:{uuid.uuid4().hex}", self._bitstream_parts(owner),
                                  self._images(part, owner))  # added nodes may boot the owner's images too
            for rec in batch.values():
                rec.slice_uuid = identity
                rec.demand = structs.replace(rec.demand, kept=kept, subnets=tuple(subnets))
                rec.update = "added" if pending is not None else ""
                rec.r, rec.outbox = rs.demand(rec.r, now, end)
            if pending is not None:  # before any message: a crash from here on is reverted
                pending = structs.replace(pending, added=(*pending.added, *batch), members=(*pending.members, *batch))
                self._put_update(pending)
            self.fault("update:staging")
            with self._holding(batch, now):
                self._drive(batch, now)
                short = [rec for rec in batch.values() if rec.r.state != rs.TICKETED]
                if short:
                    self._abandon(batch, now)
            if not short:
                granted.update(batch)
            elif best_effort and first and len(part.nodes) + len(part.links) > 1:
                parts = up.one_by_one(part)  # the whole did not fit: each element on its own
            elif best_effort:
                rec = next((r for r in short if r.error_type), short[0])
                refused.append(replace(self._sliver(rec, now), allocation_state=sm.UNALLOCATED,
                                       operational_state=sm.FAILED,
                                       error=f"not added: {rec.r.reason or rec.r.state}"))
            else:
                if pending is not None:
                    self.store.delete(UPDATES, pending.slice_urn)
                rec = next((r for r in short if r.error_type), short[0])
                raise _error(rec.error_type or "GeniError", f"Update could not place {rec.client_id}: "
                             f"{rec.r.reason or rec.r.state}; nothing was changed")
            first = False
        for rec in granted.values():  # a new node is redeemed after the new links it is on
            if rec.kind == "node":
                node = changes.desired.node(rec.client_id)
                assert node is not None
                rec.r = structs.replace(rec.r, depends_on=tuple(self._links_of(node, recs, granted, changes.removed)))
        self._keep_addresses(recs, granted, changes.removed, changes.desired)
        return granted, refused

    def _keep_addresses(self, recs: dict[str, Record], granted: dict[str, Record], removed: tuple[str, ...],
                        desired: Request) -> None:
        """A link an Update replaces (its endpoints or capacity change) keeps its subnet and the addresses of
        the interfaces it keeps; an interface new on it gets the lowest free address of that subnet, unless the
        request gives one. The new link's `addresses` say so (kept nodes take them when rewired), and a new
        node's interfaces on it are given theirs before it is redeemed (its driver uses the address given)."""
        given = {i.client_id: i.ip for n in desired.nodes for i in n.interfaces if i.ip}
        node_ips = {cid: str(info["ip"]) for rec in recs.values() if rec.kind == "node"
                    for cid, info in (rec.details.get("interfaces") or {}).items() if info.get("ip")}
        for new_id, old_id in self._replacements(recs, granted, removed).items():
            new, old = granted[new_id], recs[old_id]
            subnet = str(old.details.get("subnet") or "")
            if not subnet:
                continue
            before = list(old.details.get("interface_refs") or ())
            had = {cid: node_ips.get(cid) or (old.details.get("addresses") or {}).get(cid)
                   or f"{subnet}.{n + 1}" for n, cid in enumerate(before)}
            refs = list(new.details.get("interface_refs") or ())
            taken = {had[c] for c in refs if c in had} | set(given.values())
            free = (f"{subnet}.{n}" for n in range(1, 255) if f"{subnet}.{n}" not in taken)
            addresses = {cid: given.get(cid) or had.get(cid) or next(free, "") for cid in refs}
            new.details = {**new.details, "subnet": subnet, "addresses": addresses}
            for rec in granted.values():
                for cid, info in (rec.details.get("interfaces") or {}).items() if rec.kind == "node" else ():
                    if addresses.get(cid) and not info.get("ip"):
                        info["ip"], info["netmask"] = addresses[cid], info.get("netmask") or "255.255.255.0"

    @staticmethod
    def _orphan(part: Request, desired: Request, placed: set[str]) -> str:
        """Why a lone link cannot be placed (a node it attaches to is neither kept nor added), or ''."""
        if part.nodes or len(part.links) != 1:
            return ""
        owner = {i.client_id: n.client_id for n in desired.nodes for i in n.interfaces}
        missing = sorted({owner[r] for r in part.links[0].interface_refs if owner.get(r) not in placed})
        return f"node(s) {', '.join(missing)} it attaches to were not added" if missing else ""

    def _requested_elements(self, slice_urn: str) -> dict[str, Any]:
        """client_id -> the request element each live sliver was allocated (or last updated) from."""
        out: dict[str, Any] = {}
        for doc in self.store.scan(REQUESTS, f"{slice_urn}#"):
            if doc["slice_urn"] != slice_urn:
                continue
            try:
                req = parse_request(doc["xml"])
            except GeniError:
                continue
            for element in (*req.nodes, *req.links):
                if element.client_id in doc["client_ids"]:
                    out[element.client_id] = element
        return out

    @staticmethod
    def _interfaces_after(rec: Record, node: RequestNode, added: dict[str, Record]) -> dict[str, Any]:
        """A kept node's interface details after the change: the ones it keeps as bound, the new ones as the
        broker bound them (the new link's placement says where: `bindings`)."""
        before = dict(rec.details.get("interfaces") or {})
        links = [a for a in added.values() if a.kind == "link"]
        bound = {i: b for a in links for i, b in (a.details.get("bindings") or {}).items()}
        kept_on = {i: ip for a in links for i, ip in (a.details.get("addresses") or {}).items()}  # replaced links
        moved = {i for a in links for i in (a.details.get("interface_refs") or ()) if i not in kept_on}
        out: dict[str, Any] = {}
        for ri in node.interfaces:
            old = before.get(ri.client_id) or {}
            where = (old or bound.get(ri.client_id) or {}).get("component_id")
            if not where:
                continue
            # the address the request gives; else the one a replaced link keeps or gives it; else the one it
            # has on a link the Update keeps; else (empty) its new link's subnet decides it
            ip = ri.ip or kept_on.get(ri.client_id) or ("" if ri.client_id in moved else str(old.get("ip") or ""))
            mask = ri.netmask or (str(old.get("netmask") or "") if ip and ip == old.get("ip") else "")
            out[ri.client_id] = {"component_id": where, "ip": ip, "netmask": mask or ("255.255.255.0" if ip else "")}
        return out

    @staticmethod
    def _links_of(node: RequestNode, recs: dict[str, Record], added: dict[str, Record],
                  removed: tuple[str, ...]) -> list[str]:
        """The link slivers a kept node is on after the change (its redeem's dependencies)."""
        mine = {i.client_id for i in node.interfaces}
        links = [r for r in (*recs.values(), *added.values()) if r.kind == "link" and r.id not in removed]
        return [r.id for r in links if mine & set(r.details.get("interface_refs") or r.demand.element.interface_refs)]

    # ---- applying a change -------------------------------------------------------------------------------------
    def _apply(self, slice_urn: str, recs: dict[str, Record], added: dict[str, Record], removed: tuple[str, ...],
               rewired: dict[str, dict[str, Any]], request: Request, request_key: str, now: datetime) -> None:
        """Make the change the slice's state (allocated slivers at once, or the commit's last step): give back
        the removed slivers, record the rewired nodes' interfaces and links, and make the desired RSpec the
        request of the named slivers."""
        self._abandon({rid: recs[rid] for rid in removed if rid in recs}, now)
        for rid, change in rewired.items():
            rec = recs[rid]
            rec.details = {**rec.details, "interfaces": dict(change["after"])}
            rec.r = structs.replace(rec.r, depends_on=tuple(change["depends_on"]))
        for rec in (*recs.values(), *added.values()):
            if rec.id in removed:
                continue
            rec.update = ""
            if rec.kind == "node" and rec.r.state in rs.HOLDS_LEASE:
                self._add_interface_details(rec)
            self._save(rec)
        self._replace_request(slice_urn, {rec.client_id for rec in recs.values()}, request, request_key,
                              [rec.client_id for rec in (*recs.values(), *added.values()) if rec.id not in removed])

    def _replace_request(self, slice_urn: str, named: set[str], request: Request, request_key: str,
                         client_ids: list[str]) -> None:
        """The desired RSpec becomes the request of the named slivers: earlier requests lose their elements
        (a request left with none is dropped), and the update's request names every sliver it now describes."""
        for doc in self.store.scan(REQUESTS, f"{slice_urn}#"):
            if doc["slice_urn"] != slice_urn or doc["key"] == request_key:
                continue
            left = [c for c in doc["client_ids"] if c not in named and c not in client_ids]
            if not left:
                self.store.delete(REQUESTS, doc["key"])
            elif len(left) != len(doc["client_ids"]):
                self.store.put(REQUESTS, doc["key"], {**doc, "xml": _without(doc["xml"], set(doc["client_ids"]) -
                                                                             set(left)), "client_ids": left})
        self.store.put(REQUESTS, request_key, {"key": request_key, "slice_urn": slice_urn, "xml": request.xml,
                                               "client_ids": client_ids})

    # ---- commit (Provision) ------------------------------------------------------------------------------------
    def _commit(self, u: up.PendingUpdate, now: datetime) -> list[Sliver]:
        """Provision the added slivers, rewire the kept nodes at the authority, close the removed ones; a
        failure reverts all of it and says why (the caller holds the members' locks)."""
        assert u.lease_end is not None
        recs = {rid: rec for rid in u.members if (rec := self._load(rid)) is not None and not rec.discard}
        try:
            if u.added:
                added = [rid for rid in u.added if rid in recs]
                self._provision(added, u.lease_end, list(u.users), now)
                for rid in added:  # provisioned now: no longer shown updating (and geni_start may be asked)
                    if (rec := self._load(rid)) is not None and rec.update:
                        rec.update = ""
                        self._save(rec)
                if self._running(recs.values(), now):  # a running slice: its new slivers start with it
                    self._start_added(added, list(u.users), now)
            self.fault("update:provisioned")
            recs = {rid: rec for rid in u.members if (rec := self._load(rid)) is not None and not rec.discard}
            for rid, change in u.rewired.items():
                rec = recs.get(rid)
                if rec is not None and rec.r.state in rs.HOLDS_LEASE:
                    self._rewire(rec, change["after"], change["depends_on"], now)
        except GeniError as exc:
            log.warning("commit of the Update of %s failed, reverting: %s", u.slice_urn, exc.message)
            self._put_update(up.commit_failed(u, f"commit failed: {exc.message}", now, self.name))
            self._revert(self.pending_update(u.slice_urn), now)
            raise type(exc)(f"committing the Update of {u.slice_urn} failed, so it was reverted (the slice is as "
                            f"before the Update): {exc.message}") from None
        recs = {rid: rec for rid in u.members if (rec := self._load(rid)) is not None and not rec.discard}
        added = {rid: recs[rid] for rid in u.added if rid in recs}
        kept = {rid: rec for rid, rec in recs.items() if rid not in u.added}
        self._apply(u.slice_urn, kept, added, u.removed, u.rewired, Request((), (), u.request_xml), u.request_key, now)
        self.fault("update:applied")
        self._discharge(u.removed, now, "removed by Update")
        self.fault("update:discharged")
        self.store.delete(UPDATES, u.slice_urn)
        return [self._sliver(rec, now) for rec in recs.values() if rec.id not in u.removed]

    def _running(self, recs: Iterable[Record], now: datetime) -> bool:
        """Whether a node of the slice the update keeps is up (then what the update adds boots at commit)."""
        for rec in recs:
            if rec.kind == "node" and rec.r.state in rs.HOLDS_LEASE and rec.update not in ("added", "replacing"):
                if self.authority.status(rec.ticket_id, now)[0] in (sm.READY, sm.CONFIGURING):
                    return True
        return False

    def _start_added(self, added: list[str], users: list[dict[str, Any]], now: datetime) -> None:
        """geni_start the slivers a commit provisioned (links first: a node's ports join running segments);
        one already started (a commit completed after a crash) is left as it is."""
        recs = [rec for rid in added if (rec := self._load(rid)) is not None and rec.r.state in rs.HOLDS_LEASE]
        todo = [rec.id for rec in sorted(recs, key=lambda r: r.kind != "link")
                if self.authority.status(rec.ticket_id, now)[0] in sm.ALLOWED_ACTIONS["geni_start"]]
        if todo:
            self._perform(todo, "geni_start", now, False, users)

    def _rewire(self, rec: Record, interfaces: dict[str, Any], link_ids: list[str], now: datetime) -> None:
        """Give a running node these interfaces at the authority, each with the address and VLAN tag of its
        link among `link_ids` (the driver adds the new ports and removes the others in place)."""
        rec.details = {**rec.details, "interfaces": {k: dict(v) for k, v in interfaces.items()}}
        self._add_interface_details(rec, [lk for lid in link_ids if (lk := self._load(lid)) is not None])
        self.authority.modify(rec.ticket_id, REWIRE, now, properties={"interfaces": rec.details["interfaces"]})
        self._save(rec)

    # ---- revert (Cancel, expiry, a failed commit) ----------------------------------------------------------------
    def _revert(self, u: up.PendingUpdate | None, now: datetime) -> list[Record]:
        """Close the added slivers, put rewired nodes back, forget the update's request (the caller holds the
        members' locks). Returns the members' records: the kept ones as they are now, the added ones closed."""
        if u is None:
            return []
        recs = {rid: rec for rid in u.members if (rec := self._load(rid)) is not None}
        added = {rid: recs[rid] for rid in u.added if rid in recs}
        self._abandon(added, now)
        self._discharge(u.added, now, f"Update reverted ({u.reason})" if u.reason else "Update reverted")
        self.fault("update:reverting")
        for rid, change in u.rewired.items():
            rec = recs.get(rid)
            if rec is None:
                continue
            if rec.r.state in rs.HOLDS_LEASE and rec.details.get("interfaces") != change["before"]:
                try:
                    self._rewire(rec, change["before"], list(rec.r.depends_on), now)
                except GeniError as exc:
                    log.warning("could not put node %s back after a failed Update: %s", rec.client_id, exc.message)
        kept = [rec for rid, rec in recs.items() if rid not in u.added]
        for rec in kept:
            rec = self._load(rec.id) or rec
            rec.update = ""
            self._save(rec)
        if u.request_key:
            self.store.delete(REQUESTS, u.request_key)
        self.store.delete(UPDATES, u.slice_urn)
        return [self._load(rec.id) or rec for rec in kept] + list(added.values())

    # ---- Cancel ------------------------------------------------------------------------------------------------
    def cancel(self, slice_urn: str, sliver_urns: list[str], now: datetime) -> list[Sliver]:
        """Cancel the slice's pending Update (every sliver back as before it) or, with none pending, the named
        allocated slivers' Allocate (as Delete). SEARCHFAILED when there is nothing to cancel."""
        with self._on_slices([slice_urn]):
            u = self.pending_update(slice_urn)
            if u is not None and u.phase in (up.STAGING, up.STAGED):
                with self._holding(list(u.members), now):
                    if self.pending_update(slice_urn) != u:  # reverted or committed meanwhile by another AM worker
                        raise InProgress(f"the Update of {slice_urn} changed while Cancel waited for it; ask again")
                    u = up.begin_revert(u, "cancelled", now, self.name)
                    self._put_update(u)
                    return [self._sliver(rec, now) for rec in self._revert(u, now)]
            if u is not None:
                raise InProgress(f"the Update of {slice_urn} is {u.phase}; it cannot be cancelled now")
            named = sliver_urns or [rec.id for rec in self.records(slice_urn) if not rec.discard
                                    and rec.r.state not in (rs.CLOSE_WAIT, rs.CLOSED)]
            allocated = [rid for rid in named if (rec := self._load(rid)) is not None and not rec.discard
                         and not rec.provisioned and rec.r.state == rs.TICKETED]
            if not allocated:
                raise SearchFailed(f"nothing to cancel in slice {slice_urn}: no Update is pending and none of "
                                   f"{'the named slivers' if sliver_urns else 'its slivers'} is only allocated")
            with self._holding(allocated, now):
                return self._delete(allocated, now)

    def _forget_update_of_gone(self, slice_urn: str) -> None:
        """A slice whose slivers were all deleted keeps no pending Update (nothing is left to commit or put
        back; the added slivers went with the rest)."""
        u = self.pending_update(slice_urn)
        if u is None or u.phase == up.COMMITTING:
            return
        if not any((rec := self._load(rid)) is not None and not rec.discard for rid in u.members):
            if u.request_key:
                self.store.delete(REQUESTS, u.request_key)
            self.store.delete(UPDATES, slice_urn)

    # ---- the clock and recovery --------------------------------------------------------------------------------
    def _settle_updates(self, now: datetime) -> None:
        """Revert updates that expired unprovisioned, and finish what a slice manager that died left half
        done: a commit is completed, a revert finished (slice_manager/update.py `due`)."""
        for doc in self.store.scan(UPDATES):
            u = decode(doc, up.PendingUpdate, "update")
            gone = u.owner == self.name or self._dead(u.owner, now)
            what = up.due(u, now, gone)
            if what is None or not self._slices.acquire(u.slice_urn):
                continue
            try:
                with self._holding(list(u.members), now, strict=False) as mine:
                    if set(mine) != set(u.members):
                        continue  # a call of another slice manager holds some: the next tick
                    if what == "complete":
                        self._commit(u, now)
                    else:
                        if u.phase != up.REVERTING:
                            u = up.begin_revert(u, "expired" if now >= u.expires else "never finished", now,
                                                self.name)
                            self._put_update(u)
                        self._revert(u, now)
            except GeniError as exc:
                log.warning("pending Update of %s: %s", u.slice_urn, exc.message)
            finally:
                self._slices.release(u.slice_urn)


def _without(xml: str, client_ids: set[str]) -> str:
    """A stored request without the nodes and links of these client_ids."""
    root = parse_xml(xml, "stored request")
    for el in list(root):
        if isinstance(el.tag, str) and el.get("client_id") in client_ids:
            root.remove(el)
    return etree.tostring(root, encoding="unicode")
