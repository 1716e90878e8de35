"""One identity per actor: the development PKI issues the broker's and the authority's keys and
certificates, a home from an older version gets the missing ones without losing any, and a certificate is
an actor's only if the deployment CA issued it for that actor's URN. The authority checks tickets on its own
clock and against what it delegated."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from authority.actor import DELEGATED, Authority
from protocol.delegation import Delegation, Pool
from protocol.messages import SliverSpec
from slicex import pki
from slicex.clock import ManualClock
from slicex.devpki import (
    ACTOR_ROLES,
    actor_files,
    actor_public_key,
    actor_urn,
    check_actor_certificate,
    ensure_actor_identities,
    init_ca,
)
from slicex.errors import CredentialInvalid, CredentialSignerUntrusted, Expired, Refused, ServerError
from slicex.home import Home
from slicex.store.sqlite_store import SqliteStore
from slicex.ticket import Ticket, sign_ticket

T0 = datetime(2030, 1, 1, tzinfo=UTC)
H = timedelta(hours=1)


def test_ca_init_issues_one_certificate_per_actor_each_with_its_own_key_and_urn(tmp_path):
    home = Home(tmp_path)
    init_ca(home, "id.test")
    keys = set()
    for role in ACTOR_ROLES:
        cert_path, key_path = actor_files(home, role)
        cert = pki.load_cert(cert_path.read_bytes())
        assert pki.cert_urn(cert) == f"urn:publicid:IDN+id.test+authority+{role}"
        assert key_path.stat().st_mode & 0o077 == 0  # owner-only
        keys.add(key_path.read_bytes())
    assert len(keys) == len(ACTOR_ROLES)


def test_an_older_home_gets_the_missing_actor_certificates_and_keeps_the_others(tmp_path):
    home = Home(tmp_path)
    init_ca(home, "id.test")
    before = {p: p.read_bytes() for role in ("am", "sa") for p in actor_files(home, role)}
    ca_before = home.ca_cert.read_bytes()
    for role in ("broker", "authority"):  # what a home made before actors had identities looks like
        for p in actor_files(home, role):
            p.unlink()
    written = ensure_actor_identities(home, "id.test")
    assert set(written) == {p for role in ("broker", "authority") for p in actor_files(home, role)}
    assert {p: p.read_bytes() for p in before} == before and home.ca_cert.read_bytes() == ca_before
    assert ensure_actor_identities(home, "id.test") == [] and init_ca(home, "id.test") == []
    actor_public_key(home, "broker", "id.test")  # issued by the deployment CA for the broker's URN


def test_a_missing_actor_certificate_without_the_ca_key_is_a_clear_error(tmp_path):
    home = Home(tmp_path)
    init_ca(home, "id.test")
    home.ca_key.unlink()
    for p in actor_files(home, "authority"):
        p.unlink()
    with pytest.raises(ServerError, match="lacks the certificates of authority and the CA key"):
        ensure_actor_identities(home, "id.test")


def test_an_actor_certificate_from_another_ca_or_for_another_actor_is_not_that_actor(tmp_path):
    home = Home(tmp_path)
    init_ca(home, "id.test")
    ca = pki.load_cert(home.ca_cert.read_bytes())
    evil, evil_key = pki.create_ca("id.test", "evil")
    forged = pki.load_cert(pki.issue_certificate(evil, evil_key, actor_urn("id.test", "broker"), "b")[0])
    with pytest.raises(CredentialSignerUntrusted, match="not issued by the deployment CA"):
        check_actor_certificate(forged, ca, actor_urn("id.test", "broker"))
    authority = pki.load_cert(home.authority_cert.read_bytes())
    with pytest.raises(CredentialInvalid, match=re.escape(f"names {actor_urn('id.test', 'authority')}, expected")):
        check_actor_certificate(authority, ca, actor_urn("id.test", "broker"))


# ---- the authority's own checks (pure: an in-process authority with its own clock) -------------------------
BROKER_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
POOLS = (Pool("core:pc1", "core", tuple(f"core:pc1:{i}" for i in range(4)), "pc1"),
         Pool("core:pc2", "core", tuple(f"core:pc2:{i}" for i in range(4)), "pc2"))


class BrokerStub:
    name = "b"

    def accept(self, delegation):
        pass

    def reclaimed(self, authority):
        return ["core:pc2"]  # the operator took pc2 out (maintenance)

    def reclaim(self, order, now):
        return list(order.names), []


def authority(clock=None) -> Authority:
    a = Authority("auth", _Driver(), {"b": BROKER_KEY.public_key()}, store=SqliteStore(":memory:"),
                  inventory=Delegation("auth", "b", POOLS), clock=clock)
    a.export_to(BrokerStub())
    return a


class _Driver:
    description = "records nothing"

    def create(self, spec, now):
        return {"state": "geni_notready"}

    def destroy(self, spec, status, now):
        return None


def ticket(units=("core:pc1:0",), start=T0, end=T0 + H, seq=1, **kw) -> Ticket:
    return sign_ticket(Ticket("g/r1", "b", "sm", "r1", tuple(units), start, end, seq, **kw), BROKER_KEY)


SPEC = SliverSpec("r1", "node", "n1")


def test_the_authority_checks_the_term_on_its_own_clock_not_the_callers():
    clock = ManualClock(T0 + H)  # the ticket ended by the authority's clock
    with pytest.raises(Expired, match="clock says 2030-01-01T01:00:00Z"):
        authority(clock).redeem(ticket(), SPEC, T0)  # the caller claims it is still T0
    clock.set(T0 + timedelta(minutes=1))
    lease, _ = authority(clock).redeem(ticket(), SPEC, T0 + 2 * H)  # nor is a caller's late `now` believed
    assert lease.start == T0 + timedelta(minutes=1)


def test_export_records_what_was_delegated_and_nothing_parked():
    a = authority()
    assert a.store.get(DELEGATED, "auth|b")["names"] == ["core:pc1"]
    with pytest.raises(Refused, match="names core:pc2:0, which authority auth never delegated to broker b"):
        a.redeem(ticket(("core:pc2:0",)), SPEC, T0)
    with pytest.raises(Refused, match="names a unit more than once"):
        a.redeem(ticket(("core:pc1:0", "core:pc1:0")), SPEC, T0)
    with pytest.raises(Refused, match="names no unit"):
        a.redeem(ticket(()), SPEC, T0)


def test_a_reclaimed_pool_is_no_longer_redeemable():
    a = authority()
    a.reclaim(BrokerStub(), ["core:pc1"], T0)
    with pytest.raises(Refused, match="authority auth has delegated nothing to broker b"):
        a.redeem(ticket(), SPEC, T0)


def test_an_extension_must_promise_what_was_redeemed():
    a = authority()
    a.redeem(ticket(), SPEC, T0)
    with pytest.raises(Refused, match="promises other units than the one redeemed"):
        a.extend_lease(None, ticket(("core:pc1:1",), end=T0 + 2 * H, seq=2), T0)
    longer = a.extend_lease(None, ticket(end=T0 + 2 * H, seq=2), T0)
    assert longer.end == T0 + 2 * H
