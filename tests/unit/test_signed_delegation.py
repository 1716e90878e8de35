"""The authority delegates its own inventory as a document signed with its key, and the broker verifies it
against the authority's public key before claiming anything: unsigned, tampered, wrongly signed or
misaddressed delegations are refused with a clear error and change nothing; the broker keeps the signed
documents it accepted. Also the broker's `tickets` listing (what the dashboard snapshot shows)."""

from __future__ import annotations

import re
import threading
from datetime import UTC, datetime, timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from msgspec.structs import replace

from authority.actor import Authority, Delegator
from broker.broker import DELEGATIONS, Broker
from operations.snapshot import broker_state
from protocol.delegation import Delegation
from protocol.messages import demands_of
from resources import export_substrate
from rspec.request import parse_request
from rspec.substrate import default_substrate
from slicex.codec import decode
from slicex.errors import CredentialInvalid, Refused, Unavailable
from slicex.store.sqlite_store import SqliteStore
from slicex.term import Term
from slicex.ticket import SignedDelegation, sign_delegation, verify_delegation
from tests.factories import request_rspec, vm

SUB = default_substrate("t.org")
AUTH = "urn:publicid:IDN+t.org+authority+am"
OTHER = "urn:publicid:IDN+other.org+authority+am"
T0 = datetime(2030, 1, 1, tzinfo=UTC)


def one_vm(name: str = "n1") -> dict:
    """The demands of a one-VM request, as a slice manager sends them."""
    return demands_of(parse_request(request_rspec([vm(name)])), {name: name})


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


AUTHORITY_KEY, BROKER_KEY, AM_KEY, OTHER_KEY = _key(), _key(), _key(), _key()


def broker(store: SqliteStore | None = None, **keys) -> Broker:
    trusted = keys or {AUTH: AUTHORITY_KEY.public_key()}
    return Broker("broker", store or SqliteStore(":memory:"), BROKER_KEY, authority=AUTH, authority_keys=trusted)


def authority(store: SqliteStore | None = None, key=AUTHORITY_KEY) -> Authority:
    return Authority(AUTH, None, {}, store=store or SqliteStore(":memory:"), key=key,
                     inventory=export_substrate(SUB, AUTH, "broker"))


def signed(delegation: Delegation, key=AUTHORITY_KEY, authority_name: str = AUTH,
           broker_name: str = "broker") -> SignedDelegation:
    return sign_delegation(SignedDelegation(authority_name, broker_name, T0, delegation.to_doc()), key)


def state(b: Broker) -> tuple:
    """Everything a refused delegation must leave as it was."""
    return (sorted(map(str, b.store.scan(DELEGATIONS))), b.version(), sorted(b.calendar.pools),
            sorted(b.calendar.label_sets), b.delegated())


def test_the_authority_delegates_a_signed_document_the_broker_verifies_and_keeps():
    b = broker()
    a = authority()
    a.export_to(b)
    held = b.delegations(AUTH)
    assert len(held) == 1
    doc = decode(held[0], SignedDelegation, "delegation")
    verify_delegation(doc, AUTHORITY_KEY.public_key())  # the broker kept exactly what the authority signed
    assert (doc.authority, doc.broker) == (AUTH, "broker")
    assert sorted(Delegation.from_doc(doc.body).names()) == sorted(a.inventory.names()) == b.delegated()
    with pytest.raises(CredentialInvalid):
        verify_delegation(doc, BROKER_KEY.public_key())
    # the broker places from what it was given
    answer = b.place("sm", one_vm(), Term(T0, T0 + timedelta(hours=1)), T0)
    assert list(answer.tickets) == ["n1"]


def test_returning_a_host_is_a_signed_delegation_and_superseded_documents_go():
    b, a = broker(), authority()
    a.export_to(b)
    host = SUB.hosts[0].component_id
    pools = a.inventory.on(host)
    free, busy = a.reclaim(b, pools, T0)
    assert free == pools and not busy
    assert not set(pools) & set(b.delegated())
    a.delegate(b, pools)  # maintenance ends: the authority grants the host again, signed
    held = [decode(d, SignedDelegation, "delegation") for d in b.delegations(AUTH)]
    assert len(held) == 2 and sorted(Delegation.from_doc(held[-1].body).names()) == sorted(pools)
    for d in held:
        verify_delegation(d, AUTHORITY_KEY.public_key())
    a.export_to(b)  # the next start grants everything again: the earlier documents say nothing more
    assert len(b.delegations(AUTH)) == 1


def test_an_unsigned_delegation_is_refused_and_changes_nothing():
    b = broker()
    before = state(b)
    with pytest.raises(CredentialInvalid, match="refuses an unsigned delegation"):
        b.accept(export_substrate(SUB, AUTH, "broker"))
    with pytest.raises(CredentialInvalid, match="not signed"):
        b.accept(replace(signed(export_substrate(SUB, AUTH, "broker")), signature=""))
    with pytest.raises(CredentialInvalid, match="refuses an unsigned delegation"):
        authority(key=None).export_to(b)  # an authority without its key cannot delegate to a deployment's broker
    assert state(b) == before and b.delegations() == []


def _one_more_unit(pool: dict) -> dict:
    """A pool document granting one unit more: a counted pool's count raised, a listed pool's list grown."""
    if "count" in pool:
        return {**pool, "count": pool["count"] + 1}
    return {**pool, "units": [*pool["units"], pool["units"][-1] + "-extra"]}


@pytest.mark.parametrize("form", ["count", "units"])
def test_a_tampered_unit_list_is_refused_and_changes_nothing(form):
    b = broker()
    authority().export_to(b)
    before = state(b)
    good = signed(export_substrate(SUB, AUTH, "broker"))
    body = good.body
    at = next(i for i, p in enumerate(body["pools"]) if form in p and (p.get("units") or p.get("count")))
    pools = list(body["pools"])
    pools[at] = _one_more_unit(pools[at])
    tampered = replace(good, body={**body, "pools": pools})
    with pytest.raises(CredentialInvalid, match=r"not signed by authority .* \(or was altered\)"):
        b.accept(tampered)
    with pytest.raises(CredentialInvalid, match="or was altered"):
        b.accept(replace(good, issued=good.issued + timedelta(seconds=1)))
    assert state(b) == before and len(b.delegations()) == 1


@pytest.mark.parametrize("who", ["broker", "am"])
def test_a_delegation_signed_with_another_actors_key_is_refused(who):
    b = broker()
    before = state(b)
    forged = signed(export_substrate(SUB, AUTH, "broker"), key=BROKER_KEY if who == "broker" else AM_KEY)
    with pytest.raises(CredentialInvalid, match=re.escape(f"not signed by authority {AUTH}")):
        b.accept(forged)
    assert state(b) == before and b.delegations() == []


def test_a_delegation_naming_another_authority_is_refused():
    b = broker()
    before = state(b)
    # our authority's key over a grant of inventory that is not ours: the broker does not know that authority
    with pytest.raises(CredentialInvalid, match=re.escape(f"does not know authority {OTHER}")):
        b.accept(signed(export_substrate(SUB, OTHER, "broker"), authority_name=OTHER))
    # a broker that knows both: the other authority's name under our key does not verify
    both = broker(**{AUTH: AUTHORITY_KEY.public_key(), OTHER: OTHER_KEY.public_key()})
    with pytest.raises(CredentialInvalid, match=re.escape(f"not signed by authority {OTHER}")):
        both.accept(signed(export_substrate(SUB, OTHER, "broker"), authority_name=OTHER))
    # a body of another authority moved under our signed envelope
    with pytest.raises(CredentialInvalid, match=re.escape(f"describes inventory of {OTHER}")):
        b.accept(signed(export_substrate(SUB, OTHER, "broker")))
    assert state(b) == before and b.delegations() == [] and both.delegations() == []


def test_a_delegation_for_another_broker_is_refused():
    b = broker()
    before = state(b)
    with pytest.raises(Refused, match="is for broker broker2, not broker"):
        b.accept(signed(export_substrate(SUB, AUTH, "broker2"), broker_name="broker2"))
    assert state(b) == before


class FlakyBroker:
    """A real broker that does not answer the first `down` delegations (as one still starting)."""

    def __init__(self, inner: Broker, down: int):
        self.inner, self.down, self.name = inner, down, inner.name
        self.tries = 0

    def reclaimed(self, authority: str) -> list[str]:
        return self.inner.reclaimed(authority)

    def accept(self, delegation) -> None:
        self.tries += 1
        if self.tries <= self.down:
            raise Unavailable("broker at https://127.0.0.1:1/ does not answer")
        self.inner.accept(delegation)


def test_the_delegator_retries_with_backoff_until_the_broker_answers():
    b = broker()
    flaky = FlakyBroker(b, down=3)
    d = Delegator(authority(), flaky, first_delay=0.01, max_delay=0.04)
    assert d.start() is False and "does not answer" in d.last_error
    assert d.done.wait(5), d.last_error
    d.stop()
    assert flaky.tries == 4 and len(b.delegations(AUTH)) == 1


def test_the_delegator_stops_when_asked():
    flaky = FlakyBroker(broker(), down=10**6)
    d = Delegator(authority(), flaky, first_delay=0.01, max_delay=0.02)
    d.start()
    threading.Event().wait(0.1)
    d.stop()
    tries = flaky.tries
    threading.Event().wait(0.1)
    assert flaky.tries == tries and not d.done.is_set()


def test_tickets_lists_tickets_for_the_snapshot():
    b = broker()
    authority().export_to(b)
    term = Term(T0, T0 + timedelta(hours=1))
    granted = b.place("sm", one_vm(), term, T0, group="g1").tickets
    listing = b.tickets()
    assert [t["ticket"]["id"] for t in listing["tickets"]] == [t.id for t in granted.values()] == ["g1/n1"]
    assert listing["tickets"][0]["state"] == "active" and set(listing) == {"tickets"}
    snap = broker_state(b, T0)
    assert snap["ticket_states"] == {"active": 1} and [t["id"] for t in snap["tickets"]] == ["g1/n1"]
    given = b.delegations()[0]
    assert snap["delegations"] == [{"authority": AUTH, "issued": given["issued"],
                                    "pools": len(given["body"]["pools"]),
                                    "label_sets": len(given["body"]["label_sets"])}]
