"""The Slice Manager seam: the one interface the AM API endpoint calls.

The endpoint authenticates, authorises, parses options and formats results; everything that takes,
holds or releases resources happens behind this interface (ORCA: Allocate ≈ ticket, Provision ≈ redeem,
Renew ≈ extendTicket + extendLease, Delete ≈ close, PerformOperationalAction ≈ modifyLease)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from rspec.request import Request

ALLOCATED = "geni_allocated"
UNALLOCATED = "geni_unallocated"
PROVISIONED = "geni_provisioned"
UPDATING = "geni_updating"  # a sliver of a staged Update (GENI change set C)
UPDATE_ACTIONS = ("kept", "rewired", "added", "removed", "replaced", "replacing")
"""What the commit of a staged Update does to each sliver it concerns (its `sx_update_action` in Status, its
`update:action` in the manifest; slice_manager/update.py says what each means)."""

PENDING_ALLOCATION = "geni_pending_allocation"
NOTREADY = "geni_notready"
CONFIGURING = "geni_configuring"
STOPPING = "geni_stopping"
READY = "geni_ready"
READY_BUSY = "geni_ready_busy"
FAILED = "geni_failed"

ACTIONS = ("geni_start", "geni_restart", "geni_stop", "geni_update_users")
# the operational states each action may be asked in (what the advertisement's state machine shows)
ALLOWED_ACTIONS = {
    "geni_start": {"geni_notready", "geni_failed"},
    "geni_restart": {"geni_ready", "geni_failed", "geni_configuring"},
    "geni_stop": {"geni_ready", "geni_configuring"},
    "geni_update_users": {"geni_ready"},
}


@dataclass
class Sliver:
    """What the AM knows of one sliver: enough for the sliver struct and the manifest."""

    urn: str
    slice_urn: str
    client_id: str
    kind: str  # "node" | "link"
    allocation_state: str
    operational_state: str
    expires: datetime
    error: str = ""
    component_id: str = ""
    owner_urn: str = ""
    details: dict[str, Any] = field(default_factory=dict)  # host, vlan tag, MACs, login, ...
    slice_uuid: str = ""  # the UUID of the slice it was allocated for (slicex/slice_identity.py), '' if none named


class SliceManager(Protocol):
    def allocate(self, slice_urn: str, owner_urn: str, request: Request, end: datetime,
                 now: datetime, start: datetime | None = None, slice_uuid: str = "") -> list[Sliver]:
        """Tickets for `request`; CredentialInvalid if the slice's live slivers were allocated for another
        UUID of that slice name (checked under the slice's lock, slicex/slice_identity.py)."""
        ...

    def provision(self, sliver_urns: list[str], end: datetime, users: list[dict[str, Any]],
                  now: datetime) -> list[Sliver]: ...

    def renew(self, sliver_urns: list[str], end: datetime, now: datetime, best_effort: bool) -> list[Sliver]: ...

    def perform(self, sliver_urns: list[str], action: str, now: datetime, best_effort: bool,
                users: list[dict[str, Any]]) -> list[Sliver]: ...

    def delete(self, sliver_urns: list[str], now: datetime) -> list[Sliver]: ...

    def update(self, slice_urn: str, sliver_urns: list[str], request: Request, alloc_end: datetime,
               update_end: datetime, now: datetime, best_effort: bool = False, requester: str = "") -> list[Sliver]:
        """AM API Update (slice_manager/update.py): the named slivers (none: the slice's) become `request`;
        with `best_effort` what does not fit is left out (its sliver struct says why) instead of refusing all.
        What it adds is the `requester`'s (the caller's images and datasets, as at Allocate) and charged to him."""
        ...

    def cancel(self, slice_urn: str, sliver_urns: list[str], now: datetime) -> list[Sliver]:
        """AM API Cancel: revert the pending Update, or cancel the named allocated slivers' Allocate."""
        ...

    def slivers(self, slice_urn: str, now: datetime) -> list[Sliver]: ...

    def sliver(self, sliver_urn: str, now: datetime) -> Sliver | None: ...

    def ended(self, slice_urn: str, now: datetime) -> str | None:
        """Why a slice's last slivers here ended by themselves (expiry, failure), if recently; else None."""
        ...

    def shutdown(self, slice_urn: str, now: datetime) -> None: ...

    def is_shut_down(self, slice_urn: str) -> bool: ...

    def request_of(self, slice_urn: str) -> list[Request]: ...

    def reap(self, now: datetime) -> list[str]: ...

    def snapshot(self, sliver_urn: str, name: str, owner: str, public: bool, now: datetime) -> dict[str, Any]:
        """CreateImage: an image of a provisioned node sliver, owned by `owner`; the image's record."""
        ...
