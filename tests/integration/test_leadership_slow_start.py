"""An active actor whose start takes longer than its lease keeps the lease (deployment/leadership.py).

Found by bench/scale.py on the distributed deployment over 1,000 hosts on a loaded machine: the authority took
6.0 s to start (delegating the substrate) against a 5 s lease renewed only once it served, so it lost the lease
one second after it began serving, stopped (callers' Provisions cut: "EOF occurred in violation of protocol"),
took the lease again and started again."""

from __future__ import annotations

import time
from typing import Any

import pytest

from deployment import leadership
from deployment.leadership import Leadership, lease_name
from slicex.store.redis_store import RedisStore
from tests.integration.conftest import REDIS_URL


@pytest.fixture
def short_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leadership, "LEASE_SECONDS", 1.0)
    monkeypatch.setattr(leadership, "RENEW_SECONDS", 0.2)
    monkeypatch.setattr(leadership, "POLL_SECONDS", 0.1)


def test_a_start_longer_than_the_lease_keeps_it_and_serves_once(short_lease: None):
    store = RedisStore(REDIS_URL)
    store.flush()
    starts: list[float] = []
    stops: list[float] = []

    def serve(_fenced: Any) -> tuple[str, Any]:
        starts.append(time.monotonic())
        time.sleep(2.5)  # two and a half leases
        return "https://127.0.0.1:1/", lambda: stops.append(time.monotonic())

    lead = Leadership(store, "authority", serve)
    try:
        lead.start(wait=10)
        assert lead.state == "active" and lead.token is not None
        token = lead.token
        time.sleep(2.0)  # ten renewals
        assert (len(starts), stops, lead.state, lead.token) == (1, [], "active", token)
        assert store.lease_of(lease_name("authority"))[:2] == (lead.holder, token)
    finally:
        lead.stop()
        store.flush()
    assert len(stops) == 1 and store.lease_of(lease_name("authority")) is None  # stopped cleanly: given up


def test_an_actor_that_cannot_start_gives_the_lease_up(short_lease: None):
    store = RedisStore(REDIS_URL)
    store.flush()

    def serve(_fenced: Any) -> tuple[str, Any]:
        raise RuntimeError("no substrate")

    lead = Leadership(store, "broker", serve)
    try:
        lead.start(wait=0.5)
        time.sleep(0.3)
        assert lead.state != "active"
    finally:
        lead.stop()
        store.flush()
