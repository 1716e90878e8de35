"""Integration fixtures: a real deployment (AM + slice authority) on 127.0.0.1 with real TLS, driven by
XML-RPC clients holding user certificates, exactly as omni does."""

from __future__ import annotations

import xmlrpc.client
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from am.service import EmbeddedDeployment
from am.substrate.emulated import FailurePlan
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

    def user(self, name: str) -> User:
        ep = self.deployment.endpoints
        cert, key = self.home.user_cert(name), self.home.user_key(name)
        return User(name, f"urn:publicid:IDN+{AUTHORITY}+user+{name}", cert, key,
                    client(ep.am_url, str(cert), str(key)), client(ep.sa_url, str(cert), str(key)))


def make_home(root: Path, **config) -> Home:
    home = Home(root)
    cfg = {"authority": AUTHORITY, "sa_port": 0, "am_port": 0, "tick_seconds": 0.05}
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


def start(home: Home, clock: ManualClock | None = None, failures: FailurePlan | None = None) -> Running:
    clock = clock or ManualClock(datetime.now(UTC).replace(microsecond=0))
    failures = failures or FailurePlan()
    d = EmbeddedDeployment(home, clock=clock, failures=failures)
    d.start()
    return Running(home, d, clock, failures)


@pytest.fixture
def running(pki_home: Home, tmp_path: Path) -> Iterator[Running]:
    """A fresh deployment (own database) sharing the session's PKI."""
    cfg = pki_home.config()
    (pki_home.root / "slicex.yaml").write_text(yaml.safe_dump(
        {"authority": AUTHORITY, "sa_port": 0, "am_port": 0, "tick_seconds": 0.05,
         "store": f"sqlite:///{tmp_path / 'state.db'}", "am": cfg["am"]}))
    r = start(pki_home)
    yield r
    r.deployment.stop()
