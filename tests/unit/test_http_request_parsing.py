"""The XML-RPC edge's own request-line and header parsing (slicex/tls_xmlrpc.py `_Handler.parse_request`):
what http.server answered before, over a real socket on 127.0.0.1."""

from __future__ import annotations

import socket
import xmlrpc.client

import pytest

from slicex.tls_xmlrpc import MAX_HEADER_LINE, MAX_HEADERS, XmlRpcServer

BODY = xmlrpc.client.dumps(("hi",), methodname="echo").encode()


class Echo:
    def dispatch(self, method, params, caller):
        return [method, *params]

    def reject(self, message, too_big=False):
        return {"rejected": message}


@pytest.fixture
def server():
    srv = XmlRpcServer(("127.0.0.1", 0)).answer(Echo())
    srv.start_background()
    yield srv
    srv.close()


def _exchange(srv: XmlRpcServer, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        s.sendall(raw)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def _post(headers: str = "", version: str = "HTTP/1.1", body: bytes = BODY) -> bytes:
    return (f"POST /RPC2 {version}\r\nContent-Type: text/xml\r\nContent-Length: {len(body)}\r\n{headers}\r\n"
            .encode() + body)


def test_a_request_is_answered(server):
    reply = _exchange(server, _post())
    assert reply.startswith(b"HTTP/1.1 200")
    assert b"<string>echo</string>" in reply and b"<string>hi</string>" in reply


def test_header_names_are_case_insensitive(server):
    raw = (f"POST /RPC2 HTTP/1.1\r\ncontent-LENGTH: {len(BODY)}\r\n\r\n").encode() + BODY
    assert b"<string>hi</string>" in _exchange(server, raw)


def test_two_requests_on_one_kept_alive_connection(server):
    reply = _exchange(server, _post() + _post(headers="Connection: close\r\n"))
    assert reply.count(b"HTTP/1.1 200") == 2


def test_http_1_0_closes_after_one_answer(server):
    reply = _exchange(server, _post(version="HTTP/1.0") + _post())
    assert reply.count(b" 200 ") == 1


@pytest.mark.parametrize("line, status", [
    (b"POST\r\n\r\n", b"400"),
    (b"POST /RPC2\r\n\r\n", b"400"),  # HTTP/0.9
    (b"POST /RPC2 HTTP/1.1 extra\r\n\r\n", b"400"),
    (b"POST /RPC2 HTTX/1.1\r\n\r\n", b"400"),
    (b"POST /RPC2 HTTP/1.x\r\n\r\n", b"400"),
    (b"POST /RPC2 HTTP/1\r\n\r\n", b"400"),
    (b"POST /RPC2 HTTP/2.0\r\n\r\n", b"505"),
    (b"POST /RPC2 HTTP/1.1\r\nno colon here\r\n\r\n", b"400"),
    (b"POST /RPC2 HTTP/1.1\r\nContent-Length : 3\r\n\r\n", b"400"),
    (b"POST /RPC2 HTTP/1.1\r\n folded: x\r\n\r\n", b"400"),
])
def test_a_bad_request_line_or_header_is_refused(server, line, status):
    reply = _exchange(server, line)
    assert reply.split(b" ", 2)[1] == status, reply[:200]


def test_a_header_line_over_the_limit_is_431(server):
    reply = _exchange(server, _post(headers=f"X-Big: {'a' * MAX_HEADER_LINE}\r\n"))
    assert reply.split(b" ", 2)[1] == b"431"


def test_more_headers_than_the_limit_is_431(server):
    many = "".join(f"X-H{i}: v\r\n" for i in range(MAX_HEADERS))
    assert _exchange(server, _post(headers=many)).split(b" ", 2)[1] == b"431"
    fewer = "".join(f"X-H{i}: v\r\n" for i in range(MAX_HEADERS - 3))  # with the two of _post: under the limit
    assert b" 200 " in _exchange(server, _post(headers=fewer))


def test_expect_100_continue_is_answered_before_the_body(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(_post(headers="Expect: 100-continue\r\n")[:-len(BODY)])  # the headers only
        assert s.recv(100).startswith(b"HTTP/1.1 100")
        s.sendall(BODY)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    assert b"<string>hi</string>" in out


@pytest.mark.parametrize("params", [
    ("urn:publicid:IDN+x+slice+s", [{"geni_type": "geni_sfa", "geni_value": "<a>&amp; &lt;b&gt; é \u2603</a>" * 50}],
     "<rspec/>", {"geni_best_effort": True, "n": 3, "f": 1.5, "none": ""}),
    (),
    ([1, [2, [3]], {"k": b"\x00\x01"}],),
])
def test_a_call_is_read_as_xmlrpc_client_reads_it(params):
    from slicex.tls_xmlrpc import parse_call

    params = tuple(xmlrpc.client.Binary(p) if isinstance(p, bytes) else p for p in params)
    body = xmlrpc.client.dumps(params, methodname="Allocate").encode()
    assert parse_call(body) == xmlrpc.client.loads(body, use_builtin_types=False)


@pytest.mark.parametrize("body", [b"", b"<methodCall>", b"<methodCall><params><param><value><int>x</int>"
                                  b"</value></param></params></methodCall>", b"\xff\xfe"])
def test_a_call_that_is_not_xmlrpc_raises_as_loads_does(body):
    from slicex.tls_xmlrpc import parse_call

    with pytest.raises(Exception):  # noqa: B017 - the edge turns any parse failure into BADARGS
        parse_call(body)
    with pytest.raises(Exception):  # noqa: B017
        xmlrpc.client.loads(body)
