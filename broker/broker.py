"""The broker actor: holds inventory an authority delegated to it and issues signed tickets for units of it.

Units are claim keys (am.embed): a ticket is granted by claiming all its units atomically in the store
(owner = the ticket group), so two brokers or AM workers sharing a store never promise one unit twice.
Tickets are signed, so the authority verifies them without calling back."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime

from cryptography import x509

from slicex.errors import Busy, OutOfRange, Refused
from slicex.store import Store
from slicex.ticket import Ticket, load_signing_key, sign_ticket

DELEGATIONS = "delegations"


class Broker:
    def __init__(self, name: str, store: Store, key_pem: bytes, cert: x509.Certificate | None = None):
        self.name = name
        self.store = store
        self.key = load_signing_key(key_pem)
        self.cert = cert

    # ---- delegation ---------------------------------------------------------------------------------------
    def claim_delegation(self, authority: str, prefixes: Sequence[str]) -> None:
        """Accept inventory an authority exports (ORCA claim), as unit prefixes: `core:<host>`, `vlan:<switch>`..."""
        key = f"{self.name}|{authority}"
        doc = self.store.get(DELEGATIONS, key) or {"broker": self.name, "authority": authority, "prefixes": []}
        doc["prefixes"] = sorted(set(doc["prefixes"]) | set(prefixes))
        doc["reclaimed"] = [p for p in doc.get("reclaimed", []) if p not in prefixes]
        self.store.put(DELEGATIONS, key, doc)

    def delegated(self) -> list[str]:
        return sorted(p for d in self.store.scan(DELEGATIONS) if d["broker"] == self.name for p in d["prefixes"])

    def reclaim(self, authority: str, prefixes: Sequence[str]) -> tuple[list[str], list[str]]:
        """The authority takes back delegated inventory that no ticket promises (e.g. a host going into
        maintenance); returns (reclaimed, still promised)."""
        key = f"{self.name}|{authority}"
        doc = self.store.get(DELEGATIONS, key) or {"broker": self.name, "authority": authority, "prefixes": []}
        claims = self.store.all_claims()
        busy = [p for p in prefixes if any(k == p or k.startswith(p + ":") for k in claims)]
        free = [p for p in prefixes if p not in busy]
        doc["prefixes"] = [p for p in doc["prefixes"] if p not in free]
        doc["reclaimed"] = sorted(set(doc.get("reclaimed", [])) | set(free))
        self.store.put(DELEGATIONS, key, doc)
        return free, busy

    def reclaimed(self, authority: str) -> list[str]:
        doc = self.store.get(DELEGATIONS, f"{self.name}|{authority}") or {}
        return list(doc.get("reclaimed", []))

    def _check_delegated(self, keys: Sequence[str]) -> None:
        prefixes = self.delegated()
        if not prefixes:
            return  # a broker nobody delegated to yet refuses nothing: the embedded default before start-up
        for k in keys:
            if not any(k == p or k.startswith(p + ":") for p in prefixes):
                raise Refused(f"broker {self.name}: unit {k} is not in the inventory delegated to it (reclaimed "
                              f"by its authority, e.g. for maintenance)")

    # ---- tickets ------------------------------------------------------------------------------------------
    def ticket(self, holder: str, units_by_reservation: Mapping[str, Sequence[str]], start: datetime,
               end: datetime, group: str | None = None) -> dict[str, Ticket]:
        """Grant all reservations' units or none; return one signed ticket per reservation. `group` names the
        claim owner, so a caller that recorded it first can always relinquish (even after a crash)."""
        group = group or f"ticket:{uuid.uuid4().hex}"
        keys = [k for units in units_by_reservation.values() for k in units]
        self._check_delegated(keys)
        if not self.store.claim_all(keys, group):
            taken = [k for k in keys if self.store.owner_of(k) not in (None, group)]
            raise Busy(f"broker {self.name}: {len(taken)} of {len(keys)} units were promised to someone else "
                       f"meanwhile (e.g. {taken[0] if taken else '?'}); ask again")
        return {rid: sign_ticket(Ticket(f"{group}/{rid}", self.name, holder, rid, tuple(units), start, end, 1),
                                 self.key)
                for rid, units in units_by_reservation.items()}

    def extend_ticket(self, ticket: Ticket, end: datetime, limit: datetime | None = None) -> Ticket:
        if end <= ticket.end and end != ticket.end:
            pass  # shortening is allowed: a renew may ask for less than is held
        if limit is not None and end > limit:
            raise OutOfRange(f"broker {self.name}: cannot extend ticket {ticket.id} past {limit:%Y-%m-%dT%H:%M:%SZ}")
        return sign_ticket(replace(ticket, end=end, sequence=ticket.sequence + 1, signature=""), self.key)

    def relinquish(self, ticket: Ticket) -> int:
        """Give a ticket's units back (always, on close or failure); idempotent."""
        owner = ticket.id.rsplit("/", 1)[0]
        return sum(1 for k in ticket.units if self.store.release(k, owner))
