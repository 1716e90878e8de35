"""The XML signature attack family against SFA credentials: every forged credential is refused with
CREDENTIAL_INVALID (20) and the victim's slice is untouched, first by the verifier alone (fast), then as real
AM API calls over mutual TLS against running deployments (embedded and distributed)."""

from __future__ import annotations

import xmlrpc.client
from datetime import UTC, datetime, timedelta

import pytest

from slicex import pki
from slicex.credentials import CredentialVerifier, create_credential
from slicex.errors import CredentialInvalid, GeniError
from tests.factories import request_rspec, vm
from tests.integration.conftest import AUTHORITY
from tests.security import attacks
from tests.security.attacks import ATTACKS, Attacker

NOW = datetime.now(UTC).replace(microsecond=0)


# ---- the verifier alone ----------------------------------------------------------------------------------------
class World:
    """A slice authority, a victim (alice) with slice `victim1`, an attacker (bob) with slice `victim1x`."""

    def __init__(self) -> None:
        self.ca, self.ca_key = pki.create_ca("sec.test", "sec CA")
        self.sa, self.sa_key = pki.issue_certificate(self.ca, self.ca_key, "urn:publicid:IDN+sec.test+authority+sa",
                                                     "sa", is_ca=True)
        self.alice, self.alice_key = self._user("alice")
        self.bob, self.bob_key = self._user("bob")
        self.victim_urn = "urn:publicid:IDN+sec.test+slice+victim1"
        self.victim_cert = pki.issue_certificate(self.ca, self.ca_key, self.victim_urn, "victim1")[0]
        self.bobs_urn = "urn:publicid:IDN+sec.test+slice+victim1x"
        self.bobs_cert = pki.issue_certificate(self.ca, self.ca_key, self.bobs_urn, "victim1x")[0]
        self.verifier = CredentialVerifier(pki.TrustStore(certs=pki.load_certs(self.ca)))

    def _user(self, name: str) -> tuple[bytes, bytes]:
        return pki.issue_certificate(self.ca, self.ca_key, f"urn:publicid:IDN+sec.test+user+{name}", name)

    def credential(self, owner: bytes, target: bytes, privileges: dict[str, bool]) -> str:
        return create_credential(owner_cert=owner, target_cert=target, privileges=privileges,
                                 expires=NOW + timedelta(days=1), signer_cert_chain=[self.sa, self.ca],
                                 signer_key_pem=self.sa_key)

    def attacker(self, own_credential: str) -> Attacker:
        return Attacker(self.bob, self.bob_key, own_credential, self.victim_urn, self.victim_cert, [self.sa, self.ca])

    def as_bob(self, xml: str, privilege: str = "deleteslice"):
        return self.verifier.verify([xml], pki.load_cert(self.bob), self.victim_urn, privilege, NOW)


@pytest.fixture(scope="module")
def world() -> World:
    return World()


def _bobs_credentials(w: World) -> dict[str, str]:
    return {"user credential": w.credential(w.bob, w.bob, {"refresh": True, "resolve": True, "info": True}),
            "slice credential": w.credential(w.bob, w.bobs_cert, {"*": True})}


def test_the_genuine_credentials_work_so_the_refusals_below_mean_something(world):
    w = world
    creds = _bobs_credentials(w)
    assert w.verifier.verify([creds["slice credential"]], pki.load_cert(w.bob), w.bobs_urn, "deleteslice", NOW)
    assert w.verifier.verify([creds["user credential"]], pki.load_cert(w.bob), None, "listresources", NOW)
    alices = w.credential(w.alice, w.victim_cert, {"*": True})
    assert w.verifier.verify([alices], pki.load_cert(w.alice), w.victim_urn, "deleteslice", NOW)


@pytest.mark.parametrize("source", ["user credential", "slice credential"])
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_forged_credential_is_invalid(world, attack, source):
    forged = ATTACKS[attack](world.attacker(_bobs_credentials(world)[source]))
    with pytest.raises(CredentialInvalid) as refused:
        world.as_bob(forged)
    assert refused.value.code == 20 and refused.value.message


def test_comment_inside_a_signed_field_is_invalid(world):
    """`…+slice+victim1<!---->x` digests like `…+slice+victim1x` (C14N drops comments) but `.text` reads
    `…+slice+victim1`; it must not become a credential for the victim's slice."""
    forged = attacks.comment_splits_target(world.attacker(_bobs_credentials(world)["slice credential"]))
    assert "<!---->" in forged
    with pytest.raises(CredentialInvalid, match="comment"):
        world.as_bob(forged)


def test_transform_that_leaves_privileges_out_of_the_digest_is_invalid(world):
    w = world
    forged = attacks.signer_mistake_xpath(w.alice, w.victim_cert, w.victim_urn, w.sa_key, [w.sa, w.ca],
                                          (NOW + timedelta(days=1)).isoformat())
    with pytest.raises(CredentialInvalid, match="transform"):
        w.verifier.verify([forged], pki.load_cert(w.alice), w.victim_urn, "deleteslice", NOW)


def test_refusals_are_geni_errors_never_crashes(world):
    """Every attack, fed to the verifier through every credential entry shape, ends in a GENI error."""
    source = _bobs_credentials(world)["slice credential"]
    for build in ATTACKS.values():
        forged = build(world.attacker(source))
        for entry in (forged, {"geni_type": "geni_sfa", "geni_version": "3", "geni_value": forged},
                      {"geni_type": "geni_sfa", "geni_version": 3, "geni_value": forged.encode()}):
            with pytest.raises(GeniError):
                world.as_bob(entry)


# ---- real calls over mutual TLS -------------------------------------------------------------------------------
def _code(reply: dict) -> int:
    return reply["code"]["geni_code"]


def _sfa(xml: str) -> list[dict]:
    return [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": xml}]


def test_forged_credentials_cannot_touch_another_users_slice(running):
    """The reported attack and its family, as bob sends them to a running aggregate: each is refused with
    code 20 and an output naming the problem, and alice's slice is still there afterwards."""
    alice, bob = running.user("alice"), running.user("bob")
    victim_urn, alice_creds = alice.slice_credential("victim1")
    assert _code(alice.am.Allocate(victim_urn, alice_creds, request_rspec([vm("n1")]), {})) == 0
    bobs_slice_urn, bob_slice_creds = bob.slice_credential("victim1x")
    bob_user_cred = bob.user_credential()[0]["geni_value"]
    from slicex.credentials import parse_credential

    victim_cert = parse_credential(alice_creds[0]["geni_value"]).target_gid[0].public_bytes(
        pki.serialization.Encoding.PEM)
    home = running.home
    sa_chain = [home.sa_cert.read_bytes(), home.ca_cert.read_bytes()]
    sources = {"user": bob_user_cred, "slice": bob_slice_creds[0]["geni_value"]}
    forged: dict[str, str] = {}
    for source, own in sources.items():
        a = Attacker(bob.cert.read_bytes(), bob.key.read_bytes(), own, victim_urn, victim_cert, sa_chain)
        forged.update({f"{name} ({source})": build(a) for name, build in ATTACKS.items()})
    slice_attacker = Attacker(bob.cert.read_bytes(), bob.key.read_bytes(), sources["slice"], victim_urn,
                              victim_cert, sa_chain)
    forged["comment_splits_target"] = attacks.comment_splits_target(slice_attacker)
    for name, xml in forged.items():
        for call in (lambda x: bob.am.Delete([victim_urn], _sfa(x), {}),
                     lambda x: bob.am.Status([victim_urn], _sfa(x), {})):
            reply = call(xml)
            assert _code(reply) == 20, (name, reply)
            assert reply["output"] and "credential" in reply["output"].lower(), (name, reply)
    status = alice.am.Status([victim_urn], alice_creds, {})
    assert _code(status) == 0 and len(status["value"]["geni_slivers"]) == 1
    assert bobs_slice_urn != victim_urn


def test_escalated_credential_from_a_careless_signer_is_refused_over_tls(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("careless")
    assert _code(alice.am.Allocate(urn, creds, request_rspec([vm("n1")]), {})) == 0
    from slicex.credentials import parse_credential

    home = running.home
    target = parse_credential(creds[0]["geni_value"]).target_gid[0].public_bytes(pki.serialization.Encoding.PEM)
    forged = attacks.signer_mistake_xpath(alice.cert.read_bytes(), target, urn, home.sa_key.read_bytes(),
                                          [home.sa_cert.read_bytes(), home.ca_cert.read_bytes()],
                                          (running.clock.now() + timedelta(days=1)).isoformat())
    reply = alice.am.Delete([urn], _sfa(forged), {})
    assert _code(reply) == 20 and "transform" in reply["output"]
    assert _code(alice.am.Status([urn], creds, {})) == 0


def test_a_credential_is_never_an_xmlrpc_fault(running):
    bob = running.user("bob")
    urn = f"urn:publicid:IDN+{AUTHORITY}+slice+nosuch"
    for value in ("<signed-credential/>", "<credential xml:id='a'/>", "\x00", "<a>" * 10000,
                  xmlrpc.client.Binary(b"\xff\xfe"), 12, None):
        reply = bob.am.Status([urn], [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": value}], {})
        assert _code(reply) in (1, 20), (value, reply)


def test_a_credential_sent_as_xmlrpc_base64_is_read_like_a_string(running):
    """geni-lib sends AM credentials as XML-RPC base64 (with geni_version as an integer): the same signed
    bytes, so the same answer as omni's string; a forged one sent that way is still refused."""
    alice = running.user("alice")
    urn, creds = alice.slice_credential("base64")
    as_binary = [{"geni_type": "geni_sfa", "geni_version": 3,
                  "geni_value": xmlrpc.client.Binary(creds[0]["geni_value"].encode())}]
    reply = alice.am.Allocate(urn, as_binary, request_rspec([vm("n1")]), {})
    assert _code(reply) == 0, reply
    altered = creds[0]["geni_value"].replace("<can_delegate>true</can_delegate>",
                                            "<can_delegate>false</can_delegate>", 1)
    refused = alice.am.Delete([urn], [{"geni_type": "geni_sfa", "geni_version": 3,
                                        "geni_value": xmlrpc.client.Binary(altered.encode())}], {})
    assert _code(refused) == 20, refused
