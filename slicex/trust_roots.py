"""Keeping federation peers' roots in a deployment's trust: loaded from each peer's `root` file at start, and
for peers with `trust_roots_url` (a PEM bundle over HTTP(S)) or `ch_url` (a CH API serving `get_trust_roots`)
fetched again every `refresh_seconds`.

Each root is bound to its peer's namespaces in the trust store (slicex/pki.py), so a peer's root can never
vouch for our names or a third testbed's. A fetched bundle is checked before it replaces anything
(`screen_bundle`, pure): a bundle that does not parse, or whose every root is refused, leaves the last good
set in place; a root naming an authority outside the peer's namespaces, not a CA, or not valid now, is
refused and logged. Fetching over https verifies the server against the public CAs, or else against the
peer's own current roots (a slicex CH API presents a certificate of the peer's CA); plain http is accepted
but logged as unauthenticated. The TLS servers learn added roots at once; a root a refresh drops still opens
a TLS connection until restart, but no credential or identity chaining to it verifies any more."""

from __future__ import annotations

import logging
import ssl
import threading
import time
import urllib.error
import urllib.request
import xmlrpc.client
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from slicex import pki
from slicex.config import SlicexConfig
from slicex.peers import Peer, PeerGate, load_peers, peer_of
from slicex.tls_xmlrpc import SafeTransport

log = logging.getLogger("slicex.federation")
MAX_BUNDLE_BYTES = 1024 * 1024
FETCH_TIMEOUT = 10.0


def source_of(peer: Peer) -> str:
    """How a peer's roots are labelled in the trust store."""
    return f"peer:{peer.name}"


def _pem(certs: list[x509.Certificate]) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


@dataclass(frozen=True)
class Screened:
    """A fetched bundle after checking: the roots to trust (empty: keep the last good set) and why each
    refused one was refused."""

    accepted: list[x509.Certificate]
    refused: list[str]


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def screen_bundle(peer: Peer, data: bytes | str, now: datetime) -> Screened:
    """Which roots of a fetched bundle may stand for `peer`: CA certificates, valid at `now`, naming (if they
    name one) an authority inside the peer's namespaces."""
    text = data.encode() if isinstance(data, str) else data
    certs = pki.load_certs(text)
    if not certs:
        return Screened([], [f"peer {peer.name}: the fetched bundle holds no PEM certificate that parses"])
    accepted: list[x509.Certificate] = []
    refused: list[str] = []
    for cert in certs:
        name = pki.cert_urn(cert) or cert.subject.rfc4514_string()
        authority = pki.urn_authority(cert)
        if authority is not None and not any(pki.namespace_covers(ns, authority) for ns in peer.namespaces):
            refused.append(f"peer {peer.name}: fetched root {name} names authority {authority}, outside the peer's "
                           f"namespaces ({', '.join(peer.namespaces)}); refused")
        elif not _is_ca(cert):
            refused.append(f"peer {peer.name}: fetched certificate {name} is not a CA; refused")
        elif not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            refused.append(f"peer {peer.name}: fetched root {name} is not valid now "
                           f"({cert.not_valid_before_utc:%Y-%m-%dT%H:%M:%SZ} to "
                           f"{cert.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}); refused")
        elif cert not in accepted:
            accepted.append(cert)
    return Screened(accepted, refused)


class PeerTrust:
    """A deployment's peers and their roots: adds them to the trust store and the TLS servers, refreshes the
    ones that say where to fetch from, and builds the AM's policy gate."""

    def __init__(self, peers: list[Peer], trust: pki.TrustStore, client_cert: tuple[str, str] | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)):
        self.peers = peers
        self.trust = trust
        self.client_cert = client_cert  # (cert file, key file) presented to a peer's CH API
        self.clock = clock
        self.current: dict[str, list[x509.Certificate]] = {}  # peer name → the roots trusted now (last good)
        self.last_error: dict[str, str] = {}  # peer name → why its last refresh kept the old roots ("" when none)
        self.tls_contexts: list[ssl.SSLContext] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        for peer in peers:
            certs = pki.load_certs(peer.root.read_bytes())
            self._apply(peer, certs)
            log.info("peer %s: %d root(s) from %s vouch for %s%s", peer.name, len(certs), peer.root,
                     ", ".join(peer.namespaces), f"; refreshed from {peer.trust_roots_url or peer.ch_url} every "
                     f"{peer.refresh.total_seconds():g} s" if peer.fetches else "")

    @staticmethod
    def for_deployment(home_root: Path, cfg: SlicexConfig, trust: pki.TrustStore,
                       client_cert: tuple[str, str] | None = None) -> PeerTrust:
        return PeerTrust(load_peers(cfg.peers, cfg.authority, home_root), trust, client_cert)

    def peers_now(self) -> list[Peer]:
        return self.peers

    def gate(self, aggregate_urn: str, held: Callable[[Any], Any], wanted: Callable[[Any], Any]) -> PeerGate:
        return PeerGate(self.peers_now, aggregate_urn, held, wanted)

    def peer_of(self, caller_urn: str | None, slice_urn: str | None = None) -> Peer | None:
        return peer_of(self.peers, caller_urn, slice_urn)

    # ---- TLS ---------------------------------------------------------------------------------------------------
    def all_pem(self) -> bytes:
        return b"".join(_pem(c) for c in self.current.values())

    def extend_bundle(self, bundle: Path) -> Path:
        """Append every peer's roots to the TLS servers' CA bundle (a peer's users connect with certificates
        its CA issued); returns the bundle."""
        extra = self.all_pem()
        if extra:
            with open(bundle, "ab") as f:
                f.write(b"\n" + extra)
        return bundle

    def watch_tls(self, *contexts: ssl.SSLContext) -> None:
        """TLS server contexts that learn roots a refresh adds."""
        self.tls_contexts.extend(contexts)

    # ---- refreshing --------------------------------------------------------------------------------------------
    def _apply(self, peer: Peer, certs: list[x509.Certificate]) -> None:
        added = [c for c in certs if c not in self.current.get(peer.name, [])]
        self.current[peer.name] = list(certs)
        self.trust.set_roots(source_of(peer), list(certs), peer.namespaces)
        for ctx in self.tls_contexts:
            if added:
                ctx.load_verify_locations(cadata=_pem(added).decode())

    def fetch(self, peer: Peer) -> bytes:
        """The peer's root bundle as its `trust_roots_url` or CH API serves it (PEM); raises on failure."""
        if peer.trust_roots_url:
            return self._fetch_url(peer, peer.trust_roots_url)
        if peer.ch_url:
            return self._fetch_ch(peer, peer.ch_url)
        raise ValueError(f"peer {peer.name} has no trust_roots_url or ch_url")

    def _pinned_context(self, peer: Peer, client: bool) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False  # the peer's CA issues its servers certificates that name URNs, not hosts
        ctx.load_verify_locations(cadata=_pem(self.current.get(peer.name, [])).decode())
        if client and self.client_cert:
            ctx.load_cert_chain(*self.client_cert)
        return ctx

    def _fetch_url(self, peer: Peer, url: str) -> bytes:
        if url.startswith("http://"):
            log.warning("peer %s: fetching trust roots over plain http (%s): unauthenticated; prefer https",
                        peer.name, url)
            return self._read(urllib.request.urlopen(url, timeout=FETCH_TIMEOUT))
        try:
            return self._read(urllib.request.urlopen(url, timeout=FETCH_TIMEOUT,
                                                     context=ssl.create_default_context()))
        except urllib.error.URLError as exc:
            if not isinstance(exc.reason, ssl.SSLCertVerificationError):
                raise
        # not a public-CA server: it must then present a certificate of the peer's own CA
        return self._read(urllib.request.urlopen(url, timeout=FETCH_TIMEOUT,
                                                 context=self._pinned_context(peer, client=False)))

    @staticmethod
    def _read(resp: Any) -> bytes:
        with resp:
            data = resp.read(MAX_BUNDLE_BYTES + 1)
        if len(data) > MAX_BUNDLE_BYTES:
            raise ValueError(f"bundle larger than {MAX_BUNDLE_BYTES} bytes")
        return data

    def _fetch_ch(self, peer: Peer, url: str) -> bytes:
        proxy = xmlrpc.client.ServerProxy(url, transport=SafeTransport(self._pinned_context(peer, client=True),
                                                                       FETCH_TIMEOUT), allow_none=True)
        answer = proxy.get_trust_roots()
        if not isinstance(answer, dict) or answer.get("code") != 0:
            output = answer.get("output") if isinstance(answer, dict) else answer
            raise ValueError(f"get_trust_roots at {url} answered {output!r}")
        value = answer.get("value")
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"get_trust_roots at {url} returned {type(value).__name__}, not a list of PEM strings")
        return "\n".join(value).encode()

    def refresh(self, peer: Peer) -> bool:
        """Fetch and screen one peer's roots; True when they were replaced. A failure or a refused bundle is
        logged and keeps the last good set."""
        where = peer.trust_roots_url or peer.ch_url
        try:
            data = self.fetch(peer)
        except Exception as exc:  # noqa: BLE001 - any failure to fetch keeps the last good set
            self.last_error[peer.name] = f"fetching {where} failed: {type(exc).__name__}: {exc}"
            log.warning("peer %s: %s; keeping its last good roots", peer.name, self.last_error[peer.name])
            return False
        screened = screen_bundle(peer, data, self.clock())
        for why in screened.refused:
            log.warning("%s", why)
        if not screened.accepted:
            self.last_error[peer.name] = "; ".join(screened.refused) or "empty bundle"
            log.warning("peer %s: nothing acceptable at %s; keeping its last good roots", peer.name, where)
            return False
        self.last_error[peer.name] = "; ".join(screened.refused)
        log.debug("peer %s: fetched %d acceptable root(s) from %s", peer.name, len(screened.accepted), where)
        if screened.accepted != self.current.get(peer.name):
            self._apply(peer, screened.accepted)
            log.info("peer %s: trust roots now %s (from %s)", peer.name,
                     ", ".join(pki.cert_urn(c) or c.subject.rfc4514_string() for c in screened.accepted), where)
            return True
        return False

    def start(self) -> None:
        """Refresh every fetching peer now, then every `refresh_seconds`, in one background thread."""
        fetching = [p for p in self.peers if p.fetches]
        if not fetching or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, args=(fetching,), name="peer-trust-roots", daemon=True)
        self._thread.start()

    def _loop(self, peers: list[Peer]) -> None:
        due = {p.name: 0.0 for p in peers}
        while not self._stop.is_set():
            now = time.monotonic()
            for p in peers:
                if due[p.name] <= now:
                    self.refresh(p)
                    due[p.name] = time.monotonic() + p.refresh.total_seconds()
            self._stop.wait(max(0.05, min(due.values()) - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=FETCH_TIMEOUT + 1)
