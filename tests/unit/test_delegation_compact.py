"""A delegation names a pool of numbered units by its count, not unit by unit (a VM host's ~400 unit keys made
it 36 KB of XML-RPC per host, and 1,000 hosts over the actor servers' request limit): the count is signed and
decodes to exactly the units it stands for, a broken count is refused, documents (and stores) of the older
form listing every unit are still read and are rewritten in the compact form by the next delegation, and a
delegation too large for one request is refused for good with the reason (not retried forever) and recorded
for `slicex status`."""

from __future__ import annotations

import json
import os
import uuid
import xmlrpc.client
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from msgspec.structs import replace

from authority.actor import DELEGATION_STATUS, Authority, Delegator
from bench.scale import substrate_doc
from broker.broker import DELEGATIONS, Broker
from protocol.delegation import MAX_POOL_UNITS, Delegation, LabelSet, Pool
from protocol.messages import demands_of
from resources import export_substrate
from rspec.request import parse_request
from rspec.substrate import default_substrate, substrate_from_dict
from slicex.codec import decode, encode
from slicex.errors import BadArgs, TooBig, Unavailable
from slicex.store.sqlite_store import SqliteStore
from slicex.term import Term
from slicex.ticket import SignedDelegation, sign_delegation, verify_delegation
from slicex.tls_xmlrpc import MAX_BODY_BYTES
from tests.factories import request_rspec, vm

AUTH = "urn:publicid:IDN+t.org+authority+am"
T0 = datetime(2030, 1, 1, tzinfo=UTC)
SUB = default_substrate("t.org")
AUTHORITY_KEY, BROKER_KEY = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
REDIS_URL = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/15")


def listed(doc: dict[str, Any]) -> dict[str, Any]:
    """A delegation document in the form before counts: every pool's units listed (what today's stores hold)."""
    return {**doc, "pools": [{k: v for k, v in p.items() if k != "count"} |
                             {"units": list(Delegation.from_doc({**doc, "pools": [p]}).pools[0].units)}
                             for p in doc["pools"]]}


def wire_bytes(delegation: Delegation) -> int:
    """The bytes of the XML-RPC request carrying `delegation` signed (what the authority sends its broker)."""
    signed = sign_delegation(SignedDelegation(AUTH, "broker", T0, delegation.to_doc(), 1), AUTHORITY_KEY)
    return len(xmlrpc.client.dumps((encode(signed),), "accept", allow_none=True).encode())


def generated(hosts: int) -> Delegation:
    return export_substrate(substrate_from_dict(substrate_doc(hosts, 10, "t.org")), AUTH, "broker")


def one_vm(name: str = "n1") -> dict:
    return demands_of(parse_request(request_rspec([vm(name)])), {name: name})


# ---- the document --------------------------------------------------------------------------------------------------
def test_a_pool_of_numbered_units_is_written_as_its_count_and_read_back_unit_by_unit():
    d = Delegation(AUTH, "broker", (
        Pool("core:h1", "core", tuple(f"core:h1:{i}" for i in range(32)), "h1"),
        Pool("node:h2", "node", ("node:h2",), "h2"),  # one unit named as its pool: listed
        Pool("pport", "pport", ("pport:5000", "pport:5001"), "gw"),  # not numbered from 0: listed
        Pool("bw:x", "bw", ("bw:x:1", "bw:x:0"), "x"),  # numbered, but out of order: listed
        Pool("open:y", "open"),  # an open pool: no units
    ), (LabelSet("vlan:s", ((100, 199),)),))
    pools = d.to_doc()["pools"]
    assert pools[0] == {"name": "core:h1", "type": "core", "bin": "h1", "count": 32}
    assert [("count" in p, p.get("units")) for p in pools[1:]] == [
        (False, ["node:h2"]), (False, ["pport:5000", "pport:5001"]), (False, ["bw:x:1", "bw:x:0"]), (False, [])]
    assert Delegation.from_doc(json.loads(json.dumps(d.to_doc()))) == d


def test_a_document_listing_every_unit_still_decodes_to_the_same_delegation():
    d = export_substrate(SUB, AUTH, "broker")
    old = listed(d.to_doc())
    assert all("units" in p and "count" not in p for p in old["pools"])
    assert Delegation.from_doc(old) == d


@pytest.mark.parametrize("bad", [-1, MAX_POOL_UNITS + 1, "32", 3.0, True, None])
def test_a_count_that_is_not_a_small_whole_number_is_refused(bad):
    with pytest.raises(ValueError, match="'count' must be an integer from 0"):
        Delegation.from_doc({"authority": AUTH, "broker": "b", "label_sets": [],
                             "pools": [{"name": "core:h", "type": "core", "bin": "h", "count": bad}]})


def test_a_pool_with_both_a_count_and_a_unit_list_is_refused():
    with pytest.raises(ValueError, match="without 'units'"):
        Delegation.from_doc({"authority": AUTH, "broker": "b", "label_sets": [],
                             "pools": [{"name": "core:h", "type": "core", "bin": "h", "count": 2,
                                        "units": ["core:h:0", "core:h:1", "core:h:7"]}]})


def test_a_generated_substrate_of_1000_hosts_delegates_well_inside_one_request():
    """Before counts: 36,023,028 bytes for these 1,000 hosts (36 KB per host), over the 8 MiB limit."""
    small, large = generated(100), generated(1000)
    per_host = (wire_bytes(large) - wire_bytes(small)) / 900
    assert per_host < 4_000, per_host
    assert wire_bytes(large) < MAX_BODY_BYTES // 2
    assert Delegation.from_doc(json.loads(json.dumps(large.to_doc()))) == large  # nothing lost on the way


# ---- the broker ----------------------------------------------------------------------------------------------------
def broker(store) -> Broker:
    return Broker("broker", store, BROKER_KEY, authority=AUTH, authority_keys={AUTH: AUTHORITY_KEY.public_key()})


def authority(store) -> Authority:
    return Authority(AUTH, None, {}, store=store, key=AUTHORITY_KEY, inventory=export_substrate(SUB, AUTH, "broker"))


def test_a_signed_body_with_a_broken_count_is_refused_and_changes_nothing():
    b = broker(SqliteStore(":memory:"))
    body = export_substrate(SUB, AUTH, "broker").to_doc()
    at = next(i for i, p in enumerate(body["pools"]) if "count" in p)
    body["pools"][at] = {**body["pools"][at], "count": -3}
    forged = sign_delegation(SignedDelegation(AUTH, "broker", T0, body, 1), AUTHORITY_KEY)  # even signed
    with pytest.raises(BadArgs, match="signed but malformed"):
        b.accept(forged)
    assert b.delegations() == [] and b.delegated() == [] and not b.calendar.pools


@pytest.fixture(params=["sqlite", "redis"])
def store(request, tmp_path):
    if request.param == "sqlite":
        yield SqliteStore(str(tmp_path / "state.db"))
        return
    from slicex.store.redis_store import RedisStore

    s = RedisStore(REDIS_URL, prefix=f"compact-{uuid.uuid4().hex[:8]}")
    yield s
    s.flush()


def _as_before_counts(b: Broker) -> None:
    """Rewrite the broker's delegation record as a store of today's main holds it: every unit listed, in the
    merged delegation and in each signed document (signed again over its listed body, as the authority of
    that version signed it)."""
    (doc,) = b.store.scan(DELEGATIONS)
    doc["delegation"] = listed(doc["delegation"])
    doc["signed"] = [encode(sign_delegation(replace(decode(s, SignedDelegation, "delegation"), body=listed(s["body"]),
                                                    signature=""), AUTHORITY_KEY)) for s in doc["signed"]]
    b.store.put(DELEGATIONS, f"{b.name}|{AUTH}", doc)


def test_a_store_holding_delegations_that_list_every_unit_is_read_and_rewritten_compact(store):
    first = broker(store)
    authority(store).export_to(first)
    _as_before_counts(first)
    (old,) = store.scan(DELEGATIONS)
    assert all("units" in p for p in old["delegation"]["pools"])
    restarted = broker(store)  # a new process on that store
    assert restarted.calendar.pools == first.calendar.pools and restarted.delegated() == first.delegated()
    verify_delegation(decode(restarted.delegations(AUTH)[0], SignedDelegation, "delegation"), AUTHORITY_KEY.public_key())
    answer = restarted.place("sm", one_vm(), Term(T0, T0 + timedelta(hours=1)), T0)
    assert list(answer.tickets) == ["n1"]
    authority(store).export_to(restarted)  # the authority's next start: its document supersedes the old one
    (new,) = store.scan(DELEGATIONS)
    assert any("count" in p for p in new["delegation"]["pools"])
    assert all("units" not in p or "count" not in p for p in new["delegation"]["pools"])
    (held,) = restarted.delegations(AUTH)
    assert any("count" in p for p in held["body"]["pools"])
    assert len(json.dumps(new)) < len(json.dumps(old)) / 2
    assert broker(store).calendar.pools == first.calendar.pools


# ---- a delegation too large for a request --------------------------------------------------------------------------
class _RefusingBroker:
    """A broker proxy whose request would exceed the actor servers' limit (slicex/actor_rpc.py raises this
    before sending), or that is unreachable."""

    name = "broker"

    def __init__(self, error: Exception):
        self.error, self.calls = error, 0

    def reclaimed(self, authority: str) -> list[str]:
        return []

    def accept(self, delegation: Any) -> None:
        self.calls += 1
        raise self.error


def test_a_delegation_too_large_for_a_request_is_refused_for_good_and_recorded():
    store = SqliteStore(":memory:")
    to = _RefusingBroker(TooBig("the accept request to the broker actor is 9000000 bytes; actor servers accept "
                                "at most 8388608 bytes per request; not sent"))
    d = Delegator(authority(store), to, first_delay=0.01)
    assert d.start() is False
    d.stop()  # no retry thread to stop
    assert to.calls == 1 and d._thread is None and not d.done.is_set()
    assert "9000000 bytes" in d.refused
    (status,) = store.scan(DELEGATION_STATUS)
    assert status["state"] == "refused" and "at most 8388608 bytes" in status["error"]


def test_an_unreachable_broker_is_retried_and_recorded_as_retrying():
    store = SqliteStore(":memory:")
    to = _RefusingBroker(Unavailable("the broker actor at https://127.0.0.1:1/ is not reachable"))
    d = Delegator(authority(store), to, first_delay=0.01, max_delay=0.01)
    d.start()
    try:
        for _ in range(500):
            if to.calls >= 3:
                break
            d._stop.wait(0.01)
    finally:
        d.stop()
    assert to.calls >= 3 and not d.refused
    (status,) = store.scan(DELEGATION_STATUS)
    assert status["state"] == "retrying" and "not reachable" in status["error"]
