"""Actor calls over HTTPS with mutual TLS (the scaled-out deployment): a server that exposes one actor's
methods to trusted peers, and a client proxy that turns faults back into GENI errors.

Both ends authenticate each other against the deployment CA (not the federation roots: a peer testbed's CA
may vouch for users, never for our actors). The server answers only peers whose certificate names an
allowed URN; the client talks only to a server whose certificate names the actor it means to reach, and
checks that before a byte of the request is sent."""

from __future__ import annotations

import http.client
import logging
import ssl
import threading
import xmlrpc.client
from collections.abc import Callable, Collection, Mapping
from typing import Any
from xml.parsers.expat import ExpatError

from cryptography import x509

from slicex import logs, pki
from slicex.errors import GeniError, RpcError, TimedOut, Unavailable
from slicex.tls_xmlrpc import SafeTransport, TlsXmlRpcServer, client_context, server_context

log = logging.getLogger("slicex.actor")
_ERRORS = {cls.code: cls for cls in GeniError.__subclasses__()}


class ActorServer:
    def __init__(self, name: str, handlers: dict[str, Callable[..., Any]], callers: Mapping[str, Collection[str]],
                 address: tuple[str, int], cert_file: str, key_file: str, ca_file: str):
        """`callers`: the URN of each peer it answers, with the methods that peer may call."""
        self.name = name
        self.handlers = handlers
        self.callers = {urn.lower(): frozenset(methods) for urn, methods in callers.items()}
        self.server = TlsXmlRpcServer(address, server_context(cert_file, key_file, ca_file), self._dispatch,
                                      lambda message, too_big=False: xmlrpc.client.Fault(6 if too_big else 1, message))

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"https://{host}:{port}/"

    def _dispatch(self, method: str, params: tuple, cert: x509.Certificate | None) -> Any:
        rid = ""
        if params and isinstance(params[-1], dict) and set(params[-1]) == {logs.WIRE_KEY}:
            rid, params = str(params[-1][logs.WIRE_KEY]), params[:-1]  # the caller's request id (slicex.logs)
        with logs.bound(rid):
            return self._serve(method, params, cert)

    def _serve(self, method: str, params: tuple, cert: x509.Certificate | None) -> Any:
        caller = pki.cert_urn(cert) if cert is not None else ""
        methods = self.callers.get(caller.lower())
        if methods is None:
            return xmlrpc.client.Fault(3, f"{self.name}: {caller or 'an unnamed peer'} may not call actor methods")
        handler = self.handlers.get(method)
        if handler is None:
            return xmlrpc.client.Fault(13, f"{self.name} has no method {method!r}")
        if method not in methods:
            return xmlrpc.client.Fault(3, f"{self.name}: {caller} may not call {method}")
        logging.getLogger(f"slicex.{self.name}").log(logging.INFO if logs.request_id() else logging.DEBUG,
                                                     "%s.%s from %s", self.name, method, caller)
        try:
            return handler(*params)
        except GeniError as exc:
            return xmlrpc.client.Fault(exc.code, exc.message)
        except Exception as exc:  # noqa: BLE001 - the boundary
            log.exception("%s.%s failed", self.name, method)
            return xmlrpc.client.Fault(5, f"{self.name}.{method} failed: {type(exc).__name__}: {exc}")

    def start(self) -> None:
        self.server.start_background()

    def stop(self) -> None:
        self.server.close()


class PeerIdentityError(Exception):
    """The server's certificate chains to the deployment CA but names another actor than the one called."""


class _PinnedConnection(http.client.HTTPSConnection):
    def __init__(self, host: str, context: ssl.SSLContext, peer_urn: str, timeout: float):
        super().__init__(host, None, context=context, timeout=timeout)
        self.peer_urn = peer_urn

    def connect(self) -> None:
        super().connect()  # the handshake verified the chain against the deployment CA
        der = self.sock.getpeercert(binary_form=True)
        urn = pki.cert_urn(x509.load_der_x509_certificate(der)) if der else ""
        if urn.lower() != self.peer_urn.lower():
            self.close()
            raise PeerIdentityError(f"its certificate names {urn or 'no URN'}, not {self.peer_urn}")


class _PinnedTransport(SafeTransport):
    """xmlrpc transport whose connections refuse a server that is not `peer_urn`."""

    def __init__(self, context: ssl.SSLContext, peer_urn: str, timeout: float):
        super().__init__(context, timeout)
        self.peer_urn = peer_urn

    def make_connection(self, host: Any) -> http.client.HTTPSConnection:
        if self._connection and host == self._connection[0]:
            return self._connection[1]
        chost, self._extra_headers, _x509 = self.get_host_info(host)
        self._connection = host, _PinnedConnection(chost, self.context, self.peer_urn, self._timeout)
        return self._connection[1]


class ActorClient:
    """Calls a remote actor; faults come back as the GENI error they carry, outages as UNAVAILABLE/TIMEDOUT,
    and a server that is not the actor named (another CA, or another actor's certificate) as RPCERROR."""

    def __init__(self, name: str, url: str, cert_file: str, key_file: str, ca_file: str, peer_urn: str,
                 timeout: float = 30):
        self.name = name
        self.url = url
        self.peer_urn = peer_urn
        self._context = client_context(cert_file, key_file, ca_file)  # CERT_REQUIRED against ca_file
        self._timeout = timeout
        self._local = threading.local()  # one kept-alive connection per thread: proxies are not thread-safe

    def call(self, method: str, *args: Any) -> Any:
        try:
            return self._call(method, *args)
        except xmlrpc.client.Fault as fault:
            cls = _ERRORS.get(fault.faultCode, RpcError)
            raise cls(fault.faultString) from None
        except PeerIdentityError as exc:
            raise RpcError(f"{self.name} at {self.url} is not the {self.name} of this deployment ({exc}); "
                           f"refused to call {method}") from None
        except ssl.SSLCertVerificationError as exc:
            raise RpcError(f"{self.name} at {self.url} is not the {self.name} of this deployment: its certificate "
                           f"does not verify against the deployment CA ({exc.verify_message}); refused to call "
                           f"{method}") from None
        except TimeoutError as exc:
            raise TimedOut(f"{self.name} at {self.url} did not answer {method} in {self._timeout:.0f} s ({exc})") from None
        except (ConnectionError, OSError, ssl.SSLError) as exc:
            raise Unavailable(f"the {self.name} actor at {self.url} is not reachable ({exc}); retry when it is back") from None
        except xmlrpc.client.ProtocolError as exc:
            raise RpcError(f"{self.name} at {self.url} answered {method} with HTTP {exc.errcode}") from None
        except (ExpatError, http.client.HTTPException, xmlrpc.client.ResponseError) as exc:
            # an actor killed while answering leaves a cut-off or empty reply: an outage, not a bug of ours
            raise Unavailable(f"the {self.name} actor at {self.url} stopped in the middle of its answer "
                              f"({type(exc).__name__}: {exc}); retry when it is back") from None

    def _call(self, method: str, *args: Any) -> Any:
        proxy = getattr(self._local, "proxy", None)
        if proxy is None:
            proxy = self._local.proxy = xmlrpc.client.ServerProxy(
                self.url, transport=_PinnedTransport(self._context, self.peer_urn, self._timeout), allow_none=True)
        rid = logs.request_id()
        if rid:  # one trailing struct carries the request id to the actor's logs (slicex.logs)
            args = (*args, {logs.WIRE_KEY: rid})
        try:
            return getattr(proxy, method)(*args)
        except xmlrpc.client.Fault:
            raise  # the connection is fine: the actor answered
        except BaseException:
            self._local.proxy = None  # a broken connection is not reused
            raise
