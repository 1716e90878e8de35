"""PerformOperationalAction when the store dies half-way: all or nothing (put back, or say which slivers did
change), or per-sliver results with geni_best_effort. Never a bare failure code after a partial change."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import yaml

from slicex.errors import Unavailable
from tests.factories import request_rspec, vm
from tests.integration.conftest import Running, start, stop
from tests.integration.test_am_api import code, ok
from tests.integration.test_outages import RedisServer


@pytest.fixture
def two_provisioned(pki_home, tmp_path) -> Iterator[tuple[Running, RedisServer, str, list]]:
    """An embedded deployment on a private Redis with slivers a and b provisioned (notready)."""
    server = RedisServer(tmp_path)
    server.start()
    saved = (pki_home.root / "slicex.yaml").read_text()
    (pki_home.root / "slicex.yaml").write_text(yaml.safe_dump({**yaml.safe_load(saved), "store": server.url}))
    r = start(pki_home)
    try:
        alice = r.user("alice")
        urn, creds = alice.slice_credential("poa")
        ok(alice.am.Allocate(urn, creds, request_rspec([vm("a"), vm("b")]), {}))
        ok(alice.am.Provision([urn], creds, {}))
        yield r, server, urn, creds
    finally:
        stop(r)
        server.kill()
        (pki_home.root / "slicex.yaml").write_text(saved)


def _on_second_modify(r: Running, monkeypatch, then) -> None:
    """Run `then` just before the authority's second modify (the first sliver is done by then)."""
    authority = r.deployment.authority_actor
    real, calls = authority.modify, []

    def modify(lease_id, action, now):
        calls.append(action)
        if len(calls) == 2:
            then()
        return real(lease_id, action, now)

    monkeypatch.setattr(authority, "modify", modify)


def test_start_when_the_store_dies_half_way_names_the_sliver_that_did_change(two_provisioned, monkeypatch):
    r, server, urn, creds = two_provisioned
    alice = r.user("alice")
    _on_second_modify(r, monkeypatch, server.kill)
    reply = alice.am.PerformOperationalAction([urn], creds, "geni_start", {})
    assert code(reply) == 11, reply
    assert "failed on b" in reply["output"] and "did change and could not be put back: a (" in reply["output"]
    server.start()
    monkeypatch.undo()
    ops = {s["geni_sliver_urn"]: s["geni_operational_status"]
           for s in ok(alice.am.Status([urn], creds, {}))["geni_slivers"]}
    changed = reply["output"].split("put back: a (", 1)[1].split(")", 1)[0]
    assert ops.pop(changed) == "geni_configuring" and list(ops.values()) == ["geni_notready"]  # as it said


def test_start_with_best_effort_reports_each_sliver(two_provisioned, monkeypatch):
    r, server, urn, creds = two_provisioned
    _on_second_modify(r, monkeypatch, server.kill)
    reply = r.user("alice").am.PerformOperationalAction([urn], creds, "geni_start", {"geni_best_effort": True})
    slivers = ok(reply)
    assert [(s["geni_operational_status"], bool(s["geni_error"])) for s in slivers] == \
        [("geni_configuring", False), ("geni_notready", True)]
    assert "geni_start failed" in slivers[1]["geni_error"] and server.url in slivers[1]["geni_error"]
    server.start()


def test_start_that_fails_on_one_sliver_is_undone_on_the_others(two_provisioned, monkeypatch):
    r, server, urn, creds = two_provisioned

    def authority_down():
        raise Unavailable("authority at https://127.0.0.1:1/ is not reachable")

    _on_second_modify(r, monkeypatch, authority_down)
    reply = r.user("alice").am.PerformOperationalAction([urn], creds, "geni_start", {})
    assert code(reply) == 11 and "undone (geni_stop) on a: no sliver was changed" in reply["output"], reply
    monkeypatch.undo()
    r.clock.advance(timedelta(minutes=10))
    ops = [s["geni_operational_status"] for s in ok(r.user("alice").am.Status([urn], creds, {}))["geni_slivers"]]
    assert ops == ["geni_notready", "geni_notready"]
