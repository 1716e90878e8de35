"""Speaks-for: a tool acts for a user when the user has signed an ABAC statement
`user.speaks_for_<user keyid> <- tool keyid` (geni_abac, version 1) and the call names the user in
`geni_speaking_for`. Key ids are SubjectKeyIdentifiers (SHA-1 of the public key)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from cryptography import x509

from slicex import pki
from slicex.credentials import create_abac, verify_signed
from slicex.errors import BadArgs, CredentialExpired, CredentialInvalid, CredentialMismatch, GeniError


def create_speaks_for(user_cert_pem: bytes, user_key_pem: bytes, tool_cert_pem: bytes, expires: datetime,
                      chain: list[bytes] | None = None) -> str:
    """The user's statement that the tool speaks for them, signed with the user's key."""
    user = pki.load_cert(user_cert_pem)
    tool = pki.load_cert(tool_cert_pem)
    user_keyid = pki.subject_key_id_hex(user)
    return create_abac(head_keyid=user_keyid, head_mnemonic=pki.cert_urn(user), role=f"speaks_for_{user_keyid}",
                       tail_keyid=pki.subject_key_id_hex(tool), tail_mnemonic=pki.cert_urn(tool), expires=expires,
                       signer_cert_chain=[user_cert_pem, *(chain or [])], signer_key_pem=user_key_pem)


def verify_speaks_for(credentials: list[Any], tool_cert: x509.Certificate, speaking_for_urn: str,
                      trust: pki.TrustStore, now: datetime) -> x509.Certificate:
    """The certificate of the user the tool speaks for, or raise saying why the tool may not."""
    if not credentials:
        raise CredentialInvalid(f"geni_speaking_for names {speaking_for_urn} but no geni_abac speaks-for credential "
                                f"was passed")
    errors: list[GeniError] = []
    tool_keyid = pki.subject_key_id_hex(tool_cert)
    for text in credentials:
        try:
            cred, signers = verify_signed(text, trust, now)
            if cred.type != "abac" or cred.abac is None or cred.parent is not None:
                raise CredentialInvalid("speaks-for credential is not an undelegated ABAC credential")
            user = signers[cred.xml_id][0]
            rt0 = cred.abac.find("rt0")
            if rt0 is None:
                raise CredentialInvalid("speaks-for credential has no rt0 statement")
            head = (rt0.findtext("head/ABACprincipal/keyid") or "").strip().lower()
            role = (rt0.findtext("head/role") or "").strip()
            tail = (rt0.findtext("tail/ABACprincipal/keyid") or "").strip().lower()
            user_keyid = pki.subject_key_id_hex(user)
            if head != user_keyid or role != f"speaks_for_{user_keyid}":
                raise CredentialInvalid("speaks-for statement is not signed by the user it speaks for")
            if tail != tool_keyid:
                raise CredentialMismatch("speaks-for credential names another tool, not the certificate you "
                                         "connected with")
            if pki.cert_urn(user).lower() != speaking_for_urn.lower():
                raise CredentialMismatch(f"speaks-for credential is from {pki.cert_urn(user)}, not "
                                         f"{speaking_for_urn}")
            if cred.expires <= now:
                raise CredentialExpired(f"speaks-for credential expired at {cred.expires:%Y-%m-%dT%H:%M:%SZ}")
            return user
        except GeniError as exc:
            errors.append(exc)
        except BadArgs as exc:  # pragma: no cover - BadArgs is a GeniError; kept for clarity
            errors.append(exc)
    raise errors[-1]
