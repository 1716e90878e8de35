"""The development PKI of one deployment: a root CA, the aggregate's and slice authority's certificates,
and user certificates with ssh keys. Keys are written mode 0600."""

from __future__ import annotations

import shutil
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from slicex import pki
from slicex.home import Home


def init_ca(home: Home, authority: str, force: bool = False) -> list[Path]:
    """Create the CA and the AM / SA certificates unless they exist; return the files written."""
    written: list[Path] = []
    if home.ca_cert.exists() and not force:
        return written
    for d in (home.ca_cert.parent, home.am_cert.parent, home.sa_cert.parent, home.trusted_roots):
        d.mkdir(parents=True, exist_ok=True)
    ca_pem, ca_key = pki.create_ca(authority, f"slicex dev CA ({authority})")
    pki.write_cert(home.ca_cert, ca_pem)
    pki.write_key(home.ca_key, ca_key)
    shutil.copyfile(home.ca_cert, home.trusted_roots / f"{authority}-ca.pem")
    written += [home.ca_cert, home.ca_key, home.trusted_roots / f"{authority}-ca.pem"]
    for cert_path, key_path, role in ((home.am_cert, home.am_key, "am"), (home.sa_cert, home.sa_key, "sa")):
        cert, key = pki.issue_certificate(ca_pem, ca_key, f"urn:publicid:IDN+{authority}+authority+{role}",
                                          f"{authority} {role}", is_ca=(role == "sa"), days=3650)
        pki.write_cert(cert_path, cert)
        pki.write_key(key_path, key)
        written += [cert_path, key_path]
    return written


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
    pki.write_key(home.user_ssh_key(name), ssh.private_bytes(serialization.Encoding.PEM,
                                                             serialization.PrivateFormat.OpenSSH,
                                                             serialization.NoEncryption()))
    home.user_ssh_pub(name).write_bytes(
        ssh.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        + f" {name}@{authority}\n".encode())
    return [home.user_cert(name), home.user_key(name), home.user_ssh_pub(name), home.user_ssh_key(name)]


def roots_bundle(home: Home) -> Path:
    """Concatenate trusted_roots/ into one PEM file for the TLS server's client verification."""
    home.roots_bundle.parent.mkdir(parents=True, exist_ok=True)
    pems = [p.read_bytes() for p in sorted(home.trusted_roots.glob("*")) if p.suffix in (".pem", ".crt")]
    home.roots_bundle.write_bytes(b"\n".join(pems))
    return home.roots_bundle
