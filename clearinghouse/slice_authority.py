"""The embedded slice authority, speaking what omni's `gcf` framework calls (DESIGN §4): create slices,
issue user and slice credentials signed with xmlsec, renew, delete and list slices.

A new user needs no external portal: `slicex user add NAME` issues a certificate from the dev CA, and omni
gets credentials here. Errors are XML-RPC faults on this interface (the gcf clearinghouse protocol has no
result codes; the fault code is the GENI code of the cause); messages say what to do. A store outage is a
fault saying the store is unavailable and to retry, never a value a client could take for a credential.

Slice names are claimed atomically in the store (`store.claim`) before the slow work (the slice's key and
certificate), so two users asking for one name at once get one owner and one clear refusal. The claim's
owner is a token unique to that creation; it is released when a later CreateSlice finds the record expired,
so an expired slice's name becomes claimable again.

A slice is its URN and its UUID (the `urn:uuid:` beside the URN in the slice certificate, so in every slice
credential's target; the CH API's SLICE_UID). As GENI clearinghouses never reuse a slice name, a name is
never handed to anyone else before the slice expires: `DeleteSlice` only marks the slice deleted (no longer
listed or renewable) and the name stays reserved until the slice's expiration, since slivers its credentials
reached may live until then. Its owner may take it back with CreateSlice (the same slice, the same UUID).
A slice in a project (`<authority>:<project>+slice+<name>`) is made for that project's members only, by the
check the CH API makes (clearinghouse/projects.py)."""

from __future__ import annotations

import logging
import time
import uuid
import xmlrpc.client
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cryptography import x509

from clearinghouse import chapi
from clearinghouse.projects import project_of_slice, require_slice_maker
from slicex import pki
from slicex.clock import Clock, parse_time, rfc3339
from slicex.credentials import create_credential
from slicex.endpoint import Endpoint, Faults, public_methods
from slicex.errors import (
    AlreadyExists,
    BadArgs,
    Busy,
    CredentialSignerUntrusted,
    Forbidden,
    TimedOut,
    Unavailable,
)
from slicex.store import Store
from slicex.store.ownership import Actor, scoped
from slicex.urn import Urn, parse_urn

log = logging.getLogger("slicex.sa")
SLICES = "sa_slices"
NAME_CLAIM = "sa_slice:"  # + slice key: held by the token of the creation that owns the name
CREATE_WAIT_SECONDS = 10.0  # how long a CreateSlice waits for a concurrent creation of the same name
LEFTOVER_CLAIM_SECONDS = 60.0  # a name claim with no live record after this long was left by a crash


def _key(urn: Urn) -> str:
    """Slices are keyed by the lower-cased URN: one slice under every spelling."""
    return str(urn).lower()


def _claim_age(token: str) -> float:
    """Seconds since a name-claim token (owner|uuid|unix time) was taken; infinite if unreadable."""
    try:
        return time.time() - float(token.rsplit("|", 1)[1])
    except (IndexError, ValueError):
        return float("inf")


class SaFaults(Faults):
    """Faults, a store outage said as one: retry in a moment, the slice authority is fine."""

    def refused(self, method: str, err: Exception) -> Any:
        if isinstance(err, (Unavailable, TimedOut)):
            log.warning("%s: store unavailable: %s", method, err.message)
            return xmlrpc.client.Fault(err.code, f"{method}: the slice authority's store is unavailable, retry in a "
                                                 f"moment ({err.message})")
        return super().refused(method, err)


@dataclass
class SaPolicy:
    slice_lifetime: timedelta = timedelta(days=7)
    max_slice_lifetime: timedelta = timedelta(days=60)
    user_credential_lifetime: timedelta = timedelta(days=30)


class SliceAuthority:
    def __init__(self, authority: str, sa_cert_pem: bytes, sa_key_pem: bytes, ca_cert_pem: bytes,
                 ca_key_pem: bytes, store: Store, clock: Clock, aggregates: dict[str, str],
                 url: str = "", policy: SaPolicy | None = None):
        self.authority = authority
        self.sa_cert_pem = sa_cert_pem
        self.sa_key_pem = sa_key_pem
        self.ca_cert_pem = ca_cert_pem
        self.ca_key_pem = ca_key_pem
        self.store = scoped(store, Actor.SLICE_AUTHORITY)
        self.clock = clock
        self.aggregates = aggregates
        self.url = url
        self.policy = policy or SaPolicy()
        self.urn = f"urn:publicid:IDN+{authority}+authority+sa"
        # Members are the users our own CA certified in our namespace. TLS also admits federation peers'
        # users (their roots are trusted for their namespaces), who must not get credentials here.
        self._members = pki.TrustStore(certs=pki.load_certs(ca_cert_pem))

    # ---- edge: XML-RPC dispatch -------------------------------------------------------------------------------
    METHODS = ("GetVersion", "CreateUserCredential", "CreateSlice", "RenewSlice", "DeleteSlice",
               "ListAggregates", "ListMySlices", "GetCredential", "ResolveSlice")

    def endpoint(self) -> Endpoint:
        """The gcf clearinghouse protocol on XML-RPC: each of `METHODS` is the public method of that name, and
        every refusal a fault whose code is the GENI code of its cause."""
        return Endpoint("sa", public_methods(self, self.METHODS), SaFaults("this slice authority"))

    # ---- methods ---------------------------------------------------------------------------------------------
    def GetVersion(self, caller: x509.Certificate) -> dict[str, Any]:
        return {"urn": self.urn, "hostname": self.url, "gcf-ch_api": 2, "slicex_sa": True,
                "authority": self.authority}

    def _caller_urn(self, caller: x509.Certificate) -> str:
        """The caller's URN, once their certificate is shown to be one our CA issued in our namespace."""
        urn = pki.cert_urn(caller)
        if not urn:
            raise BadArgs("your certificate carries no GENI URN in subjectAltName")
        try:
            self._members.verify_chain(caller, [], self.clock.now())
        except CredentialSignerUntrusted as exc:
            raise CredentialSignerUntrusted(f"this slice authority serves members of {self.authority} only, "
                                            f"certified by its own CA: {exc.message}") from None
        return urn

    def _chain(self) -> list[bytes]:
        return [self.sa_cert_pem, self.ca_cert_pem]

    def CreateUserCredential(self, caller: x509.Certificate, user_cert_pem: str = "") -> str:
        """A user credential for the caller (the certificate passed must be the caller's own)."""
        self._caller_urn(caller)  # refuse certificates without a GENI URN
        if user_cert_pem:
            certs = pki.load_certs(user_cert_pem.encode() if isinstance(user_cert_pem, str) else user_cert_pem)
            if not certs or certs[0].public_key().public_numbers() != caller.public_key().public_numbers():
                raise BadArgs("the certificate passed is not the one you connected with")
        caller_pem = caller.public_bytes(pki.serialization.Encoding.PEM)
        now = self.clock.now()
        return create_credential(owner_cert=caller_pem, target_cert=caller_pem,
                                 privileges={"refresh": True, "resolve": True, "info": True},
                                 expires=min(now + self.policy.user_credential_lifetime, caller.not_valid_after_utc),
                                 signer_cert_chain=self._chain(), signer_key_pem=self.sa_key_pem)

    def CreateSlice(self, caller: x509.Certificate, slice_urn: str) -> str:
        """Create the slice if new (the caller owns it) and return a slice credential.

        The name is claimed in the store before the key is generated; a caller that loses the claim waits for
        the winner's record and then gets the answer for an existing slice (its credential if it is the owner,
        AlreadyExists if not)."""
        owner = self._caller_urn(caller)
        urn = parse_urn(slice_urn, "slice")
        if urn.top_authority != self.authority.lower():
            raise BadArgs(f"{slice_urn} belongs to authority {urn.authority}; this slice authority issues slices "
                          f"under {self.authority}")
        extra = None
        project = project_of_slice(self.authority, urn)
        if project is not None and not self._owns_live(urn, owner):
            extra = {"project": require_slice_maker(self.store, self.authority, project, owner,
                                                    self.clock.now())["urn"]}
        record, _created = self.claim_slice(urn, owner, extra)
        if record["owner"].lower() != owner.lower():
            if record.get("deleted"):
                raise AlreadyExists(f"slice {slice_urn} was deleted at {record['deleted']}, and its name is reserved "
                                    f"until {record['expires']}, when the slice would have expired (slice names are "
                                    f"never reused while slivers of the old slice may live); choose another name")
            raise AlreadyExists(f"slice {slice_urn} already exists and belongs to {record['owner']}; "
                                f"choose another slice name")
        self._still_member(record, owner)
        if record.get("deleted"):  # its owner takes a deleted slice back: the same slice, the same UUID
            record = {k: v for k, v in record.items() if k != "deleted"}
            self.store.put(SLICES, _key(urn), record)
        return self._slice_credential(caller, record)

    @staticmethod
    def _still_member(record: dict[str, Any], owner: str) -> None:
        """The creator of a slice whose lead was handed over through the CH API may have been removed from it;
        then this interface gives them nothing either."""
        if chapi.role_of(record, owner) is None:
            raise Forbidden(f"you are no longer a member of slice {record['urn']}: its LEAD removed you (ask them "
                            f"to add you back)")

    def _owns_live(self, urn: Urn, owner: str) -> bool:
        record = self.store.get(SLICES, _key(urn))
        return record is not None and record["owner"].lower() == owner.lower() \
            and parse_time(record["expires"]) > self.clock.now()

    def claim_slice(self, urn: Urn, owner: str, extra: dict[str, Any] | None = None) -> tuple[dict[str, Any], bool]:
        """The live record of slice `urn` and whether this call created it (for `owner`, with `extra` fields
        such as a CH API project or expiration). Shared by CreateSlice and the CH API's create_slice, so both
        interfaces keep one record per slice and one atomic name claim."""
        key, claim = _key(urn), NAME_CLAIM + _key(urn)
        deadline = time.monotonic() + CREATE_WAIT_SECONDS
        while True:
            now = self.clock.now()
            record = self.store.get(SLICES, key)
            if record is not None and parse_time(record["expires"]) > now:
                return record, False
            if record is not None:  # expired: free its name (a no-op if another caller already did)
                self.store.release(claim, record.get("claim", ""))
            token = f"{owner}|{uuid.uuid4().hex}|{time.time():.3f}"
            if self.store.claim(claim, token):
                try:
                    return self._create(urn, owner, token, now, extra), True
                except BaseException:
                    self.store.release(claim, token)
                    raise
            holder = self.store.owner_of(claim)
            if holder is not None and _claim_age(holder) > LEFTOVER_CLAIM_SECONDS \
                    and self.store.get(SLICES, key) is None:
                self.store.release(claim, holder)  # left by a creation that died before writing its record
                continue
            if time.monotonic() > deadline:
                raise Busy(f"slice {urn} is being created by another request; retry in a moment")
            time.sleep(0.05)

    def _create(self, urn: Urn, owner: str, token: str, now: datetime,
                extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The slow part, done only by the holder of the name claim: the slice's certificate and record. The
        slice's UUID (`uid`, the CH API's SLICE_UID) is the one its certificate carries."""
        uid = str((extra or {}).get("uid") or uuid.uuid4())
        cert_pem, _key_pem = pki.issue_certificate(self.ca_cert_pem, self.ca_key_pem, str(urn), urn.name,
                                                   days=self.policy.max_slice_lifetime.days + 1, subject_uuid=uid)
        record = {"urn": str(urn), "owner": owner, "created": rfc3339(now), "claim": token,
                  "expires": rfc3339(now + self.policy.slice_lifetime), "cert": cert_pem.decode()}
        record.update(extra or {})
        record["uid"] = uid
        self.store.put(SLICES, _key(urn), record)
        return record

    def _slice_credential(self, caller: x509.Certificate, record: dict[str, Any]) -> str:
        return create_credential(owner_cert=caller.public_bytes(pki.serialization.Encoding.PEM),
                                 target_cert=record["cert"].encode(), privileges={"*": True},
                                 expires=parse_time(record["expires"]), signer_cert_chain=self._chain(),
                                 signer_key_pem=self.sa_key_pem)

    GetCredential = CreateSlice

    def ResolveSlice(self, caller: x509.Certificate, slice_urn: str) -> dict[str, Any]:
        record = self._owned(caller, slice_urn)
        return {"urn": record["urn"], "owner": record["owner"], "expires": record["expires"]}

    def _owned(self, caller: x509.Certificate, slice_urn: str, deleted_too: bool = False) -> dict[str, Any]:
        owner = self._caller_urn(caller)
        urn = parse_urn(slice_urn, "slice")
        record = self.store.get(SLICES, _key(urn))
        if record is None or parse_time(record["expires"]) <= self.clock.now():
            raise BadArgs(f"no slice {slice_urn} at this slice authority (or it expired)")
        if record["owner"].lower() != owner.lower():
            raise BadArgs(f"slice {slice_urn} belongs to {record['owner']}")
        self._still_member(record, owner)
        if record.get("deleted") and not deleted_too:
            raise BadArgs(f"slice {slice_urn} was deleted at {record['deleted']}; CreateSlice takes it back (its "
                          f"name is yours until {record['expires']})")
        return record

    def RenewSlice(self, caller: x509.Certificate, slice_urn: str, expiration: Any) -> bool:
        record = self._owned(caller, slice_urn)
        now = self.clock.now()
        when = parse_time(expiration if isinstance(expiration, str) else str(expiration))
        if when <= now or when > now + self.policy.max_slice_lifetime:
            return False
        record["expires"] = rfc3339(when)
        self.store.put(SLICES, record["urn"].lower(), record)
        return True

    def DeleteSlice(self, caller: x509.Certificate, slice_urn: str) -> bool:
        """Mark the slice deleted: it is no longer listed or renewable, and no credential is issued for it
        except to its owner taking it back. Its name stays reserved until the slice's expiration, since
        slivers its credentials reached may live until then (aggregates may be anywhere; the SA cannot ask)."""
        record = self._owned(caller, slice_urn, deleted_too=True)
        if not record.get("deleted"):
            record["deleted"] = rfc3339(self.clock.now())
            self.store.put(SLICES, record["urn"].lower(), record)
        return True

    def ListAggregates(self, caller: x509.Certificate) -> list[list[str]]:
        """The aggregates as gcf's clearinghouse lists them: `[urn, url]` pairs (omni's gcf framework unpacks
        each entry as a pair; a struct made it fail, and every omni call without `-a` with it)."""
        return [[urn, url] for urn, url in sorted(self.aggregates.items())]

    def ListMySlices(self, caller: x509.Certificate, user_urn: str = "") -> list[str]:
        owner = self._caller_urn(caller)
        now = self.clock.now()
        return sorted(r["urn"] for r in self.store.scan(SLICES)
                      if r["owner"].lower() == owner.lower() and parse_time(r["expires"]) > now
                      and not r.get("deleted") and chapi.role_of(r, owner) is not None)

    def slice_expiry(self, slice_urn: str) -> datetime | None:
        record = self.store.get(SLICES, slice_urn.lower())
        return parse_time(record["expires"]) if record else None
