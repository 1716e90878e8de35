"""Each actor's face, declared once: `BrokerApi` and `AuthorityApi` are what a caller may ask, and which kind
of caller may ask it (`calls_from`). The local actors (broker.broker.Broker, authority.actor.Authority)
implement them; the remote proxies and the servers' handler tables are derived from these declarations
(protocol/remote.py), so a message is written once.

Slice managers ask the broker for promises and what is free, and the authority for leases; an authority
hands its inventory to the broker and takes it back. Reading what a broker delegated and promised is open to
both of its callers."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, TypeVar

from protocol.delegation import Delegation
from protocol.messages import Demands, Maintenance, PlaceAnswer, SliverSpec, SlotAnswer, SlotQuery
from slicex.term import Term
from slicex.ticket import Lease, SignedDelegation, SignedReclaim, Ticket

SLICE_MANAGER = "slice_manager"
AUTHORITY = "authority"
# the site's operator: whoever holds the authority's own key (`slicex maintenance` on the operator's home)
OPERATOR = "operator"

F = TypeVar("F", bound=Callable[..., Any])


def calls_from(*callers: str) -> Callable[[F], F]:
    """Mark a protocol method with the kinds of caller that may call it over the network."""
    def mark(method: F) -> F:
        method.callers = frozenset(callers)  # type: ignore[attr-defined]
        return method
    return mark


class BrokerApi(Protocol):
    """The broker (ORCA's broker actor): places demands into signed tickets over its calendar, extends and
    takes them back, and holds what its authority delegated."""

    @calls_from(SLICE_MANAGER)
    def place(self, holder: str, demands: Demands, term: Term, now: datetime, group: str | None = None,
              dry_run: bool = False, authority: str = "") -> PlaceAnswer:
        """Choose where every demanded node and link goes and book it all or nothing; asking again with
        the same `group` answers the tickets already granted."""
        ...

    @calls_from(SLICE_MANAGER)
    def find_slot(self, holder: str, demands: Demands, query: SlotQuery, now: datetime | None = None,
                  authority: str = "") -> SlotAnswer:
        """The earliest start at which the demands fit for the query's duration (a calendar search; nothing
        is booked), or why none does in its window."""
        ...

    @calls_from(SLICE_MANAGER)
    def extend_ticket(self, ticket: Ticket, end: datetime, limit: datetime | None = None,
                      now: datetime | None = None) -> Ticket:
        """A new ticket for the same units ending at `end`."""
        ...

    @calls_from(SLICE_MANAGER)
    def relinquish(self, ticket: Ticket, now: datetime | None = None) -> int:
        """Give a ticket's units back (idempotent): how many claims were released."""
        ...

    @calls_from(SLICE_MANAGER)
    def query(self, group: str, reservations: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Where each reservation's ticket of `group` stands (ORCA query)."""
        ...

    @calls_from(SLICE_MANAGER)
    def availability(self, known: str = "", now: datetime | None = None,
                     term: Term | None = None) -> dict[str, Any]:
        """What is in use now (or over `term`), with a version callers cache the answer by."""
        ...

    @calls_from(SLICE_MANAGER, AUTHORITY)
    def reclaimed(self, authority: str) -> list[str]:
        """The names `authority` reclaimed from this broker (they stay out when it delegates again)."""
        ...

    @calls_from(SLICE_MANAGER, AUTHORITY)
    def delegations(self, authority: str = "") -> list[dict[str, Any]]:
        """The delegation documents the broker accepted."""
        ...

    @calls_from(SLICE_MANAGER, AUTHORITY)
    def tickets(self) -> dict[str, Any]:
        """Every ticket this broker holds, for an operator's view."""
        ...

    @calls_from(AUTHORITY)
    def accept(self, delegation: SignedDelegation | Delegation) -> None:
        """ORCA claim: an authority delegates inventory (signed: the broker verifies it)."""
        ...

    @calls_from(AUTHORITY)
    def reclaim(self, order: SignedReclaim, now: datetime | None = None) -> tuple[list[str], list[str]]:
        """Take inventory back: (reclaimed now, still promised and draining)."""
        ...


class AuthorityApi(Protocol):
    """The authority (ORCA's site authority): redeems broker tickets into leases on its substrate."""

    @calls_from(SLICE_MANAGER)
    def redeem(self, ticket: Ticket, spec: SliverSpec, now: datetime) -> tuple[Lease, dict[str, Any]]:
        """Turn a ticket into a lease: the lease and the driver's record."""
        ...

    @calls_from(SLICE_MANAGER)
    def extend_lease(self, lease: Lease | None, ticket: Ticket, now: datetime | None = None) -> Lease:
        """Move a lease's end to its extended ticket's end."""
        ...

    @calls_from(SLICE_MANAGER)
    def modify(self, lease_id: str, action: str, now: datetime,
               properties: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """An operational action on a leased unit (ORCA modifyLease): the driver's new record."""
        ...

    @calls_from(SLICE_MANAGER)
    def view(self, lease_id: str) -> dict[str, Any]:
        """What the driver adds to the manifest of a leased unit."""
        ...

    @calls_from(SLICE_MANAGER)
    def status(self, lease_id: str, now: datetime) -> tuple[str, str]:
        """(GENI operational state, error) of a leased unit."""
        ...

    @calls_from(SLICE_MANAGER)
    def close(self, lease_id: str, now: datetime) -> bool:
        """Tear a lease down and free its units (idempotent)."""
        ...

    @calls_from(SLICE_MANAGER)
    def snapshot(self, lease_id: str, name: str, owner: str, public: bool, now: datetime) -> dict[str, Any]:
        """CreateImage: an image of a leased node in the aggregate's catalogue, owned by `owner` (public or
        not); the image's record (urn, name, owner, public, size_bytes, base, created, description)."""
        ...

    @calls_from(OPERATOR)
    def maintenance(self, host: str, back: bool, now: datetime) -> Maintenance:
        """`slicex maintenance HOST [--end]`: take the pools of a host (its component id) out of the broker's
        inventory (a signed reclaim order; what is promised drains), or give them back (a signed delegation)."""
        ...
