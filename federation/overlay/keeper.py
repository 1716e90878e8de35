"""Keeps one node's address: claims one (the preferred address, else random ones from the pool), renews it
at a quarter of the lease in a background thread, and releases it on leave. The state lives in a
`core.Lease`; this module only sends the claims the core asks for and feeds it the answers."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from ipaddress import IPv4Address

from federation.overlay import core
from federation.overlay.claims import RedisClaims
from federation.overlay.core import Holder, Lease, NamespaceConfig, Outcome, Phase
from slicex.errors import GeniError, Refused

log = logging.getLogger(__name__)


class LeaseKeeper:
    def __init__(self, claims: RedisClaims, config: NamespaceConfig, holder: Holder,
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None,
                 on_change: Callable[[Lease], None] | None = None):
        self.claims = claims
        self.config = config
        self.holder = holder
        self.clock = clock
        self.rng = rng or random.Random()
        self.on_change = on_change
        self.lease = Lease()
        self.renewals = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> IPv4Address | None:
        return self.lease.address if self.lease.phase is Phase.BOUND else None

    def _set(self, lease: Lease) -> None:
        changed = lease.phase is not self.lease.phase or lease.address != self.lease.address
        self.lease = lease
        if changed and self.on_change:
            self.on_change(lease)

    def acquire(self, preferred: IPv4Address | None = None, attempts: int | None = None) -> IPv4Address:
        """Claim an address: `preferred` first, then random free ones, at most `attempts` tries (default: the
        whole pool). Raises Refused naming the namespace when none could be had."""
        with self._lock:
            if self.lease.phase is Phase.BOUND:
                return self.lease.address  # type: ignore[return-value]
            self.lease = Lease()
            limit = attempts if attempts is not None else len(self.config.candidates()) + 1
            for n, address in enumerate(core.candidate_order(self.config, self.rng, preferred)):
                if n >= limit:
                    break
                sent = self.clock()
                outcome, _ = self.claims.claim(self.config.name, address, self.holder, self.config.lease)
                self._set(core.on_claim(self.lease, self.config, address, outcome, sent))
                if self.lease.phase is Phase.BOUND:
                    return address
            raise Refused(f"no free address in namespace {self.config.name} ({self.config.network}) after "
                          f"{len(self.lease.tried)} claims")

    def renew(self) -> Lease:
        """One renewal round: mark the lease lost if it ran out, else renew when a quarter lease has passed."""
        with self._lock:
            now = self.clock()
            self._set(core.on_tick(self.lease, now))
            if not core.renew_due(self.lease, now):
                return self.lease
            address = self.lease.address
            assert address is not None
            try:
                outcome, _ = self.claims.claim(self.config.name, address, self.holder, self.config.lease)
            except GeniError as exc:
                self._set(core.on_store_error(self.lease, self.clock(), exc.message))
                log.warning("renewing %s in %s: %s", address, self.config.name, exc.message)
                return self.lease
            self._set(core.on_claim(self.lease, self.config, address, outcome, now))
            if outcome is Outcome.RENEWED or outcome is Outcome.WON:
                self.renewals += 1
            return self.lease

    def start(self, poll: float | None = None) -> None:
        """Renew in the background, checking every `poll` seconds (default a twentieth of the lease)."""
        step = poll if poll is not None else max(0.005, self.config.lease / 20)

        def loop() -> None:
            while not self._stop.wait(step):
                if self.renew().phase is not Phase.BOUND:
                    return

        self._thread = threading.Thread(target=loop, name=f"lease-{self.holder.node}", daemon=True)
        self._thread.start()

    def leave(self) -> bool:
        """Stop renewing and release the address. True when the store freed it (False when it had already
        expired or passed to another node)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            address = self.lease.address if self.lease.phase is Phase.BOUND else None
            self._set(core.on_release(self.lease))
            return address is not None and self.claims.release(self.config.name, address, self.holder)
