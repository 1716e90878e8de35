"""Actor impersonation and forged promises, against a running deployment over mutual TLS.

Each actor has its own key and URN, issued by the deployment CA: the broker's signs tickets, the
authority's signs leases, the AM's is the slice manager's TLS identity. An impostor at an actor's address
(another CA's certificate, or our CA's certificate for another actor), a caller from another CA, and
tickets or leases forged, altered, expired or naming what was never delegated must all be refused with a
reason that says what was wrong."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from msgspec.structs import replace

from protocol.messages import SliverSpec, demands_of
from protocol.remote import RemoteAuthority, RemoteBroker
from resources import export_substrate
from rspec.request import parse_request
from rspec.substrate import default_substrate
from slicex import pki
from slicex.actor_rpc import ActorClient, ActorServer
from slicex.devpki import actor_urn
from slicex.errors import BadArgs, CredentialInvalid, Expired, Forbidden, Refused, RpcError, Unavailable
from slicex.home import Home
from slicex.term import Term
from slicex.ticket import Ticket, load_signing_key, sign_lease, sign_ticket
from tests.factories import request_rspec, vm
from tests.integration.conftest import AUTHORITY, REDIS_URL, Running, start, stop

AM = actor_urn(AUTHORITY, "am")
BROKER = actor_urn(AUTHORITY, "broker")
AUTH = actor_urn(AUTHORITY, "authority")


@pytest.fixture
def distributed(pki_home: Home) -> Iterator[Running]:
    """A distributed deployment: broker and authority actor servers (own keys, own clocks) over mTLS."""
    from slicex.store.redis_store import RedisStore

    RedisStore(REDIS_URL).flush()
    (pki_home.root / "slicex.yaml").write_text(yaml.safe_dump(
        {"authority": AUTHORITY, "sa_port": 0, "am_port": 0, "tick_seconds": 0.05, "store": REDIS_URL,
         "dashboard_port": None}))
    r = start(pki_home, distributed=True)
    yield r
    stop(r)
    RedisStore(REDIS_URL).flush()


def other_ca(tmp_path: Path, urn: str) -> tuple[str, str, str]:
    """(certificate, key, CA certificate) files of `urn` issued by a CA that is not the deployment's."""
    ca, ca_key = pki.create_ca("evil.test", "evil CA")
    cert, key = pki.issue_certificate(ca, ca_key, urn, "impostor")
    paths = tmp_path / "impostor.pem", tmp_path / "impostor.key", tmp_path / "evil-ca.pem"
    for p, data in zip(paths, (cert, key, ca), strict=True):
        p.write_bytes(data)
    return str(paths[0]), str(paths[1]), str(paths[2])


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].strip("/"))


def impostor_broker(r: Running, cert: str, key: str, calls: list[str]) -> ActorServer:
    """Stop the real broker and serve its address with `cert`: it would grant anything it is asked."""
    port = port_of(r.actors[0].url)
    r.actors[0].stop()

    def record(name: str):
        def handler(*args: Any) -> Any:
            calls.append(name)
            return [] if name == "reclaimed" else {}
        return handler

    handlers = {m: record(m) for m in ("place", "availability", "reclaimed", "query", "accept")}
    fake = ActorServer("broker", handlers, {AM: frozenset(handlers)}, ("127.0.0.1", port), cert, key, str(r.home.ca_cert))
    fake.start()
    return fake


def counted(r: Running) -> list[str]:
    """Wrap every handler of both real actor servers so a test can see that none was reached."""
    calls: list[str] = []
    for actor in r.actors:
        for name, h in list(actor.server.handlers.items()):
            def wrapped(*args: Any, _h=h, _n=name) -> Any:
                calls.append(_n)
                return _h(*args)
            actor.server.handlers[name] = wrapped
    return calls


# ---- the slice manager refuses a server that is not the actor it calls -------------------------------------
def test_a_broker_with_a_certificate_from_another_ca_is_refused_by_the_slice_manager(distributed, tmp_path):
    r = distributed
    cert, key, _ = other_ca(tmp_path, BROKER)  # the right URN, the wrong CA
    calls: list[str] = []
    fake = impostor_broker(r, cert, key, calls)
    try:
        alice = r.user("alice")
        urn, creds = alice.slice_credential("impca")
        reply = alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {})
        assert reply["code"]["geni_code"] == 10, reply
        assert "not the broker of this deployment" in reply["output"]
        assert "does not verify against the deployment CA" in reply["output"]
        assert calls == []  # not one request reached the impostor
    finally:
        fake.stop()


def test_a_server_of_our_ca_with_another_actors_urn_is_refused_as_the_broker(distributed):
    r = distributed
    h = r.home
    calls: list[str] = []
    fake = impostor_broker(r, str(h.authority_cert), str(h.authority_key), calls)  # our CA, the authority's URN
    try:
        alice = r.user("alice")
        urn, creds = alice.slice_credential("impurn")
        reply = alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {})
        assert reply["code"]["geni_code"] == 10, reply
        assert f"names {AUTH}, not {BROKER}" in reply["output"] and "not the broker of this deployment" in reply["output"]
        assert calls == []
    finally:
        fake.stop()


def test_the_authority_client_refuses_the_broker_at_the_authoritys_address(distributed):
    """Pinning is per actor: the broker's genuine certificate is not good enough for the authority."""
    r = distributed
    h = r.home
    client = ActorClient("authority", r.actors[0].url, str(h.am_cert), str(h.am_key), str(h.ca_cert), AUTH)
    with pytest.raises(RpcError, match=re.escape(f"names {BROKER}, not {AUTH}")):
        client.call("status", "nothing", "2030-01-01T00:00:00Z")


# ---- actor servers refuse callers that are not ours ----------------------------------------------------------
@pytest.mark.parametrize("role", ["broker", "authority"])
def test_a_caller_with_another_cas_certificate_is_refused_by_the_actor_server(distributed, tmp_path, role):
    r = distributed
    calls = counted(r)
    cert, key, _ = other_ca(tmp_path, AM)  # claims to be our aggregate
    url = r.actors[0 if role == "broker" else 1].url
    client = ActorClient(role, url, cert, key, str(r.home.ca_cert), BROKER if role == "broker" else AUTH)
    with pytest.raises((Unavailable, RpcError)):
        client.call("reclaimed" if role == "broker" else "status", AM if role == "broker" else "x", *(
            [] if role == "broker" else ["2030-01-01T00:00:00Z"]))
    assert calls == []


@pytest.mark.parametrize("role", ["broker", "authority"])
def test_a_user_of_our_ca_may_not_call_actor_methods(distributed, role):
    r = distributed
    calls = counted(r)
    h = r.home
    url = r.actors[0 if role == "broker" else 1].url
    client = ActorClient(role, url, str(h.user_cert("alice")), str(h.user_key("alice")), str(h.ca_cert),
                         BROKER if role == "broker" else AUTH)
    with pytest.raises(Forbidden, match="may not call actor methods"):
        client.call("reclaimed" if role == "broker" else "close", AM if role == "broker" else "x",
                    *([] if role == "broker" else ["2030-01-01T00:00:00Z"]))
    assert calls == []


def test_the_authority_may_delegate_to_the_broker_but_not_the_other_way(distributed):
    r = distributed
    h = r.home
    as_authority = ActorClient("broker", r.actors[0].url, str(h.authority_cert), str(h.authority_key),
                               str(h.ca_cert), BROKER)
    assert isinstance(as_authority.call("reclaimed", AM), list)
    as_broker = ActorClient("authority", r.actors[1].url, str(h.broker_cert), str(h.broker_key), str(h.ca_cert), AUTH)
    with pytest.raises(Forbidden, match=re.escape(f"{BROKER} may not call")):
        as_broker.call("close", "x", "2030-01-01T00:00:00Z")


@pytest.mark.parametrize("method", ["place", "extend_ticket", "relinquish", "query", "availability"])
def test_the_authoritys_identity_may_not_ask_the_broker_for_promises(distributed, method):
    """Each caller calls only its own methods: the authority hands inventory over; it never asks for
    promises (the slice manager's side: tests/security/test_delegation_forgery.py)."""
    r = distributed
    calls = counted(r)
    h = r.home
    as_authority = ActorClient("broker", r.actors[0].url, str(h.authority_cert), str(h.authority_key),
                               str(h.ca_cert), BROKER)
    with pytest.raises(Forbidden, match=re.escape(f"{AUTH} may not call {method}")):
        as_authority.call(method, "x")
    assert calls == []


# ---- maintenance: an order only the site's operator (the authority's own key) may give ------------------------
BM1 = f"urn:publicid:IDN+{AUTHORITY}+node+bm1"


@pytest.mark.parametrize("who", ["am", "broker"])
def test_only_the_sites_operator_may_order_maintenance(distributed, who):
    """The slice manager's identity (every AM worker holds it) and the broker's may not take a host out of the
    inventory: the authority server answers FORBIDDEN before its handler runs."""
    r = distributed
    calls = counted(r)
    h = r.home
    cert, key, urn = (h.am_cert, h.am_key, AM) if who == "am" else (h.broker_cert, h.broker_key, BROKER)
    caller = ActorClient("authority", r.actors[1].url, str(cert), str(key), str(h.ca_cert), AUTH)
    with pytest.raises(Forbidden, match=re.escape(urn) + " may not call (maintenance|actor methods)"):
        caller.call("maintenance", BM1, False, "2030-01-01T00:00:00Z")
    assert calls == []
    assert BM1.rsplit("+", 1)[1] not in " ".join(_actors(r)[0].reclaimed(AM))


def test_the_operator_takes_a_host_out_and_back_through_the_running_authority(distributed):
    from deployment.actors import Caller, authority_client

    r = distributed
    operator = authority_client(r.actors[1].url, Caller.of_home(r.home, "authority"), AUTHORITY, 10.0)
    broker, _ = _actors(r)
    now = r.clock.now()
    out = operator.maintenance(BM1, False, now)
    assert not out.back and out.reclaimed and not out.busy
    assert set(out.reclaimed) <= set(broker.reclaimed(AM))
    back = operator.maintenance(BM1, True, now)
    assert back.back and not set(out.reclaimed) & set(broker.reclaimed(AM))
    with pytest.raises(BadArgs, match="owns no host"):
        operator.maintenance(f"urn:publicid:IDN+{AUTHORITY}+node+nowhere", False, now)


# ---- the authority checks tickets for real -------------------------------------------------------------------
def _actors(r: Running) -> tuple[RemoteBroker, RemoteAuthority]:
    """The broker and authority as the slice manager reaches them (its identity, its pins)."""
    h = r.home
    creds = (str(h.am_cert), str(h.am_key), str(h.ca_cert))
    return (RemoteBroker(ActorClient("broker", r.actors[0].url, *creds, BROKER)),
            RemoteAuthority(ActorClient("authority", r.actors[1].url, *creds, AUTH)))


def _core_pool():
    inventory = export_substrate(default_substrate(AUTHORITY), AM, "broker")
    return next(p for p in inventory.pools if p.resource_type == "core")


def _genuine(r: Running, minutes: int = 10) -> Ticket:
    """A ticket the broker grants the slice manager for one VM (reservation r1)."""
    broker, _ = _actors(r)
    now = r.clock.now()
    demands = demands_of(parse_request(request_rspec([vm("n1")])), {"n1": "r1"})
    return broker.place("sm", demands, Term(now, now + timedelta(minutes=minutes)), now).tickets["r1"]


def _leased(r: Running) -> list[str]:
    return [k for k in r.deployment.store.all_claims() if k.startswith("leased:")]


SPEC = SliverSpec("r1", "node", "n1", details={})


def test_a_genuine_ticket_redeems(distributed):
    r = distributed
    _, authority = _actors(r)
    t = _genuine(r)
    lease, _ = authority.redeem(t, replace(SPEC, units=t.units), r.clock.now())
    assert lease.units == t.units and sorted(_leased(r)) == sorted(f"leased:{u}" for u in t.units)


def test_the_authority_refuses_a_ticket_signed_with_the_aggregates_key(distributed):
    r = distributed
    _, authority = _actors(r)
    t = _genuine(r)
    forged = sign_ticket(replace(t, signature=""), load_signing_key(r.home.am_key.read_bytes()))
    with pytest.raises(CredentialInvalid, match=f"ticket {t.id} is not signed by broker"):
        authority.redeem(forged, SPEC, r.clock.now())
    assert _leased(r) == []


@pytest.mark.parametrize("change", ["end", "units", "no units"])
def test_the_authority_refuses_an_altered_ticket(distributed, change):
    r = distributed
    _, authority = _actors(r)
    t = _genuine(r)
    altered = {"end": replace(t, end=t.end + timedelta(days=30)),
               "units": replace(t, units=(*t.units, _core_pool().units[1])),
               "no units": replace(t, units=())}[change]
    with pytest.raises(CredentialInvalid, match="altered"):
        authority.redeem(altered, SPEC, r.clock.now())
    assert _leased(r) == []


def test_the_authority_checks_the_term_on_its_own_clock_not_the_callers(distributed):
    r = distributed
    _, authority = _actors(r)
    t = _genuine(r, minutes=10)
    said = r.clock.now()  # what the caller claims the time is
    r.clock.advance(timedelta(minutes=11))  # the authority's clock: the ticket has ended
    with pytest.raises(Expired, match="clock says"):
        authority.redeem(t, SPEC, said)
    assert _leased(r) == []


def test_the_authority_refuses_units_it_never_delegated(distributed):
    r = distributed
    _, authority = _actors(r)
    now = r.clock.now()
    broker_key = load_signing_key(r.home.broker_key.read_bytes())  # a broker that promises what it never got
    ghost = sign_ticket(Ticket("g/r1", "broker", "sm", "r1", ("core:ghost-host:0",), now, now + timedelta(minutes=5), 1,
                               authority=AM), broker_key)
    with pytest.raises(Refused, match="names core:ghost-host:0, which authority .* never delegated to broker broker"):
        authority.redeem(ghost, SPEC, now)
    empty = sign_ticket(Ticket("g/r2", "broker", "sm", "r2", (), now, now + timedelta(minutes=5), 1, authority=AM),
                        broker_key)
    with pytest.raises(Refused, match="names no unit"):
        authority.redeem(empty, replace(SPEC, id="r2"), now)
    assert _leased(r) == []


# ---- the slice manager checks leases -------------------------------------------------------------------------
class Forger:
    """Stands between the slice manager and the authority and rewrites the leases it answers with."""

    def __init__(self, real: Any, forge):
        self.real, self.forge = real, forge

    def redeem(self, ticket, spec, now):
        lease, status = self.real.redeem(ticket, spec, now)
        return self.forge(lease), status

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def _forgeries(home: Home) -> dict[str, Any]:
    am_key = load_signing_key(home.am_key.read_bytes())
    authority_key = load_signing_key(home.authority_key.read_bytes())
    return {
        "signed with the aggregate's key": (lambda lease: sign_lease(replace(lease, signature=""), am_key),
                                            "not signed by authority"),
        "altered after signing": (lambda lease: replace(lease, end=lease.end + timedelta(days=30)),
                                  "not signed by authority"),
        "signed, for other units": (lambda lease: sign_lease(replace(lease, units=("core:elsewhere:0",), signature=""),
                                                             authority_key), "units differ"),
    }


@pytest.mark.parametrize("forgery", ["signed with the aggregate's key", "altered after signing",
                                     "signed, for other units"])
def test_the_slice_manager_refuses_a_forged_lease_and_leaks_nothing(running, forgery):
    r = running
    forge, reason = _forgeries(r.home)[forgery]
    r.deployment.sm.authority = Forger(r.deployment.sm.authority, forge)
    alice = r.user("alice")
    urn, creds = alice.slice_credential("forged")
    assert alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {})["code"]["geni_code"] == 0
    reply = alice.am.Provision([urn], creds, {})
    assert reply["code"]["geni_code"] == 20, reply  # CREDENTIAL_INVALID
    assert "provisioning a failed" in reply["output"] and reason in reply["output"]
    held = {k: v for k, v in r.deployment.store.all_claims().items() if v.startswith("ticket:")}
    assert held == {}  # the real lease was closed and the ticket relinquished
    status = alice.am.Status([urn], creds, {})
    assert all(s["geni_allocation_status"] != "geni_provisioned" for s in status["value"]["geni_slivers"])

