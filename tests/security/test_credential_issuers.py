"""Who may issue credentials: only a slice authority (`…+authority+sa` over the target's namespace). Whoever
holds another key the deployment's CA certified — the AM's, the broker's, the authority actor's, an exchange
point's — signs a `*` credential for alice's slice naming himself (bob) as owner: every one is refused with
CREDENTIAL_INVALID (20) and alice's slice is untouched, over mutual TLS against both deployments. A user
delegating his slice credential to another user (geni-tools' delegateSliceCred.py) keeps working."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from slicex import pki
from slicex.credentials import CredentialVerifier, create_credential, parse_credential
from slicex.errors import CredentialInvalid
from slicex.home import Home
from tests.factories import request_rspec, vm
from tests.integration.conftest import AUTHORITY, Running

NOW = datetime.now(UTC).replace(microsecond=0)
V3 = {"geni_rspec_version": {"type": "GENI", "version": "3"}}
ACTOR_KEYS = ("am", "broker", "authority")


def _code(reply: dict) -> int:
    return reply["code"]["geni_code"]


def _sfa(xml: str) -> list[dict]:
    return [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": xml}]


def _actor_identity(home: Home, role: str) -> tuple[bytes, bytes]:
    cert, key = {"am": (home.am_cert, home.am_key), "broker": (home.broker_cert, home.broker_key),
                 "authority": (home.authority_cert, home.authority_key)}[role]
    return cert.read_bytes(), key.read_bytes()


def _legacy_exchange_point(home: Home) -> tuple[bytes, bytes]:
    """The identity `slicex sep init` issued before this fix (…+authority+sep): exchange points set up then
    still hold it, so the refusal must not depend on re-issuing it."""
    return pki.issue_certificate(home.ca_cert.read_bytes(), home.ca_key.read_bytes(),
                                 f"urn:publicid:IDN+{AUTHORITY}+authority+sep", "exchange point")


def _issued_by(signer: tuple[bytes, bytes], owner: bytes, target: bytes, home: Home, expires: datetime) -> str:
    cert, key = signer
    return create_credential(owner_cert=owner, target_cert=target, privileges={"*": True}, expires=expires,
                             signer_cert_chain=[cert, home.ca_cert.read_bytes()], signer_key_pem=key)


def _victim(running: Running, name: str) -> tuple[str, list[dict], bytes]:
    alice = running.user("alice")
    urn, creds = alice.slice_credential(name)
    assert _code(alice.am.Allocate(urn, creds, request_rspec([vm("n1")]), {})) == 0
    target = parse_credential(creds[0]["geni_value"]).target_gid[0].public_bytes(pki.serialization.Encoding.PEM)
    return urn, creds, target


# ---- over mutual TLS, both deployments -------------------------------------------------------------------------
def test_credentials_issued_by_actor_and_exchange_point_keys_are_refused(running):
    home = running.home
    urn, alice_creds, target = _victim(running, "issuers1")
    bob = running.user("bob")
    expires = running.clock.now() + timedelta(days=1)
    signers = {role: _actor_identity(home, role) for role in ACTOR_KEYS}
    signers["exchange point (…+authority+sep)"] = _legacy_exchange_point(home)
    for who, signer in signers.items():
        forged = _issued_by(signer, bob.cert.read_bytes(), target, home, expires)
        for call in (lambda x: bob.am.Describe([urn], _sfa(x), V3), lambda x: bob.am.Delete([urn], _sfa(x), {})):
            reply = call(forged)
            assert _code(reply) == 20, (who, reply)
            assert "not a slice authority" in reply["output"], (who, reply["output"])
            assert pki.cert_urn(pki.load_cert(signer[0])) in reply["output"], (who, reply["output"])
    status = running.user("alice").am.Status([urn], alice_creds, {})
    assert _code(status) == 0 and len(status["value"]["geni_slivers"]) == 1


def test_a_user_credential_issued_by_the_am_key_is_refused(running):
    """ListResources with a user credential the AM key signed for bob: refused like the slice credentials."""
    home = running.home
    bob = running.user("bob")
    forged = _issued_by(_actor_identity(home, "am"), bob.cert.read_bytes(), bob.cert.read_bytes(), home,
                        running.clock.now() + timedelta(days=1))
    reply = bob.am.ListResources(_sfa(forged), V3)
    assert _code(reply) == 20 and "not a slice authority" in reply["output"], reply


def test_a_slice_credential_delegated_by_its_owner_still_works(running):
    """What geni-tools' delegateSliceCred.py makes: alice, the owner, signs a child credential for bob whose
    parent is the slice authority's credential to her."""
    urn, alice_creds, target = _victim(running, "issuers2")
    alice, bob = running.user("alice"), running.user("bob")
    delegated = create_credential(owner_cert=bob.cert.read_bytes(), target_cert=target,
                                  privileges={"getsliceresources": False}, expires=running.clock.now()
                                  + timedelta(hours=2), signer_cert_chain=[alice.cert.read_bytes()],
                                  signer_key_pem=alice.key.read_bytes(), parent=alice_creds[0]["geni_value"])
    reply = bob.am.Describe([urn], _sfa(delegated), V3)
    assert _code(reply) == 0, reply
    assert _code(bob.am.Delete([urn], _sfa(delegated), {})) == 3  # delegated read-only


# ---- the exchange point's identity -----------------------------------------------------------------------------
def test_sep_init_issues_an_identity_that_is_not_an_authority(pki_home: Home, tmp_path: Path):
    from cli.sep import cmd_init

    config = tmp_path / "sep" / "sep.yaml"
    args = argparse.Namespace(home=str(pki_home.root), config=str(config), force=False, host="127.0.0.1",
                              port=0, store="sep.db", trust=None,
                              aggregate=[f"urn:publicid:IDN+{AUTHORITY}+authority+am=https://127.0.0.1:1/"])
    assert cmd_init(args) == 0
    urn = pki.cert_urn(pki.load_cert((config.parent / "sep-cert.pem").read_bytes()))
    assert urn == f"urn:publicid:IDN+{AUTHORITY}+tool+sep"
    assert "+authority+" not in urn


# ---- the verifier alone (unit) ----------------------------------------------------------------------------------
class Namespace:
    def __init__(self, name: str = "issuers.test"):
        self.name = name
        self.ca, self.ca_key = pki.create_ca(name, f"{name} CA")
        self.sa = self.mint("authority+sa", is_ca=True)
        self.alice = self.mint("user+alice")
        self.bob = self.mint("user+bob")
        self.slice_urn = f"urn:publicid:IDN+{name}+slice+s1"
        self.slice_cert = pki.issue_certificate(self.sa[0], self.sa[1], self.slice_urn, "s1")[0]
        self.verifier = CredentialVerifier(pki.TrustStore(certs=pki.load_certs(self.ca)))

    def mint(self, kind_name: str, is_ca: bool = False) -> tuple[bytes, bytes]:
        return pki.issue_certificate(self.ca, self.ca_key, f"urn:publicid:IDN+{self.name}+{kind_name}", kind_name,
                                     is_ca=is_ca)

    def issue(self, signer: tuple[bytes, bytes], owner: bytes) -> str:
        return create_credential(owner_cert=owner, target_cert=self.slice_cert, privileges={"*": True},
                                 expires=NOW + timedelta(days=1), signer_cert_chain=[signer[0], self.ca],
                                 signer_key_pem=signer[1])


@pytest.fixture(scope="module")
def ns() -> Namespace:
    return Namespace()


def test_the_slice_authority_issues(ns):
    assert ns.verifier.verify([ns.issue(ns.sa, ns.bob[0])], pki.load_cert(ns.bob[0]), ns.slice_urn, "deleteslice",
                              NOW)


@pytest.mark.parametrize("signer", ["authority+am", "authority+broker", "authority+authority", "authority+sep",
                                    "authority+ca", "authority+cm", "tool+sep", "user+mallory"])
def test_no_other_identity_issues(ns, signer):
    key = ns.mint(signer, is_ca=signer == "authority+ca")
    with pytest.raises(CredentialInvalid, match="not a slice authority") as refused:
        ns.verifier.verify([ns.issue(key, ns.bob[0])], pki.load_cert(ns.bob[0]), ns.slice_urn, "deleteslice", NOW)
    assert refused.value.code == 20


def test_a_delegation_whose_root_an_actor_signed_is_refused(ns):
    """Delegation does not launder an issuer: the chain's root credential must come from a slice authority."""
    am = ns.mint("authority+am")
    root = ns.issue(am, ns.alice[0])
    child = create_credential(owner_cert=ns.bob[0], target_cert=ns.slice_cert, privileges={"*": False},
                              expires=NOW + timedelta(hours=1), signer_cert_chain=[ns.alice[0]],
                              signer_key_pem=ns.alice[1], parent=root)
    with pytest.raises(CredentialInvalid, match="not a slice authority"):
        ns.verifier.verify([child], pki.load_cert(ns.bob[0]), ns.slice_urn, "getsliceresources", NOW)
