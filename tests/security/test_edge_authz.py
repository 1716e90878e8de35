"""The AM API edge, attacked over mutual TLS on both deployments: sliver existence is not revealed to callers
without the slice's credential, a shut-down slice stays shut down under every spelling of its URN, Shutdown is
for the slice's holders of `shutdown` and the configured operators only, and geni_start_time is never
silently ignored."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from slicex.clock import rfc3339
from slicex.devpki import add_user
from slicex.home import Home
from tests.factories import request_rspec, vm
from tests.integration.conftest import AUTHORITY, Running, deployment
from tests.integration.test_am_api import RSPEC_V3, code, ok

FAKE_SLIVER = f"urn:publicid:IDN+{AUTHORITY}+sliver+{uuid.uuid4().hex[:16]}"


def _sliver_calls(urns: list[str], creds: list[dict], now) -> dict[str, tuple]:
    """Every AM API call that takes a URN list, with arguments that would otherwise succeed."""
    return {
        "Status": ("Status", urns, creds, {}),
        "Describe": ("Describe", urns, creds, {"geni_rspec_version": RSPEC_V3}),
        "Renew": ("Renew", urns, creds, rfc3339(now + timedelta(hours=1)), {}),
        "Provision": ("Provision", urns, creds, {}),
        "PerformOperationalAction": ("PerformOperationalAction", urns, creds, "geni_start", {}),
        "Delete": ("Delete", urns, creds, {}),
    }


def _call(proxy, method: str, *args) -> dict:
    return getattr(proxy, method)(*args)


@pytest.mark.parametrize("method", ["Status", "Describe", "Renew", "Provision", "PerformOperationalAction",
                                    "Delete"])
def test_another_slices_sliver_and_a_made_up_one_get_the_same_answer(running, method):
    alice, bob = running.user("alice"), running.user("bob")
    a_urn, a_creds = alice.slice_credential("hidden")
    real = ok(alice.am.Allocate(a_urn, a_creds, request_rspec([vm("secret")]), {}))["geni_slivers"][0]
    _, b_creds = bob.slice_credential("bobs")
    ok(bob.am.Allocate(_, b_creds, request_rspec([vm("mine")]), {}))
    now = running.clock.now()
    answers = []
    for target in (real["geni_sliver_urn"], FAKE_SLIVER):
        reply = _call(bob.am, *_sliver_calls([target], b_creds, now)[method])
        answers.append((code(reply), reply["output"].replace(target, "<URN>"), reply["value"]))
    assert answers[0] == answers[1]
    assert answers[0][0] == 12 and answers[0][1]
    # and alice's sliver is untouched
    status = ok(alice.am.Status([a_urn], a_creds, {}))["geni_slivers"]
    assert [(s["geni_sliver_urn"], s["geni_allocation_status"]) for s in status] == \
        [(real["geni_sliver_urn"], "geni_allocated")]


def test_a_user_credential_alone_gets_the_same_refusal_for_real_and_made_up_slivers(running):
    alice, bob = running.user("alice"), running.user("bob")
    a_urn, a_creds = alice.slice_credential("hidden2")
    real = ok(alice.am.Allocate(a_urn, a_creds, request_rspec([vm("secret")]), {}))["geni_slivers"][0]
    user_creds = bob.user_credential()
    answers = []
    for target in (real["geni_sliver_urn"], FAKE_SLIVER):
        reply = bob.am.Status([target], user_creds, {})
        answers.append((code(reply), reply["output"].replace(target, "<URN>")))
    assert answers[0] == answers[1] and answers[0][0] != 0


def test_owner_still_reaches_own_slivers_by_sliver_urn(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("bysliver")
    sliver = ok(alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {}))["geni_slivers"][0]["geni_sliver_urn"]
    status = ok(alice.am.Status([sliver], creds, {}))
    assert status["geni_urn"].lower() == urn.lower()
    assert [s["geni_sliver_urn"] for s in status["geni_slivers"]] == [sliver]
    shouted = sliver.replace(f"+{AUTHORITY}+", f"+{AUTHORITY.upper()}+")
    assert [s["geni_sliver_urn"] for s in ok(alice.am.Status([shouted], creds, {}))["geni_slivers"]] == [sliver]


def _spelled(authority: str, name: str) -> str:
    return f"urn:publicid:IDN+{authority}+slice+{name}"


@pytest.mark.parametrize("authority,name", [
    (AUTHORITY, "SHUTCASE"), (AUTHORITY.upper(), "shutcase"), ("SliceX.Test", "ShutCase"),
], ids=["slice-name-upper", "authority-upper", "mixed"])
def test_shutdown_cannot_be_bypassed_by_respelling_the_slice_urn(running, authority, name):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("shutcase")
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {}))
    assert ok(alice.am.Shutdown(urn, creds, {})) is True
    other = _spelled(authority, name)
    assert other != urn and other.lower() == urn.lower()
    reply = alice.am.Allocate(other, creds, request_rspec([vm("b")]), {})
    assert code(reply) == 7, reply
    assert "shut down" in reply["output"]
    slivers = ok(alice.am.Status([other], creds, {}))["geni_slivers"]
    assert [s["geni_client_id"] for s in slivers] == ["a"]


def test_shutdown_under_one_spelling_stops_slivers_allocated_under_another(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("shutcase2")
    ok(alice.am.Allocate(_spelled(AUTHORITY.upper(), "shutcase2"), creds, request_rspec([vm("a")]), {}))
    assert ok(alice.am.Shutdown(_spelled("SliceX.TEST", "ShutCase2"), creds, {})) is True
    assert code(alice.am.Provision([urn], creds, {})) == 7


# ---- Shutdown: the slice's holders of `shutdown`, and configured operators ------------------------------------
@pytest.fixture(params=["embedded", "distributed"])
def operated(request, pki_home: Home, tmp_path: Path) -> Iterator[Running]:
    """A deployment whose slicex.yaml names carol as an operator (dave is an ordinary user)."""
    for name in ("carol", "dave"):
        if not pki_home.user_cert(name).exists():
            add_user(pki_home, AUTHORITY, name)
    yield from deployment(request.param, pki_home, tmp_path,
                          operators=[f"urn:publicid:IDN+{AUTHORITY.upper()}+user+carol"])


def test_slice_owner_may_shut_down_own_slice(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("ownshut")
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {}))
    assert ok(alice.am.Shutdown(urn, creds, {})) is True


def test_configured_operator_shuts_down_any_slice_with_own_user_credential(operated):
    alice, carol = operated.user("alice"), operated.user("carol")
    urn, creds = alice.slice_credential("opshut")
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {}))
    assert ok(carol.am.Shutdown(urn, carol.user_credential(), {})) is True
    assert code(alice.am.Allocate(urn, creds, request_rspec([vm("b")]), {})) == 7


def test_non_operator_with_a_user_credential_cannot_shut_down(operated):
    alice, dave = operated.user("alice"), operated.user("dave")
    urn, creds = alice.slice_credential("noshut")
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {}))
    reply = dave.am.Shutdown(urn, dave.user_credential(), {})
    assert code(reply) in (3, 22) and reply["output"]
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("b")]), {}))  # not shut down


def test_operator_needs_a_valid_credential_of_their_own(operated):
    alice, carol = operated.user("alice"), operated.user("carol")
    urn, creds = alice.slice_credential("opnocred")
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {}))
    reply = carol.am.Shutdown(urn, alice.user_credential(), {})  # alice's credential, carol's connection
    assert code(reply) == 22 and reply["output"]
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("b")]), {}))


# ---- geni_start_time -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("start", ["tomorrow-ish", "2030-13-45T99:00:00Z", 42])
def test_unparseable_geni_start_time_is_badargs(running, start):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("starttime")
    reply = alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {"geni_start_time": start})
    assert code(reply) == 1 and "geni_start_time" in reply["output"]
    assert code(alice.am.Status([urn], creds, {})) == 12  # nothing was allocated


def test_future_geni_start_time_is_honoured_not_ignored(running):
    """A future start is an advance reservation (tests/integration/test_advance_reservations.py); one past the
    booking horizon (am.max_lease) is OUTOFRANGE, nothing held."""
    alice = running.user("alice")
    urn, creds = alice.slice_credential("later")
    when = rfc3339(running.clock.now() + timedelta(hours=2))
    (s,) = ok(alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {"geni_start_time": when}))["geni_slivers"]
    assert s["geni_start_time"] == when and s["geni_allocation_status"] == "geni_allocated"
    far = rfc3339(running.clock.now() + timedelta(days=400))
    reply = alice.am.Allocate(urn, creds, request_rspec([vm("b")]), {"geni_start_time": far})
    assert code(reply) == 19 and "horizon" in reply["output"]


def test_past_or_present_geni_start_time_starts_now(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("now")
    for i, when in enumerate((running.clock.now() - timedelta(minutes=5), running.clock.now())):
        ok(alice.am.Allocate(urn, creds, request_rspec([vm(f"a{i}")]), {"geni_start_time": rfc3339(when)}))
