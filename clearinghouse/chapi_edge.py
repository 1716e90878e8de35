"""The CH API's XML-RPC edge: one mutual-TLS port (`chapi_port`, default the slice authority's port + 7)
serving the clearinghouse at `/CH`, the slice authority at `/SA` and the member authority at `/MA`, as
omni's `chapi` framework and geni-lib address them. It routes by path and translates nothing; the
authorities are clearinghouse/chapi_authority.py.

The shared TLS server hands a handler the method, params and client certificate but not the path, so this
edge's request handler notes the path of the request being served in a thread-local (the server runs each
request in its own thread)."""

from __future__ import annotations

import threading
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cryptography import x509

from clearinghouse import chapi
from clearinghouse.chapi_authority import ChapiAuthority, Member
from clearinghouse.slice_authority import SliceAuthority
from slicex import pki
from slicex.home import Home
from slicex.tls_xmlrpc import TlsXmlRpcServer, _Handler, server_context

PATHS = ("CH", "SA", "MA")
_request = threading.local()


class _PathHandler(_Handler):
    def do_POST(self) -> None:
        _request.path = urlsplit(self.path).path.strip("/").upper()
        try:
            super().do_POST()
        finally:
            _request.path = ""


def home_directory(home: Home, ca_pem: bytes, authority: str, now: datetime) -> list[Member]:
    """The deployment's users as the member authority lists them: each `<user>-cert.pem` our CA issued in our
    namespace, with its e-mail address and `<user>-ssh.pub`."""
    members = pki.TrustStore(certs=pki.load_certs(ca_pem))
    out = []
    for name in home.users():
        try:
            cert = pki.load_cert(home.user_cert(name).read_bytes())
            members.verify_chain(cert, [], now)
        except Exception:  # noqa: BLE001 - a stray or foreign file is not a member
            continue
        urn = pki.cert_urn(cert)
        if not urn or not urn.lower().startswith(f"urn:publicid:idn+{authority.lower()}+user+"):
            continue
        pub: Path = home.user_ssh_pub(name)
        keys = tuple(line.strip() for line in pub.read_text().splitlines() if line.strip()) if pub.exists() else ()
        out.append(Member(urn, name, pki.cert_email(cert), keys))
    return out


class ChapiServer:
    """The CH, SA and MA on their own mutual-TLS port; `bind` gives it the authorities once its URLs are known."""

    def __init__(self, host: str, port: int, cert_file: str, key_file: str, ca_file: str):
        self.authority: ChapiAuthority | None = None
        self.server = TlsXmlRpcServer((host, port), server_context(cert_file, key_file, ca_file), self._dispatch,
                                      self._reject)
        self.server.RequestHandlerClass = _PathHandler
        self.url = f"https://{host}:{self.server.port}"

    def bind(self, authority: ChapiAuthority) -> ChapiServer:
        self.authority = authority
        return self

    def urls(self) -> dict[str, str]:
        return {p: f"{self.url}/{p}" for p in PATHS}

    def _dispatch(self, method: str, params: tuple, cert: x509.Certificate | None) -> Any:
        path = getattr(_request, "path", "")
        if path not in PATHS:
            return chapi.error(chapi.argument(f"no CH API service at /{path}: use {self.url}/CH, /SA or /MA"))
        if self.authority is None:
            return chapi.error(chapi.ChError(chapi.CONFIGURATION, "the CH API is starting; retry in a moment"))
        return self.authority.call(path, method, params, cert)

    @staticmethod
    def _reject(message: str, too_big: bool = False) -> Any:
        return chapi.error(chapi.argument(message))

    def start(self) -> threading.Thread:
        return self.server.start_background()

    def close(self) -> None:
        self.server.close()


def serve(home: Home, sa: SliceAuthority, host: str, port: int, ca_file: str,
          aggregates: dict[str, str]) -> ChapiServer:
    """The CH API of a deployment: its slice authority's records, identity and members, its aggregates."""
    server = ChapiServer(host, port, str(home.sa_cert), str(home.sa_key), ca_file)
    ca_pem = home.ca_cert.read_bytes()
    return server.bind(ChapiAuthority(sa, lambda: home_directory(home, ca_pem, sa.authority, sa.clock.now()),
                                      server.urls(), aggregates))
