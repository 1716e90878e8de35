"""X.509 for GENI: a development CA, authority and user certificates carrying the GENI URN in
subjectAltName (plus a urn:uuid and email) and a SubjectKeyIdentifier (speaks-for key ids), and a trust
store that verifies chains to configured roots."""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from slicex.errors import CredentialExpired, CredentialInvalid, CredentialSignerUntrusted

__all__ = ["create_ca", "issue_certificate", "write_key", "write_cert", "cert_urn", "cert_uuid", "cert_email",
           "subject_key_id_hex", "load_certs", "load_cert", "TrustStore", "serialization"]


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem_key(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn[:64])])


def create_ca(authority: str, common_name: str, days: int = 3650) -> tuple[bytes, bytes]:
    """A self-signed root CA for `authority`; returns (cert PEM, key PEM)."""
    key = _key()
    now = datetime.now(UTC) - timedelta(minutes=5)
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
                      is_ca: bool = False, days: int = 365, key_pem: bytes | None = None) -> tuple[bytes, bytes]:
    """A certificate for `urn` signed by the CA; returns (cert PEM, key PEM)."""
    ca = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, None)
    key = serialization.load_pem_private_key(key_pem, None) if key_pem else _key()
    now = datetime.now(UTC) - timedelta(minutes=5)
    not_after = min(now + timedelta(days=days), ca.not_valid_after_utc)
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(urn),
                                     x509.UniformResourceIdentifier(f"urn:uuid:{uuid.uuid4()}")]
    if email:
        names.append(x509.RFC822Name(email))
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


def _sans(cert: x509.Certificate) -> list[x509.GeneralName]:
    try:
        return list(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    except x509.ExtensionNotFound:
        return []


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


def _signed_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    if cert.issuer != issuer.subject:
        return False
    key = issuer.public_key()
    try:
        if isinstance(key, rsa.RSAPublicKey):
            key.verify(cert.signature, cert.tbs_certificate_bytes, padding.PKCS1v15(), cert.signature_hash_algorithm)
        elif isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm))
        else:
            return False
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


class TrustStore:
    """The roots a deployment trusts: PEM files and directories of *.pem / *.crt."""

    def __init__(self, roots: list[str | Path] | None = None, certs: list[x509.Certificate] | None = None):
        self.roots: list[x509.Certificate] = list(certs or [])
        for r in roots or []:
            p = Path(r)
            files = sorted(p.glob("*.pem")) + sorted(p.glob("*.crt")) if p.is_dir() else [p]
            for f in files:
                self.roots.extend(load_certs(f.read_bytes()))

    def roots_pem(self) -> bytes:
        return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in self.roots)

    def is_root(self, cert: x509.Certificate) -> bool:
        return any(cert == r for r in self.roots)

    def verify_chain(self, leaf: x509.Certificate, intermediates: list[x509.Certificate],
                     at: datetime) -> list[x509.Certificate]:
        """The path from `leaf` to a trusted root, or raise saying why there is none."""
        path = [leaf]
        current = leaf
        pool = [c for c in intermediates if c != leaf]
        for _depth in range(10):
            if not (current.not_valid_before_utc <= at <= current.not_valid_after_utc):
                raise CredentialExpired(f"certificate {cert_urn(current) or current.subject.rfc4514_string()} is "
                                        f"valid {current.not_valid_before_utc:%Y-%m-%dT%H:%M:%SZ} to "
                                        f"{current.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}, not at {at:%Y-%m-%dT%H:%M:%SZ}")
            for root in self.roots:
                if current == root or _signed_by(current, root):
                    if current != root:
                        if not (root.not_valid_before_utc <= at <= root.not_valid_after_utc):
                            raise CredentialExpired(f"trusted root {root.subject.rfc4514_string()} has expired")
                        path.append(root)
                    return path
            issuer = next((c for c in pool if c.subject == current.issuer and _signed_by(current, c)), None)
            if issuer is None:
                if any(c.subject == current.issuer for c in pool + self.roots):
                    raise CredentialSignerUntrusted(
                        f"certificate {current.subject.rfc4514_string()} names issuer "
                        f"{current.issuer.rfc4514_string()}, but no trusted certificate of that name signed it")
                raise CredentialSignerUntrusted(
                    f"certificate {cert_urn(leaf) or leaf.subject.rfc4514_string()} does not chain to a root this "
                    f"aggregate trusts (issuer {current.issuer.rfc4514_string()} is unknown)")
            if not _is_ca(issuer):
                raise CredentialInvalid(f"{issuer.subject.rfc4514_string()} issued a certificate but is not a CA")
            path.append(issuer)
            pool.remove(issuer)
            current = issuer
        raise CredentialInvalid("certificate chain is longer than 10")
