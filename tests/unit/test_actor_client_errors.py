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
