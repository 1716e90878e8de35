"""X.509 for GENI: a development CA, authority and user certificates carrying the GENI URN in
subjectAltName (plus a urn:uuid and email) and a SubjectKeyIdentifier (speaks-for key ids), and a trust
store that validates paths to configured roots, each root bound to the URN namespaces it may vouch for."""

from __future__ import annotations

import functools
import logging
import os
import threading
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import (
    Criticality,
    ExtensionPolicy,
    PolicyBuilder,
    Store,
    VerificationError,
)

from slicex.errors import CredentialExpired, CredentialInvalid, CredentialSignerUntrusted

log = logging.getLogger("slicex.pki")

BACKDATE = timedelta(hours=1)
"""Certificates start an hour before they are issued (as public CAs do): a peer whose clock is behind ours, or
a credential checked against a time taken a little earlier, still finds them valid."""

__all__ = ["create_ca", "issue_certificate", "write_key", "write_cert", "cert_urn", "cert_uuid", "cert_email",
           "subject_key_id_hex", "load_certs", "load_cert", "TrustStore", "TrustedRoot", "namespace_covers",
           "urn_authority", "serialization"]


KEY_KINDS = ("rsa", "ec")
"""`rsa`: RSA-2048, what GENI tools expect of users, slice authorities and CAs (xmlsec signs credentials
rsa-sha256). `ec`: ECDSA P-256, for identities only slicex itself checks (the AM's TLS certificate, the broker's
and the authority's signatures): a P-256 signature costs a tenth of an RSA-2048 one, and a TLS server signs
once per handshake."""


def _key(kind: str = "rsa") -> rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey:
    if kind == "ec":
        return ec.generate_private_key(ec.SECP256R1())
    if kind != "rsa":
        raise ValueError(f"unknown key kind {kind!r}: one of {', '.join(KEY_KINDS)}")
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem_key(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn[:64])])


def create_ca(authority: str, common_name: str, days: int = 3650) -> tuple[bytes, bytes]:
    """A self-signed root CA for `authority`; returns (cert PEM, key PEM)."""
    key = _key()
    now = datetime.now(UTC) - BACKDATE
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (x509.CertificateBuilder()
            .subject_name(_name(common_name)).issuer_name(_name(common_name))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectAlternativeName([
                x509.UniformResourceIdentifier(f"urn:publicid:IDN+{authority}+authority+ca"),
                x509.UniformResourceIdentifier(f"urn:uuid:{uuid.uuid4()}")]), critical=False)
            .add_extension(ski, critical=False)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def issue_certificate(ca_cert_pem: bytes, ca_key_pem: bytes, urn: str, common_name: str, email: str | None = None,
                      is_ca: bool = False, days: int = 365, key_pem: bytes | None = None,
                      subject_uuid: str | None = None, dns_names: tuple[str, ...] = (),
                      key_kind: str = "rsa") -> tuple[bytes, bytes]:
    """A certificate for `urn` signed by the CA; returns (cert PEM, key PEM). `subject_uuid` is the
    `urn:uuid:` it carries beside the URN (a new one if not given): a slice keeps its UUID across the
    certificates issued for it over its life. `dns_names` go into subjectAltName too: the names a server
    answers TLS under (the AM's public hostname). `key_kind` is the new key's (KEY_KINDS) when `key_pem` is
    not given."""
    ca = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, None)
    key = serialization.load_pem_private_key(key_pem, None) if key_pem else _key(key_kind)
    now = datetime.now(UTC) - BACKDATE
    not_after = min(now + timedelta(days=days), ca.not_valid_after_utc)
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(urn),
                                     x509.UniformResourceIdentifier(f"urn:uuid:{subject_uuid or uuid.uuid4()}")]
    if email:
        names.append(x509.RFC822Name(email))
    names += [x509.DNSName(name) for name in dns_names]
    builder = (x509.CertificateBuilder()
               .subject_name(_name(common_name)).issuer_name(ca.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now).not_valid_after(not_after)
               .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
               .add_extension(x509.SubjectAlternativeName(names), critical=False)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.public_key()), critical=False))
    if not is_ca:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def write_key(path: str | Path, key_pem: bytes) -> None:
    """Write a private key readable by its owner only (created 0600, never world-readable)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.exists():
        p.unlink()
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key_pem)


def write_cert(path: str | Path, pem: bytes) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(pem)


def load_certs(pem: bytes | str) -> list[x509.Certificate]:
    """Every certificate in a PEM bundle, in order."""
    data = pem.encode() if isinstance(pem, str) else pem
    try:
        return x509.load_pem_x509_certificates(data)
    except Exception:  # noqa: BLE001 - any malformed certificate (ValueError, InvalidVersion, ...) is "none"
        return []


def load_cert(pem: bytes | str) -> x509.Certificate:
    certs = load_certs(pem)
    if not certs:
        raise CredentialInvalid("not a PEM certificate")
    return certs[0]


@functools.lru_cache(maxsize=4096)
def _sans(cert: x509.Certificate) -> tuple[x509.GeneralName, ...]:
    """The certificate's subjectAltNames; cached per certificate (equal by DER): a call asks its caller's URN
    a dozen times, and each decode of the extensions cost about 20 µs."""
    try:
        return tuple(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    except x509.ExtensionNotFound:
        return ()


def cert_urn(cert: x509.Certificate | bytes | str) -> str:
    """The `urn:publicid:IDN+...` URI in subjectAltName, or '' if none."""
    c = cert if isinstance(cert, x509.Certificate) else load_cert(cert)
    for n in _sans(c):
        if isinstance(n, x509.UniformResourceIdentifier) and n.value.startswith("urn:publicid:IDN+"):
            return n.value
    return ""


def cert_uuid(cert: x509.Certificate) -> str:
    for n in _sans(cert):
        if isinstance(n, x509.UniformResourceIdentifier) and n.value.startswith("urn:uuid:"):
            return n.value[len("urn:uuid:"):]
    return ""


def cert_email(cert: x509.Certificate) -> str:
    for n in _sans(cert):
        if isinstance(n, x509.RFC822Name):
            return n.value
    return ""


def subject_key_id_hex(cert: x509.Certificate) -> str:
    """SubjectKeyIdentifier as lower-case hex (speaks-for key ids); computed from the key if absent."""
    try:
        ski = cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        ski = x509.SubjectKeyIdentifier.from_public_key(cert.public_key())
    return ski.digest.hex()


def namespace_covers(namespace: str, authority: str) -> bool:
    """GENI namespace rule: authority `ns` vouches for `ns` and its sub-authorities `ns:sub` (case-insensitive)."""
    ns, auth = namespace.lower(), authority.lower()
    return auth == ns or auth.startswith(ns + ":")


def urn_authority(cert: x509.Certificate) -> str | None:
    """The authority part of the certificate's GENI URN, or None if it carries none."""
    urn = cert_urn(cert)
    if not urn:
        return None
    parts = urn[len("urn:publicid:IDN+"):].split("+")
    return parts[0] if len(parts) == 3 and parts[0] else None


class LruCache:
    """A bounded, thread-safe map that forgets the least recently used entry: for verification results that
    are expensive to compute and asked for again with every call."""

    def __init__(self, size: int = 4096):
        self.size = size
        self._items: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


@dataclass(frozen=True)
class TrustedRoot:
    """A root certificate and the URN namespaces it may vouch for (its own authority unless configured)."""

    cert: x509.Certificate
    namespaces: tuple[str, ...]
    source: str


# GENI authority certificates (slice authorities that also sign credentials, CAs without keyUsage) are valid
# RFC 5280 but not web PKI: issuers must assert basicConstraints cA (the validator checks it and path length);
# leaves may be authorities themselves.
_CA_POLICY = ExtensionPolicy.permit_all().require_present(x509.BasicConstraints, Criticality.AGNOSTIC, None)
_EE_POLICY = ExtensionPolicy.permit_all()


class TrustStore:
    """The roots a deployment trusts, each bound to the namespaces it may vouch for.

    Roots come from PEM files and directories of *.pem / *.crt. A root's namespace is the authority of the
    URN in its subjectAltName (`urn:publicid:IDN+<ns>+authority+ca`), or what `namespaces` says for its file
    name (a string or a list); a root with neither vouches for nothing and is set aside in `ignored`."""

    def __init__(self, roots: list[str | Path] | None = None, certs: list[x509.Certificate] | None = None,
                 namespaces: Mapping[str, str | list[str]] | None = None):
        configured = {name: (ns,) if isinstance(ns, str) else tuple(ns) for name, ns in (namespaces or {}).items()}
        self._paths = LruCache(4096)  # (leaf, intermediates) → (path, valid from, valid until)
        self.generation = 0  # counts replacements of roots: results verified under older roots are stale
        self.trusted: list[TrustedRoot] = []
        self.ignored: list[str] = []
        for cert in certs or []:
            self._add(cert, (), "certificate")
        for r in roots or []:
            p = Path(r)
            files = sorted(p.glob("*.pem")) + sorted(p.glob("*.crt")) if p.is_dir() else [p]
            for f in files:
                for cert in load_certs(f.read_bytes()):
                    self._add(cert, configured.get(f.name, ()), str(f.name))

    def _add(self, cert: x509.Certificate, namespaces: tuple[str, ...], source: str) -> None:
        own = urn_authority(cert)
        chosen = namespaces or ((own,) if own else ())
        if not chosen:
            self.ignored.append(f"{source}: root {cert.subject.rfc4514_string()} names no GENI authority and no "
                                f"namespace is configured for it, so it vouches for nothing")
            log.warning(self.ignored[-1])
            return
        self.trusted.append(TrustedRoot(cert, tuple(n.lower() for n in chosen), source))

    def set_roots(self, source: str, certs: list[x509.Certificate], namespaces: tuple[str, ...]) -> None:
        """Replace the roots that came from `source` (a federation peer's, refreshed) with `certs`, bound to
        `namespaces`; paths validated before are validated again, so a dropped root vouches for nothing."""
        kept = [r for r in self.trusted if r.source != source]
        self.trusted = kept + [TrustedRoot(c, tuple(n.lower() for n in namespaces), source) for c in certs]
        self._paths = LruCache(4096)
        self.generation += 1

    @property
    def roots(self) -> list[x509.Certificate]:
        return [r.cert for r in self.trusted]

    def roots_pem(self) -> bytes:
        return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in self.roots)

    def is_root(self, cert: x509.Certificate) -> bool:
        return any(cert == r for r in self.roots)

    def verify_chain(self, leaf: x509.Certificate, intermediates: list[x509.Certificate],
                     at: datetime) -> list[x509.Certificate]:
        """The path from `leaf` to a trusted root (RFC 5280 path validation by cryptography), every
        certificate on it inside the namespace of that root; or raise saying why there is none."""
        def name() -> str:  # for refusals only: reading the subjectAltName costs as much as the cached check
            return cert_urn(leaf) or leaf.subject.rfc4514_string()

        if not (leaf.not_valid_before_utc <= at <= leaf.not_valid_after_utc):
            raise CredentialExpired(f"certificate {name()} is valid {leaf.not_valid_before_utc:%Y-%m-%dT%H:%M:%SZ} "
                                    f"to {leaf.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}, not at {at:%Y-%m-%dT%H:%M:%SZ}")
        trusted, paths = self.trusted, self._paths  # one consistent set while a peer's roots are replaced
        if not trusted:
            raise CredentialSignerUntrusted("this aggregate trusts no root certificate")
        key = (leaf.fingerprint(hashes.SHA256()), *(c.fingerprint(hashes.SHA256()) for c in intermediates))
        known = paths.get(key)
        if known is not None and known[1] <= at <= known[2]:
            return list(known[0])
        verifier = (PolicyBuilder().store(Store([r.cert for r in trusted])).time(at).max_chain_depth(8)
                    .extension_policies(ca_policy=_CA_POLICY, ee_policy=_EE_POLICY).build_client_verifier())
        try:
            path = list(verifier.verify(leaf, [c for c in intermediates if c != leaf]).chain)
        except VerificationError as exc:
            expired = [c for c in intermediates + [r.cert for r in trusted]
                       if c.subject == leaf.issuer and not (c.not_valid_before_utc <= at <= c.not_valid_after_utc)]
            if expired:
                raise CredentialExpired(f"certificate {name()}: its issuer {expired[0].subject.rfc4514_string()} is "
                                        f"not valid at {at:%Y-%m-%dT%H:%M:%SZ}") from None
            raise CredentialSignerUntrusted(f"certificate {name()} does not chain to a root this aggregate trusts "
                                            f"(issuer {leaf.issuer.rfc4514_string()}): {exc}") from None
        root = next(r for r in trusted if r.cert == path[-1])
        for cert in path[:-1]:
            authority = urn_authority(cert)
            if authority is not None and not any(namespace_covers(ns, authority) for ns in root.namespaces):
                raise CredentialSignerUntrusted(
                    f"{cert_urn(cert)} is outside the namespace its root {root.cert.subject.rfc4514_string()} "
                    f"({root.source}) may vouch for ({', '.join(root.namespaces)})")
        paths.put(key, (tuple(path), max(c.not_valid_before_utc for c in path),
                              min(c.not_valid_after_utc for c in path)))
        return path
