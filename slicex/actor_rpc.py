"""Actor calls over HTTPS with mutual TLS (the scaled-out deployment): a server that exposes one actor's
methods to trusted peers as an endpoint of the one XML-RPC helper (slicex/endpoint.py), and a client proxy
that turns faults back into GENI errors.

Both ends authenticate each other against the deployment CA (not the federation roots: a peer testbed's CA
may vouch for users, never for our actors). The server answers only peers whose certificate names an
allowed URN; the client talks only to a server whose certificate names the actor it means to reach, and
checks that before a byte of the request is sent."""

from __future__ import annotations

import http.client
import ssl
import threading
import time
import xmlrpc.client
from collections.abc import Callable, Collection, Mapping
from typing import Any
from xml.parsers.expat import ExpatError

from cryptography import x509

from slicex import logs, pki
from slicex.endpoint import Caller, Endpoint, Faults, arity_of, method
from slicex.errors import (
    Forbidden,
    GeniError,
    RpcError,
    ServerError,
    TimedOut,
    TooBig,
    Unavailable,
    Unsupported,
)
from slicex.tls_xmlrpc import MAX_BODY_BYTES, SafeTransport, TlsXmlRpcServer, client_context, server_context

_ERRORS = {cls.code: cls for cls in GeniError.__subclasses__()}
Handlers = dict[str, Callable[..., Any]]
"""An actor's methods as the wire calls them (protocol/remote.py derives them from the actor's Protocol)."""


class ActorFaults(Faults):
    """Faults, an unexpected failure named with its actor: the slice manager passes it on to the user, who
    should read which actor failed."""

    def failed(self, method: str, exc: Exception) -> Any:
        return xmlrpc.client.Fault(ServerError.code, f"{self.service}.{method} failed: {type(exc).__name__}: {exc}")


class Peers:
    """Who may call an actor, and what: each caller's certificate URN with the methods it may call. A peer
    not listed learns nothing of the actor's methods; a listed one is told which method it may not call."""

    def __init__(self, actor: str, callers: Mapping[str, Collection[str]]):
        self.actor = actor
        self.callers = {urn.lower(): frozenset(methods) for urn, methods in callers.items()}

    def admit(self, cert: Caller) -> None:
        urn = pki.cert_urn(cert) if cert is not None else ""
        if urn.lower() not in self.callers:
            raise Forbidden(f"{self.actor}: {urn or 'an unnamed peer'} may not call actor methods")

    def check(self, name: str, cert: Caller) -> None:
        urn = pki.cert_urn(cert) if cert is not None else ""
        if name not in self.callers.get(urn.lower(), ()):
            raise Forbidden(f"{self.actor}: {urn} may not call {name}")


def with_request_id(args: tuple) -> tuple:
    """The call's arguments and, when there is one, the request id as one trailing struct (slicex.logs)."""
    rid = logs.request_id()
    return (*args, {logs.WIRE_KEY: rid}) if rid else args


def request_id_of(name: str, params: tuple) -> tuple[str, tuple, str]:
    """`with_request_id` undone on arrival: (method, the call's own arguments, the caller's request id)."""
    if params and isinstance(params[-1], dict) and set(params[-1]) == {logs.WIRE_KEY}:
        return name, params[:-1], str(params[-1][logs.WIRE_KEY])
    return name, params, ""


def actor_endpoint(name: str, handlers: Handlers, callers: Mapping[str, Collection[str]]) -> Endpoint:
    """The actor `name`'s XML-RPC surface: `handlers` answered to `callers` (URN -> methods it may call), every
    refusal a fault with its GENI code. It logs as `slicex.<name>`, as the in-process actor does
    (slicex.logs.Traced)."""
    peers = Peers(name, callers)

    def on_wire(n: str) -> Callable[..., Any]:
        # looked up at each call: the table is the server's (`ActorServer.handlers`)
        return lambda cert, *params: handlers[n](*params)

    return Endpoint(name, [method(n, on_wire(n), arity=arity_of(h, leading=0)) for n, h in handlers.items()],
                    ActorFaults(name, unknown=Unsupported), admit=peers.admit, check=peers.check,
                    unwrap=request_id_of)


class ActorServer:
    """One actor's methods served over mutual TLS to the peers of this deployment (`actor_endpoint`)."""

    def __init__(self, name: str, handlers: Handlers, callers: Mapping[str, Collection[str]],
                 address: tuple[str, int], cert_file: str, key_file: str, ca_file: str):
        """`callers`: the URN of each peer it answers, with the methods that peer may call."""
        self.name = name
        self.handlers = handlers
        self.server = TlsXmlRpcServer(address, server_context(cert_file, key_file, ca_file)).answer(
            actor_endpoint(name, handlers, callers))

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"https://{host}:{port}/"

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


class RequestTooLarge(Exception):
    """A request larger than an actor server accepts (`ActorServer`: slicex.tls_xmlrpc's MAX_BODY_BYTES)."""

    def __init__(self, size: int, limit: int):
        super().__init__(f"{size} bytes")
        self.size, self.limit = size, limit


class _PinnedTransport(SafeTransport):
    """xmlrpc transport whose connections refuse a server that is not `peer_urn`, and that never sends a
    request larger than the actor servers accept (the server would refuse it only after reading it, and a
    body beyond what it drains ends in a cut connection, which reads as an outage to retry)."""

    def __init__(self, context: ssl.SSLContext, peer_urn: str, timeout: float, max_body: int | None = None):
        super().__init__(context, timeout)
        self.peer_urn = peer_urn
        self.max_body = MAX_BODY_BYTES if max_body is None else max_body

    def request(self, host: Any, handler: str, request_body: bytes, verbose: bool = False) -> Any:
        if len(request_body) > self.max_body:
            raise RequestTooLarge(len(request_body), self.max_body)
        return super().request(host, handler, request_body, verbose)

    def make_connection(self, host: Any) -> http.client.HTTPSConnection:
        if self._connection and host == self._connection[0]:
            return self._connection[1]
        chost, self._extra_headers, _x509 = self.get_host_info(host)
        self._connection = host, _PinnedConnection(chost, self.context, self.peer_urn, self._timeout)
        return self._connection[1]


LOCATE_SECONDS = 1.0
"""How long an actor client trusts where the store said the active actor is (standby actors, issue 37)."""


class ActorClient:
    """Calls a remote actor; faults come back as the GENI error they carry, outages as UNAVAILABLE/TIMEDOUT,
    and a server that is not the actor named (another CA, or another actor's certificate) as RPCERROR."""

    def __init__(self, name: str, url: str, cert_file: str, key_file: str, ca_file: str, peer_urn: str,
                 timeout: float = 30, locate: Callable[[], str | None] | None = None):
        """`locate`: where the active actor is now (its URL published in the store, slicex's standby actors),
        asked at most once a second and again after an outage; None, or no answer: `url`."""
        self.name = name
        self._given = url
        self._locate = locate
        self._located: tuple[float, str] | None = None  # (when asked, what it said)
        self.peer_urn = peer_urn
        self._context = client_context(cert_file, key_file, ca_file)  # CERT_REQUIRED against ca_file
        self._timeout = timeout
        self._local = threading.local()  # one kept-alive connection per thread: proxies are not thread-safe

    @property
    def url(self) -> str:
        """The actor's URL now: the one `locate` names (cached a second), else the one given."""
        if self._locate is None:
            return self._given
        now = time.monotonic()
        if self._located is None or now - self._located[0] >= LOCATE_SECONDS:
            try:
                found = self._locate()
            except GeniError:  # the store is away: the last URL known is the best guess
                found = None
            self._located = (now, found or (self._located[1] if self._located else self._given))
        return self._located[1]

    def call(self, method: str, *args: Any) -> Any:
        try:
            return self._call(method, *args)
        except RequestTooLarge as exc:
            raise TooBig(f"the {method} request to the {self.name} actor at {self.url} is {exc.size} bytes; actor "
                         f"servers accept at most {exc.limit} bytes per request; not sent") from None
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
            raise self._moved(TimedOut(f"{self.name} at {self.url} did not answer {method} in {self._timeout:.0f} s "
                                       f"({exc})")) from None
        except (ConnectionError, OSError, ssl.SSLError) as exc:
            raise self._moved(Unavailable(f"the {self.name} actor at {self.url} is not reachable ({exc}); retry "
                                          f"when it is back")) from None
        except xmlrpc.client.ProtocolError as exc:
            raise RpcError(f"{self.name} at {self.url} answered {method} with HTTP {exc.errcode}") from None
        except (ExpatError, http.client.HTTPException, xmlrpc.client.ResponseError) as exc:
            # an actor killed while answering leaves a cut-off or empty reply: an outage, not a bug of ours
            raise self._moved(Unavailable(f"the {self.name} actor at {self.url} stopped in the middle of its answer "
                                          f"({type(exc).__name__}: {exc}); retry when it is back")) from None

    def _moved(self, error: GeniError) -> GeniError:
        """After an outage the actor may have moved (a standby took over): ask where it is before the next call."""
        self._located = None
        return error

    def _call(self, method: str, *args: Any) -> Any:
        proxy = getattr(self._local, "proxy", None)
        url = self.url
        if proxy is None or getattr(self._local, "url", None) != url:
            proxy = self._local.proxy = xmlrpc.client.ServerProxy(
                url, transport=_PinnedTransport(self._context, self.peer_urn, self._timeout), allow_none=True)
            self._local.url = url
        try:
            return getattr(proxy, method)(*with_request_id(args))
        except (xmlrpc.client.Fault, RequestTooLarge):
            raise  # the connection is fine: the actor answered, or nothing was sent
        except BaseException:
            self._local.proxy = None  # a broken connection is not reused
            raise
