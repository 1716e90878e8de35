"""Running the exchange point: its TLS XML-RPC server (the AM's machinery, slicex/tls_xmlrpc.py), the record
store, start-up recovery of unfinished operations, and the loop that retries rollbacks a domain could not
take yet. `slicex sep serve` (cli/sep.py) runs one in the foreground."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from federation.sep.config import SepConfig
from federation.sep.overlay import load_overlay
from federation.sep.relay import Relay
from federation.sep.service import ExchangePoint
from slicex import pki
from slicex.clock import Clock, SystemClock
from slicex.credentials import CredentialVerifier
from slicex.store import open_store
from slicex.tls_xmlrpc import TlsXmlRpcServer, server_context

log = logging.getLogger("slicex.sep")


def roots_bundle(cfg: SepConfig, into: Path) -> Path:
    """The trusted roots as one PEM file: TLS checks users' and domains' certificates against it."""
    pems = []
    for r in cfg.trusted_roots:
        files = sorted(r.glob("*.pem")) + sorted(r.glob("*.crt")) if r.is_dir() else [r]
        pems += [f.read_bytes() for f in files]
    into.parent.mkdir(parents=True, exist_ok=True)
    into.write_bytes(b"\n".join(pems))
    return into


class SepServer:
    """One exchange point: `start()` serves, and recovers what the record shows unfinished behind it."""

    def __init__(self, cfg: SepConfig, clock: Clock | None = None, port: int | None = None):
        self.cfg = cfg
        run_dir = (cfg.path.parent if cfg.path else Path.cwd()) / "run"
        bundle = roots_bundle(cfg, run_dir / "sep-roots.pem")
        trust = pki.TrustStore([str(r) for r in cfg.trusted_roots], namespaces=cfg.trusted_root_namespaces)
        sep_cert = pki.load_cert(cfg.cert.read_bytes())
        self.store = open_store(cfg.store)
        self.server = TlsXmlRpcServer((cfg.host, cfg.port if port is None else port),
                                      server_context(str(cfg.cert), str(cfg.key), str(bundle)))
        url = cfg.url or f"https://{cfg.host}:{self.server.port}/"
        self.sep = ExchangePoint(pki.cert_urn(sep_cert), url, cfg.domains,
                                 Relay(str(cfg.cert), str(cfg.key), str(bundle), cfg.timeout_seconds), self.store,
                                 CredentialVerifier(trust), sep_cert, clock or SystemClock(),
                                 load_overlay(cfg.overlay, {"log_dir": str(run_dir / "overlay"),
                                                            **cfg.overlay_options}))
        self.server.answer(self.sep.endpoint())
        self.url = url
        self._stop = threading.Event()

    def start(self) -> str:
        """Serve at once; the retry loop's first pass rolls back what the record shows unfinished (a call on
        such a slice meanwhile gets BUSY), so a hung domain never keeps the exchange point from serving."""
        self.server.start_background()
        threading.Thread(target=self.sep.retry_loop, args=(self._stop, self.cfg.retry_seconds),
                         name="sep-retry", daemon=True).start()
        return self.url

    def stop(self) -> None:
        self._stop.set()
        self.server.close()
        self.store.close()
