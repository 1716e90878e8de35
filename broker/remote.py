"""The broker as a network actor: its server side (methods over mutual TLS) and the proxy slice managers
use, with the same methods as broker.broker.Broker."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from broker.broker import Broker
from slicex.actor_rpc import ActorClient
from slicex.clock import parse_time, rfc3339
from slicex.ticket import Ticket


def broker_handlers(broker: Broker) -> dict[str, Any]:
    def ticket(holder, units, start, end, group):
        tickets = broker.ticket(holder, units, parse_time(start), parse_time(end), group=group or None)
        return {rid: t.to_doc() for rid, t in tickets.items()}

    def extend_ticket(doc, end):
        return broker.extend_ticket(Ticket.from_doc(doc), parse_time(end)).to_doc()

    def relinquish(doc):
        return broker.relinquish(Ticket.from_doc(doc))

    return {"ticket": ticket, "extend_ticket": extend_ticket, "relinquish": relinquish}


class RemoteBroker:
    def __init__(self, client: ActorClient):
        self.client = client

    def ticket(self, holder: str, units_by_reservation: Mapping[str, Sequence[str]], start: datetime,
               end: datetime, group: str | None = None) -> dict[str, Ticket]:
        docs = self.client.call("ticket", holder, {k: list(v) for k, v in units_by_reservation.items()},
                                rfc3339(start), rfc3339(end), group or "")
        return {rid: Ticket.from_doc(d) for rid, d in docs.items()}

    def extend_ticket(self, ticket: Ticket, end: datetime) -> Ticket:
        return Ticket.from_doc(self.client.call("extend_ticket", ticket.to_doc(), rfc3339(end)))

    def relinquish(self, ticket: Ticket) -> int:
        return self.client.call("relinquish", ticket.to_doc())
