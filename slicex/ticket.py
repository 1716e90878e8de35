"""Tickets, leases and delegations: signed promises of resources over a term (SHARP-style), and the signed
grant of inventory they are made from.

A broker signs each ticket with its key, so an authority verifies it without calling the broker back; an
authority signs each lease the same way, so a slice manager (or a peer) can check what it holds. The
signature covers a canonical JSON of every field: sorted keys, no spaces, times in RFC 3339, and optional
fields left out while they have their default (so a ticket issued before a field existed still verifies). Its
algorithm is the key's: ECDSA P-256 with SHA-256 for the keys `slicex ca init` makes, RSA-PSS with SHA-256
for the RSA keys of homes made before; the verifier takes it from the signer's certificate, never from the
document.

A ticket names concrete units (`units`, claim keys such as `core:<host>:3`, `vlan:<switch>:1042`): the
broker's policy chose them, and the authority leases exactly those. `labels` are the label values chosen for it (e.g. `("vlan", 1042)`) that reservations depending on it use.

A delegation (an authority's grant of inventory to a broker, ORCA's claim) is signed the same way by the
authority, so a broker accepts inventory only from the authority whose key it holds, and keeps the signed
document to show what it was given. Its `body` is the delegation as data (broker/delegation.py
`Delegation.to_doc`: pools, label sets, substrate description); the kernel signs it without knowing its
shape. A reclaim order (the authority takes inventory back) is signed the same way, with `"kind": "reclaim"`
in what is signed so that neither document's signature passes for the other's. Both carry the authority's
`sequence`: the broker applies them in that order (broker/broker.py `_in_order`)."""

from __future__ import annotations

import base64
import json
from datetime import datetime
from typing import Any

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

from slicex.clock import rfc3339
from slicex.codec import decode, encode
from slicex.errors import CredentialInvalid
from slicex.term import Term

_PSS = padding.PSS(padding.MGF1(hashes.SHA256()), padding.PSS.MAX_LENGTH)
Labels = tuple[tuple[str, int], ...]


_FIELDS: dict[type, tuple[Any, ...]] = {}


def _canonical(obj: Any) -> dict[str, Any]:
    """Every field as JSON-able data, optional ones only when set; the signature itself excluded. What is
    signed, so it stays exactly as it was before these types were Structs (a stored ticket still verifies)."""
    out: dict[str, Any] = {}
    declared = _FIELDS.get(type(obj))
    if declared is None:
        declared = _FIELDS[type(obj)] = msgspec.structs.fields(obj)
    for f in declared:
        if f.name == "signature":
            continue
        v = getattr(obj, f.name)
        if f.name in obj._OPTIONAL and v == f.default:
            continue
        if isinstance(v, datetime):
            v = rfc3339(v)
        elif isinstance(v, tuple):
            v = [list(x) if isinstance(x, tuple) else x for x in v]
        out[f.name] = v
    return out


class Ticket(msgspec.Struct, frozen=True, omit_defaults=True):
    id: str  # "<claim group>/<reservation>": the group owns the units' claims in the store
    broker: str
    holder: str  # the slice manager (or slice) it was issued to
    reservation: str
    units: tuple[str, ...]  # concrete units (claim keys)
    start: datetime
    end: datetime
    sequence: int = 0  # 1 when issued, +1 per extension: a lower one is a stale copy
    signature: str = ""
    labels: Labels = ()
    authority: str = ""  # whose inventory the units are

    _OPTIONAL = ("labels", "authority")

    @property
    def term(self) -> Term:
        return Term(self.start, self.end)

    @property
    def group(self) -> str:
        return self.id.rsplit("/", 1)[0]

    def label(self, name: str) -> int | None:
        return next((v for k, v in self.labels if k == name), None)

    def payload(self) -> bytes:
        return json.dumps(_canonical(self), sort_keys=True, separators=(",", ":")).encode()


class Lease(msgspec.Struct, frozen=True, omit_defaults=True):
    id: str
    authority: str
    ticket: str  # id of the ticket redeemed
    holder: str
    reservation: str
    units: tuple[str, ...]  # always concrete: what the substrate driver set up
    start: datetime
    end: datetime
    sequence: int = 1  # the ticket's sequence it follows: extended with ticket n, the lease is n
    signature: str = ""
    labels: Labels = ()

    _OPTIONAL = ("labels",)

    @property
    def term(self) -> Term:
        return Term(self.start, self.end)

    def payload(self) -> bytes:
        return json.dumps(_canonical(self), sort_keys=True, separators=(",", ":")).encode()



_LEASE_FROM_TICKET = ("holder", "reservation", "units", "start", "end", "sequence", "labels")


def lease_beside(lease: Lease, ticket: Ticket | None) -> dict[str, Any]:
    """A lease stored beside the ticket it redeemed: only the fields that differ from the ticket's (its units,
    term and names usually repeat them), marked `from_ticket`. `lease_from` gives back the same lease, so its
    signed bytes (`payload`) are the same: the signature still verifies. Without a ticket, the whole lease.
    Its `id` stays (what a reader of the store looks a lease up by)."""
    doc = encode(lease)
    if ticket is None:
        return doc
    for k in _LEASE_FROM_TICKET:
        if getattr(lease, k) == getattr(ticket, k):
            doc.pop(k, None)
        elif k not in doc:  # a default (no labels, sequence 0) beside a ticket's other value: spelled out
            doc[k] = encode(getattr(lease, k))
    if lease.ticket == ticket.id:
        del doc["ticket"]
    return {"from_ticket": True, **doc}


def lease_from(d: dict[str, Any], ticket: Ticket | None) -> Lease:
    """The lease `lease_beside` stored (or a whole lease's document, as stored before issue 33)."""
    if not d.get("from_ticket"):
        return decode(d, Lease, "lease")
    if ticket is None:
        raise ValueError("a lease stored beside its ticket, read without it")
    base: dict[str, Any] = {k: encode(getattr(ticket, k)) for k in _LEASE_FROM_TICKET}
    return decode({**base, "ticket": ticket.id, **{k: v for k, v in d.items() if k != "from_ticket"}}, Lease, "lease")


def load_signing_key(key_pem: bytes):
    """Load a signing key once (loading validates the key, which costs far more than a signature)."""
    return serialization.load_pem_private_key(key_pem, None)


class SignedDelegation(msgspec.Struct, frozen=True, omit_defaults=True):
    """An authority's signed grant of inventory to one broker."""

    authority: str  # whose inventory (the name tickets and leases carry)
    broker: str  # the broker it is granted to
    issued: datetime  # by the authority's clock
    body: dict[str, Any]  # the delegation: {authority, broker, pools, label_sets, substrate}
    # the authority numbers its messages to a broker (delegations and reclaims alike, increasing): the broker
    # applies them in that order, so an old document sent again cannot undo a newer one
    sequence: int = 0
    signature: str = ""

    _OPTIONAL = ("sequence",)

    def payload(self) -> bytes:
        return json.dumps(_canonical(self), sort_keys=True, separators=(",", ":")).encode()


class SignedReclaim(msgspec.Struct, frozen=True, omit_defaults=True, tag_field="kind", tag="reclaim"):
    """An authority's signed order to one broker to give back delegated inventory (maintenance), numbered in
    the same sequence as its delegations."""

    authority: str
    broker: str
    issued: datetime  # by the authority's clock
    names: tuple[str, ...]  # pools and label sets
    sequence: int = 0
    signature: str = ""

    _OPTIONAL = ()

    def payload(self) -> bytes:
        return json.dumps({**_canonical(self), "kind": "reclaim"}, sort_keys=True, separators=(",", ":")).encode()



_ECDSA = ec.ECDSA(hashes.SHA256())


def _sign(obj, key):
    if isinstance(key, bytes):
        key = load_signing_key(key)
    if isinstance(key, ec.EllipticCurvePrivateKey):
        signature = key.sign(obj.payload(), _ECDSA)
    elif isinstance(key, rsa.RSAPrivateKey):
        signature = key.sign(obj.payload(), _PSS, hashes.SHA256())
    else:
        raise TypeError(f"cannot sign with a {type(key).__name__}: an RSA or elliptic-curve key is needed")
    return msgspec.structs.replace(obj, signature=base64.b64encode(signature).decode())


def _verify(obj, public_key, what: str) -> None:
    """The algorithm is the public key's (from the signer's certificate), never chosen by the document."""
    try:
        signature = base64.b64decode(obj.signature)
        if isinstance(public_key, ec.EllipticCurvePublicKey):
            public_key.verify(signature, obj.payload(), _ECDSA)
        elif isinstance(public_key, rsa.RSAPublicKey):
            public_key.verify(signature, obj.payload(), _PSS, hashes.SHA256())
        else:
            raise CredentialInvalid(f"{what}: a {type(public_key).__name__} cannot verify it")
    except (InvalidSignature, ValueError):
        raise CredentialInvalid(what) from None


def sign_ticket(ticket: Ticket, key) -> Ticket:
    """Sign with a loaded private key (or PEM bytes, loaded here)."""
    return _sign(ticket, key)


def verify_ticket(ticket: Ticket, broker_public_key) -> None:
    """Raise CredentialInvalid unless the broker signed exactly this ticket."""
    _verify(ticket, broker_public_key, f"ticket {ticket.id} is not signed by broker {ticket.broker} (or was altered)")


def sign_lease(lease: Lease, key) -> Lease:
    return _sign(lease, key)


def verify_lease(lease: Lease, authority_public_key) -> None:
    """Raise CredentialInvalid unless the authority signed exactly this lease."""
    _verify(lease, authority_public_key,
            f"lease {lease.id} is not signed by authority {lease.authority} (or was altered)")


def sign_delegation(delegation: SignedDelegation, key) -> SignedDelegation:
    """Sign with the authority's key (a loaded private key, or PEM bytes)."""
    return _sign(delegation, key)


def sign_reclaim(order: SignedReclaim, key) -> SignedReclaim:
    """Sign with the authority's key (a loaded private key, or PEM bytes)."""
    return _sign(order, key)


def verify_reclaim(order: SignedReclaim, authority_public_key) -> None:
    """Raise CredentialInvalid unless the authority's key signed exactly this reclaim order."""
    if not order.signature:
        raise CredentialInvalid(f"reclaim order from {order.authority} to broker {order.broker} is not signed; a "
                                f"broker gives inventory back only on its authority's signed order")
    _verify(order, authority_public_key,
            f"reclaim order to broker {order.broker} is not signed by authority {order.authority} (or was altered)")


def verify_delegation(delegation: SignedDelegation, authority_public_key) -> None:
    """Raise CredentialInvalid unless the authority's key signed exactly this delegation, and the body names
    the same authority and broker as the signed envelope (a body cannot be moved under another name)."""
    if not delegation.signature:
        raise CredentialInvalid(f"delegation from {delegation.authority} to broker {delegation.broker} is not "
                                f"signed; a broker accepts only inventory its authority signed")
    _verify(delegation, authority_public_key,
            f"delegation to broker {delegation.broker} is not signed by authority {delegation.authority} "
            f"(or was altered)")
    named = (delegation.body.get("authority"), delegation.body.get("broker"))
    if named != (delegation.authority, delegation.broker):
        raise CredentialInvalid(f"delegation signed by {delegation.authority} for broker {delegation.broker} "
                                f"describes inventory of {named[0]} for broker {named[1]}")
