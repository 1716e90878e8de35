"""The actors' own keys are elliptic-curve (a tenth of RSA's signing cost, and the AM signs once per TLS
handshake) while what GENI tools check stays RSA; tickets, leases and delegations verify by the key type of
the signer's certificate, so a home made with RSA actor keys keeps working."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from msgspec.structs import replace

from authority.substrate.emulated import EmulatedDriver
from deployment.actors import embedded_slice_manager, home_keys_and_names
from protocol import slice_manager as sm
from rspec.request import parse_request
from rspec.substrate import default_substrate
from slicex import pki
from slicex.clock import ManualClock
from slicex.codec import decode, encode
from slicex.devpki import ACTOR_ROLES, actor_files, actor_public_key, actor_urn, init_ca
from slicex.errors import CredentialInvalid
from slicex.home import Home
from slicex.store.sqlite_store import SqliteStore
from slicex.ticket import Lease, Ticket, sign_lease, sign_ticket, verify_lease, verify_ticket
from tests.factories import request_rspec, vm

T0 = datetime(2030, 1, 1, tzinfo=UTC)
H = timedelta(hours=1)


def _private_key(path):
    return pki.serialization.load_pem_private_key(path.read_bytes(), None)


def test_a_new_home_gives_the_am_broker_and_authority_p256_keys_and_keeps_rsa_where_geni_tools_check(tmp_path):
    home = Home(tmp_path)
    init_ca(home, "kind.test")
    for role in ACTOR_ROLES:
        cert_path, key_path = actor_files(home, role)
        key, public = _private_key(key_path), pki.load_cert(cert_path.read_bytes()).public_key()
        assert key.public_key().public_numbers() == public.public_numbers()  # the key is the certificate's
        if isinstance(public, ec.EllipticCurvePublicKey):
            assert public.curve.name == "secp256r1"
    assert {r: isinstance(actor_public_key(home, r, "kind.test"), ec.EllipticCurvePublicKey) for r in ACTOR_ROLES} \
        == {"am": True, "sa": False, "broker": True, "authority": True}
    assert isinstance(actor_public_key(home, "sa", "kind.test"), rsa.RSAPublicKey)  # signs credentials (xmlsec)
    assert isinstance(pki.load_cert(home.ca_cert.read_bytes()).public_key(), rsa.RSAPublicKey)


def _ticket() -> Ticket:
    return Ticket("g/r1", "b", "sm", "r1", ("core:pc1:0",), T0, T0 + H, 1)


@pytest.mark.parametrize("make", [lambda: ec.generate_private_key(ec.SECP256R1()),
                                  lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048)],
                         ids=["p256", "rsa"])
def test_a_ticket_verifies_with_its_signers_key_of_either_kind_and_not_once_altered_or_with_another_key(make):
    key = make()
    signed = sign_ticket(_ticket(), key)
    verify_ticket(signed, key.public_key())
    with pytest.raises(CredentialInvalid, match="not signed by broker b"):
        verify_ticket(replace(signed, units=("core:pc1:1",)), key.public_key())
    with pytest.raises(CredentialInvalid, match="not signed by broker b"):
        verify_ticket(replace(signed, end=T0 + 2 * H), key.public_key())
    for other in (ec.generate_private_key(ec.SECP256R1()), rsa.generate_private_key(public_exponent=65537,
                                                                                        key_size=2048)):
        with pytest.raises(CredentialInvalid, match="not signed by broker b"):
            verify_ticket(signed, other.public_key())
    lease = sign_lease(Lease("l1", "a", "g/r1", "sm", "r1", ("core:pc1:0",), T0, T0 + H), key)
    verify_lease(lease, key.public_key())
    with pytest.raises(CredentialInvalid, match="not signed by authority a"):
        verify_lease(replace(lease, holder="mallory"), key.public_key())


def test_a_signature_a_key_of_another_kind_made_is_refused_by_the_certificates_key_type():
    """The verifier takes the algorithm from the certificate: an RSA signature presented for an EC broker (or
    the reverse) is refused, whatever the document says."""
    ec_key, rsa_key = ec.generate_private_key(ec.SECP256R1()), rsa.generate_private_key(public_exponent=65537,
                                                                                         key_size=2048)
    with pytest.raises(CredentialInvalid):
        verify_ticket(sign_ticket(_ticket(), rsa_key), ec_key.public_key())
    with pytest.raises(CredentialInvalid):
        verify_ticket(sign_ticket(_ticket(), ec_key), rsa_key.public_key())
    with pytest.raises(CredentialInvalid):
        verify_ticket(replace(_ticket(), signature="not base64!"), ec_key.public_key())


def test_a_home_made_with_rsa_actor_keys_keeps_signing_and_verifying_tickets_leases_and_delegations(tmp_path):
    home = Home(tmp_path)
    init_ca(home, "kind.test")
    ca_pem, ca_key = home.ca_cert.read_bytes(), home.ca_key.read_bytes()
    for role in ("am", "broker", "authority"):  # what `slicex ca init` made before actor keys were P-256
        cert_path, key_path = actor_files(home, role)
        cert, key = pki.issue_certificate(ca_pem, ca_key, actor_urn("kind.test", role), f"kind.test {role}",
                                          days=3650, key_kind="rsa")
        pki.write_key(key_path, key)
        pki.write_cert(cert_path, cert)
    keys, name = home_keys_and_names(home, "kind.test")
    assert isinstance(keys.broker, rsa.RSAPrivateKey) and isinstance(keys.authority, rsa.RSAPrivateKey)
    sub = default_substrate("kind.test")
    clock = ManualClock(T0)
    asm = embedded_slice_manager(SqliteStore(str(tmp_path / "s.db")), sub, EmulatedDriver(sub), keys=keys,
                                 authority_name=name, clock=clock)  # the delegation is signed and verified
    assert isinstance(actor_public_key(home, "authority", "kind.test"), rsa.RSAPublicKey)
    slivers = asm.allocate("urn:publicid:IDN+kind.test+slice+s1", "o", parse_request(request_rspec([vm("a")])),
                           T0 + H, T0)  # a ticket signed by the broker's RSA key
    provisioned = asm.provision([s.urn for s in slivers], T0 + 2 * H, [], T0)  # verified, redeemed, leased
    assert {s.allocation_state for s in provisioned} == {sm.PROVISIONED}
    asm.delete([s.urn for s in provisioned], T0)


@pytest.mark.parametrize("doc", [
    Ticket("g/r1", "b", "sm", "r1", ("core:pc1:0", "mem:pc1:0"), T0, T0 + H, 2, "sig", (("vlan", 1042),), "a"),
    Ticket("g/r1", "b", "sm", "r1", ("core:pc1:0",), T0, T0 + H),  # optional fields at their defaults
    Lease("l1", "a", "g/r1", "sm", "r1", ("core:pc1:0",), T0, T0 + H, 3, "sig", (("vlan", 7),)),
    Lease("l1", "a", "g/r1", "sm", "r1", (), T0, T0 + H),
], ids=["ticket", "ticket-defaults", "lease", "lease-defaults"])
def test_a_stored_ticket_or_lease_is_what_its_signed_payload_says_and_reads_back_the_same(doc):
    """The stored form (the codec's, defaults left out) is the signed payload as data less its defaults, so a
    stored ticket or lease reads back the same and still verifies."""
    import json

    stored = encode(doc)
    payload = json.loads(doc.payload())
    assert {k: v for k, v in stored.items() if k != "signature"} == {k: v for k, v in payload.items() if k in stored}
    assert decode(json.loads(json.dumps(stored)), type(doc), "doc") == doc
    key = ec.generate_private_key(ec.SECP256R1())
    signed = sign_ticket(doc, key) if isinstance(doc, Ticket) else sign_lease(doc, key)
    again = decode(json.loads(json.dumps(encode(signed))), type(doc), "doc")
    (verify_ticket if isinstance(doc, Ticket) else verify_lease)(again, key.public_key())
