"""One active broker and one active authority, however many processes run each (issue 37).

Every process of a role (`slicex actor broker`, `slicex actor broker --standby` on another host) contends for
the role's lease in the deployment's Redis store (slicex.store.redis_store: `take_lease`). The holder serves:
it builds its actor on a store *fenced* with the lease's token (every write it makes is refused once another
holds the lease, checked inside the write's own script), publishes its URL in the store (`actor-roles`), and
renews the lease every second. The others are standbys: they record themselves (`actor-standbys`), poll the
lease and take it when it lapses, `LEASE_SECONDS` after the holder's last renewal (at once when the holder
stopped cleanly and gave it up, or died on this same host). A holder that cannot renew (it lost the lease, or
the store did not answer for longer than the lease) stops serving and contends again as a standby. AM workers
and the authority call whichever URL `actor-roles` names (`active_url`)."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from slicex.errors import GeniError

log = logging.getLogger("slicex.leadership")

LEASE_SECONDS = 5.0
"""How long a lease outlives its holder's last renewal: the standby takes over within this (plus its start)."""
RENEW_SECONDS = 1.0
POLL_SECONDS = 0.5
ROLES_TABLE = "actor-roles"  # role -> the active process: url, holder, token, since
STANDBYS_TABLE = "actor-standbys"  # holder -> a waiting process: role, seen_at
STANDBY_SEEN_SECONDS = 10.0  # a standby record older than this is a process gone


def lease_name(role: str) -> str:
    return f"actor-{role}"


def new_holder() -> str:
    """This process's name in a lease: host, pid and a nonce (a pid reused later is another holder)."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"


def dead_here(holder: str) -> bool:
    """Whether `holder` was a process of this host that no longer runs (its lease can be taken at once)."""
    host, _sep, rest = holder.partition("/")
    pid = rest.partition("/")[0]
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def supports_leases(store: Any) -> bool:
    """Leases live in Redis (plain or through Sentinel): a SQLite store has one process, so no standby."""
    inner = getattr(store, "inner", store)
    return hasattr(inner, "take_lease")


def active_url(store: Any, role: str) -> str | None:
    """The URL of the active `role` actor as it published it, while its lease is held; None otherwise."""
    inner = getattr(store, "inner", store)
    if not supports_leases(inner):
        return None
    held = inner.lease_of(lease_name(role))
    doc = inner.get(ROLES_TABLE, role)
    if held is None or doc is None or doc.get("token") != held[1]:
        return None
    return str(doc["url"])


class Leadership:
    """Run `serve` while this process holds `role`'s lease; wait as a standby while another does.

    `serve(fenced_store)` starts the actor on the fenced store and returns (its URL, how to stop it)."""

    def __init__(self, store: Any, role: str, serve: Callable[[Any], tuple[str, Callable[[], None]]],
                 standby: bool = False):
        if not supports_leases(store):
            raise ValueError("leases need a Redis store")
        self.store = store
        self.role = role
        self.serve = serve
        self.standby = standby
        self.holder = new_holder()
        self.state = "starting"  # then "active" or "standby"
        self.url: str | None = None
        self.token: int | None = None
        self._stop = threading.Event()
        self._decided = threading.Event()  # set once it first became active or standby
        self._thread: threading.Thread | None = None

    def start(self, wait: float = LEASE_SECONDS + 2) -> None:
        """Contend in the background; return once this process is active or standby (or `wait` passed)."""
        self._thread = threading.Thread(target=self._run, name=f"{self.role}-leadership", daemon=True)
        self._thread.start()
        self._decided.wait(wait)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(15)

    def _run(self) -> None:
        name = lease_name(self.role)
        while not self._stop.is_set():
            try:
                token = self._take(name)
            except GeniError as exc:
                log.warning("%s: the store did not answer the lease (%s); trying again", self.role, exc.message)
                token = None
            if token is None:
                self._wait_as_standby()
                continue
            self._lead(name, token)

    def _take(self, name: str) -> int | None:
        token = self.store.take_lease(name, self.holder, int(LEASE_SECONDS * 1000))
        if token is None:
            held = self.store.lease_of(name)
            if held is not None and dead_here(held[0]):
                log.warning("%s: the lease holder %s is dead (a process of this host): taking over at once",
                            self.role, held[0])
                token = self.store.take_lease(name, self.holder, int(LEASE_SECONDS * 1000),
                                              replacing=f"{held[0]}|{held[1]}")
        return token

    def _wait_as_standby(self) -> None:
        if self.state != "standby":
            log.warning("%s: standby (%s); another process holds the lease", self.role, self.holder)
        self.state = "standby"
        self._decided.set()
        try:
            self.store.put(STANDBYS_TABLE, self.holder, {"role": self.role, "holder": self.holder,
                                                         "seen_at": time.time()})
        except GeniError:
            pass  # the store is away: the lease poll says so
        self._stop.wait(POLL_SECONDS)

    def _lead(self, name: str, token: int) -> None:
        """Serve while the lease holds. It is renewed from the moment it is taken, in a thread of its own: an
        actor whose start takes longer than the lease (an authority delegating 1,000 hosts on a loaded machine
        took 6 s) would otherwise lose it while starting and stop again at once, its callers' requests cut."""
        fenced = self.store.fenced(name, token)
        taken = time.monotonic()
        lost, done = threading.Event(), threading.Event()
        renewer = threading.Thread(target=self._renew, args=(name, token, lost, done),
                                   name=f"{self.role}-lease", daemon=True)
        renewer.start()
        try:
            try:
                url, stop = self.serve(fenced)
            except Exception:  # noqa: BLE001 - an actor that cannot start gives the lease to another
                log.exception("%s: could not start as the active actor; giving the lease up", self.role)
                done.set()
                renewer.join(LEASE_SECONDS)
                self._drop(name, token)
                self._stop.wait(POLL_SECONDS * 4)
                return
            if not lost.is_set():
                try:
                    fenced.put(ROLES_TABLE, self.role, {"url": url, "holder": self.holder, "token": token,
                                                        "since": datetime.now(UTC).isoformat()})
                    fenced.delete(STANDBYS_TABLE, self.holder)
                except GeniError as exc:
                    log.error("%s: could not publish its URL (%s)", self.role, exc.message)
                self.state, self.url, self.token = "active", url, token
                self._decided.set()
                log.warning("%s: active at %s (lease token %d, serving %.1f s after taking it)", self.role, url,
                            token, time.monotonic() - taken)
            while not (lost.is_set() or self._stop.is_set()):
                lost.wait(POLL_SECONDS)
            self.state, self.url, self.token = "standby", None, None
            stop()
        finally:
            done.set()
            renewer.join(LEASE_SECONDS)
        if self._stop.is_set():
            self._drop(name, token)

    def _renew(self, name: str, token: int, lost: threading.Event, done: threading.Event) -> None:
        """Renew the lease every RENEW_SECONDS until `done`; set `lost` when it cannot be kept."""
        renewed = time.monotonic()
        while not (done.wait(RENEW_SECONDS) or self._stop.is_set()):
            try:
                if not self.store.renew_lease(name, self.holder, token, int(LEASE_SECONDS * 1000)):
                    log.error("%s: lost the lease (token %d): it lapsed or another process took it; no longer "
                              "active", self.role, token)
                    lost.set()
                    return
                renewed = time.monotonic()
            except GeniError as exc:
                if time.monotonic() - renewed >= LEASE_SECONDS:
                    log.error("%s: could not renew the lease for %.0f s (%s): no longer active", self.role,
                              LEASE_SECONDS, exc.message)
                    lost.set()
                    return

    def _drop(self, name: str, token: int) -> None:
        try:
            self.store.drop_lease(name, self.holder, token)
        except GeniError:
            pass  # it lapses by itself


def roles_status(store: Any, now: float | None = None) -> dict[str, dict[str, Any]]:
    """Per role: the active process (holder, url, token, lease age: seconds since its last renewal) and the
    standbys seen lately. What `slicex status` prints."""
    inner = getattr(store, "inner", store)
    now = time.time() if now is None else now
    out: dict[str, dict[str, Any]] = {}
    standbys = inner.scan(STANDBYS_TABLE)
    for role in ("broker", "authority"):
        held = inner.lease_of(lease_name(role))
        doc = inner.get(ROLES_TABLE, role)
        active = None
        if held is not None:
            active = {"holder": held[0], "token": held[1], "age": max(0.0, LEASE_SECONDS - held[2]),
                      "url": doc["url"] if doc and doc.get("token") == held[1] else None}
        waiting = [d for d in standbys if d.get("role") == role and now - float(d.get("seen_at", 0)) <
                   STANDBY_SEEN_SECONDS]
        out[role] = {"active": active, "standbys": waiting}
    return out
