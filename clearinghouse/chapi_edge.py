"""The CH API's XML-RPC edge: one mutual-TLS port (`chapi_port`, default the slice authority's port + 7)
serving the clearinghouse at `/CH`, the slice authority at `/SA` and the member authority at `/MA`, as
omni's `chapi` framework and geni-lib address them. It routes by path (slicex.endpoint.Routes), names the v1
method a v2 generic call means, and makes every outcome a CH API result (`ChapiResults`); the authorities are
clearinghouse/chapi_authority.py."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from clearinghouse import chapi
from clearinghouse.chapi_authority import ChapiAuthority, Member
from clearinghouse.slice_authority import SliceAuthority
from slicex import pki
from slicex.endpoint import Endpoint, Routes
from slicex.errors import GeniError
from slicex.home import Home
from slicex.tls_xmlrpc import TlsXmlRpcServer, server_context

PATHS = ("CH", "SA", "MA")


@dataclass(frozen=True)
class ChapiResults:
    """CH API answers: `{code, value, output}` with the CH API's codes and geni-ch's wording, never a fault."""

    service: str  # CH, SA or MA
    refusals: tuple[type[Exception], ...] = (chapi.ChError, GeniError)

    def unknown_method(self, method: str, offered: Sequence[str]) -> Exception:
        return chapi.ChError(chapi.NOT_IMPLEMENTED, f"{method} is not a method of the {self.service} here; it "
                                                    f"offers {', '.join(offered)} (and the v2 generic calls for them)")

    def no_certificate(self, method: str) -> Exception:
        return chapi.ChError(chapi.AUTHENTICATION, "no client certificate: connect with your user certificate")

    def bad_arguments(self, message: str) -> Exception:
        return chapi.argument(message)

    def value(self, method: str, value: Any) -> Any:
        return chapi.ok(value)

    def refused(self, method: str, err: Exception) -> Any:
        return chapi.error(err if isinstance(err, chapi.ChError) else chapi.from_geni(err))  # type: ignore[arg-type]

    def failed(self, method: str, exc: Exception) -> Any:
        return chapi.error(chapi.ChError(chapi.SERVER, f"{method} failed: {type(exc).__name__}: {exc}"))

    def rejected(self, message: str, too_big: bool) -> Any:
        return chapi.error(chapi.argument(message))

    def code_of(self, answer: Any) -> int:
        return int(answer["code"])


def _v1_call(method: str, params: tuple) -> tuple[str, tuple, str]:
    """A v2 generic call (`lookup("SLICE", ...)`) as the v1 method it means."""
    return (*chapi.v1_name(method, params), "")


def endpoints(authority: ChapiAuthority) -> dict[str, Endpoint]:
    """The CH, SA and MA of `authority`, each its own surface."""
    return {p: Endpoint(f"chapi.{p.lower()}", authority.methods(p), ChapiResults(p), unwrap=_v1_call) for p in PATHS}


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

    def __init__(self, host: str, port: int, cert_file: str, key_file: str, ca_file: str,
                 public_host: str | None = None):
        self.server = TlsXmlRpcServer((host, port), server_context(cert_file, key_file, ca_file))
        self.url = f"https://{public_host or host}:{self.server.port}"  # what its lookups name (slicex.yaml public_hostname)

    def bind(self, authority: ChapiAuthority) -> ChapiServer:
        self.server.answer(Routes(endpoints(authority), self._missing, self._reject))
        return self

    def urls(self) -> dict[str, str]:
        return {p: f"{self.url}/{p}" for p in PATHS}

    def _missing(self, path: str) -> dict[str, Any]:
        return chapi.error(chapi.argument(f"no CH API service at /{path}: use {self.url}/CH, /SA or /MA"))

    @staticmethod
    def _reject(message: str, too_big: bool = False) -> Any:
        return chapi.error(chapi.argument(message))

    def start(self) -> threading.Thread:
        return self.server.start_background()

    def close(self) -> None:
        self.server.close()


def serve(home: Home, sa: SliceAuthority, host: str, port: int, ca_file: str,
          aggregates: dict[str, str], public_host: str | None = None) -> ChapiServer:
    """The CH API of a deployment: its slice authority's records, identity and members, its aggregates; it
    listens on `host` and names its services under `public_host` when given."""
    server = ChapiServer(host, port, str(home.sa_cert), str(home.sa_key), ca_file, public_host)
    ca_pem = home.ca_cert.read_bytes()
    return server.bind(ChapiAuthority(sa, lambda: home_directory(home, ca_pem, sa.authority, sa.clock.now()),
                                      server.urls(), aggregates))
