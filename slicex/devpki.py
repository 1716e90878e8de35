"""The development PKI of one deployment: a root CA, one certificate per actor, and user certificates with
ssh keys. Keys are written mode 0600.

Each actor has its own key and URN, so a stolen or misused key speaks for one actor only:
  am         `...+authority+am`         the AM API's TLS identity, and the slice manager's as an actor client
  sa         `...+authority+sa`         the slice authority (signs credentials; a CA for its namespace)
  broker     `...+authority+broker`     signs tickets; TLS identity of the broker actor server
  authority  `...+authority+authority`  signs leases; TLS identity of the authority actor server

The slice authority's key (and the CA's and users') is RSA: GENI tools check the credentials it signs and the
certificates it issues. The AM's, the broker's and the authority's are ECDSA P-256 (`ACTOR_KEY_KINDS`): only
slicex checks what they sign, and the AM signs once per TLS handshake. A home made before keeps its RSA keys;
signatures are checked by the key type of the certificate (slicex/ticket.py)."""

from __future__ import annotations

import contextlib
import fcntl
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from slicex import pki
from slicex.errors import CredentialInvalid, CredentialSignerUntrusted, ServerError
from slicex.home import Home

ACTOR_ROLES = ("am", "sa", "broker", "authority")
ACTOR_KEY_KINDS = {"am": "ec", "sa": "rsa", "broker": "ec", "authority": "ec"}


def actor_urn(authority: str, role: str) -> str:
    """The URN an actor's certificate carries (what its peers pin)."""
    return f"urn:publicid:IDN+{authority}+authority+{role}"


def actor_files(home: Home, role: str) -> tuple[Path, Path]:
    """(certificate, key) of one actor in a home."""
    files = {"am": (home.am_cert, home.am_key), "sa": (home.sa_cert, home.sa_key),
             "broker": (home.broker_cert, home.broker_key), "authority": (home.authority_cert, home.authority_key)}
    if role not in files:
        raise ValueError(f"unknown actor {role!r}: one of {', '.join(ACTOR_ROLES)}")
    return files[role]


@contextlib.contextmanager
def _pki_lock(home: Home) -> Iterator[None]:
    """Serialise PKI writes: the broker, authority and AM processes of one home may start at once, and two
    of them issuing the same missing certificate would leave a key that does not match its certificate."""
    home.ca_cert.parent.mkdir(parents=True, exist_ok=True)
    with open(home.ca_cert.parent / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def init_ca(home: Home, authority: str, force: bool = False) -> list[Path]:
    """Create the CA unless it exists (or `force`), then every actor certificate that is missing (a home made
    by an older version gets the ones it lacks; existing ones are kept). Returns the files written."""
    with _pki_lock(home):
        written: list[Path] = []
        if force or not home.ca_cert.exists():
            home.trusted_roots.mkdir(parents=True, exist_ok=True)
            ca_pem, ca_key = pki.create_ca(authority, f"slicex dev CA ({authority})")
            pki.write_cert(home.ca_cert, ca_pem)
            pki.write_key(home.ca_key, ca_key)
            shutil.copyfile(home.ca_cert, home.trusted_roots / f"{authority}-ca.pem")
            written += [home.ca_cert, home.ca_key, home.trusted_roots / f"{authority}-ca.pem"]
        written += _issue_missing(home, authority, replace=force)
        return written


def ensure_actor_identities(home: Home, authority: str) -> list[Path]:
    """At start-up: issue the actor certificates an older home lacks (never replacing one); the CA must
    exist. Returns the files written."""
    if not home.ca_cert.exists():
        raise ServerError(f"no CA in {home.root}: run `slicex ca init` first")
    if all(all(p.exists() for p in actor_files(home, role)) for role in ACTOR_ROLES) and not _am_lacks_name(home):
        return []
    with _pki_lock(home):
        return _issue_missing(home, authority, replace=False)


def _issue_missing(home: Home, authority: str, replace: bool) -> list[Path]:
    written: list[Path] = []
    todo = [r for r in ACTOR_ROLES if replace or not all(p.exists() for p in actor_files(home, r))
            or (r == "am" and _am_lacks_name(home))]
    if not todo:
        return written
    if not home.ca_key.exists():
        raise ServerError(f"{home.root} lacks the certificates of {', '.join(todo)} and the CA key to issue them "
                          f"({home.ca_key}); issue them with the CA and copy them there")
    ca_pem, ca_key = home.ca_cert.read_bytes(), home.ca_key.read_bytes()
    for role in todo:
        cert_path, key_path = actor_files(home, role)
        # the AM's TLS certificate also names the DNS name clients reach it by (slicex.yaml public_hostname), as
        # Fed4FIRE asks of an aggregate; a certificate issued before the name was set is issued again, same key
        dns = _am_dns_names(home) if role == "am" else ()
        keep = key_path.read_bytes() if role == "am" and not replace and key_path.exists() and cert_path.exists() \
            else None
        cert, key = pki.issue_certificate(ca_pem, ca_key, actor_urn(authority, role), f"{authority} {role}",
                                          is_ca=(role == "sa"), days=3650, key_pem=keep, dns_names=dns,
                                          key_kind=ACTOR_KEY_KINDS[role])
        pki.write_key(key_path, key)
        pki.write_cert(cert_path, cert)
        written += [cert_path, key_path]
    return written


def _am_dns_names(home: Home) -> tuple[str, ...]:
    name = home.config().public_hostname
    return (name,) if name else ()


def _am_lacks_name(home: Home) -> bool:
    """Whether the AM's certificate exists but lacks the DNS name slicex.yaml's public_hostname gives."""
    wanted = _am_dns_names(home)
    if not wanted or not home.am_cert.exists():
        return False
    cert = pki.load_cert(home.am_cert.read_bytes())
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return True
    return not set(wanted) <= {n.lower() for n in names.get_values_for_type(x509.DNSName)}


def actor_public_key(home: Home, role: str, authority: str) -> Any:
    """The public key of an actor's certificate, after checking the deployment CA issued it for that actor's
    URN: the key that verifies what the actor signs (tickets: broker, leases: authority)."""
    cert_path, _ = actor_files(home, role)
    cert = pki.load_cert(cert_path.read_bytes())
    ca = pki.load_cert(home.ca_cert.read_bytes())
    check_actor_certificate(cert, ca, actor_urn(authority, role))
    return cert.public_key()


def check_actor_certificate(cert: x509.Certificate, ca: x509.Certificate, urn: str,
                            at: datetime | None = None) -> None:
    """Raise unless `ca` issued `cert` directly, it is valid at `at`, and it names `urn`."""
    try:
        cert.verify_directly_issued_by(ca)
    except Exception:  # noqa: BLE001 - wrong issuer name, bad signature, unsupported key: all "not ours"
        raise CredentialSignerUntrusted(f"certificate of {pki.cert_urn(cert) or cert.subject.rfc4514_string()} "
                                        f"was not issued by the deployment CA") from None
    at = at or datetime.now(UTC)
    if not cert.not_valid_before_utc <= at <= cert.not_valid_after_utc:
        raise CredentialInvalid(f"certificate of {urn} is not valid at {at:%Y-%m-%dT%H:%M:%SZ}")
    if pki.cert_urn(cert).lower() != urn.lower():
        raise CredentialInvalid(f"certificate names {pki.cert_urn(cert) or 'no URN'}, expected {urn}")


def add_user(home: Home, authority: str, name: str, email: str | None = None) -> list[Path]:
    """Issue a user certificate (URN in subjectAltName, SubjectKeyIdentifier) and an ssh key pair."""
    from slicex.urn import parse_urn

    parse_urn(f"urn:publicid:IDN+{authority}+user+{name}", "user")
    ca_pem = home.ca_cert.read_bytes()
    ca_key = home.ca_key.read_bytes()
    cert, key = pki.issue_certificate(ca_pem, ca_key, f"urn:publicid:IDN+{authority}+user+{name}", name,
                                      email=email or f"{name}@{authority}", days=365)
    pki.write_cert(home.user_cert(name), cert)
    pki.write_key(home.user_key(name), key)
    ssh = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = home.user_ssh_private(name)
    pki.write_key(private, ssh.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                             serialization.NoEncryption()))
    home.user_ssh_pub(name).write_bytes(
        ssh.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        + f" {name}@{authority}\n".encode())
    (home.root / f"{name}-ssh.key").unlink(missing_ok=True)  # a re-issued user's old key no longer pairs with .pub
    return [home.user_cert(name), home.user_key(name), home.user_ssh_pub(name), private]


def roots_bundle(home: Home) -> Path:
    """Concatenate trusted_roots/ into one PEM file for the TLS server's client verification."""
    home.roots_bundle.parent.mkdir(parents=True, exist_ok=True)
    pems = [p.read_bytes() for p in sorted(home.trusted_roots.glob("*")) if p.suffix in (".pem", ".crt")]
    home.roots_bundle.write_bytes(b"\n".join(pems))
    return home.roots_bundle
