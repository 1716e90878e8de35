"""The authority: verifies tickets without calling the broker, leases each unit once, redeems idempotently,
extends, modifies, closes and reaps leases through a substrate driver."""

from __future__ import annotations

import itertools
import threading
from datetime import UTC, datetime, timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from msgspec.structs import replace

from authority.actor import LEASES, Authority, lease_owner
from protocol.delegation import Delegation, Pool
from protocol.messages import SliverSpec
from slicex.errors import CredentialInvalid, Expired, Refused, SearchFailed, ServerError
from slicex.store.sqlite_store import SqliteStore
from slicex.ticket import Ticket, sign_ticket, verify_lease

T0 = datetime(2030, 1, 1, tzinfo=UTC)
H = timedelta(hours=1)
BROKER_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
OTHER_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
AUTH_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)


class Recorder:
    """A substrate driver that records what it is asked (the SubstrateDriver protocol, nothing more)."""

    description = "test driver"

    def __init__(self, fail: str = ""):
        self.calls: list[tuple[str, str]] = []
        self.fail = fail

    def create(self, spec, now):
        if spec.client_id == self.fail:
            raise RuntimeError("disk full on pc1")
        self.calls.append(("create", spec.id))
        return {"state": "geni_notready", "units": list(spec.units), "labels": [list(x) for x in spec.labels]}

    def modify(self, spec, status, action, now):
        self.calls.append((action, spec.id))
        return {**status, "state": "geni_ready" if action == "geni_start" else "geni_notready"}

    def destroy(self, spec, status, now):
        self.calls.append(("destroy", spec.id))

    def status(self, spec, status, now):
        return status["state"], ""


def ticket(units=("core:pc1:0",), start=T0, end=T0 + H, key=BROKER_KEY, broker="b", tid="g/r1", seq=1, **kw):
    return sign_ticket(Ticket(tid, broker, "sm", tid.split("/")[1], tuple(units), start, end, seq, **kw), key)


class BrokerStub:
    """Takes delegations (ORCA claim) and nothing else."""

    def __init__(self, name):
        self.name = name
        self.accepted = []

    def accept(self, delegation):
        self.accepted.append(delegation)


def authority(driver=None, store=None):
    """An authority that delegated its one pool (4 cores of pc1) to brokers b and b2."""
    inventory = Delegation("auth", "b", (Pool("core:pc1", "core", tuple(f"core:pc1:{i}" for i in range(4)), "pc1"),))
    a = Authority("auth", driver or Recorder(), {"b": BROKER_KEY.public_key(), "b2": OTHER_KEY.public_key()},
                  store=store or SqliteStore(":memory:"), key=AUTH_KEY, inventory=inventory)
    a.delegate(BrokerStub("b"))
    a.delegate(BrokerStub("b2"))
    return a


def spec(rid="r1", client_id="n1"):
    return SliverSpec(rid, "node", client_id, details={"host": "pc1"})


def test_redeem_checks_signature_trust_and_term():
    a = authority()
    with pytest.raises(CredentialInvalid, match="altered"):
        a.redeem(replace(ticket(), units=("core:pc1:1",)), spec(), T0)
    with pytest.raises(CredentialInvalid, match="does not trust broker evil"):
        a.redeem(ticket(broker="evil"), spec(), T0)
    with pytest.raises(Refused, match="starts at"):
        a.redeem(ticket(start=T0 + H, end=T0 + 2 * H), spec(), T0)
    with pytest.raises(Expired, match="expired"):
        a.redeem(ticket(), spec(), T0 + H)
    with pytest.raises(Refused, match="for authority other"):
        a.redeem(ticket(authority="other"), spec(), T0)
    assert a.store.all_claims() == {} and a.store.scan(LEASES) == []


def test_a_lease_is_signed_and_redeeming_again_returns_it():
    d = Recorder()
    a = authority(d)
    lease, status = a.redeem(ticket(), spec(), T0)
    verify_lease(lease, AUTH_KEY.public_key())
    assert (lease.units, lease.end, status["units"]) == (("core:pc1:0",), T0 + H, ["core:pc1:0"])
    again, _ = a.redeem(ticket(), spec(), T0)
    assert again == lease and d.calls == [("create", "r1")]
    assert a.store.all_claims() == {"leased:core:pc1:0": lease_owner(lease.id)}


def test_two_promises_of_one_unit_are_never_both_leased():
    a = authority()
    a.redeem(ticket(), spec(), T0)
    with pytest.raises(Refused, match="already leased"):
        a.redeem(ticket(key=OTHER_KEY, broker="b2", tid="g2/r2"), spec("r2"), T0)


def test_extend_follows_newer_tickets_only():
    a = authority()
    lease, _ = a.redeem(ticket(), spec(), T0)
    longer = a.extend_lease(lease, ticket(end=T0 + 3 * H, seq=2), T0)
    assert (longer.end, longer.sequence) == (T0 + 3 * H, 2)
    assert a.extend_lease(longer, ticket(end=T0 + 2 * H, seq=1), T0) == longer  # a late, older extension
    a.close(lease.id, T0)
    with pytest.raises(SearchFailed, match="no lease for ticket g/r1"):
        a.extend_lease(longer, ticket(end=T0 + 4 * H, seq=3), T0)


def test_modify_status_close_and_close_again():
    d = Recorder()
    a = authority(d)
    lease, _ = a.redeem(ticket(), spec(), T0)
    assert a.status(lease.id, T0) == ("geni_notready", "")
    a.modify(lease.id, "geni_start", T0)
    assert a.status(lease.id, T0) == ("geni_ready", "")
    assert a.close(lease.id, T0) and not a.close(lease.id, T0)
    assert d.calls[-1] == ("destroy", "r1") and a.store.all_claims() == {}
    with pytest.raises(SearchFailed):
        a.modify(lease.id, "geni_start", T0)


def test_a_driver_failure_is_a_reason_and_leaves_nothing():
    a = authority(Recorder(fail="n1"))
    with pytest.raises(ServerError, match="could not set up node n1: disk full on pc1"):
        a.redeem(ticket(), spec(), T0)
    assert a.store.all_claims() == {} and a.store.scan(LEASES) == []


def test_expired_leases_are_reaped_on_the_authoritys_clock():
    d = Recorder()
    a = authority(d)
    a.redeem(ticket(), spec(), T0)
    a.redeem(ticket(("core:pc1:1",), tid="g/r2", end=T0 + 2 * H), spec("r2"), T0)
    assert a.reap(T0 + H - timedelta(seconds=1)) == []
    assert a.reap(T0 + H) == ["g/r1"] and [lease.id for lease in a.leases()] == ["g/r2"]
    assert a.store.all_claims() == {"leased:core:pc1:1": lease_owner("g/r2")}



class Blocking(Recorder):
    """A driver whose create of one sliver waits until released (a slow substrate: minutes for real hosts)."""

    def __init__(self, slow: str):
        super().__init__()
        self.slow = slow
        self.entered = threading.Event()
        self.release = threading.Event()

    def create(self, spec, now):
        if spec.id == self.slow:
            self.entered.set()
            assert self.release.wait(10), "never released"
        return super().create(spec, now)


def test_a_slow_driver_call_for_one_lease_does_not_hold_up_the_others():
    """No authority-wide lock across a driver call: r2 is leased and closed while r1's create is under way,
    and a second redeem of r1 waits for the first (one lease's calls never overlap)."""
    d = Blocking("r1")
    a = authority(d, SqliteStore(":memory:"))
    results: dict[str, object] = {}

    def redeem(name):
        results[name] = a.redeem(ticket(tid="g/r1"), spec("r1"), T0)

    first = threading.Thread(target=redeem, args=("first",))
    first.start()
    assert d.entered.wait(5)
    lease, _ = a.redeem(ticket(("core:pc1:1",), tid="g/r2"), spec("r2"), T0)
    assert a.close(lease.id, T0)
    again = threading.Thread(target=redeem, args=("again",))
    again.start()
    again.join(0.3)
    assert again.is_alive(), "a second redeem of the same lease ran while the first was in the driver"
    d.release.set()
    first.join(5)
    again.join(5)
    assert results["first"] == results["again"]
    assert d.calls == [("create", "r2"), ("destroy", "r2"), ("create", "r1")]


def test_two_leases_whose_ids_hash_alike_never_wait_for_each_other():
    """The authority once kept 64 lease locks chosen by hash: two leases whose ids hashed alike waited for each
    other's driver calls (a slow container boot held up an unrelated redeem; the test above failed once in 64
    runs). Each lease has a lock of its own now."""
    slow = "g/r1"
    alike = next(t for t in (f"g/x{i}" for i in itertools.count()) if hash(t) % 64 == hash(slow) % 64)
    d = Blocking("r1")
    a = authority(d, SqliteStore(":memory:"))
    first = threading.Thread(target=a.redeem, args=(ticket(tid=slow), spec("r1"), T0))
    first.start()
    try:
        assert d.entered.wait(5)
        other = threading.Thread(target=a.redeem, args=(ticket(("core:pc1:1",), tid=alike), spec("r2"), T0))
        other.start()
        other.join(3)
        assert not other.is_alive(), "a redeem waited for another lease's driver call"
    finally:
        d.release.set()
        first.join(5)


def test_concurrent_promises_of_one_unit_never_lease_it_twice():
    """Six tickets (from brokers b and b2) promise the four cores between them, two cores twice: redeemed at
    once, each core is leased once and the two second promises are refused."""
    a = authority(store=None)
    errors: list[str] = []
    leases = []

    def redeem(i):
        key, broker = (BROKER_KEY, "b") if i < 4 else (OTHER_KEY, "b2")
        try:
            leases.append(a.redeem(ticket((f"core:pc1:{i % 4}",), key=key, broker=broker, tid=f"g/c{i}"),
                                   spec(f"c{i}"), T0)[0])
        except Refused as exc:
            errors.append(exc.message)

    threads = [threading.Thread(target=redeem, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(u for lease in leases for u in lease.units) == [f"core:pc1:{i}" for i in range(4)]
    assert len(errors) == 2 and all("already leased" in e for e in errors)
