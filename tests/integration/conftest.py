"""Integration fixtures: a real deployment (AM + slice authority) on 127.0.0.1 with real TLS, driven by
XML-RPC clients holding user certificates, exactly as omni does."""

from __future__ import annotations

import os
import xmlrpc.client
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from authority.substrate.emulated import FailurePlan
from deployment.service import EmbeddedDeployment
from slicex.clock import ManualClock
from slicex.devpki import add_user, init_ca
from slicex.home import Home
from slicex.tls_xmlrpc import client

AUTHORITY = "slicex.test"


@dataclass
class User:
    name: str
    urn: str
    cert: Path
    key: Path
    am: xmlrpc.client.ServerProxy
    sa: xmlrpc.client.ServerProxy

    def user_credential(self) -> list[dict]:
        return [{"geni_type": "geni_sfa", "geni_version": "3",
                 "geni_value": self.sa.CreateUserCredential(self.cert.read_text())}]

    def slice_credential(self, name: str) -> tuple[str, list[dict]]:
        urn = f"urn:publicid:IDN+{AUTHORITY}+slice+{name}"
        return urn, [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": self.sa.CreateSlice(urn)}]


@dataclass
class Running:
    home: Home
    deployment: EmbeddedDeployment
    clock: ManualClock
    failures: FailurePlan
    actors: tuple = ()

    def user(self, name: str) -> User:
        ep = self.deployment.endpoints
        cert, key = self.home.user_cert(name), self.home.user_key(name)
        return User(name, f"urn:publicid:IDN+{AUTHORITY}+user+{name}", cert, key,
                    client(ep.am_url, str(cert), str(key)), client(ep.sa_url, str(cert), str(key)))


def make_home(root: Path, **config) -> Home:
    home = Home(root)
    cfg = {"authority": AUTHORITY, "sa_port": 0, "am_port": 0, "tick_seconds": 0.05, "dashboard_port": None}
    cfg.update(config)
    root.mkdir(parents=True, exist_ok=True)
    (root / "slicex.yaml").write_text(yaml.safe_dump(cfg))
    init_ca(home, AUTHORITY)
    for name in ("alice", "bob"):
        add_user(home, AUTHORITY, name)
    return home


@pytest.fixture(scope="session")
def pki_home(tmp_path_factory) -> Home:
    return make_home(tmp_path_factory.mktemp("slicex-home"))


def start(home: Home, clock: ManualClock | None = None, failures: FailurePlan | None = None,
          distributed: bool = False) -> Running:
    """Start a deployment. distributed=True: broker and authority are separate actor servers reached over
    mutual TLS, and all state is in the store the config names (Redis in these tests)."""
    clock = clock or ManualClock(datetime.now(UTC).replace(microsecond=0))
    failures = failures or FailurePlan()
    actors: tuple = ()
    urls: dict[str, str] = {}
    if distributed:
        from deployment.service import ActorProcess

        broker = ActorProcess(home, "broker", port=0, clock=clock)
        broker_url = broker.start()
        authority = ActorProcess(home, "authority", port=0, clock=clock, failures=failures, broker_url=broker_url)
        actors = (broker, authority)  # the authority delegates to its broker as it starts
        urls = {"broker_url": broker_url, "authority_url": authority.start()}
    d = EmbeddedDeployment(home, clock=clock, failures=failures, **urls)
    d.start()
    return Running(home, d, clock, failures, actors)


def stop(r: Running) -> None:
    r.deployment.stop()
    for a in r.actors:
        a.stop()


REDIS_URL = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/12")


def deployment(kind: str, pki_home: Home, tmp_path: Path, **config) -> Iterator[Running]:
    """A fresh deployment of `kind` sharing the session's PKI: embedded (SQLite, in-process actors) or
    distributed (Redis, broker and authority as actor servers over mutual TLS); `config` adds slicex.yaml keys."""
    from slicex.store.redis_store import RedisStore

    distributed = kind == "distributed"
    store = REDIS_URL if distributed else f"sqlite:///{tmp_path / 'state.db'}"
    if distributed:
        RedisStore(REDIS_URL).flush()
    path = pki_home.root / "slicex.yaml"
    saved = path.read_text() if path.exists() else None
    path.write_text(yaml.safe_dump(
        {"authority": AUTHORITY, "sa_port": 0, "am_port": 0, "tick_seconds": 0.05, "store": store,
         "dashboard_port": None, **config}))  # written whole: what an earlier test wrote never carries over
    try:  # and put back, even when the deployment refuses it (tests that read the session's file go on)
        r = start(pki_home, distributed=distributed)
        yield r
        stop(r)
    finally:
        if saved is not None:
            path.write_text(saved)
        if distributed:
            RedisStore(REDIS_URL).flush()


@pytest.fixture(params=["embedded", "distributed"])
def running(request, pki_home: Home, tmp_path: Path) -> Iterator[Running]:
    """The same tests run against both deployments."""
    yield from deployment(request.param, pki_home, tmp_path)
