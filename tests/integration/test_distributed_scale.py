"""The distributed deployment (broker and authority as actor servers over mutual TLS, state in Redis) over a
generated substrate of 1,000 VM hosts delegates it and places a node: its delegation used to be 36 MB of
XML-RPC, over the actor servers' 8 MiB request limit, so the authority retried forever and every Allocate
was refused. A delegation still too large for one request is refused for good with the reason, in the
authority's log and in `slicex status`, not retried."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from authority.actor import DELEGATION_STATUS
from bench.scale import substrate_doc
from cli.main import _delegation_lines
from slicex.home import Home
from slicex.store import open_store
from tests.factories import request_rspec, vm
from tests.integration.conftest import AUTHORITY, Running, deployment
from tests.integration.test_am_api import code, ok


def _substrate(tmp_path: Path, hosts: int) -> str:
    path = tmp_path / "substrate.yaml"
    path.write_text(yaml.safe_dump(substrate_doc(hosts, 10, AUTHORITY), sort_keys=False))
    return str(path)


def _statuses(r: Running) -> list[dict]:
    store = open_store(str(r.home.config().store))
    try:
        return store.scan(DELEGATION_STATUS)
    finally:
        store.close()


@pytest.fixture
def thousand_hosts(pki_home: Home, tmp_path: Path) -> Iterator[Running]:
    yield from deployment("distributed", pki_home, tmp_path, substrate=_substrate(tmp_path, 1000))


def test_a_distributed_deployment_over_1000_hosts_delegates_and_places_a_node(thousand_hosts: Running):
    r = thousand_hosts
    authority = r.actors[1]
    assert authority.delegator.done.is_set(), authority.delegator.last_error
    alice = r.user("alice")
    urn, creds = alice.slice_credential("big")
    manifest = ok(alice.am.Allocate(urn, creds, request_rspec([vm("n1")]), {}))
    assert len(r.actors[0].actor.substrate_of().hosts) == 1000  # the broker holds the whole substrate
    assert f"urn:publicid:IDN+{AUTHORITY}+node+r" in manifest["geni_rspec"]  # placed on a generated host
    (sliver,) = ok(alice.am.Status([urn], creds, {}))["geni_slivers"]
    assert sliver["geni_allocation_status"] == "geni_allocated"
    assert [s["state"] for s in _statuses(r)] == ["delegated"]
    good, lines = _delegation_lines(r.home)
    assert good and lines == [lines[0]] and "delegated to its broker" in lines[0]


@pytest.fixture
def tight_limit(pki_home: Home, tmp_path: Path, monkeypatch) -> Iterator[Running]:
    """A deployment whose actor requests may carry at most 20,000 bytes: its delegation does not fit."""
    monkeypatch.setattr("slicex.actor_rpc.MAX_BODY_BYTES", 20_000)
    yield from deployment("distributed", pki_home, tmp_path)


def test_a_delegation_too_large_for_a_request_is_refused_for_good_and_status_says_so(tight_limit: Running, caplog):
    r = tight_limit
    delegator = r.actors[1].delegator
    assert not delegator.done.is_set() and delegator._thread is None  # not retried
    assert "at most 20000 bytes per request" in delegator.refused
    (status,) = _statuses(r)
    assert status["state"] == "refused" and "at most 20000 bytes" in status["error"]
    good, lines = _delegation_lines(r.home)
    assert not good and lines[0].startswith("delegation: REFUSED") and "not retried" in lines[0]
    alice = r.user("alice")
    urn, creds = alice.slice_credential("nothing")
    refused = alice.am.Allocate(urn, creds, request_rspec([vm("n1")]), {})
    assert code(refused) == 7 and "delegated no substrate" in refused["output"]


def test_the_authority_logs_a_refused_delegation_as_an_error(pki_home: Home, tmp_path: Path, monkeypatch, caplog):
    monkeypatch.setattr("slicex.actor_rpc.MAX_BODY_BYTES", 20_000)
    with caplog.at_level(logging.ERROR, logger="slicex.authority"):
        for r in deployment("distributed", pki_home, tmp_path):
            assert r.actors[1].delegator.refused
    (record,) = [rec for rec in caplog.records if "cannot delegate" in rec.getMessage()]
    assert record.levelno == logging.ERROR and "will not retry" in record.getMessage()
    assert "at most 20000 bytes" in record.getMessage()
