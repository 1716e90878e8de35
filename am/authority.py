"""The authority actor: owns the substrate, redeems broker tickets into leases, extends, modifies and closes
leases through its substrate driver, and reaps expired leases on its own clock."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from slicex.errors import CredentialInvalid, Expired
from slicex.ticket import Ticket, verify_ticket


@dataclass(frozen=True)
class Lease:
    ticket: Ticket
    end: datetime
    sequence: int


class Authority:
    def __init__(self, name: str, driver: Any, broker_keys: dict[str, Any]):
        self.name = name
        self.driver = driver
        self.broker_keys = broker_keys  # broker name → public key, configured when the broker is trusted

    def redeem(self, ticket: Ticket, kind: str, now: datetime) -> tuple[Lease, dict[str, Any]]:
        """Check the broker's signature and the term, then ask the driver for the resource."""
        key = self.broker_keys.get(ticket.broker)
        if key is None:
            raise CredentialInvalid(f"authority {self.name} does not trust broker {ticket.broker}")
        verify_ticket(ticket, key)
        if now >= ticket.end:
            raise Expired(f"ticket {ticket.id} expired at {ticket.end:%Y-%m-%dT%H:%M:%SZ}; allocate again")
        return Lease(ticket, ticket.end, ticket.sequence), self.driver.provisioned(kind, now)

    def extend_lease(self, lease: Lease, ticket: Ticket) -> Lease:
        verify_ticket(ticket, self.broker_keys[ticket.broker])
        return Lease(ticket, ticket.end, ticket.sequence)

    def modify_lease(self, op: dict[str, Any], kind: str, client_id: str, action: str, now: datetime,
                     boot_seconds: float | None) -> dict[str, Any]:
        return self.driver.act(op, kind, client_id, action, now, boot_seconds)

    def expired(self, lease_end: datetime, now: datetime) -> bool:
        return now >= lease_end
