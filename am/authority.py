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


def authority_handlers(authority: Authority) -> dict[str, Any]:
    """The authority's methods as a network actor (see slicex.actor_rpc)."""
    from slicex.clock import parse_time

    def redeem(doc, kind, now):
        lease, op = authority.redeem(Ticket.from_doc(doc), kind, parse_time(now))
        return {"ticket": lease.ticket.to_doc(), "end": lease.ticket.to_doc()["end"], "sequence": lease.sequence,
                "op": op}

    def extend_lease(doc):
        lease = authority.extend_lease(None, Ticket.from_doc(doc))
        return {"ticket": lease.ticket.to_doc(), "sequence": lease.sequence}

    return {"redeem": redeem, "extend_lease": extend_lease}


class RemoteAuthority:
    """Proxy with the same methods as Authority, for slice managers in other processes."""

    def __init__(self, client: Any):
        self.client = client

    def redeem(self, ticket: Ticket, kind: str, now: datetime) -> tuple[Lease, dict[str, Any]]:
        from slicex.clock import rfc3339

        out = self.client.call("redeem", ticket.to_doc(), kind, rfc3339(now))
        t = Ticket.from_doc(out["ticket"])
        return Lease(t, t.end, out["sequence"]), out["op"]

    def extend_lease(self, lease: Any, ticket: Ticket) -> Lease:
        out = self.client.call("extend_lease", ticket.to_doc())
        t = Ticket.from_doc(out["ticket"])
        return Lease(t, t.end, out["sequence"])
