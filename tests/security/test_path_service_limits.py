"""The path service (`slicex scs`, and inside `slicex up`) is plain HTTP and unauthenticated, so what one
client may cost the process is bounded: a body over the limit is refused from its Content-Length before it is
read (TOOBIG 6, as the AM's own server does), a socket with nothing to read is closed, a connection that
trickles is cut, and connections beyond the bound are closed unserved. Real sockets on 127.0.0.1; the
assertions are about what the server does (answers, closes), never how long it took."""

from __future__ import annotations

import socket
import threading
import xmlrpc.client
from collections.abc import Iterator

import pytest

from slicex.tls_xmlrpc import ConnectionLimits
from stitching.model import Topology
from stitching.server import MAX_BODY_BYTES, PATH_SERVICE_LIMITS, make_server

CLIENT_PATIENCE = 30.0
"""How long a test socket waits for the server before the test calls it unresponsive (far above every limit
these servers are given)."""


@pytest.fixture
def serve() -> Iterator:
    started = []

    def start(limits: ConnectionLimits = PATH_SERVICE_LIMITS) -> tuple[str, int]:
        server = make_server(lambda: Topology({}, {}), "127.0.0.1", 0, limits=limits)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        started.append((server, thread))
        return server.server_address[:2]

    yield start
    for server, thread in started:
        server.close()
        thread.join(5)


def _connect(address: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(address, timeout=CLIENT_PATIENCE)
    return sock


def _headers(length: int) -> bytes:
    return (f"POST /geni/xmlrpc HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/xml\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def _read_answer(sock: socket.socket) -> bytes:
    data = b""
    while b"</methodResponse>" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed the connection (EOF or reset) before the client's patience ran out."""
    try:
        while True:
            if not sock.recv(65536):
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _still_open(sock: socket.socket) -> bool:
    """Whether the server keeps this connection open (nothing to read yet, no EOF)."""
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.settimeout(CLIENT_PATIENCE)


def _answers(address: tuple[str, int]) -> bool:
    proxy = xmlrpc.client.ServerProxy(f"http://{address[0]}:{address[1]}/geni/xmlrpc")
    return proxy.GetVersion()["code"]["geni_code"] == 0


def test_an_oversize_body_is_refused_before_it_is_read(serve):
    """The reported attack: a 256 MB POST that never finishes. The answer (TOOBIG) comes back having sent
    only the headers and a few bytes of the body, so the server decided without reading it."""
    address = serve()
    with _connect(address) as sock:
        sock.sendall(_headers(256 * 1024 * 1024) + b"<?xml version='1.0'?><methodCall>")
        answer = _read_answer(sock)
    assert b"200 OK" in answer.split(b"\r\n", 1)[0]
    code, output = _result(answer)
    assert code == 6, answer
    assert str(MAX_BODY_BYTES) in output and str(256 * 1024 * 1024) in output
    assert _answers(address)


def test_a_body_without_a_usable_length_is_refused(serve):
    address = serve()
    with _connect(address) as sock:
        sock.sendall(b"POST /geni/xmlrpc HTTP/1.1\r\nHost: x\r\nContent-Length: lots\r\n\r\n")
        code, _ = _result(_read_answer(sock))
    assert code == 1


def test_a_body_that_never_finishes_is_dropped_when_idle(serve):
    address = serve(ConnectionLimits(idle_seconds=0.5, lifetime_seconds=None, max_connections=8))
    with _connect(address) as sock:
        sock.sendall(_headers(4096) + b"<?xml version='1.0'?>")
        assert _closed_by_server(sock)
    assert _answers(address)


def test_a_connection_that_trickles_is_cut(serve):
    """One byte at a time, each within the idle limit: the connection's lifetime ends it."""
    address = serve(ConnectionLimits(idle_seconds=5, lifetime_seconds=1.0, max_connections=8))
    cut = threading.Event()
    with _connect(address) as sock:
        sock.sendall(_headers(100_000))

        def watch() -> None:
            if _closed_by_server(sock):
                cut.set()

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        for _ in range(int(CLIENT_PATIENCE / 0.05)):
            if cut.wait(0.05):
                break
            try:
                sock.send(b" ")
            except OSError:
                break
        watcher.join(CLIENT_PATIENCE)
    assert cut.is_set()
    assert _answers(address)


def test_idle_connections_beyond_the_bound_are_refused_and_the_rest_time_out(serve):
    limits = ConnectionLimits(idle_seconds=3.0, lifetime_seconds=None, max_connections=4)
    address = serve(limits)
    before = threading.active_count()
    held = [_connect(address) for _ in range(limits.max_connections)]
    for sock in held:  # each is being served (its handler waits for a request line)
        sock.sendall(b"POST /geni/xmlrpc HTTP/1.1\r\n")
    extra = [_connect(address) for _ in range(6)]
    try:
        for sock in extra:
            assert _closed_by_server(sock), "a connection beyond the bound was kept"
        assert all(_still_open(sock) for sock in held), "the extra ones were served, not refused"
        assert threading.active_count() <= before + limits.max_connections
        for sock in held:
            assert _closed_by_server(sock), "an idle connection was never closed"
    finally:
        for sock in held + extra:
            sock.close()
    assert _answers(address)


def test_the_path_service_keeps_its_limits_by_default():
    """What `slicex scs` and `slicex up` serve with: every bound set."""
    limits = PATH_SERVICE_LIMITS
    assert limits.idle_seconds and limits.lifetime_seconds and limits.max_connections
    server = make_server(lambda: Topology({}, {}), "127.0.0.1", 0)
    try:
        assert server.limits == PATH_SERVICE_LIMITS and server.max_body == MAX_BODY_BYTES
    finally:
        server.server_close()


def _result(answer: bytes) -> tuple[int, str]:
    body = answer.split(b"\r\n\r\n", 1)[1]
    (value,), _ = xmlrpc.client.loads(body)
    return value["code"]["geni_code"], value.get("output", "")
