"""An actor that is down is UNAVAILABLE with a message for people: which actor, where, and to retry — not the
internal call name ("not reachable for unavailable" was the old text)."""

from __future__ import annotations

import socket

import pytest

from slicex import pki
from slicex.actor_rpc import ActorClient
from slicex.errors import Unavailable


def test_an_actor_that_is_down_is_unavailable_with_a_message_for_people(tmp_path):
    ca, ca_key = pki.create_ca("rpc.test", "rpc CA")
    cert, key = pki.issue_certificate(ca, ca_key, "urn:publicid:IDN+rpc.test+authority+am", "am")
    for name, data in (("ca.pem", ca), ("am.pem", cert), ("am.key", key)):
        (tmp_path / name).write_bytes(data)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = ActorClient("broker", f"https://127.0.0.1:{port}/", str(tmp_path / "am.pem"), str(tmp_path / "am.key"),
                         str(tmp_path / "ca.pem"), "urn:publicid:IDN+rpc.test+authority+broker", timeout=2)
    with pytest.raises(Unavailable) as refused:
        client.call("unavailable")
    message = refused.value.message
    assert message.startswith(f"the broker actor at https://127.0.0.1:{port}/ is not reachable")
    assert "for unavailable" not in message and "retry" in message


def test_an_actor_killed_while_answering_is_unavailable_not_an_internal_error(tmp_path):
    """The chaos test saw `ExpatError: no element found` become SERVERERROR (5) when the broker died between
    its status line and its body; a cut-off answer is an outage (11)."""
    import ssl
    import threading

    ca, ca_key = pki.create_ca("rpc.test", "rpc CA")
    am, am_key = pki.issue_certificate(ca, ca_key, "urn:publicid:IDN+rpc.test+authority+am", "am")
    broker, broker_key = pki.issue_certificate(ca, ca_key, "urn:publicid:IDN+rpc.test+authority+broker", "broker")
    for name, data in (("ca.pem", ca), ("am.pem", am), ("am.key", am_key), ("broker.pem", broker),
                       ("broker.key", broker_key)):
        (tmp_path / name).write_bytes(data)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(tmp_path / "broker.pem"), str(tmp_path / "broker.key"))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]

    def answer_nothing() -> None:
        """Every connection (the client's transport may retry once) gets the status line and no body, after
        its whole request was read: closing with unread bytes resets the connection instead."""
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # the test closed the listener
            try:
                with ctx.wrap_socket(conn, server_side=True) as tls:
                    data = b""
                    while b"\r\n\r\n" not in data:
                        data += tls.recv(65536)
                    head, _, body = data.partition(b"\r\n\r\n")
                    length = int(next((line.split(b":", 1)[1] for line in head.split(b"\r\n")
                                       if line.lower().startswith(b"content-length:")), b"0"))
                    while len(body) < length:
                        body += tls.recv(65536)
                    tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/xml\r\nContent-Length: 0\r\n\r\n")
            except (OSError, ssl.SSLError):
                continue

    server = threading.Thread(target=answer_nothing, daemon=True)
    server.start()
    client = ActorClient("broker", f"https://127.0.0.1:{port}/", str(tmp_path / "am.pem"), str(tmp_path / "am.key"),
                         str(tmp_path / "ca.pem"), "urn:publicid:IDN+rpc.test+authority+broker", timeout=30)
    try:
        with pytest.raises(Unavailable, match="stopped in the middle of its answer"):
            client.call("place")
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the accept(); close() alone leaves the thread blocked in it
        listener.close()
        server.join(10)
    assert not server.is_alive()
