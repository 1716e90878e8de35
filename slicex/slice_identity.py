"""Which slice a credential is for: its URN *and* its UUID.

A slice name can be made again after its slice is gone (GENI slice authorities wait until the old slice's
expiration; a peer's authority or a reset one may not), so the URN alone would hand the old slice's slivers to
whoever holds the new slice. Slice authorities put the slice's UUID in the slice certificate (a `urn:uuid:`
beside the URN in subjectAltName), which every slice credential carries as its target. The aggregate records
that UUID with each sliver it allocates and refuses, with CREDENTIAL_INVALID, a credential for the same URN
that names another UUID, or none: the slice was re-created, and the new slice never reaches the old one's
slivers. Slivers recorded without a UUID (allocated with a credential naming none, or before slivers kept
it) constrain nothing."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from slicex import pki
from slicex.errors import CredentialInvalid

if TYPE_CHECKING:
    from slicex.credentials import Credential


def slice_uuid(credential: Credential) -> str:
    """The slice UUID a verified slice credential names ('' for none): the `urn:uuid:` of the target
    certificate its authority signed. A delegation must keep it: delegations keep the target URN, and a
    delegated credential naming another UUID would let its holder pick which slice of that name he means."""
    named = {pki.cert_uuid(c.target_gid[0]) if c.target_gid else "" for c in credential.chain()}
    if len(named) > 1:
        raise CredentialInvalid(f"the credentials in this delegation chain name different UUIDs for slice "
                                f"{credential.target_urn} ({', '.join(sorted(u or '(none)' for u in named))}); a "
                                f"delegation must keep its parent's target")
    return named.pop()


def check_same_slice(slice_urn: str, presented: str, recorded: Iterable[str]) -> None:
    """Refuse a credential naming slice UUID `presented` for slivers recorded under another UUID."""
    for uuid in sorted({u for u in recorded if u}):
        if not presented:
            raise CredentialInvalid(f"your credential for slice {slice_urn} names no slice UUID (its target "
                                    f"certificate carries no urn:uuid), but the slivers here belong to the slice "
                                    f"of that name with UUID {uuid}; get a current slice credential from your "
                                    f"slice authority")
        if presented != uuid:
            raise CredentialInvalid(f"your credential is for slice {slice_urn} with UUID {presented}, but the slivers "
                                    f"here belong to the slice of that name with UUID {uuid}: the slice was "
                                    f"re-created (deleted and made again) since they were allocated, and a new "
                                    f"slice never reaches the old one's slivers; use another slice name, or wait "
                                    f"until they expire")
