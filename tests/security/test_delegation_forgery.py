"""Forged inventory, against the distributed deployment's broker over mutual TLS.

The broker takes inventory only from the authority actor's identity, as a delegation signed by the authority
it names. The authority's identity sends it unsigned delegations, the authority's genuine one with a unit
added, ones signed with the broker's or the AM's key, and ones naming another authority or addressed to
another broker: each is refused with the reason. The slice manager's identity may not hand inventory over
or take it back at all, whatever it sends. Old documents sent again (a delegation after the host went into
maintenance, a reclaim order after it came back) are refused. In every case what the broker holds and
promises does not change (no forged unit can be placed)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from msgspec.structs import replace

from protocol.remote import RemoteBroker
from slicex.actor_rpc import ActorClient
from slicex.codec import decode
from slicex.devpki import actor_urn
from slicex.errors import CredentialInvalid, Forbidden, GeniError, Refused
from slicex.home import Home
from slicex.ticket import SignedDelegation, SignedReclaim, load_signing_key, sign_delegation, sign_reclaim
from tests.integration.conftest import AUTHORITY, Running, deployment

AM = actor_urn(AUTHORITY, "am")
OTHER = "urn:publicid:IDN+evil.test+authority+am"


@pytest.fixture
def distributed(pki_home: Home, tmp_path: Path) -> Iterator[Running]:
    yield from deployment("distributed", pki_home, tmp_path)


def _broker(r: Running, as_role: str) -> RemoteBroker:
    """The broker as `as_role` (am: the slice manager; authority: the authority actor) reaches it."""
    h = r.home
    cert, key = (h.am_cert, h.am_key) if as_role == "am" else (h.authority_cert, h.authority_key)
    return RemoteBroker(ActorClient("broker", r.actors[0].url, str(cert), str(key), str(h.ca_cert),
                                    actor_urn(AUTHORITY, "broker")))


def _key(r: Running, role: str):
    h = r.home
    return load_signing_key({"broker": h.broker_key, "am": h.am_key, "authority": h.authority_key}[role].read_bytes())


def _one_more_unit(pool: dict) -> dict:
    """A pool document granting one unit more than signed: a counted pool's count raised (its next unit), a
    listed pool's list grown."""
    if "count" in pool:
        return {**pool, "count": pool["count"] + 1}
    return {**pool, "units": [*pool["units"], f"{pool['units'][-1]}9"]}


def _forged_unit(pool: dict) -> str:
    """The unit `_one_more_unit` adds."""
    return f"{pool['name']}:{pool['count']}" if "count" in pool else f"{pool['units'][-1]}9"


def _forgeries(r: Running, genuine: SignedDelegation) -> dict[str, SignedDelegation]:
    body = genuine.body
    bigger = {**body, "pools": [_one_more_unit(body["pools"][0]), *body["pools"][1:]]}
    return {
        "unsigned": replace(genuine, signature=""),
        "tampered unit list": replace(genuine, body=bigger),
        "signed by the broker": sign_delegation(replace(genuine, body=bigger, signature=""), _key(r, "broker")),
        "signed by the AM": sign_delegation(replace(genuine, body=bigger, signature=""), _key(r, "am")),
        "another authority": sign_delegation(SignedDelegation(OTHER, "broker", genuine.issued,
                                                              {**bigger, "authority": OTHER}), _key(r, "authority")),
        "body of another authority": sign_delegation(replace(genuine, body={**bigger, "authority": OTHER},
                                                             signature=""), _key(r, "authority")),
        "another broker": sign_delegation(SignedDelegation(AM, "broker2", genuine.issued,
                                                           {**bigger, "broker": "broker2"}), _key(r, "authority")),
    }


REASONS = {
    "unsigned": "is not signed",
    "tampered unit list": f"not signed by authority {AM} (or was altered)",
    "signed by the broker": f"not signed by authority {AM} (or was altered)",
    "signed by the AM": f"not signed by authority {AM} (or was altered)",
    "another authority": f"does not know authority {OTHER}",
    "body of another authority": f"describes inventory of {OTHER}",
    "another broker": "is for broker broker2, not broker",
}


def test_forged_delegations_are_refused_and_change_nothing(distributed: Running):
    r = distributed
    broker = _broker(r, "authority")
    (held,) = [decode(d, SignedDelegation, "delegation") for d in broker.delegations(AM)]
    forged_unit = _forged_unit(held.body["pools"][0])
    before = (broker.delegations(), r.actors[0].actor.delegated(), r.actors[0].actor.version())
    for what, forged in _forgeries(r, held).items():
        with pytest.raises(GeniError, match=re.escape(REASONS[what])) as refused:
            broker.accept(forged)
        assert isinstance(refused.value, Refused if what == "another broker" else CredentialInvalid), what
    # a bare delegation (no signature field at all) is refused too
    with pytest.raises(CredentialInvalid, match="refuses an unsigned delegation"):
        broker.client.call("accept", held.body)
    assert (broker.delegations(), r.actors[0].actor.delegated(), r.actors[0].actor.version()) == before
    assert forged_unit not in r.actors[0].actor.calendar.pools[held.body["pools"][0]["name"]].units
    broker.accept(held)  # the genuine document, sent again, is still good


def _held(r: Running) -> tuple[SignedDelegation, list[str]]:
    """The authority's grant the broker holds, and the pools of its first host."""
    (held,) = [decode(d, SignedDelegation, "delegation") for d in _broker(r, "am").delegations(AM)]
    first = held.body["pools"][0]["bin"]
    return held, [p["name"] for p in held.body["pools"] if p["bin"] == first]


def _holding(r: Running) -> tuple:
    return (_broker(r, "am").delegations(), r.actors[0].actor.delegated(), r.actors[0].actor.version())


def test_the_slice_managers_identity_may_not_hand_inventory_over_or_take_it_back(distributed: Running):
    r = distributed
    held, pools = _held(r)
    as_am = _broker(r, "am")
    before = _holding(r)
    with pytest.raises(Forbidden, match=re.escape(f"{AM} may not call accept")):
        as_am.accept(held)  # even the authority's genuine document
    order = sign_reclaim(SignedReclaim(AM, "broker", held.issued, tuple(pools), held.sequence + 1), _key(r, "authority"))
    with pytest.raises(Forbidden, match=re.escape(f"{AM} may not call reclaim")):
        as_am.reclaim(order)  # even one the authority signed
    with pytest.raises(GeniError, match="has no method 'tick'"):  # nobody moves a broker's clock
        as_am.client.call("tick", "2099-01-01T00:00:00Z")
    assert _holding(r) == before


def test_old_documents_sent_again_are_refused_and_change_nothing(distributed: Running):
    r = distributed
    held, pools = _held(r)
    as_authority = _broker(r, "authority")
    authority_key = _key(r, "authority")
    order = sign_reclaim(SignedReclaim(AM, "broker", held.issued, tuple(pools), held.sequence + 1), authority_key)
    assert as_authority.reclaim(order) == (pools, [])  # maintenance
    before = _holding(r)
    with pytest.raises(Refused, match=r"delegation number \d+ .* is older than its number \d+"):
        as_authority.accept(held)  # the start-up grant again: would bring the host back
    assert _holding(r) == before and not set(pools) & set(r.actors[0].actor.delegated())
    body = {**held.body, "pools": [p for p in held.body["pools"] if p["name"] in pools], "label_sets": []}
    back = sign_delegation(SignedDelegation(AM, "broker", held.issued, body, held.sequence + 2), authority_key)
    as_authority.accept(back)  # maintenance ends
    before = _holding(r)
    with pytest.raises(Refused, match=r"reclaim order number \d+ .* is older than"):
        as_authority.reclaim(order)  # would take the host out again
    assert _holding(r) == before and set(pools) <= set(r.actors[0].actor.delegated())


def test_a_malformed_document_is_bad_arguments_not_a_server_error(distributed: Running):
    as_authority = _broker(distributed, "authority")
    for method, doc in (("accept", {"signature": "x"}), ("reclaim", {"kind": "reclaim"}), ("reclaim", {"a": 1})):
        with pytest.raises(GeniError, match="not a (SignedDelegation|Delegation|SignedReclaim)") as refused:
            as_authority.client.call(method, doc)
        assert refused.value.code == 1, (method, doc)  # BADARGS
