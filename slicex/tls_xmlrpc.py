"""XML-RPC over mutually authenticated TLS: the edge both the AM and the slice authority stand behind.

The client certificate is the caller's identity: a handler receives it with every call. Oversize bodies,
DTDs and unparseable XML-RPC get an answer built by the service's `reject`: a GENI result for the AM (TOOBIG 6
for an oversize body, BADARGS 1 otherwise), an XML-RPC fault with the same codes for the slice authority and
the actor servers, whose protocols speak in faults.

Faults: when `dispatch` (or `reject`) returns or raises an `xmlrpc.client.Fault`, the reply is an XML-RPC fault
response, so clients raise `xmlrpc.client.Fault`; anything else is marshalled as the call's value.

Oversize bodies are answered, not dropped: the decision is made from Content-Length before the body is read,
the answer is sent at once, then up to `DRAIN_BYTES` of the body are read and thrown away (for at most
`DRAIN_SECONDS`) so a client still sending its body can finish and read the answer; then the connection is
closed. Without the drain the server closed a socket with unread data, the kernel answered with a reset, and
the client's send failed before it ever saw the answer.

What one connection may cost is bounded by `ConnectionLimits`: a socket with nothing to read for
`idle_seconds` is closed, a connection older than `lifetime_seconds` is cut (one that trickles a byte at a time
never goes idle), and beyond `max_connections` at once a new connection is closed unserved (each served one
holds a thread and up to `max_body` bytes). `XmlRpcServer` is the same server over plain HTTP, for the path
service (stitching/server.py), which omni's stitcher calls without a client certificate.

What a server answers is a surface (slicex/endpoint.py: one helper for every surface's methods, arity and
error mapping); `answer(surface)` puts one on a server made before it (its port names the surface's URL).
`request_path()` is the path of the request being answered, for a surface that routes by path (the CH API)."""

from __future__ import annotations

import contextvars
import http.client
import logging
import queue
import socket
import socketserver
import ssl
import threading
import time
import xmlrpc.client
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any, Protocol
from urllib.parse import urlsplit
from xml.parsers import expat

from cryptography import x509

log = logging.getLogger("slicex.xmlrpc")

Dispatch = Callable[[str, tuple, x509.Certificate | None], Any]
Rejection = Callable[[str], Any]
_path: contextvars.ContextVar[str] = contextvars.ContextVar("xmlrpc_request_path", default="")


def request_path() -> str:
    """The path of the URL of the request being answered on this thread ("" outside a request)."""
    return _path.get()


def _starting(*_: Any, **__: Any) -> xmlrpc.client.Fault:
    """What a server answers before its surface is given to it (`answer`)."""
    return xmlrpc.client.Fault(11, "this server is starting; retry in a moment")


class Surface(Protocol):
    """What a server answers: slicex.endpoint.Endpoint (or its Routes)."""

    def dispatch(self, method: str, params: tuple, caller: x509.Certificate | None) -> Any: ...
    def reject(self, message: str, too_big: bool = False) -> Any: ...

MAX_BODY_BYTES = 8 * 1024 * 1024
STOP_POLL_SECONDS = 0.05
"""How often a serving loop looks for a stop request: socketserver's default (0.5 s) made every stop of a
deployment with five servers take two seconds."""
MAX_HEADER_LINE = 65536  # http.client's limits on a request's header lines, kept
MAX_HEADERS = 100
DRAIN_BYTES = 64 * 1024 * 1024
DRAIN_SECONDS = 15.0


@dataclass(frozen=True)
class ConnectionLimits:
    """What one client may hold of a server: None lifts a bound."""

    idle_seconds: float = 60.0  # a socket (TLS handshake included) with nothing to read this long is closed
    lifetime_seconds: float | None = None  # a connection is cut this long after it was accepted
    max_connections: int | None = None  # served at once; more are closed as they arrive


AM_LIMITS = ConnectionLimits()
"""The AM, slice authority and actor servers: a 60 s idle timeout, as before limits were named."""


def server_context(cert_file: str, key_file: str, ca_file: str) -> ssl.SSLContext:
    """Mutual TLS, 1.2 or later. No TLS 1.3 session tickets: omni, geni-lib and our actor clients open a new
    connection per call without resuming a session, so the two tickets OpenSSL sends after each handshake (each
    encrypted, and written apart) were CPU and round trips spent for nothing; every connection is verified in a
    full handshake, as it was."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    ctx.load_verify_locations(cafile=ca_file)
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.num_tickets = 0
    return ctx


def client_context(cert_file: str, key_file: str, ca_file: str | None = None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_cert_chain(cert_file, key_file)
    if ca_file:
        ctx.load_verify_locations(cafile=ca_file)
        ctx.check_hostname = False
    else:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def parse_call(body: bytes) -> tuple[tuple, str | None]:
    """(params, method name) of an XML-RPC call, as `xmlrpc.client.loads` reads them, with expat's text
    buffered: a credential travels as escaped XML inside a string, and unbuffered expat called the Python
    unmarshaller once per entity reference in it (`&lt;` ...), which made parsing a call with one
    credential take twice as long."""
    target = xmlrpc.client.Unmarshaller(use_builtin_types=False)
    parser = expat.ParserCreate(None, None)
    parser.buffer_text = True
    parser.StartElementHandler = target.start
    parser.EndElementHandler = target.end
    parser.CharacterDataHandler = target.data
    target.xml(None, None)
    parser.Parse(body, True)
    return target.close(), target.getmethodname()


class ThreadReuse:
    """Threads that serve one connection after another. Every connection still has a thread of its own at
    once (a connection kept alive holds one, as before); a thread that finished its connection waits up to
    `idle_seconds` for the next instead of ending, because starting a thread per connection cost about 90 µs
    of CPU per call (clone, a new interpreter thread state, its bootstrap and its end), a tenth of what a
    GetVersion with its TLS handshake costs the server. A thread's kept-alive connections to other actors
    (slicex/actor_rpc.py keeps one per thread) live as long as it does, so a thread idles for less than the
    actor servers' idle timeout (`AM_LIMITS`): a connection it reuses has not been closed under it."""

    def __init__(self, name: str, idle_seconds: float = 30.0):
        self.name = name
        self.idle_seconds = idle_seconds
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()  # None: leave
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for a job that no submit has counted on yet

    def submit(self, job: Callable[[], None]) -> None:
        """Run `job` now on an idle thread, or on a new one when none is idle."""
        with self._lock:
            if self._idle:
                self._idle -= 1
                self._jobs.put(job)  # under the lock: a thread timing out sees it (see _serve)
                return
        threading.Thread(target=self._serve, args=(job,), name=self.name, daemon=True).start()

    def close(self) -> None:
        """Let the idle threads leave now (a closed server's would otherwise wait out `idle_seconds`)."""
        with self._lock:
            for _ in range(self._idle):
                self._jobs.put(None)
            self._idle = 0

    def _serve(self, job: Callable[[], None] | None) -> None:
        while job is not None:
            try:
                job()
            except Exception:  # noqa: BLE001 - a job's failure must not end the thread unlogged
                log.exception("a connection's thread failed")
            with self._lock:
                self._idle += 1
            try:
                job = self._jobs.get(timeout=self.idle_seconds)
            except queue.Empty:
                with self._lock:
                    if self._jobs.empty():  # no submit counted on this thread: leave
                        self._idle -= 1
                        return
                    job = self._jobs.get_nowait()  # a submit counted on an idle thread after the timeout


class _Handler(BaseHTTPRequestHandler):
    server: TlsXmlRpcServer
    protocol_version = "HTTP/1.1"
    # buffered: status line, headers and body leave in one TLS record (flushed when the request is done), not
    # one record (and one syscall) for the headers and another for the body
    wbufsize = 64 * 1024

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), fmt % args)

    def parse_request(self) -> bool:
        """The request line and headers of an HTTP/1.0 or 1.1 request, answered as http.server answers bad
        ones (400 for a bad request line, 431 for a header line over 64 KiB or more than 100 headers, 505 for
        HTTP/2 and later) but without its email-package header parser, which cost about a tenth of the
        interpreter time of a call (a few header lines need no MIME parser)."""
        self.command = None
        self.request_version = "HTTP/1.0"  # a refusal has a status line (http.server's 0.9 default sent none)
        self.close_connection = True
        self.requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        words = self.requestline.split()
        if not words:
            return False
        if len(words) != 3:
            self.send_error(HTTPStatus.BAD_REQUEST, f"Bad request syntax ({self.requestline!r})")
            return False
        command, path, version = words
        major, _, minor = version.removeprefix("HTTP/").partition(".")
        if not (version.startswith("HTTP/") and major.isdigit() and minor.isdigit() and len(major) <= 10
                and len(minor) <= 10):
            self.send_error(HTTPStatus.BAD_REQUEST, f"Bad request version ({version!r})")
            return False
        if int(major) >= 2:
            self.send_error(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, f"Invalid HTTP version ({major}.{minor})")
            return False
        # "//host/x" would read as an absolute URI to a client that follows it (http.server's gh-87389)
        self.command, self.request_version = command, version
        self.path = "/" + path.lstrip("/") if path.startswith("//") else path
        self.close_connection = (int(major), int(minor)) < (1, 1)
        headers = http.client.HTTPMessage()
        for count in range(MAX_HEADERS + 1):
            line = self.rfile.readline(MAX_HEADER_LINE + 1)
            if len(line) > MAX_HEADER_LINE:
                self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Line too long")
                return False
            if line in (b"\r\n", b"\n", b""):
                break
            if count == MAX_HEADERS:
                self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Too many headers")
                return False
            name, colon, value = str(line, "iso-8859-1").partition(":")
            if not colon or not name or name != name.strip() or name[0] in " \t":
                self.send_error(HTTPStatus.BAD_REQUEST, f"Bad header line ({line[:80]!r})")
                return False
            headers[name] = value.strip()
        self.headers = headers
        connection = headers.get("Connection", "").lower()
        if connection == "close":
            self.close_connection = True
        elif connection == "keep-alive":
            self.close_connection = False
        if headers.get("Expect", "").lower() == "100-continue" and self.request_version >= "HTTP/1.1":
            return self.handle_expect_100()
        return True

    def handle_expect_100(self) -> bool:
        """Send "100 Continue" now: the buffered writer (`wbufsize`) held it until the answer, so a client
        that waits for it before sending its body (curl does, for bodies over 1 KiB) waited its timeout."""
        ok = super().handle_expect_100()
        self.wfile.flush()
        return ok

    def do_POST(self) -> None:
        token = _path.set(urlsplit(self.path).path)
        try:
            self._post()
        finally:
            _path.reset(token)

    def _post(self) -> None:
        try:
            length = int(self.headers.get("content-length", "0"))
        except ValueError:
            length = -1
        if length < 0:
            self._reply(self._marshal(self._rejection("request has no valid Content-Length")), close=True)
            return
        if length > self.server.max_body:
            self._reply(self._marshal(self._rejection(
                f"request body is {length} bytes; at most {self.server.max_body} accepted", too_big=True)),
                close=True)
            self._drain(length)
            return
        body = self.rfile.read(length)
        cert = None
        peer_certificate = getattr(self.connection, "getpeercert", None)  # None over plain HTTP
        der = peer_certificate(binary_form=True) if peer_certificate is not None else None
        if der:
            cert = x509.load_der_x509_certificate(der)
        if b"<!DOCTYPE" in body[:4096].upper() or b"<!ENTITY" in body.upper():
            response = self._rejection("XML-RPC request carries a DTD or entity declaration; refused")
        else:
            try:
                params, method = parse_call(body)
            except Exception as exc:  # noqa: BLE001 - any parse failure becomes a result
                response = self._rejection(f"request is not valid XML-RPC: {exc}")
            else:
                try:
                    response = self.server.dispatch(method or "", params, cert)
                except xmlrpc.client.Fault as fault:
                    response = fault
                except Exception as exc:  # noqa: BLE001 - the last boundary: answer, never drop the connection
                    log.exception("%s failed", method)
                    response = self._rejection(f"server failed in {method}: {type(exc).__name__}")
        self._reply(self._marshal(response))

    def _rejection(self, message: str, too_big: bool = False) -> Any:
        try:
            return self.server.reject(message, too_big=too_big)
        except xmlrpc.client.Fault as fault:
            return fault

    def _marshal(self, response: Any) -> str:
        """A fault response for a Fault, else a one-value method response."""
        try:
            if isinstance(response, xmlrpc.client.Fault):
                return xmlrpc.client.dumps(response, methodresponse=True, allow_none=True)
            return xmlrpc.client.dumps((response,), methodresponse=True, allow_none=True)
        except Exception as exc:  # noqa: BLE001
            log.error("cannot marshal a response: %s", exc)
            return self._marshal(self._rejection(f"server could not encode its answer: {exc}"))

    def _drain(self, length: int) -> None:
        """Read and discard what the client is still sending (bounded in bytes and time) so it can finish
        sending and then read the answer already sent."""
        self.wfile.flush()
        deadline = time.monotonic() + DRAIN_SECONDS
        left = min(length, DRAIN_BYTES)
        try:
            while left > 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self.connection.settimeout(remaining)
                chunk = self.rfile.read1(min(left, 256 * 1024))
                if not chunk:
                    break
                left -= len(chunk)
        except (OSError, ssl.SSLError):
            pass  # the client gave up; the connection closes either way

    def do_GET(self) -> None:
        self.send_error(405, "AM API speaks XML-RPC over POST")

    def _reply(self, text: str, close: bool = False) -> None:
        data = text.encode("utf-8")
        self.send_response(200)
        self.send_header("Content-Type", "text/xml")
        self.send_header("Content-Length", str(len(data)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)


class XmlRpcServer(socketserver.TCPServer):
    """A threaded XML-RPC server over plain HTTP, a thread per connection within `limits` (threads reused:
    `ThreadReuse`)."""

    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], dispatch: Dispatch = _starting, reject: Callable[..., Any] = _starting,
                 max_body: int = MAX_BODY_BYTES, limits: ConnectionLimits = AM_LIMITS, reuse_port: bool = False):
        """`reuse_port`: bind with SO_REUSEPORT, so several processes (AM workers) listen on one port and the
        kernel spreads new connections over them; every one of them must ask for it."""
        self.allow_reuse_port = reuse_port
        self.dispatch = dispatch
        self.reject = reject
        self.max_body = max_body
        self.limits = limits
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        self._served = 0  # connections accepted and not yet finished
        self._threads = ThreadReuse(f"xmlrpc-{address[1]}-conn")
        super().__init__(address, _Handler, bind_and_activate=True)

    def answer(self, surface: Surface) -> XmlRpcServer:
        """Serve `surface` from now on."""
        self.dispatch, self.reject = surface.dispatch, surface.reject
        return self

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = self.socket.accept()
        sock.settimeout(self.limits.idle_seconds)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no Nagle/delayed-ACK stall between replies
        return sock, addr

    def process_request(self, request: socket.socket, client_address: Any) -> None:
        """Serve the connection in a thread of its own, or close it unserved when `max_connections` are."""
        with self._open_lock:
            full = self.limits.max_connections is not None and self._served >= self.limits.max_connections
            if not full:
                self._served += 1
        if full:
            log.warning("refused a connection from %s: %d connections are being served, the most at once",
                        client_address, self.limits.max_connections)
            self.shutdown_request(request)
            return
        try:
            self._threads.submit(lambda: self.process_request_thread(request, client_address))
        except Exception:
            self._finished()
            raise

    def _finished(self) -> None:
        with self._open_lock:
            self._served -= 1

    def _secure(self, request: socket.socket, client_address: Any) -> socket.socket | None:
        """The connection to speak HTTP over (None: it failed before a request could be read)."""
        return request

    def process_request_thread(self, request: socket.socket, client_address: Any) -> None:
        try:
            conn = self._secure(request, client_address)
            if conn is None:
                return
            with self._open_lock:
                self._open.add(conn)
            cutter = None
            if self.limits.lifetime_seconds is not None:
                cutter = threading.Timer(self.limits.lifetime_seconds, _cut, (conn, client_address))
                cutter.daemon = True
                cutter.start()
            try:
                self.finish_request(conn, client_address)
            except Exception:
                self.handle_error(conn, client_address)
            finally:
                self.shutdown_request(conn)
                if cutter is not None:
                    cutter.cancel()
                with self._open_lock:
                    self._open.discard(conn)
        finally:
            self._finished()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away before its answer (it timed out, or was killed) is a log line, not a
        traceback on stderr; anything else is logged with its traceback."""
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, (ssl.SSLError, ConnectionError, TimeoutError)):
            log.info("connection from %s ended before the reply was sent: %s", client_address, exc)
        else:
            log.exception("request from %s failed", client_address)

    def close(self) -> None:
        """Stop serving: no new connections, and kept-alive ones are cut (as a stopped process's would be)."""
        self.shutdown()
        self._threads.close()
        with self._open_lock:
            for conn in list(self._open):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self.server_close()

    @property
    def port(self) -> int:
        return self.server_address[1]

    def start_background(self) -> threading.Thread:
        t = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": STOP_POLL_SECONDS},
                             name=f"xmlrpc-{self.port}", daemon=True)
        t.start()
        return t


def _cut(conn: socket.socket, client_address: Any) -> None:
    """End a connection that outlived its lifetime: its thread's read or write fails and the thread ends."""
    log.info("cut the connection from %s: it outlived its lifetime", client_address)
    try:
        socket.socket.shutdown(conn, socket.SHUT_RDWR)  # the plain socket's: under TLS too, without the TLS layer
    except OSError:
        pass


class TlsXmlRpcServer(XmlRpcServer):
    """The XML-RPC server on a TLS socket that requires a client certificate."""

    def __init__(self, address: tuple[str, int], context: ssl.SSLContext, dispatch: Dispatch = _starting,
                 reject: Callable[..., Any] = _starting, max_body: int = MAX_BODY_BYTES, limits: ConnectionLimits = AM_LIMITS,
                 reuse_port: bool = False):
        self.context = context
        super().__init__(address, dispatch, reject, max_body, limits, reuse_port)

    def _secure(self, request: socket.socket, client_address: Any) -> socket.socket | None:
        try:
            return self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            log.info("TLS handshake with %s failed: %s", client_address, exc)
            self.shutdown_request(request)
            return None


class SafeTransport(xmlrpc.client.SafeTransport):
    """Client transport with a client certificate (for tests, the CLI and actor calls)."""

    def __init__(self, context: ssl.SSLContext, timeout: float = 60):
        super().__init__(context=context)
        self._timeout = timeout

    def make_connection(self, host):
        conn = super().make_connection(host)
        conn.timeout = self._timeout
        return conn


def client(url: str, cert_file: str, key_file: str, ca_file: str | None = None,
           timeout: float = 60) -> xmlrpc.client.ServerProxy:
    return xmlrpc.client.ServerProxy(url, transport=SafeTransport(client_context(cert_file, key_file, ca_file),
                                                                  timeout), allow_none=True)
