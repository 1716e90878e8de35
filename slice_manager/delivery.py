"""The reservation driver (a mixin of ActorSliceManager): delivers each record's outbox to its actor and
applies the answers through the pure transitions of slice_manager/reservation.py.

Messages and their actor: ticket → broker `place` (one per ticket group: the demands of the allocation's
nodes and links, all or nothing; the broker chooses and answers tickets with the placement), extendTicket →
broker `extend_ticket`, relinquish → broker `relinquish`, redeem → authority `redeem`, extendLease →
authority `extend_lease`, close → authority `close`. A record is persisted with its outbox before any
message leaves (the message boundary) and again once the answers are applied. Every lease is checked: the
authority's signature, and that it is the lease of the ticket redeemed."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from msgspec.structs import replace

from protocol.api import AuthorityApi, BrokerApi
from protocol.messages import Demands, LinkDemand, NodeDemand, SliverDetails, SliverSpec
from slice_manager import reservation as rs
from slice_manager.records import Record
from slicex.errors import (
    CredentialInvalid,
    GeniError,
    RpcError,
    TimedOut,
    Unavailable,
)
from slicex.term import Term
from slicex.ticket import Lease, Ticket, verify_lease

DRIVE_ROUNDS = 64


def _closes_a_link(rec: Record, msgs: Iterable[rs.Message]) -> bool:
    """Whether `rec` is a link being closed: those go after the nodes closed with them, whose interfaces are
    on the link (a cloud refuses to delete a network while ports are on it: Neutron's 409)."""
    return rec.kind == "link" and any(m.kind == "close" for m in msgs)


class Delivery:
    """Outbox delivery and answers."""

    broker: BrokerApi  # the actors it sends to (set by ActorSliceManager)
    authority: AuthorityApi

    # ---- the message plumbing ----------------------------------------------------------------------------------
    def _drive(self, recs: dict[str, Record], now: datetime) -> None:
        """Deliver every outbox message of `recs` and apply the answers until nothing is left to send (or
        only messages that could not be delivered). Each record is persisted with its outbox before any
        message leaves, and again after the answers are applied."""
        stuck: set[tuple[str, rs.Message]] = set()  # not delivered in this drive: retried by the next reap
        for _ in range(DRIVE_ROUNDS):
            self._resume_dependants(recs, now)
            sending = {rid: [m for m in rec.outbox if (rid, m) not in stuck] for rid, rec in recs.items()}
            sending = {rid: msgs for rid, msgs in sending.items() if msgs}
            if not sending:
                return
            for rid in sending:
                self._save(recs[rid])
            delivered_any = False
            tickets = [(recs[rid], m) for rid, msgs in sending.items() for m in msgs if m.kind == "ticket"]
            for group in sorted({rec.group for rec, _ in tickets}):
                batch = [(rec, m) for rec, m in tickets if rec.group == group]
                self.fault("ticket:pending")
                events = self._deliver_tickets(batch, now)
                self.fault("ticket:answered")
                for (rec, m), ev in zip(batch, events, strict=True):
                    delivered_any |= self._answer(rec, m, ev, now)
                    if ev is None:
                        stuck.add((rec.id, m))
            for rid, msgs in sorted(sending.items(), key=lambda kv: _closes_a_link(recs[kv[0]], kv[1])):
                # a ticket's units go back to the broker only once the authority let go of them: relinquished
                # first, they could be promised and redeemed for another slice while still leased
                for m in sorted(msgs, key=lambda m: m.kind != "close"):
                    if m.kind == "ticket":
                        continue
                    if m.kind == "relinquish" and any(x.kind == "close" for x in recs[rid].outbox):
                        stuck.add((rid, m))  # the close was not delivered: this waits for it
                        continue
                    rec = recs[rid]
                    self.fault(f"{m.kind}:pending")
                    ev = self._deliver(rec, m, now)
                    self.fault(f"{m.kind}:answered")
                    delivered_any |= self._answer(rec, m, ev, now)
                    if ev is None:
                        stuck.add((rid, m))
            for rid in sending:
                self._save(recs[rid])
            if not delivered_any:
                return  # what is left could not be delivered: recover/reap retries it

    def _answer(self, rec: Record, m: rs.Message, event: Any, now: datetime) -> bool:
        """Take `m` out of the outbox and apply the answer; an undeliverable release stays for a retry."""
        if event is None:
            return False
        rec.outbox = [x for x in rec.outbox if x != m]
        rec.r, more = rs.apply(rec.r, event, now)
        rec.outbox += [x for x in more if x not in rec.outbox]
        if rec.r.state in (rs.ACTIVE, rs.ACTIVE_TICKETED):
            rec.provisioned = True
        return True

    def _resume_dependants(self, recs: dict[str, Record], now: datetime) -> None:
        waiting = [rec for rec in recs.values() if rec.r.pending == rs.PRIMING]
        if not waiting:
            return
        known = {rec.id: rec.r for rec in recs.values()}
        for rec in waiting:
            missing = [d for d in rec.r.depends_on if d not in known]
            for d in missing:
                other = self._load(d)
                if other is not None:
                    known[d] = other.r
            rec.r, msgs = rs.on_dependencies(rec.r, known, now)
            rec.outbox += msgs

    def _deliver_tickets(self, batch: list[tuple[Record, rs.Message]], now: datetime) -> list[Any]:
        """One `place` message for a ticket group: the demands of its nodes and links (no unit named); the
        broker's policy chooses, books all or nothing, and answers tickets with the placement of each."""
        batch = sorted(batch, key=lambda rm: rm[0].demand.order)
        nodes, links = [], []
        for rec, m in batch:
            element = replace(rec.demand.element, reservation=rec.id)
            tag = dict(m.inputs).get("vlan")
            if tag is not None and isinstance(element, LinkDemand):
                element = replace(element, vlan_tag=tag)  # a consumer takes the tag its producer chose
            (nodes if isinstance(element, NodeDemand) else links).append(element)
        rec0, m0 = batch[0]
        d0 = rec0.demand  # the request's constraints, and an Update's difference (kept nodes, subnets in use)
        demands = Demands(tuple(nodes), tuple(links), d0.image_policy, d0.bitstream_parts, d0.images, d0.kept,
                          d0.subnets)
        term = Term(m0.start or now, m0.end or (now + timedelta(minutes=10)))
        try:
            answer = self.broker.place(self.name, demands, term, now, group=rec0.group,
                                       authority=getattr(self.authority, "name", "") or "")
        except (Unavailable, TimedOut, RpcError) as exc:
            for rec, _ in batch:
                rec.error_type = type(exc).__name__
            return [rs.FailedRpc(m.request, "ticket", f"broker: {exc.message}") for _, m in batch]
        except GeniError as exc:
            for rec, _ in batch:
                rec.error_type = type(exc).__name__
            return [rs.TicketUpdate(m.request, False, reason=exc.message) for _, m in batch]
        missing = [rec.client_id for rec, _ in batch if rec.id not in answer.tickets]
        if missing:  # a broker that granted less than asked answered wrongly: all or nothing, nothing kept
            for rec, _ in batch:
                rec.error_type = "RpcError"
            why = f"broker: its answer holds no ticket for {', '.join(missing)}"
            return [rs.FailedRpc(m.request, "ticket", why) for _, m in batch]
        out = []
        for rec, m in batch:
            t = answer.tickets[rec.id]
            where = answer.placements.get(rec.id) or {}
            rec.ticket = t
            rec.component_id = where.get("component_id", rec.component_id)
            rec.details = {**rec.details, **dict(where.get("details") or {})}
            if t.labels and rec.kind == "link":
                rec.details["vlan_tag"] = dict(t.labels).get("vlan", rec.details.get("vlan_tag"))
            out.append(rs.TicketUpdate(m.request, True, t.sequence, t.end, t.labels))
        return out

    def _deliver(self, rec: Record, m: rs.Message, now: datetime) -> Any:
        """Send one message to its actor; return the answer as a reservation event (None: not delivered)."""
        actor = "broker" if m.kind in ("extendTicket", "relinquish") else "authority"
        try:
            if m.kind == "extendTicket":
                if rec.ticket is None:
                    return rs.TicketUpdate(m.request, False, reason="no ticket to extend")
                t = self.broker.extend_ticket(rec.ticket, m.end, now=now)
                rec.ticket = t
                return rs.TicketUpdate(m.request, True, t.sequence, t.end, t.labels)
            if m.kind == "relinquish":
                stub = rec.ticket or Ticket(rec.ticket_id, "", self.name, rec.id, (), now, now)
                self.broker.relinquish(stub, now)
                return rs.CloseAck(m.request, "relinquish")
            if m.kind == "redeem":
                if rec.ticket is None:
                    return rs.LeaseUpdate(m.request, False, reason="no ticket to redeem")
                lease, _status = self.authority.redeem(rec.ticket, self._spec(rec, m.inputs), now)
                self._check_lease(lease, rec.ticket)
                rec.lease = lease
                return rs.LeaseUpdate(m.request, True, lease.sequence, lease.end)
            if m.kind == "extendLease":
                if rec.ticket is None:
                    return rs.LeaseUpdate(m.request, False, reason="no ticket to extend the lease with")
                lease = self.authority.extend_lease(rec.lease, rec.ticket, now)
                self._check_lease(lease, rec.ticket)
                rec.lease = lease
                return rs.LeaseUpdate(m.request, True, lease.sequence, lease.end)
            if m.kind == "close":
                self.authority.close(rec.ticket_id, now)
                return rs.CloseAck(m.request, "close")
        except (Unavailable, TimedOut, RpcError) as exc:
            if m.kind in ("relinquish", "close"):
                return None  # stays in the outbox; recover/reap delivers it again
            rec.error_type = type(exc).__name__
            return rs.FailedRpc(m.request, m.kind, f"{actor}: {exc.message}")
        except GeniError as exc:
            if m.kind in ("relinquish", "close"):
                return None
            rec.error_type = type(exc).__name__
            if m.kind in ("extendTicket",):
                return rs.TicketUpdate(m.request, False, reason=exc.message)
            return rs.LeaseUpdate(m.request, False, reason=exc.message)
        raise ValueError(f"unknown message kind {m.kind!r}")

    def _check_lease(self, lease: Lease, ticket: Ticket) -> None:
        """Raise CredentialInvalid unless the authority signed `lease` and it is the lease of `ticket`."""
        verify_lease(lease, self.lease_key)
        wrong = [what for what, ok in (
            ("ticket", lease.ticket == ticket.id), ("reservation", lease.reservation == ticket.reservation),
            ("holder", lease.holder == ticket.holder), ("units", lease.units == ticket.units),
            ("authority", not ticket.authority or lease.authority == ticket.authority),
            ("end", lease.end == ticket.end), ("start", ticket.start <= lease.start < lease.end),
            ("sequence", lease.sequence == ticket.sequence), ("labels", lease.labels == ticket.labels)) if not ok]
        if wrong:
            raise CredentialInvalid(f"lease {lease.id} from authority {lease.authority} does not match ticket "
                                    f"{ticket.id} ({', '.join(wrong)} differ); refused")

    def _spec(self, rec: Record, inputs: Iterable[tuple[str, int]]) -> SliverSpec:
        details = SliverDetails(**rec.details)  # logins: a driver with sshd needs them
        details["slice_urn"] = rec.slice_urn  # a host driver keeps one slice's nodes apart from another's
        details["owner"] = rec.owner_urn  # and boots only images its owner may use
        return SliverSpec(rec.id, rec.kind, rec.client_id, rec.ticket.units if rec.ticket else (),
                          tuple(inputs) or (rec.ticket.labels if rec.ticket else ()), details)

