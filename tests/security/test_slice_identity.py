"""A slice belongs to one owner for its whole life, attacked over mutual TLS on both deployments.

A slice is its URN *and* its UUID (the `urn:uuid:` beside the URN in the slice certificate's subjectAltName,
which every slice credential carries as its target). The slice authority never hands a slice's name to anyone
else before the slice expires, deleted or not; the aggregate records the UUID with the slivers it allocates and
refuses (CREDENTIAL_INVALID) a credential for the same URN naming another UUID, or none: a slice re-created
somewhere (a peer's authority, a reset store) never reaches the slivers of the slice it replaced."""

from __future__ import annotations

import xmlrpc.client
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import NameOID

from slicex import pki
from slicex.clock import rfc3339
from slicex.credentials import create_credential, parse_credential
from slicex.tls_xmlrpc import client
from tests.factories import request_rspec, vm
from tests.integration.conftest import Running, User
from tests.integration.test_am_api import RSPEC_V3, code, ok
from tests.security.test_namespace_roots import with_peer  # noqa: F401 - the fixture


def _sfa(xml: str) -> list[dict]:
    return [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": xml}]


def _uuid_of(creds: list[dict]) -> str:
    return pki.cert_uuid(parse_credential(creds[0]["geni_value"]).target_gid[0])


def _slice_cert(running: Running, urn: str, with_uuid: bool = True) -> bytes:
    """A certificate for `urn` from the deployment's own CA: what a slice authority that made the slice again
    (or one that puts no UUID in it) would issue."""
    if with_uuid:
        cert, _key = pki.issue_certificate(running.home.ca_cert.read_bytes(), running.home.ca_key.read_bytes(),
                                           urn, urn.rsplit("+", 1)[-1])
        return cert
    ca = pki.load_cert(running.home.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(running.home.ca_key.read_bytes(), None)
    now = datetime.now(UTC) - timedelta(hours=1)
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "noid")]))
            .issuer_name(ca.subject).public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(urn)]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM)


def _sa_credential(running: Running, owner: User, target_cert: bytes) -> list[dict]:
    """A slice credential signed by the deployment's genuine slice authority."""
    home = running.home
    return _sfa(create_credential(owner_cert=owner.cert.read_bytes(), target_cert=target_cert,
                                  privileges={"*": True}, expires=running.clock.now() + timedelta(days=2),
                                  signer_cert_chain=[home.sa_cert.read_bytes(), home.ca_cert.read_bytes()],
                                  signer_key_pem=home.sa_key.read_bytes()))


def _sliver_calls(urn: str, creds: list[dict], running: Running) -> dict[str, tuple]:
    later = rfc3339(running.clock.now() + timedelta(hours=2))
    return {"Status": ("Status", [urn], creds, {}),
            "Describe": ("Describe", [urn], creds, {"geni_rspec_version": RSPEC_V3}),
            "Renew": ("Renew", [urn], creds, later, {}),
            "Provision": ("Provision", [urn], creds, {}),
            "PerformOperationalAction": ("PerformOperationalAction", [urn], creds, "geni_update_users",
                                         {"geni_users": [{"urn": "x", "keys": ["ssh-ed25519 AAAA bob"]}]}),
            "Delete": ("Delete", [urn], creds, {}),
            "Allocate": ("Allocate", urn, creds, request_rspec([vm("bobs")]), {}),
            "Shutdown": ("Shutdown", urn, creds, {}),
            "Update": ("Update", [urn], creds, request_rspec([vm("a"), vm("bobs")]), {}),
            "Cancel": ("Cancel", [urn], creds, {})}


def _alices_slice(running: Running, name: str) -> tuple[User, str, list[dict], list[str]]:
    alice = running.user("alice")
    urn, creds = alice.slice_credential(name)
    slivers = ok(alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {}))["geni_slivers"]
    ok(alice.am.Provision([urn], creds, {}))
    return alice, urn, creds, sorted(s["geni_sliver_urn"] for s in slivers)


def _still_hers(alice: User, urn: str, creds: list[dict], slivers: list[str]) -> None:
    status = ok(alice.am.Status([urn], creds, {}))
    assert sorted(s["geni_sliver_urn"] for s in status["geni_slivers"]) == slivers
    assert all(s["geni_allocation_status"] == "geni_provisioned" for s in status["geni_slivers"])


# ---- the slice authority: a name is never handed out again before the slice expires --------------------------
def test_a_deleted_slices_name_stays_its_owners_until_it_expires(running):
    """The reported attack: alice provisions, `omni deleteslice`, bob `createslice` of the same name."""
    alice, urn, creds, slivers = _alices_slice(running, "reused")
    bob = running.user("bob")
    assert alice.sa.DeleteSlice(urn) is True
    assert urn not in alice.sa.ListMySlices(alice.urn)
    with pytest.raises(xmlrpc.client.Fault) as refused:
        bob.sa.CreateSlice(urn)
    assert refused.value.faultCode == 17
    assert "reserved until" in refused.value.faultString and "deleted" in refused.value.faultString
    assert urn not in bob.sa.ListMySlices(bob.urn)
    _still_hers(alice, urn, creds, slivers)

    # the owner may take her deleted slice back: the same slice, the same UUID, her slivers
    again = _sfa(alice.sa.CreateSlice(urn))
    assert _uuid_of(again) == _uuid_of(creds)
    assert urn in alice.sa.ListMySlices(alice.urn)
    _still_hers(alice, urn, again, slivers)

    # once the slice has expired the name is free again, as a new slice with a new UUID
    assert alice.sa.DeleteSlice(urn) is True
    running.clock.advance(timedelta(days=8))  # past the slice lifetime (7 days): the slivers ended with it
    bobs = _sfa(bob.sa.CreateSlice(urn))
    assert _uuid_of(bobs) and _uuid_of(bobs) != _uuid_of(creds)
    assert code(bob.am.Status([urn], bobs, {})) == 12


def test_the_slice_uuid_is_in_its_certificate_and_survives_renewal(running):
    from tests.integration.test_chapi import chapi_user
    from tests.integration.test_chapi import ok as ch_ok

    alice = chapi_user(running, "alice")
    created = ch_ok(alice.sa.create_slice([], {"fields": {"SLICE_NAME": "longlived"}}))
    urn = created["SLICE_URN"]
    creds = ch_ok(alice.sa.get_credentials(urn, [], {}))
    assert _uuid_of(creds) == created["SLICE_UID"]
    later = rfc3339(running.clock.now() + timedelta(days=55))  # past the first certificate: it is reissued
    assert ch_ok(alice.sa.update_slice(urn, [], {"fields": {"SLICE_EXPIRATION": later}}))
    renewed = ch_ok(alice.sa.get_credentials(urn, [], {}))
    assert renewed[0]["geni_value"] != creds[0]["geni_value"]
    assert _uuid_of(renewed) == created["SLICE_UID"]
    gcf = running.user("alice")
    assert _uuid_of(_sfa(gcf.sa.CreateSlice(urn))) == created["SLICE_UID"]


# ---- the aggregate: slivers answer only to the slice they were allocated for -----------------------------------
@pytest.mark.parametrize("method", ["Status", "Describe", "Renew", "Provision", "PerformOperationalAction",
                                    "Delete", "Allocate", "Shutdown", "Update", "Cancel"])
def test_a_credential_for_a_recreated_slice_cannot_reach_the_old_slices_slivers(running, method):
    alice, urn, creds, slivers = _alices_slice(running, f"old{method[:6].lower()}")
    bob = running.user("bob")
    recreated = _sa_credential(running, bob, _slice_cert(running, urn))
    assert _uuid_of(recreated) != _uuid_of(creds)
    reply = getattr(bob.am, method)(*_sliver_calls(urn, recreated, running)[method][1:])
    assert code(reply) == 20, reply
    assert "re-created" in reply["output"] and _uuid_of(creds) in reply["output"], reply["output"]
    _still_hers(alice, urn, creds, slivers)


def test_v2_create_sliver_with_a_recreated_slices_credential_is_refused_as_re_created(running):
    alice, urn, creds, slivers = _alices_slice(running, "oldv2")
    bob = running.user("bob")
    v2 = client(running.deployment.endpoints.am_v2_url, str(bob.cert), str(bob.key))
    recreated = [c["geni_value"] for c in _sa_credential(running, bob, _slice_cert(running, urn))]
    for call in (lambda: v2.CreateSliver(urn, recreated, request_rspec([vm("b")]), [], {}),
                 lambda: v2.SliverStatus(urn, recreated, {}), lambda: v2.DeleteSliver(urn, recreated, {})):
        reply = call()
        assert code(reply) == 20 and "re-created" in reply["output"], reply
    _still_hers(alice, urn, creds, slivers)


def test_a_credential_naming_no_slice_uuid_cannot_reach_slivers_recorded_with_one(running):
    alice, urn, creds, slivers = _alices_slice(running, "noid")
    bob = running.user("bob")
    anonymous = _sa_credential(running, bob, _slice_cert(running, urn, with_uuid=False))
    assert _uuid_of(anonymous) == ""
    for method in ("Status", "Delete"):
        reply = getattr(bob.am, method)([urn], anonymous, {})
        assert code(reply) == 20 and "names no slice UUID" in reply["output"], reply
    _still_hers(alice, urn, creds, slivers)


def test_a_peers_slice_made_again_under_its_name_cannot_reach_the_first_ones_slivers(with_peer,  # noqa: F811
                                                                                  tmp_path: Path):
    running, peer = with_peer
    url = running.deployment.endpoints.am_url

    def peer_user(name: str) -> tuple[bytes, xmlrpc.client.ServerProxy]:
        cert, key = peer.mint(f"urn:publicid:IDN+peer.test+user+{name}")
        (tmp_path / f"{name}.pem").write_bytes(cert)
        (tmp_path / f"{name}.key").write_bytes(key)
        return cert, client(url, str(tmp_path / f"{name}.pem"), str(tmp_path / f"{name}.key"))

    urn = "urn:publicid:IDN+peer.test+slice+exp1"
    (pat_cert, pat), (mallory_cert, mallory) = peer_user("pat"), peer_user("mallory")
    pats = _sfa(peer.credential(pat_cert, peer.mint(urn)[0]))
    sliver = ok(pat.Allocate(urn, pats, request_rspec([vm("a")]), {}))["geni_slivers"][0]["geni_sliver_urn"]
    second = _sfa(peer.credential(mallory_cert, peer.mint(urn)[0]))  # the peer made the slice again
    for method in ("Status", "Delete"):
        reply = getattr(mallory, method)([urn], second, {})
        assert code(reply) == 20 and "re-created" in reply["output"], reply
    assert [s["geni_sliver_urn"] for s in ok(pat.Status([urn], pats, {}))["geni_slivers"]] == [sliver]
