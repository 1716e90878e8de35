"""Forged inventory, against the distributed deployment's broker over mutual TLS.

The broker takes inventory only as a delegation signed by the authority it names. Callers the broker answers
(the slice manager's AM identity, the authority's own) send it unsigned delegations, the authority's genuine
one with a unit added, ones signed with the broker's or the AM's key, and ones naming another authority or
addressed to another broker: each is refused with the reason, and what the broker holds and promises does
not change (no forged unit can be placed)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from broker.remote import RemoteBroker
from slicex.actor_rpc import ActorClient
from slicex.devpki import actor_urn
from slicex.errors import CredentialInvalid, GeniError, Refused
from slicex.home import Home
from slicex.ticket import SignedDelegation, load_signing_key, sign_delegation
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


def _forgeries(r: Running, genuine: SignedDelegation) -> dict[str, SignedDelegation]:
    body = genuine.body
    pool = body["pools"][0]
    bigger = {**body, "pools": [{**pool, "units": [*pool["units"], f"{pool['units'][-1]}9"]}, *body["pools"][1:]]}
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


@pytest.mark.parametrize("caller", ["am", "authority"])
def test_forged_delegations_are_refused_and_change_nothing(distributed: Running, caller: str):
    r = distributed
    broker = _broker(r, caller)
    (held,) = [SignedDelegation.from_doc(d) for d in broker.delegations(AM)]
    forged_unit = f"{held.body['pools'][0]['units'][-1]}9"
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
