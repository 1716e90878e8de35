"""A Python caller's way through the exchange point: fetch its certificate, sign the speaks-for credential
that lets it act for you at each domain, and make a slice that spans testbeds in one call."""

from __future__ import annotations

import socket
import ssl
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from cryptography.hazmat.primitives import serialization

from slicex import pki
from slicex.speaksfor import create_speaks_for
from slicex.tls_xmlrpc import client, client_context


class SepError(Exception):
    """The exchange point refused a call: its GENI code and output."""

    def __init__(self, method: str, code: int, output: str):
        super().__init__(f"{method}: geni_code {code}: {output}")
        self.method, self.code, self.output = method, code, output


def sep_certificate(url: str, cert_file: str, key_file: str, ca_file: str | None = None,
                    timeout: float = 30) -> bytes:
    """The exchange point's certificate (PEM), as its TLS server presents it (it is the tool your speaks-for
    credential names)."""
    u = urlparse(url)
    ctx = client_context(cert_file, key_file, ca_file)
    with socket.create_connection((u.hostname, u.port or 443), timeout=timeout) as raw, \
            ctx.wrap_socket(raw, server_hostname=u.hostname) as tls:
        der = tls.getpeercert(binary_form=True)
    if not der:
        raise ssl.SSLError(f"{url} presented no certificate")
    return pki.load_cert(ssl.DER_cert_to_PEM_cert(der)).public_bytes(serialization.Encoding.PEM)


def speaks_for_credential(user_cert: str | Path, user_key: str | Path, sep_cert_pem: bytes,
                          days: int = 30) -> dict[str, str]:
    """The user's geni_abac speaks-for credential for the exchange point, as an AM API credential struct."""
    text = create_speaks_for(Path(user_cert).read_bytes(), Path(user_key).read_bytes(), sep_cert_pem,
                             datetime.now(UTC).replace(microsecond=0) + timedelta(days=days))
    return {"geni_type": "geni_abac", "geni_version": "1", "geni_value": text}


def span_slice(sep_url: str, user_cert: str | Path, user_key: str | Path, slice_urn: str, slice_credential: str,
               rspec: str, users: list[dict[str, Any]] | None = None, start: bool = True,
               ca_file: str | None = None, timeout: float = 600) -> dict[str, Any]:
    """Allocate, provision and (with `start`) start one slice across the exchange point's domains; returns
    {"manifest": merged manifest, "slivers": every domain's sliver structs}. All or nothing: on any refusal
    the exchange point has undone what it took, and SepError carries its code and why."""
    cert, key = str(user_cert), str(user_key)
    creds = [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": slice_credential},
             speaks_for_credential(cert, key, sep_certificate(sep_url, cert, key, ca_file))]
    sep = client(sep_url, cert, key, ca_file, timeout=timeout)

    def call(method: str, *params: Any) -> Any:
        out = getattr(sep, method)(*params)
        if out["code"]["geni_code"] != 0:
            raise SepError(method, out["code"]["geni_code"], out.get("output", ""))
        return out["value"]

    call("Allocate", slice_urn, creds, rspec, {})
    prov = call("Provision", [slice_urn], creds, {"geni_users": users or []})
    slivers = prov["geni_slivers"]
    if start:
        slivers = call("PerformOperationalAction", [slice_urn], creds, "geni_start", {"geni_users": users or []})
    return {"manifest": prov["geni_rspec"], "slivers": slivers, "credentials": creds}
