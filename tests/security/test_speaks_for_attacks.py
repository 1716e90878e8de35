"""Speaks-for under attack: a leaked speaks-for statement (alice lets tool T act for her) rewritten so that
another tool, mallory's, may act for alice. The signed ABAC element must be the one read."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

import pytest
from lxml import etree

from slicex import pki
from slicex.credentials import XML_ID, CredentialVerifier, create_credential
from slicex.errors import CredentialInvalid
from slicex.speaksfor import create_speaks_for

NOW = datetime.now(UTC).replace(microsecond=0)
AUTH = "sf.test"
SLICE = f"urn:publicid:IDN+{AUTH}+slice+s1"
ALICE = f"urn:publicid:IDN+{AUTH}+user+alice"


@pytest.fixture(scope="module")
def world():
    ca, ca_key = pki.create_ca(AUTH, "sf CA")
    sa, sa_key = pki.issue_certificate(ca, ca_key, f"urn:publicid:IDN+{AUTH}+authority+sa", "sa", is_ca=True)

    def user(name: str) -> tuple[bytes, bytes]:
        return pki.issue_certificate(ca, ca_key, f"urn:publicid:IDN+{AUTH}+user+{name}", name)

    alice, tool, mallory = user("alice"), user("tool"), user("mallory")
    target = pki.issue_certificate(ca, ca_key, SLICE, "s1")[0]
    slice_cred = create_credential(owner_cert=alice[0], target_cert=target, privileges={"*": True},
                                   expires=NOW + timedelta(days=1), signer_cert_chain=[sa, ca], signer_key_pem=sa_key)
    speaks_for = create_speaks_for(alice[0], alice[1], tool[0], NOW + timedelta(hours=1))
    return CredentialVerifier(pki.TrustStore(certs=pki.load_certs(ca))), slice_cred, speaks_for, tool, mallory


def _creds(slice_cred: str, speaks_for: str) -> list[dict]:
    return [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": slice_cred},
            {"geni_type": "geni_abac", "geni_version": "1", "geni_value": speaks_for}]


def _retarget(speaks_for: str, tool_cert: bytes, how: str) -> str:
    """Rewrite the statement's tail to `tool_cert`'s key id, hiding the signed original as `how` says."""
    root = etree.fromstring(speaks_for.split("?>", 1)[1].encode())
    signed = root.find("credential")
    forged = copy.deepcopy(signed)
    forged.find("abac/rt0/tail/ABACprincipal/keyid").text = pki.subject_key_id_hex(pki.load_cert(tool_cert))
    if how == "plain id first":
        forged.set("id", forged.attrib.pop(XML_ID))
        root.remove(signed)
        etree.SubElement(root, "wrapper").append(signed)
        root.insert(0, forged)
    elif how == "inside signatures":
        forged.set("id", forged.attrib.pop(XML_ID))
        root.remove(signed)
        root.find("signatures").append(signed)
        root.insert(0, forged)
    elif how == "second abac":
        signed.append(forged.find("abac"))
    return etree.tostring(root, encoding="unicode")


def test_the_genuine_statement_lets_the_tool_speak_for_alice(world):
    verifier, slice_cred, speaks_for, tool, _ = world
    v = verifier.verify(_creds(slice_cred, speaks_for), pki.load_cert(tool[0]), SLICE, "deleteslice", NOW,
                        speaking_for=ALICE)
    assert v.effective_caller_urn == ALICE


@pytest.mark.parametrize("how", ["plain id first", "inside signatures", "second abac"])
def test_a_rewritten_statement_does_not_let_another_tool_speak_for_alice(world, how):
    verifier, slice_cred, speaks_for, _, mallory = world
    forged = _retarget(speaks_for, mallory[0], how)
    with pytest.raises(CredentialInvalid):
        verifier.verify(_creds(slice_cred, forged), pki.load_cert(mallory[0]), SLICE, "deleteslice", NOW,
                        speaking_for=ALICE)
