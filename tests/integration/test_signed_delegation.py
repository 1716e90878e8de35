"""The authority delegates its own inventory, signed with its key: in the distributed deployment its actor
process does it (at start, retrying until the broker answers, in any start order), and the AM process writes
nothing to the authority's tables; in the embedded one the in-process authority delegates the same signed
way. The broker holds the signed document it accepted."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from authority.actor import DELEGATED, Authority
from broker.broker import DELEGATIONS
from deployment.service import ActorProcess, EmbeddedDeployment
from slicex.codec import decode
from slicex.devpki import actor_public_key
from slicex.errors import CredentialInvalid
from slicex.home import Home
from slicex.ticket import SignedDelegation, verify_delegation
from tests.factories import request_rspec, vm
from tests.integration.conftest import AUTHORITY, Running, deployment
from tests.integration.test_am_api import ok

AM = f"urn:publicid:IDN+{AUTHORITY}+authority+am"


@pytest.fixture
def distributed(pki_home: Home, tmp_path: Path) -> Iterator[Running]:
    yield from deployment("distributed", pki_home, tmp_path)


def held_by_broker(r: Running) -> list[SignedDelegation]:
    """The signed delegations the broker holds, asked as the slice manager asks it (over mTLS when remote)."""
    return [decode(d, SignedDelegation, "delegation") for d in r.deployment.broker.delegations(AM)]


def assert_signed_by_the_authority(r: Running) -> SignedDelegation:
    held = held_by_broker(r)
    assert len(held) == 1, held
    doc = held[0]
    verify_delegation(doc, actor_public_key(r.home, "authority", AUTHORITY))  # the authority actor's own key
    for other in ("broker", "am"):
        with pytest.raises(CredentialInvalid):
            verify_delegation(doc, actor_public_key(r.home, other, AUTHORITY))
    assert (doc.authority, doc.broker) == (AM, "broker") and doc.body["pools"] and doc.body["substrate"]
    return doc


def test_the_broker_holds_a_delegation_signed_by_the_authority(running: Running):
    """Both deployments (conftest `running`): one code path, the authority signs what it delegates."""
    r = running
    doc = assert_signed_by_the_authority(r)
    if r.actors:
        assert r.actors[1].delegator.done.is_set()  # the authority actor's process delegated
    else:
        assert isinstance(r.deployment.authority_actor, Authority)  # embedded: the in-process authority did
    # the authority's own record says what the signed document says
    record = r.deployment.store.get(DELEGATED, f"{AM}|broker")
    names = [p["name"] for p in doc.body["pools"]] + [ls["name"] for ls in doc.body["label_sets"]]
    assert sorted(record["names"]) == sorted(names)
    alice = r.user("alice")
    urn, creds = alice.slice_credential("signed")
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("n1")]), {}))
    ok(alice.am.Provision([urn], creds, {}))  # the authority redeems against what it delegated


def test_the_am_process_writes_nothing_to_authority_tables(distributed: Running):
    r = distributed
    store = r.deployment.store
    given = held_by_broker(r)
    saved = {f"{d['authority']}|{d['broker']}": d for d in store.scan(DELEGATED)}
    assert saved, "the authority recorded nothing"
    for key in saved:
        store.delete(DELEGATED, key)
    # a second AM process of this deployment (as an AM worker, or `slicex up` restarted) starts against the
    # running broker and authority
    am = EmbeddedDeployment(r.home, clock=r.clock, sa_port=0, am_port=0, broker_url=r.actors[0].url,
                            authority_url=r.actors[1].url)
    try:
        am.start()
        assert list(store.scan(DELEGATED)) == []  # it did not act for the authority
        assert held_by_broker(r) == given  # nor delegate anything to the broker
        assert not isinstance(am.authority_actor, Authority)  # it reaches the authority actor, builds none
    finally:
        am.stop()
        for key, doc in saved.items():
            store.put(DELEGATED, key, doc)


def test_the_authority_delegates_in_any_start_order(distributed: Running):
    """The authority comes up before its broker: it retries until the broker answers; both restarted at
    their addresses, the deployment serves again."""
    r = distributed
    broker, authority = r.actors
    broker_url, authority_url = broker.url, authority.url
    port = {u: int(re.search(r":(\d+)/?$", u).group(1)) for u in (broker_url, authority_url)}
    broker.stop()
    authority.stop()
    for d in list(r.deployment.store.scan(DELEGATIONS)):  # forget every delegation: the new one must be made
        r.deployment.store.delete(DELEGATIONS, f"{d['broker']}|{d['authority']}")
    for d in list(r.deployment.store.scan(DELEGATED)):
        r.deployment.store.delete(DELEGATED, f"{d['authority']}|{d['broker']}")
    first = ActorProcess(r.home, "authority", port=port[authority_url], clock=r.clock, failures=r.failures,
                         broker_url=broker_url)
    r.actors = (broker, first)
    first.delegator.first_delay = 0.1
    first.start()
    assert not first.delegator.done.is_set() and first.delegator.last_error  # no broker yet
    second = ActorProcess(r.home, "broker", port=port[broker_url], clock=r.clock)
    second.start()
    r.actors = (second, first)
    assert first.delegator.done.wait(10), first.delegator.last_error
    assert_signed_by_the_authority(r)
    alice = r.user("alice")
    urn, creds = alice.slice_credential("any-order")
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("n1")]), {}))
    ok(alice.am.Provision([urn], creds, {}))
