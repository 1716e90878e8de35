"""When omni cannot tell a credential's type it labels it `geni_unknown` (a delegated slice credential holds two
`<type>` elements); slicex then reads what it is from its content. Nothing a label says may make a document count
for more than its verified content: each of these is refused with CREDENTIAL_INVALID (20) or MISMATCH (22), over
mutual TLS, on both deployments."""

from __future__ import annotations

from datetime import timedelta

import pytest
from lxml import etree

from slicex.speaksfor import create_speaks_for
from tests.factories import request_rspec, vm
from tests.integration.conftest import Running
from tests.integration.test_am_api import code, ok
from tests.integration.test_stock_clients import RSPEC_V3, as_omni_labels, delegate


def _labelled(kind: str, version: str, xml: str) -> list[dict]:
    return [{"geni_type": kind, "geni_version": version, "geni_value": xml}]


def _refusal(reply: dict) -> tuple[int, str]:
    return reply["code"]["geni_code"], reply["output"]


@pytest.fixture
def shared(running: Running):
    """alice's slice with a sliver, her slice credential, and bob."""
    alice, bob = running.user("alice"), running.user("bob")
    urn, creds = alice.slice_credential("labels")
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("n1")]), {}))
    return running, alice, bob, urn, creds[0]["geni_value"]


@pytest.mark.parametrize("label", [("geni_sfa", "3"), ("geni_unknown", "0"), ("geni_sfa", "1"), ("", "")])
@pytest.mark.parametrize("value", ["not a credential", "<signed-credential/>", "<rspec type='request'/>"])
def test_a_document_that_is_not_a_credential_is_refused_whatever_its_label(shared, label, value):
    _running, _alice, bob, urn, _cred = shared
    got, output = _refusal(bob.am.Describe([urn], _labelled(*label, value), {"geni_rspec_version": RSPEC_V3}))
    assert got == 20, output


@pytest.mark.parametrize("label", [("geni_sfaBROKEN", "3"), ("geni_magic", "9"), ("geni_sfa", "1"), ("", "")])
def test_a_genuine_credential_under_a_type_that_does_not_exist_is_refused(shared, label):
    """Only omni's geni_unknown ("I could not tell") lets the content decide; a label naming a type that does
    not exist is refused, as the GENI AM API acceptance suite's badtype test requires."""
    _running, alice, _bob, urn, cred = shared
    got, output = _refusal(alice.am.Describe([urn], _labelled(*label, cred), {"geni_rspec_version": RSPEC_V3}))
    assert got == 20 and "unknown credential type" in output, output


def test_a_speaks_for_statement_labelled_sfa_or_unknown_grants_nothing(shared):
    """alice lets bob's tool speak for her; relabelled, the statement is no slice credential, and unlabelled as
    ABAC it is not taken as a speaks-for statement either."""
    running, alice, bob, urn, cred = shared
    speaks_for = create_speaks_for(alice.cert.read_bytes(), alice.key.read_bytes(), bob.cert.read_bytes(),
                                   running.clock.now() + timedelta(hours=1))
    for label in (("geni_sfa", "3"), ("geni_unknown", "0")):
        got, output = _refusal(bob.am.Describe([urn], _labelled(*label, speaks_for), {"geni_rspec_version": RSPEC_V3}))
        assert got == 20, output
        with_slice = _labelled("geni_sfa", "3", cred) + _labelled(*label, speaks_for)
        got, output = _refusal(bob.am.Describe([urn], with_slice, {"geni_rspec_version": RSPEC_V3,
                                                                    "geni_speaking_for": alice.urn}))
        assert got == 20 and "speaks-for" in output, output
    labelled_abac = _labelled("geni_sfa", "3", cred) + _labelled("geni_abac", "1", speaks_for)
    ok(bob.am.Describe([urn], labelled_abac, {"geni_rspec_version": RSPEC_V3, "geni_speaking_for": alice.urn}))


def test_someone_elses_credential_labelled_unknown_is_still_theirs(shared):
    _running, _alice, bob, urn, cred = shared
    got, output = _refusal(bob.am.Describe([urn], as_omni_labels(cred), {"geni_rspec_version": RSPEC_V3}))
    assert got == 22 and "belongs to" in output, output


def test_a_delegation_bob_signs_himself_is_refused_under_omnis_label(shared):
    """bob wraps alice's slice credential as its parent and signs a delegation to himself with his own key."""
    _running, alice, bob, urn, cred = shared
    forged = delegate(bob, cred, bob)
    got, output = _refusal(bob.am.Describe([urn], as_omni_labels(forged), {"geni_rspec_version": RSPEC_V3}))
    assert got == 20 and "owner of its parent" in output, output


def test_a_delegation_altered_after_signing_is_refused_under_omnis_label(shared):
    _running, alice, bob, urn, cred = shared
    genuine = delegate(alice, cred, bob, {"info": False})
    ok(bob.am.Status([urn], as_omni_labels(genuine), {}))
    root = etree.fromstring(genuine.split("?>", 1)[1].encode())
    root.find("credential/privileges/privilege/name").text = "*"  # the delegation's own, signed privilege list
    altered = etree.tostring(root, encoding="unicode")
    got, output = _refusal(bob.am.Delete([urn], as_omni_labels(altered), {}))
    assert got == 20, output
    got, output = _refusal(bob.am.Delete([urn], as_omni_labels(genuine), {}))
    assert got == 3, output  # the genuine delegation grants info only: Delete is forbidden, not granted
    assert code(alice.am.Status([urn], _labelled("geni_sfa", "3", cred), {})) == 0
