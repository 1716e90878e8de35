"""Tickets and leases: signed promises of units over a term (SHARP-style).

A broker signs each ticket with its key, so an authority verifies it without calling the broker back. The
signature covers a canonical JSON of every field."""

from __future__ import annotations

import base64
import json
from dataclasses import asdict, dataclass, replace
from datetime import datetime

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding

from slicex.clock import parse_time, rfc3339
from slicex.errors import CredentialInvalid


@dataclass(frozen=True)
class Ticket:
    id: str
    broker: str
    holder: str  # the slice manager (or slice) it was issued to
    reservation: str
    units: tuple[str, ...]  # claim keys: cores, memory chunks, nodes, VLAN tags, FPGA planes
    start: datetime
    end: datetime
    sequence: int = 0
    signature: str = ""

    def payload(self) -> bytes:
        d = asdict(self)
        d.pop("signature")
        d["start"], d["end"] = rfc3339(self.start), rfc3339(self.end)
        d["units"] = list(self.units)
        return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()

    def to_doc(self) -> dict:
        return {**json.loads(self.payload()), "signature": self.signature}

    @staticmethod
    def from_doc(d: dict) -> Ticket:
        return Ticket(d["id"], d["broker"], d["holder"], d["reservation"], tuple(d["units"]), parse_time(d["start"]),
                      parse_time(d["end"]), int(d["sequence"]), d.get("signature", ""))


def load_signing_key(key_pem: bytes):
    """Load a broker key once (loading validates the key, which costs far more than a signature)."""
    return serialization.load_pem_private_key(key_pem, None)


def sign_ticket(ticket: Ticket, key) -> Ticket:
    """Sign with a loaded private key (or PEM bytes, loaded here)."""
    if isinstance(key, bytes):
        key = load_signing_key(key)
    sig = key.sign(ticket.payload(), padding.PSS(padding.MGF1(hashes.SHA256()), padding.PSS.MAX_LENGTH),
                   hashes.SHA256())
    return replace(ticket, signature=base64.b64encode(sig).decode())


def verify_ticket(ticket: Ticket, broker_public_key) -> None:
    """Raise CredentialInvalid unless the broker signed exactly this ticket."""
    try:
        broker_public_key.verify(base64.b64decode(ticket.signature), ticket.payload(),
                                 padding.PSS(padding.MGF1(hashes.SHA256()), padding.PSS.MAX_LENGTH), hashes.SHA256())
    except (InvalidSignature, ValueError):
        raise CredentialInvalid(f"ticket {ticket.id} is not signed by broker {ticket.broker} (or was altered)") from None
