"""The XML-RPC servers' TLS: every connection a full, mutually authenticated handshake, and no TLS 1.3 session
tickets sent after it (no client of ours resumes a session: they were CPU and bytes for nothing)."""

from __future__ import annotations

import socket
import ssl
import xmlrpc.client

import pytest

from slicex import pki
from slicex.tls_xmlrpc import TlsXmlRpcServer, client_context, server_context


class _Echo:
    def dispatch(self, method, params, caller):
        return pki.cert_urn(caller) if caller is not None else ""

    def reject(self, message, too_big=False):
        return xmlrpc.client.Fault(1, message)


@pytest.fixture
def served(tmp_path):
    ca, ca_key = pki.create_ca("tls.test", "tls CA")
    am, am_key = pki.issue_certificate(ca, ca_key, "urn:publicid:IDN+tls.test+authority+am", "am", key_kind="ec")
    user, user_key = pki.issue_certificate(ca, ca_key, "urn:publicid:IDN+tls.test+user+alice", "alice")
    for name, data in (("ca.pem", ca), ("am.pem", am), ("am.key", am_key), ("u.pem", user), ("u.key", user_key)):
        (tmp_path / name).write_bytes(data)
    server = TlsXmlRpcServer(("127.0.0.1", 0), server_context(str(tmp_path / "am.pem"), str(tmp_path / "am.key"),
                                                              str(tmp_path / "ca.pem"))).answer(_Echo())
    server.start_background()
    yield server, tmp_path
    server.close()


def _call(port: int, ctx: ssl.SSLContext) -> tuple[bytes, str | None, ssl.SSLSession | None]:
    """One call on a new connection: the reply, and the TLS version and session as the client saw them once
    the answer began (a TLS 1.3 server sends its tickets before that)."""
    body = xmlrpc.client.dumps((), "whoami").encode()
    with ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10)) as s:
        s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: text/xml\r\nConnection: close\r\n"
                  + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        reply = s.recv(65536)
        version, session = s.version(), s.session
        while chunk := s.recv(65536):
            reply += chunk
    return reply, version, session


def test_a_tls13_connection_is_answered_without_session_tickets(served):
    server, d = served
    reply, version, session = _call(server.port, client_context(str(d / "u.pem"), str(d / "u.key"),
                                                                 str(d / "ca.pem")))
    assert version == "TLSv1.3"
    assert b"urn:publicid:IDN+tls.test+user+alice" in reply  # the caller was authenticated by certificate
    assert session is not None and not session.has_ticket  # nothing to resume a session with


def test_a_client_without_a_certificate_is_still_refused(served):
    server, d = served
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with pytest.raises((ssl.SSLError, ConnectionError)):  # TLS 1.3 reports the refusal at the first read
        _call(server.port, ctx)
