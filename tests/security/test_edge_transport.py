"""The XML-RPC edge and the slice authority under attack, over mutual TLS on both deployments: oversize
requests are answered (not dropped), absurd numbers in a request are BADARGS, slice-authority errors are real
XML-RPC faults (store outages say so), and two users racing for one slice name get one owner."""

from __future__ import annotations

import threading
import xmlrpc.client
from datetime import timedelta

import pytest

from slicex.store.redis_store import RedisStore
from tests.factories import request_rspec, vm
from tests.integration.conftest import AUTHORITY
from tests.integration.test_am_api import code, ok

MB = 1024 * 1024


# ---- oversize requests ---------------------------------------------------------------------------------------
def test_twenty_megabyte_allocate_is_answered_toobig_and_the_server_keeps_serving(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("huge20")
    rspec = request_rspec([vm("a")], extra="<!--" + "x" * (20 * MB) + "-->")
    reply = alice.am.Allocate(urn, creds, rspec, {})  # the stock xmlrpc.client sends all 20 MB, then reads
    assert code(reply) == 6, reply
    assert "bytes" in reply["output"]
    again = running.user("alice")  # a new connection, as the old one was closed after the answer
    assert ok(again.am.GetVersion())["geni_api"] == 3
    ok(again.am.Allocate(urn, creds, request_rspec([vm("a")]), {}))


def test_twenty_megabyte_call_to_the_slice_authority_is_a_toobig_fault(running):
    alice = running.user("alice")
    with pytest.raises(xmlrpc.client.Fault) as err:
        alice.sa.CreateSlice("x" * (20 * MB))
    assert err.value.faultCode == 6 and "bytes" in err.value.faultString
    assert running.user("alice").sa.GetVersion()["urn"].endswith("+authority+sa")


# ---- numbers in requests -------------------------------------------------------------------------------------
@pytest.mark.parametrize("capacity", ["1e999", "nan", "inf", "-5", "1e300"])
def test_absurd_link_capacity_is_badargs_with_a_clear_output(running, capacity):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("capacity")
    rspec = request_rspec([vm("a", ifaces=["a:0"]), vm("b", ifaces=["b:0"])],
                          [{"client_id": "l", "ifaces": ["a:0", "b:0"], "capacity": capacity}])
    reply = alice.am.Allocate(urn, creds, rspec, {})
    assert code(reply) == 1, reply
    assert "link l capacity" in reply["output"] and "kbps" in reply["output"]


# ---- slice authority: faults ---------------------------------------------------------------------------------
@pytest.mark.parametrize("method,args", [
    ("CreateSlice", ("not-a-urn",)),
    ("CreateSlice", (f"urn:publicid:IDN+{AUTHORITY}+user+alice",)),
    ("RenewSlice", ("urn:publicid:IDN+", "2030-01-01T00:00:00Z")),
    ("NoSuchMethod", ()),
])
def test_slice_authority_errors_are_xmlrpc_faults(running, method, args):
    alice = running.user("alice")
    with pytest.raises(xmlrpc.client.Fault) as err:
        getattr(alice.sa, method)(*args)
    assert err.value.faultCode in (1, 13) and err.value.faultString


def test_slice_authority_store_outage_is_a_fault_saying_retry(running):
    alice = running.user("alice")
    sa = running.deployment.sa
    real = sa.store
    sa.store = RedisStore("redis://127.0.0.1:1/0", timeout=0.5)  # nothing listens on port 1
    try:
        with pytest.raises(xmlrpc.client.Fault) as err:
            alice.sa.CreateSlice(f"urn:publicid:IDN+{AUTHORITY}+slice+outage")
    finally:
        sa.store = real
    assert err.value.faultCode == 11
    assert "store is unavailable" in err.value.faultString and "retry" in err.value.faultString
    alice.slice_credential("outage")  # back: works


# ---- slice authority: one owner per name ---------------------------------------------------------------------
def _race(users: list, urn: str) -> dict[str, object]:
    """Each user calls CreateSlice(urn) at the same moment from a thread of its own: name -> credential or fault."""
    barrier = threading.Barrier(len(users))
    outcome: dict[str, object] = {}

    def create(user) -> None:
        barrier.wait()
        try:
            outcome[user.name] = user.sa.CreateSlice(urn)
        except xmlrpc.client.Fault as fault:
            outcome[user.name] = fault

    threads = [threading.Thread(target=create, args=(u,)) for u in users]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcome


def test_concurrent_create_slice_for_one_name_gives_exactly_one_owner(running):
    for n in range(12):
        urn = f"urn:publicid:IDN+{AUTHORITY}+slice+race{n}"
        outcome = _race([running.user("alice"), running.user("bob")], urn)
        winners = [name for name, got in outcome.items() if isinstance(got, str)]
        losers = [got for got in outcome.values() if isinstance(got, xmlrpc.client.Fault)]
        assert len(winners) == 1 and len(losers) == 1, outcome
        assert losers[0].faultCode == 17 and "belongs to" in losers[0].faultString
        owner = running.user(winners[0])
        assert urn in owner.sa.ListMySlices(owner.urn)
        other = running.user("bob" if winners[0] == "alice" else "alice")
        assert urn not in other.sa.ListMySlices(other.urn)


def test_an_expired_slice_name_can_be_claimed_again_and_a_deleted_one_once_it_has_expired(running):
    alice, bob = running.user("alice"), running.user("bob")
    urn, _ = alice.slice_credential("reuse")
    with pytest.raises(xmlrpc.client.Fault):
        bob.sa.CreateSlice(urn)
    running.clock.advance(timedelta(days=8))  # past the slice lifetime (7 days)
    _, creds = bob.slice_credential("reuse")
    assert urn in bob.sa.ListMySlices(bob.urn)
    assert bob.sa.DeleteSlice(urn) is True
    with pytest.raises(xmlrpc.client.Fault) as reserved:  # deleted, but reserved until it would have expired
        alice.sa.CreateSlice(urn)
    assert reserved.value.faultCode == 17 and "reserved until" in reserved.value.faultString
    running.clock.advance(timedelta(days=8))
    _, creds = alice.slice_credential("reuse")
    assert urn in alice.sa.ListMySlices(alice.urn)
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {}))
