"""SFA credentials: create, parse, verify; every refusal names its reason and carries the right code."""

from __future__ import annotations

import shutil
import subprocess
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slicex import pki
from slicex.credentials import CredentialVerifier, create_credential, parse_credential
from slicex.errors import (
    CredentialExpired,
    CredentialInvalid,
    CredentialMismatch,
    CredentialSignerUntrusted,
    Forbidden,
)
from slicex.speaksfor import create_speaks_for
from tests.fixtures import third_party

NOW = datetime.now(UTC).replace(microsecond=0)
AUTH = "cred.test"
SLICE = f"urn:publicid:IDN+{AUTH}+slice+s1"


class Authority:
    def __init__(self, authority: str = AUTH):
        self.ca, self.ca_key = pki.create_ca(authority, f"{authority} CA")
        self.sa, self.sa_key = pki.issue_certificate(self.ca, self.ca_key, f"urn:publicid:IDN+{authority}+authority+sa",
                                                     "sa", is_ca=True)
        self.authority = authority

    def user(self, name: str) -> tuple[bytes, bytes]:
        return pki.issue_certificate(self.ca, self.ca_key, f"urn:publicid:IDN+{self.authority}+user+{name}", name)

    def slice_cert(self, urn: str = SLICE) -> bytes:
        return pki.issue_certificate(self.ca, self.ca_key, urn, "slice")[0]

    def credential(self, owner: bytes, target: bytes | None = None, privileges=None, expires=None) -> str:
        return create_credential(owner_cert=owner, target_cert=target or self.slice_cert(),
                                 privileges=privileges or {"*": True}, expires=expires or NOW + timedelta(days=1),
                                 signer_cert_chain=[self.sa, self.ca], signer_key_pem=self.sa_key)

    def verifier(self) -> CredentialVerifier:
        return CredentialVerifier(pki.TrustStore(certs=pki.load_certs(self.ca)))


@pytest.fixture(scope="module")
def home():
    a = Authority()
    alice, alice_key = a.user("alice")
    bob, bob_key = a.user("bob")
    return a, (alice, alice_key), (bob, bob_key)


def sfa(xml):
    return [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": xml}]


def test_round_trip(home):
    a, (alice, _), _ = home
    xml = a.credential(alice)
    cred = parse_credential(xml)
    assert cred.target_urn == SLICE and cred.owner_urn.endswith("+user+alice")
    v = a.verifier().verify(sfa(xml), pki.load_cert(alice), SLICE, "createsliver", NOW)
    assert v.effective_caller_urn.endswith("+user+alice")
    assert v.expires == NOW + timedelta(days=1)


def test_bare_string_credentials_are_accepted(home):
    a, (alice, _), _ = home
    assert a.verifier().verify([a.credential(alice)], pki.load_cert(alice), SLICE, "createsliver", NOW)


def test_altered_privilege_is_invalid(home):
    a, (alice, _), _ = home
    xml = a.credential(alice, privileges={"info": False}).replace("<name>info</name>", "<name>*</name>")
    with pytest.raises(CredentialInvalid, match="altered"):
        a.verifier().verify(sfa(xml), pki.load_cert(alice), SLICE, "createsliver", NOW)


def test_expired(home):
    a, (alice, _), _ = home
    xml = a.credential(alice, expires=NOW - timedelta(seconds=1))
    with pytest.raises(CredentialExpired):
        a.verifier().verify(sfa(xml), pki.load_cert(alice), SLICE, "createsliver", NOW)


def test_untrusted_signer(home):
    a, (alice, _), _ = home
    rogue = Authority()
    with pytest.raises(CredentialSignerUntrusted):
        a.verifier().verify(sfa(rogue.credential(alice)), pki.load_cert(alice), SLICE, "createsliver", NOW)


def test_wrong_owner(home):
    a, (alice, _), (bob, _) = home
    with pytest.raises(CredentialMismatch, match="belongs to"):
        a.verifier().verify(sfa(a.credential(alice)), pki.load_cert(bob), SLICE, "createsliver", NOW)


def test_wrong_target(home):
    a, (alice, _), _ = home
    with pytest.raises(CredentialMismatch, match="not urn"):
        a.verifier().verify(sfa(a.credential(alice)), pki.load_cert(alice), SLICE.replace("s1", "s2"),
                            "createsliver", NOW)


def test_missing_privilege_is_forbidden(home):
    a, (alice, _), _ = home
    with pytest.raises(Forbidden, match="deleteslice"):
        a.verifier().verify(sfa(a.credential(alice, privileges={"info": False})), pki.load_cert(alice), SLICE,
                            "deleteslice", NOW)


def test_signer_outside_its_namespace_is_untrusted(home):
    a, (alice, _), _ = home
    other = pki.issue_certificate(a.ca, a.ca_key, "urn:publicid:IDN+elsewhere.org+authority+sa", "sa2", is_ca=True)
    xml = create_credential(owner_cert=alice, target_cert=a.slice_cert(), privileges={"*": True},
                            expires=NOW + timedelta(days=1), signer_cert_chain=[other[0], a.ca],
                            signer_key_pem=other[1])
    with pytest.raises(CredentialSignerUntrusted, match="namespace"):
        a.verifier().verify(sfa(xml), pki.load_cert(alice), SLICE, "createsliver", NOW)


def test_unknown_type_and_garbage(home):
    a, (alice, _), _ = home
    with pytest.raises(CredentialInvalid, match="unknown credential type"):
        a.verifier().verify([{"geni_type": "x", "geni_version": "1", "geni_value": "<a/>"}], pki.load_cert(alice),
                            SLICE, "createsliver", NOW)
    with pytest.raises(CredentialInvalid):
        a.verifier().verify(sfa("<<<"), pki.load_cert(alice), SLICE, "createsliver", NOW)
    bomb = '<!DOCTYPE x [<!ENTITY a "aaaa">]><signed-credential>&a;</signed-credential>'
    with pytest.raises(CredentialInvalid, match="DOCTYPE"):
        a.verifier().verify(sfa(bomb), pki.load_cert(alice), SLICE, "createsliver", NOW)


def _delegate(a, parent_xml, owner_key_cert, to_cert, privileges, expires=None):
    owner_cert, owner_key = owner_key_cert
    return create_credential(owner_cert=to_cert, target_cert=a.slice_cert(), privileges=privileges,
                             expires=expires or NOW + timedelta(hours=1), signer_cert_chain=[owner_cert],
                             signer_key_pem=owner_key, parent=parent_xml)


def test_delegation_valid(home):
    a, alice, (bob, _) = home
    parent = a.credential(alice[0], privileges={"*": True})
    child = _delegate(a, parent, alice, bob, {"*": False})
    v = a.verifier().verify(sfa(child), pki.load_cert(bob), SLICE, "createsliver", NOW)
    assert v.expires == NOW + timedelta(hours=1)
    assert len(parse_credential(child).chain()) == 2


def test_delegation_of_a_non_delegatable_privilege(home):
    a, alice, (bob, _) = home
    parent = a.credential(alice[0], privileges={"*": False})
    with pytest.raises(CredentialInvalid, match="can_delegate"):
        a.verifier().verify(sfa(_delegate(a, parent, alice, bob, {"*": False})), pki.load_cert(bob), SLICE,
                            "createsliver", NOW)


def test_delegation_widening_privileges(home):
    a, alice, (bob, _) = home
    parent = a.credential(alice[0], privileges={"info": True})
    with pytest.raises(CredentialInvalid, match="does not"):
        a.verifier().verify(sfa(_delegate(a, parent, alice, bob, {"control": False})), pki.load_cert(bob), SLICE,
                            "createsliver", NOW)


def test_delegation_outliving_parent(home):
    a, alice, (bob, _) = home
    parent = a.credential(alice[0], expires=NOW + timedelta(hours=1))
    child = _delegate(a, parent, alice, bob, {"*": False}, expires=NOW + timedelta(days=3))
    with pytest.raises(CredentialInvalid, match="after its parent"):
        a.verifier().verify(sfa(child), pki.load_cert(bob), SLICE, "createsliver", NOW)


def test_delegation_signed_by_someone_else(home):
    a, alice, (bob, bob_key) = home
    parent = a.credential(alice[0])
    child = _delegate(a, parent, (bob, bob_key), bob, {"*": False})
    with pytest.raises(CredentialInvalid, match="owner of its parent"):
        a.verifier().verify(sfa(child), pki.load_cert(bob), SLICE, "createsliver", NOW)


def test_speaks_for(home):
    a, (alice, alice_key), (tool, _) = home
    slice_cred = a.credential(alice)
    sf = create_speaks_for(alice, alice_key, tool, NOW + timedelta(hours=1))
    creds = sfa(slice_cred) + [{"geni_type": "geni_abac", "geni_version": "1", "geni_value": sf}]
    v = a.verifier().verify(creds, pki.load_cert(tool), SLICE, "createsliver", NOW,
                            speaking_for=f"urn:publicid:IDN+{AUTH}+user+alice")
    assert v.effective_caller_urn.endswith("+user+alice")
    with pytest.raises(CredentialMismatch):  # the tool alone cannot use alice's credential
        a.verifier().verify(sfa(slice_cred), pki.load_cert(tool), SLICE, "createsliver", NOW)
    with pytest.raises(CredentialMismatch, match="not urn"):
        a.verifier().verify(creds, pki.load_cert(tool), SLICE, "createsliver", NOW,
                            speaking_for=f"urn:publicid:IDN+{AUTH}+user+carol")
    mallory, _ = a.user("mallory")
    with pytest.raises(CredentialMismatch, match="another tool"):
        a.verifier().verify(creds, pki.load_cert(mallory), SLICE, "createsliver", NOW,
                            speaking_for=f"urn:publicid:IDN+{AUTH}+user+alice")
    with pytest.raises(CredentialExpired):
        a.verifier().verify(creds, pki.load_cert(tool), SLICE, "createsliver", NOW + timedelta(hours=2),
                            speaking_for=f"urn:publicid:IDN+{AUTH}+user+alice")


def test_public_fixture_credential_is_untrusted(home):
    path = third_party("credentials/untrusted-usercred.xml")
    a, (alice, _), _ = home
    xml = path.read_text()
    assert parse_credential(xml).owner_urn.endswith("+user+alice")
    with pytest.raises((CredentialSignerUntrusted, CredentialExpired, CredentialMismatch)):
        a.verifier().verify(sfa(xml), pki.load_cert(alice), None, "listresources", NOW)


@pytest.mark.skipif(shutil.which("xmlsec1") is None, reason="xmlsec1 binary not installed (make system-deps)")
def test_xmlsec1_binary_verifies_our_credentials(home, tmp_path):
    """Other GENI tools verify with the xmlsec1 program, one signature node at a time."""
    a, (alice, _), _ = home
    xml = a.credential(alice)
    cred = parse_credential(xml)
    (tmp_path / "c.xml").write_text(xml)
    (tmp_path / "ca.pem").write_bytes(a.ca)
    out = subprocess.run(["xmlsec1", "--verify", "--node-id", f"Sig_{cred.xml_id}", "--trusted-pem",
                          str(tmp_path / "ca.pem"), str(tmp_path / "c.xml")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_any_byte_change_inside_the_credential_is_rejected(home, data):
    a, (alice, _), _ = home
    xml = _SIGNED.setdefault("xml", a.credential(alice))
    start = xml.index("<type>")
    end = xml.index("</privileges>")
    pos = data.draw(st.integers(start, end - 1))
    ch = data.draw(st.sampled_from("aZ09"))
    if xml[pos] == ch or xml[pos] in "<>/\"&":
        return
    mutated = xml[:pos] + ch + xml[pos + 1:]
    with pytest.raises((CredentialInvalid, CredentialMismatch, CredentialExpired, CredentialSignerUntrusted)):
        a.verifier().verify(sfa(mutated), pki.load_cert(alice), SLICE, "createsliver", NOW)


_SIGNED: dict[str, str] = {}


def test_a_credential_sent_again_is_not_verified_again_but_time_still_counts(home, monkeypatch):
    """omni sends the same slice credential with every call: its signatures are verified once per verifier,
    while expiry (credential and certificates) is still checked at every call's time."""
    import slicex.credentials as credentials

    a, (alice, _), _ = home
    xml = a.credential(alice, expires=NOW + timedelta(hours=1))
    verifier = a.verifier()
    calls = []
    real = credentials._check_signatures
    monkeypatch.setattr(credentials, "_check_signatures", lambda *args: calls.append(1) or real(*args))
    for _ in range(3):
        verifier.verify(sfa(xml), pki.load_cert(alice), SLICE, "createsliver", NOW)
    assert len(calls) == 1
    with pytest.raises(CredentialExpired):
        verifier.verify(sfa(xml), pki.load_cert(alice), SLICE, "createsliver", NOW + timedelta(hours=2))
    with pytest.raises(CredentialExpired):  # past the certificates' end: the cached path does not outlive them
        verifier.verify(sfa(xml), pki.load_cert(alice), SLICE, "createsliver", NOW + timedelta(days=4000))
    altered = xml.replace("<can_delegate>true</can_delegate>", "<can_delegate>false</can_delegate>", 1)
    with pytest.raises(CredentialInvalid):
        verifier.verify(sfa(altered), pki.load_cert(alice), SLICE, "createsliver", NOW)
    assert len(calls) == 2


def test_a_remembered_answer_is_given_only_to_the_same_call_within_its_validity(home, monkeypatch):
    """The verifier remembers a granted call (same credential bytes, caller certificate, target, privilege and
    roots) and answers it again without checking; anything else about the call is checked in full. An attacker
    replaying a credential someone else used, for another target or privilege, after it expired, before its
    certificates were valid, or after its root was dropped gets the refusal the full check gives."""
    import slicex.credentials as credentials

    a, (alice, _), (bob, _) = home
    xml = a.credential(alice, privileges={"info": False}, expires=NOW + timedelta(hours=1))
    verifier = a.verifier()
    checks = []
    real = credentials.CredentialVerifier._check_one
    monkeypatch.setattr(credentials.CredentialVerifier, "_check_one",
                        lambda self, *args: checks.append(args[3:5]) or real(self, *args))
    first = verifier.verify(sfa(xml), pki.load_cert(alice), SLICE, "listresources", NOW)
    assert verifier.verify(sfa(xml), pki.load_cert(alice), SLICE, "listresources", NOW + timedelta(minutes=5)) == first
    assert len(checks) == 1  # answered again from memory
    with pytest.raises(CredentialMismatch, match="not to you"):  # bob replays alice's credential
        verifier.verify(sfa(xml), pki.load_cert(bob), SLICE, "listresources", NOW)
    with pytest.raises(CredentialMismatch, match="not "):  # another target
        verifier.verify(sfa(xml), pki.load_cert(alice), "urn:publicid:IDN+cred.test+slice+other", "listresources", NOW)
    with pytest.raises(Forbidden, match="deleteslice is needed"):  # a privilege it does not grant
        verifier.verify(sfa(xml), pki.load_cert(alice), SLICE, "deleteslice", NOW)
    with pytest.raises(CredentialExpired):  # at its expiry the remembered answer is not used
        verifier.verify(sfa(xml), pki.load_cert(alice), SLICE, "listresources", NOW + timedelta(hours=1))
    with pytest.raises(CredentialExpired):  # before the certificates were issued
        verifier.verify(sfa(xml), pki.load_cert(alice), SLICE, "listresources", NOW - timedelta(days=2))
    verifier.trust.set_roots("certificate", [], ())  # the operator drops the root that vouched for it
    with pytest.raises(CredentialSignerUntrusted):
        verifier.verify(sfa(xml), pki.load_cert(alice), SLICE, "listresources", NOW)
    assert len(checks) == 7


def test_a_credential_an_elliptic_curve_key_signs_is_ecdsa_sha256_verified_and_refused_once_altered(home):
    """A signer with a P-256 key (slicex's own actor keys are; so may a federation's slice authority be) signs
    ecdsa-sha256, which is checked as fully as rsa-sha256: any change to what it covers is refused."""
    a, (alice, _), _ = home
    sa, sa_key = pki.issue_certificate(a.ca, a.ca_key, f"urn:publicid:IDN+{AUTH}+authority+sa", "sa", is_ca=True,
                                       key_kind="ec")
    target = pki.issue_certificate(a.ca, a.ca_key, SLICE, "slice")[0]
    xml = create_credential(owner_cert=alice, target_cert=target, privileges={"info": False},
                            expires=NOW + timedelta(days=1), signer_cert_chain=[sa, a.ca], signer_key_pem=sa_key)
    assert "xmldsig-more#ecdsa-sha256" in xml and "rsa-sha256" not in xml
    assert a.verifier().verify(sfa(xml), pki.load_cert(alice), SLICE, "getsliceresources", NOW)
    with pytest.raises(CredentialInvalid, match="altered"):
        a.verifier().verify(sfa(xml.replace("<name>info</name>", "<name>*</name>")), pki.load_cert(alice), SLICE,
                            "createsliver", NOW)
