"""Namespace-bound roots: a trusted root vouches only for URNs in its own namespace (and sub-authorities), so
a federation peer's CA cannot mint slice authorities, users or slices in ours."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from slicex import pki
from slicex.credentials import CredentialVerifier, create_credential, parse_credential
from slicex.errors import CredentialSignerUntrusted
from slicex.tls_xmlrpc import client
from tests.factories import request_rspec, vm
from tests.integration.conftest import AUTHORITY, REDIS_URL, Running, make_home, start, stop

NOW = datetime.now(UTC).replace(microsecond=0)


class Authority:
    def __init__(self, name: str):
        self.name = name
        self.ca, self.ca_key = pki.create_ca(name, f"{name} CA")
        self.sa, self.sa_key = self.mint(f"urn:publicid:IDN+{name}+authority+sa", is_ca=True)

    def mint(self, urn: str, is_ca: bool = False) -> tuple[bytes, bytes]:
        return pki.issue_certificate(self.ca, self.ca_key, urn, urn.rsplit("+", 1)[-1], is_ca=is_ca)

    def credential(self, owner: bytes, target: bytes, signer: tuple[bytes, bytes] | None = None) -> str:
        cert, key = signer or (self.sa, self.sa_key)
        return create_credential(owner_cert=owner, target_cert=target, privileges={"*": True},
                                 expires=NOW + timedelta(days=1), signer_cert_chain=[cert, self.ca],
                                 signer_key_pem=key)


@pytest.fixture(scope="module")
def two():
    home, peer = Authority("home.test"), Authority("peer.test")
    trust = pki.TrustStore(certs=pki.load_certs(home.ca) + pki.load_certs(peer.ca))
    return home, peer, CredentialVerifier(trust)


def test_a_peer_root_vouches_for_its_own_namespace(two):
    _home, peer, verifier = two
    user, _ = peer.mint("urn:publicid:IDN+peer.test+user+pat")
    slice_urn = "urn:publicid:IDN+peer.test:lab+slice+exp1"
    target, _ = peer.mint(slice_urn)
    assert verifier.verify([peer.credential(user, target)], pki.load_cert(user), slice_urn, "createsliver", NOW)


def test_a_peer_root_cannot_mint_a_slice_authority_in_our_namespace(two):
    home, peer, verifier = two
    forged_sa = peer.mint("urn:publicid:IDN+home.test+authority+sa", is_ca=True)
    user, _ = peer.mint("urn:publicid:IDN+peer.test+user+mallory")
    victim = "urn:publicid:IDN+home.test+slice+victim"
    victim_cert, _ = home.mint(victim)
    with pytest.raises(CredentialSignerUntrusted, match="outside the namespace"):
        verifier.verify([peer.credential(user, victim_cert, signer=forged_sa)], pki.load_cert(user), victim,
                        "deleteslice", NOW)


def test_a_peer_root_cannot_mint_users_in_our_namespace(two):
    home, peer, verifier = two
    fake_alice, _ = peer.mint("urn:publicid:IDN+home.test+user+alice")
    slice_urn = "urn:publicid:IDN+peer.test+slice+exp2"
    target, _ = peer.mint(slice_urn)
    with pytest.raises(CredentialSignerUntrusted, match="outside the namespace"):
        verifier.verify([peer.credential(fake_alice, target)], pki.load_cert(fake_alice), slice_urn,
                        "createsliver", NOW)


def test_a_namespace_is_not_a_string_prefix(two):
    _home, peer, _ = two
    trust = pki.TrustStore(certs=pki.load_certs(peer.ca))
    lookalike, _ = peer.mint("urn:publicid:IDN+peer.testbed+user+x")
    with pytest.raises(CredentialSignerUntrusted):
        trust.verify_chain(pki.load_cert(lookalike), [], NOW)
    sub, _ = peer.mint("urn:publicid:IDN+PEER.test:Lab+user+x")
    assert len(trust.verify_chain(pki.load_cert(sub), [], NOW)) == 2


def test_roots_take_their_namespace_from_configuration_or_vouch_for_nothing(tmp_path):
    import uuid as _uuid

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"legacy root {_uuid.uuid4()}")])
    legacy = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
              .serial_number(x509.random_serial_number()).not_valid_before(NOW - timedelta(days=1))
              .not_valid_after(NOW + timedelta(days=30))
              .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
              .sign(key, hashes.SHA256()))
    (tmp_path / "legacy.pem").write_bytes(legacy.public_bytes(pki.serialization.Encoding.PEM))
    assert pki.TrustStore([tmp_path]).trusted == [] and "vouches for nothing" in pki.TrustStore([tmp_path]).ignored[0]
    configured = pki.TrustStore([tmp_path], namespaces={"legacy.pem": ["legacy.test", "other.test"]})
    assert configured.trusted[0].namespaces == ("legacy.test", "other.test")


@given(ns=st.from_regex(r"[a-z][a-z0-9.]{0,12}", fullmatch=True),
       other=st.from_regex(r"[a-z0-9.:]{0,12}", fullmatch=True))
def test_namespace_covers_exactly_itself_and_sub_authorities(ns, other):
    assert pki.namespace_covers(ns, ns.upper())
    assert pki.namespace_covers(ns, f"{ns}:{other}")
    assert pki.namespace_covers(ns, ns + other) == (other == "" or other.startswith(":"))


# ---- over mutual TLS, against running deployments -------------------------------------------------------------
@pytest.fixture(params=["embedded", "distributed"])
def with_peer(request, tmp_path_factory) -> Iterator[tuple[Running, Authority]]:
    """A deployment that trusts a federation peer's root (namespace peer.test) beside its own."""
    root: Path = tmp_path_factory.mktemp("peer-home")
    peer = Authority("peer.test")
    distributed = request.param == "distributed"
    store = REDIS_URL if distributed else f"sqlite:///{root / 'state.db'}"
    home = make_home(root, store=store)
    (home.trusted_roots / "peer.test-ca.pem").write_bytes(peer.ca)
    if distributed:
        from slicex.store.redis_store import RedisStore

        RedisStore(REDIS_URL).flush()
    cfg = yaml.safe_load(home.config_file.read_text())
    home.config_file.write_text(yaml.safe_dump(cfg))
    r = start(home, distributed=distributed)
    yield r, peer
    stop(r)
    if distributed:
        from slicex.store.redis_store import RedisStore

        RedisStore(REDIS_URL).flush()


def test_peer_minted_slice_authority_cannot_delete_our_users_slice(with_peer, tmp_path):
    running, peer = with_peer
    alice = running.user("alice")
    victim, creds = alice.slice_credential("victim")
    assert creds[0]["geni_value"] and alice.am.Allocate(victim, creds, request_rspec([vm("n1")]), {})["code"][
        "geni_code"] == 0
    victim_cert = parse_credential(creds[0]["geni_value"]).target_gid[0].public_bytes(pki.serialization.Encoding.PEM)
    forged_sa = peer.mint(f"urn:publicid:IDN+{AUTHORITY}+authority+sa", is_ca=True)
    # mallory is a genuine peer user (TLS accepts her: the peer's root is trusted) ...
    mallory_cert, mallory_key = peer.mint("urn:publicid:IDN+peer.test+user+mallory")
    # ... and so would be a peer-minted "alice" of our namespace, at the TLS layer
    fake_alice_cert, fake_alice_key = peer.mint(f"urn:publicid:IDN+{AUTHORITY}+user+alice")
    for name, (cert, key) in {"mallory": (mallory_cert, mallory_key),
                              "fake-alice": (fake_alice_cert, fake_alice_key)}.items():
        (tmp_path / f"{name}.pem").write_bytes(cert)
        (tmp_path / f"{name}.key").write_bytes(key)
        am = client(running.deployment.endpoints.am_url, str(tmp_path / f"{name}.pem"), str(tmp_path / f"{name}.key"))
        forged = peer.credential(cert, victim_cert, signer=forged_sa)
        for call in (am.Delete, am.Status):
            reply = call([victim], [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": forged}], {})
            assert reply["code"]["geni_code"] == 23, (name, reply)
            assert "outside the namespace" in reply["output"], (name, reply)
    status = alice.am.Status([victim], creds, {})
    assert status["code"]["geni_code"] == 0 and len(status["value"]["geni_slivers"]) == 1


def test_the_slice_authority_serves_its_own_members_only(with_peer, tmp_path):
    """TLS admits a trusted peer's users; the slice authority must not hand them credentials, least of all a
    peer-minted "alice" of our namespace asking for alice's slice (its owner check compares URNs)."""
    import xmlrpc.client

    running, peer = with_peer
    alice = running.user("alice")
    victim, _creds = alice.slice_credential("victim")
    for name, urn in {"mallory": "urn:publicid:IDN+peer.test+user+mallory",
                      "fake-alice": f"urn:publicid:IDN+{AUTHORITY}+user+alice"}.items():
        cert, key = peer.mint(urn)
        (tmp_path / f"{name}.pem").write_bytes(cert)
        (tmp_path / f"{name}.key").write_bytes(key)
        sa = client(running.deployment.endpoints.sa_url, str(tmp_path / f"{name}.pem"), str(tmp_path / f"{name}.key"))
        for method, args in (("CreateSlice", (victim,)), ("CreateUserCredential", (cert.decode(),)),
                             ("ListMySlices", (urn,))):
            with pytest.raises(xmlrpc.client.Fault) as refused:
                getattr(sa, method)(*args)
            assert refused.value.faultCode == 23 and "members of" in refused.value.faultString, name
