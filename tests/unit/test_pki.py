import stat
from datetime import UTC, datetime, timedelta

import pytest

from slicex import pki
from slicex.errors import CredentialExpired, CredentialSignerUntrusted

NOW = datetime.now(UTC)


def test_user_certificate_carries_urn_uuid_email_and_ski():
    ca, key = pki.create_ca("p.test", "CA")
    cert_pem, _ = pki.issue_certificate(ca, key, "urn:publicid:IDN+p.test+user+alice", "alice", email="a@p.test")
    cert = pki.load_cert(cert_pem)
    assert pki.cert_urn(cert) == "urn:publicid:IDN+p.test+user+alice"
    assert len(pki.cert_uuid(cert)) == 36
    assert pki.cert_email(cert) == "a@p.test"
    assert len(pki.subject_key_id_hex(cert)) == 40


def test_keys_are_never_world_readable(tmp_path):
    _, key = pki.create_ca("p.test", "CA")
    pki.write_key(tmp_path / "k.pem", key)
    mode = stat.S_IMODE((tmp_path / "k.pem").stat().st_mode)
    assert mode == 0o600


def test_chain_to_root_through_an_intermediate():
    ca, key = pki.create_ca("p.test", "CA")
    sa, sa_key = pki.issue_certificate(ca, key, "urn:publicid:IDN+p.test+authority+sa", "sa", is_ca=True)
    leaf, _ = pki.issue_certificate(sa, sa_key, "urn:publicid:IDN+p.test+user+x", "x")
    trust = pki.TrustStore(certs=pki.load_certs(ca))
    path = trust.verify_chain(pki.load_cert(leaf), pki.load_certs(sa), NOW)
    assert len(path) == 3


def test_unknown_root_is_untrusted_and_expiry_is_checked():
    ca, key = pki.create_ca("p.test", "CA")
    other, _ = pki.create_ca("q.test", "Other")
    leaf, _ = pki.issue_certificate(ca, key, "urn:publicid:IDN+p.test+user+x", "x", days=1)
    with pytest.raises(CredentialSignerUntrusted):
        pki.TrustStore(certs=pki.load_certs(other)).verify_chain(pki.load_cert(leaf), [], NOW)
    with pytest.raises(CredentialExpired):
        pki.TrustStore(certs=pki.load_certs(ca)).verify_chain(pki.load_cert(leaf), [], NOW + timedelta(days=3))


def test_trust_store_reads_directories(tmp_path):
    ca, _ = pki.create_ca("p.test", "CA")
    (tmp_path / "a.pem").write_bytes(ca)
    assert len(pki.TrustStore([tmp_path]).roots) == 1


def test_a_certificate_is_valid_at_a_time_taken_before_it_was_issued():
    """Suites and peers take `now` before certificates exist (a module's NOW, a peer's slow clock): a
    certificate issued later must still verify at that time (it failed 5 minutes into a long test run)."""
    earlier = datetime.now(UTC) - timedelta(minutes=30)
    ca, key = pki.create_ca("p.test", "CA")
    leaf, _ = pki.issue_certificate(ca, key, "urn:publicid:IDN+p.test+user+x", "x")
    assert len(pki.TrustStore(certs=pki.load_certs(ca)).verify_chain(pki.load_cert(leaf), [], earlier)) == 2
