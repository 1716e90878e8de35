"""The broker as a network actor: its server side (methods over mutual TLS), who may call which method, and
the proxy slice managers and authorities use, with the same methods as broker.broker.Broker.

A broker in its own process runs its own clock (ActorProcess): no caller advances it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from broker.broker import Broker, Demand
from broker.delegation import Delegation
from slicex.actor_rpc import ActorClient
from slicex.clock import parse_time, rfc3339
from slicex.errors import BadArgs
from slicex.term import Term
from slicex.ticket import SignedDelegation, SignedReclaim, Ticket

# what each kind of caller may ask: a slice manager asks for promises and what is free; an authority hands
# inventory over and takes it back. Reading what was delegated and promised is open to both.
READS = frozenset({"reclaimed", "delegations", "tickets"})
SLICE_MANAGER_CALLS = READS | {"ticket", "issue", "extend_ticket", "relinquish", "query", "place", "availability"}
AUTHORITY_CALLS = READS | {"accept", "reclaim"}


def broker_callers(slice_manager: str, authority: str) -> dict[str, frozenset[str]]:
    """The broker actor server's callers (certificate URN) and the methods each may call."""
    return {slice_manager: SLICE_MANAGER_CALLS, authority: AUTHORITY_CALLS}


def _t(text: str | None) -> datetime | None:
    return parse_time(text) if text else None


def broker_handlers(broker: Broker) -> dict[str, Any]:
    def ticket(holder, units, start, end, group):
        tickets = broker.ticket(holder, units, parse_time(start), parse_time(end), group=group or None)
        return {rid: t.to_doc() for rid, t in tickets.items()}

    def issue(holder, demands, start, end, now, group, wait_until):
        granted = broker.issue(holder, {rid: Demand.from_doc(d) for rid, d in demands.items()},
                               Term(parse_time(start), parse_time(end)), parse_time(now), group=group or None,
                               wait_until=_t(wait_until))
        return None if granted is None else {rid: t.to_doc() for rid, t in granted.items()}

    def extend_ticket(doc, end, now=""):
        return broker.extend_ticket(Ticket.from_doc(doc), parse_time(end), now=_t(now)).to_doc()

    def relinquish(doc, now=""):
        return broker.relinquish(Ticket.from_doc(doc), _t(now))

    def query(group, reservations):
        return broker.query(group, reservations)

    def place(holder, demands, start, end, now, group, dry_run, authority=""):
        answer = broker.place(holder, demands, Term(parse_time(start), parse_time(end)), parse_time(now),
                              group=group or None, dry_run=bool(dry_run), authority=authority)
        if "tickets" in answer:
            answer = {**answer, "tickets": {rid: t.to_doc() for rid, t in answer["tickets"].items()}}
        return answer

    def availability(known="", now="", start="", end=""):
        term = Term(parse_time(start), parse_time(end)) if start and end else None
        return broker.availability(known, _t(now), term)

    def reclaimed(authority):
        return broker.reclaimed(authority)

    def accept(delegation):
        # a signed document (the authority's grant) is verified by the broker; a bare one is refused by a
        # broker that knows its authorities' keys
        try:
            parsed = (SignedDelegation.from_doc(delegation) if "signature" in delegation
                      else Delegation.from_doc(delegation))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BadArgs(f"broker {broker.name}: not a delegation: {exc!r}") from None
        broker.accept(parsed)
        return True

    def delegations(authority=""):
        return broker.delegations(authority)

    def tickets():
        return broker.tickets()

    def reclaim(order, now=""):
        try:
            parsed = SignedReclaim.from_doc(order)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BadArgs(f"broker {broker.name}: not a reclaim order: {exc!r}") from None
        return list(broker.reclaim(parsed, _t(now)))

    return {"ticket": ticket, "issue": issue, "extend_ticket": extend_ticket, "relinquish": relinquish,
            "query": query, "place": place, "availability": availability, "reclaimed": reclaimed, "accept": accept,
            "reclaim": reclaim, "delegations": delegations, "tickets": tickets}


class RemoteBroker:
    def __init__(self, client: ActorClient, policy: Any = None):
        self.client = client
        self.policy = policy  # unused: the broker process applies the policy it was configured with

    def ticket(self, holder: str, units_by_reservation: Mapping[str, Sequence[str]], start: datetime,
               end: datetime, group: str | None = None) -> dict[str, Ticket]:
        docs = self.client.call("ticket", holder, {k: list(v) for k, v in units_by_reservation.items()},
                                rfc3339(start), rfc3339(end), group or "")
        return {rid: Ticket.from_doc(d) for rid, d in docs.items()}

    def issue(self, holder: str, demands: Mapping[str, Demand], term: Term, now: datetime,
              group: str | None = None, wait_until: datetime | None = None) -> dict[str, Ticket] | None:
        docs = self.client.call("issue", holder, {rid: d.to_doc() for rid, d in demands.items()},
                                rfc3339(term.start), rfc3339(term.end), rfc3339(now), group or "",
                                rfc3339(wait_until) if wait_until else "")
        return None if docs is None else {rid: Ticket.from_doc(d) for rid, d in docs.items()}

    def extend_ticket(self, ticket: Ticket, end: datetime, now: datetime | None = None) -> Ticket:
        return Ticket.from_doc(self.client.call("extend_ticket", ticket.to_doc(), rfc3339(end),
                                                rfc3339(now) if now else ""))

    def relinquish(self, ticket: Ticket, now: datetime | None = None) -> int:
        return self.client.call("relinquish", ticket.to_doc(), rfc3339(now) if now else "")

    def query(self, group: str, reservations: Sequence[str]) -> dict[str, dict[str, Any]]:
        return self.client.call("query", group, list(reservations))

    def place(self, holder: str, demands: Mapping[str, Any], term: Term, now: datetime, group: str | None = None,
              dry_run: bool = False, authority: str = "") -> dict[str, Any]:
        """The broker decides placement (Broker.place); tickets come back as Ticket objects."""
        answer = self.client.call("place", holder, dict(demands), rfc3339(term.start), rfc3339(term.end),
                                  rfc3339(now), group or "", bool(dry_run), authority)
        if "tickets" in answer:
            answer["tickets"] = {rid: Ticket.from_doc(d) for rid, d in answer["tickets"].items()}
        return answer

    def availability(self, known: str = "", now: datetime | None = None, term: Term | None = None) -> dict[str, Any]:
        if term is None:
            return self.client.call("availability", known, rfc3339(now) if now else "")
        return self.client.call("availability", known, rfc3339(now) if now else "", rfc3339(term.start),
                                rfc3339(term.end))

    def reclaimed(self, authority: str) -> list[str]:
        return self.client.call("reclaimed", authority)

    def accept(self, delegation: Delegation | SignedDelegation) -> None:
        """ORCA claim: an authority in another process delegates to this broker (a signed document)."""
        self.client.call("accept", delegation.to_doc())

    def delegations(self, authority: str = "") -> list[dict[str, Any]]:
        """The signed delegation documents the broker accepted."""
        return self.client.call("delegations", authority)

    def tickets(self) -> dict[str, Any]:
        """The broker's tickets and queue (Broker.tickets)."""
        return self.client.call("tickets")

    def reclaim(self, order: SignedReclaim, now: datetime | None = None) -> tuple[list[str], list[str]]:
        free, busy = self.client.call("reclaim", order.to_doc(), rfc3339(now) if now else "")
        return free, busy
