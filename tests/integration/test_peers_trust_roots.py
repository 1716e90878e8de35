"""Peers' trust roots fetched from a real local HTTP server and refreshed: a rotated root replaces the old one
in the trust store (and is added to TLS contexts); a bundle that fails to parse, names another namespace or
cannot be fetched is refused and logged, keeping the last good set (slicex/trust_roots.py)."""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from slicex import pki
from slicex.errors import CredentialSignerUntrusted
from slicex.peers import parse_peer
from slicex.trust_roots import PeerTrust, screen_bundle


class Bundle:
    """What the local server answers at /roots.pem (status, body); changed by the tests."""

    def __init__(self) -> None:
        self.status = 200
        self.body = b""
        self.hits = 0


@pytest.fixture
def served() -> Iterator[tuple[Bundle, str]]:
    bundle = Bundle()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            bundle.hits += 1
            body = bundle.body if self.path == "/roots.pem" else b"no such file"
            self.send_response(bundle.status if self.path == "/roots.pem" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield bundle, f"http://127.0.0.1:{server.server_address[1]}/roots.pem"
    server.shutdown()
    server.server_close()


def user_of(ca: tuple[bytes, bytes], name: str, authority: str = "a.test"):
    cert, _ = pki.issue_certificate(ca[0], ca[1], f"urn:publicid:IDN+{authority}+user+{name}", name)
    return pki.load_cert(cert)


def setup(tmp_path: Path, url: str, refresh: float = 3600):
    old = pki.create_ca("a.test", "A CA 2029")
    (tmp_path / "a.pem").write_bytes(old[0])
    peer = parse_peer("testbed-a", {"root": "a.pem", "trust_roots_url": url, "refresh_seconds": refresh},
                      tmp_path, "b.test")
    trust = pki.TrustStore(certs=[pki.load_cert(pki.create_ca("b.test", "B CA")[0])])
    return old, peer, trust, PeerTrust([peer], trust)


def test_rotated_root_replaces_the_old_one_and_reaches_tls(tmp_path: Path, served) -> None:
    bundle, url = served
    old, peer, trust, peers = setup(tmp_path, url)
    now = datetime.now(UTC)
    trust.verify_chain(user_of(old, "alice"), [], now)  # the configured root, bound to a.test
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    peers.watch_tls(ctx)
    new = pki.create_ca("a.test", "A CA 2030")
    bundle.body = new[0]
    assert peers.refresh(peer) is True and bundle.hits == 1
    assert peers.current["testbed-a"] == [pki.load_cert(new[0])]
    assert len(ctx.get_ca_certs()) == 1  # the TLS server learnt the new root
    trust.verify_chain(user_of(new, "alice"), [], now)
    with pytest.raises(CredentialSignerUntrusted):  # the dropped root vouches for nothing now (no stale cache)
        trust.verify_chain(user_of(old, "alice"), [], now)
    assert peers.refresh(peer) is False  # same bundle again: nothing to change


@pytest.mark.parametrize("status, body, words", [
    (200, b"this is not PEM", "holds no PEM certificate that parses"),
    (200, None, "names authority b.test, outside the peer's namespaces (a.test)"),
    (404, b"gone", "fetching http"),
    (200, "leaf", "is not a CA"),
])
def test_bad_bundle_is_refused_and_logged_keeping_the_last_good(tmp_path: Path, served, caplog, status, body,
                                                              words) -> None:
    bundle, url = served
    old, peer, trust, peers = setup(tmp_path, url)
    if body is None:  # a's URL now serves a root that claims b.test (our namespace): a namespace change
        body = pki.create_ca("b.test", "impostor")[0]
    elif body == "leaf":
        body = pki.issue_certificate(old[0], old[1], "urn:publicid:IDN+a.test+user+x", "x")[0]
    bundle.status, bundle.body = status, body
    with caplog.at_level(logging.WARNING, logger="slicex.federation"):
        assert peers.refresh(peer) is False
    assert words in caplog.text and "keeping its last good roots" in caplog.text
    assert words in peers.last_error["testbed-a"]
    assert peers.current["testbed-a"] == [pki.load_cert(old[0])]
    trust.verify_chain(user_of(old, "alice"), [], datetime.now(UTC))


def test_a_bundle_with_one_foreign_root_keeps_the_peers_own(tmp_path: Path) -> None:
    (tmp_path / "a.pem").write_bytes(pki.create_ca("a.test", "A")[0])
    peer = parse_peer("a", {"root": "a.pem"}, tmp_path, "b.test")
    own, foreign = pki.create_ca("a.test:site", "A site")[0], pki.create_ca("c.test", "C")[0]
    screened = screen_bundle(peer, own + foreign, datetime.now(UTC))
    assert screened.accepted == [pki.load_cert(own)]
    assert len(screened.refused) == 1 and "c.test" in screened.refused[0]


def test_background_refresh_follows_the_period(tmp_path: Path, served) -> None:
    bundle, url = served
    old, peer, trust, peers = setup(tmp_path, url, refresh=0.2)
    bundle.body = old[0]
    peers.start()
    try:
        new = pki.create_ca("a.test", "A CA next")
        bundle.body = new[0]
        deadline = time.monotonic() + 5
        while peers.current["testbed-a"] != [pki.load_cert(new[0])] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert peers.current["testbed-a"] == [pki.load_cert(new[0])]
        assert bundle.hits >= 2  # fetched at start, then again after the period
    finally:
        peers.stop()
