"""The exchange point as an ordinary AM API v3 client of each domain's aggregate: mutual TLS with the
exchange point's own certificate, the user's credentials passed through, and `geni_speaking_for` naming
the user (the user's geni_abac speaks-for credential, in the credentials, lets the domain accept that).

A call either answers (a GENI result: success or a refusal with its code) or does not (`NoAnswer`: the
connection was refused or cut, or the timeout passed); the two matter differently to a rollback."""

from __future__ import annotations

import http.client
import socket
import ssl
import xml.parsers.expat
import xmlrpc.client
from dataclasses import dataclass
from typing import Any

from slicex.tls_xmlrpc import client


class NoAnswer(Exception):
    """The domain gave no answer; it may or may not have acted on the call."""


class Refusal(Exception):
    """The domain answered with a GENI error code."""

    def __init__(self, code: int, output: str):
        super().__init__(output)
        self.code = code
        self.output = output


NO_ANSWER = (OSError, socket.timeout, ssl.SSLError, http.client.HTTPException, xmlrpc.client.ProtocolError,
             xml.parsers.expat.ExpatError)


@dataclass(frozen=True)
class Domain:
    """One testbed's aggregate as the exchange point reaches it."""

    urn: str
    url: str


class Relay:
    """Calls one domain's AM API v3 with the exchange point's identity."""

    def __init__(self, cert_file: str, key_file: str, ca_file: str | None, timeout: float):
        self.cert_file, self.key_file, self.ca_file, self.timeout = cert_file, key_file, ca_file, timeout

    def call(self, domain: Domain, method: str, *params: Any) -> Any:
        """The call's `value`; Refusal with the domain's code and output; NoAnswer when there is none."""
        proxy = client(domain.url, self.cert_file, self.key_file, self.ca_file, timeout=self.timeout)
        try:
            out = getattr(proxy, method)(*params)
        except xmlrpc.client.Fault as fault:
            raise Refusal(2, f"{domain.urn} faulted: {fault.faultString}") from None
        except NO_ANSWER as exc:
            raise NoAnswer(f"{domain.urn} ({domain.url}) did not answer {method}: {type(exc).__name__}: {exc}") \
                from None
        finally:
            proxy("close")()
        if not isinstance(out, dict) or not isinstance(out.get("code"), dict):
            raise Refusal(2, f"{domain.urn} answered {method} with something that is not an AM API v3 result")
        code = int(out["code"].get("geni_code", 2))
        if code != 0:
            raise Refusal(code, str(out.get("output") or f"geni_code {code}"))
        return out.get("value")
