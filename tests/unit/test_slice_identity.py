"""The slice identity rules (slicex/slice_identity.py) on credentials and recorded UUIDs, without a deployment."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slicex import pki
from slicex.credentials import create_credential, parse_credential
from slicex.errors import CredentialInvalid
from slicex.slice_identity import check_same_slice, slice_uuid

SLICE = "urn:publicid:IDN+t.org+slice+s1"
LATER = datetime.now(UTC) + timedelta(days=1)


@pytest.fixture(scope="module")
def authority():
    ca, ca_key = pki.create_ca("t.org", "t.org CA")
    sa = pki.issue_certificate(ca, ca_key, "urn:publicid:IDN+t.org+authority+sa", "sa", is_ca=True)
    alice = pki.issue_certificate(ca, ca_key, "urn:publicid:IDN+t.org+user+alice", "alice")
    bob = pki.issue_certificate(ca, ca_key, "urn:publicid:IDN+t.org+user+bob", "bob")
    return ca, ca_key, sa, alice, bob


def _slice_cert(authority, slice_uuid_: str) -> bytes:
    ca, ca_key, *_ = authority
    return pki.issue_certificate(ca, ca_key, SLICE, "s1", subject_uuid=slice_uuid_)[0]


def _credential(authority, target: bytes) -> str:
    ca, _key, sa, alice, _bob = authority
    return create_credential(owner_cert=alice[0], target_cert=target, privileges={"*": True}, expires=LATER,
                             signer_cert_chain=[sa[0], ca], signer_key_pem=sa[1])


def test_the_slice_uuid_is_the_target_certificates(authority):
    named = str(uuid.uuid4())
    assert slice_uuid(parse_credential(_credential(authority, _slice_cert(authority, named)))) == named


def test_a_delegation_keeps_its_parents_slice_uuid(authority):
    _ca, _key, _sa, alice, bob = authority
    first = str(uuid.uuid4())
    parent = _credential(authority, _slice_cert(authority, first))

    def delegate(target: bytes) -> str:
        return create_credential(owner_cert=bob[0], target_cert=target, privileges={"info": False},
                                 expires=LATER, signer_cert_chain=[alice[0]], signer_key_pem=alice[1],
                                 parent=parent)

    assert slice_uuid(parse_credential(delegate(_slice_cert(authority, first)))) == first
    with pytest.raises(CredentialInvalid, match="different UUIDs"):
        slice_uuid(parse_credential(delegate(_slice_cert(authority, str(uuid.uuid4())))))


uuids = st.uuids().map(str)


@given(presented=st.one_of(st.just(""), uuids), recorded=st.lists(st.one_of(st.just(""), uuids), max_size=4))
def test_a_credential_passes_exactly_when_every_recorded_uuid_is_its_own(presented, recorded):
    others = {u for u in recorded if u and u != presented}
    if others:
        with pytest.raises(CredentialInvalid) as refused:
            check_same_slice(SLICE, presented, recorded)
        assert ("re-created" if presented else "names no slice UUID") in refused.value.message
        assert min(others) in refused.value.message
    else:
        check_same_slice(SLICE, presented, recorded)
