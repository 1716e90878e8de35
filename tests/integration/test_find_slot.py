"""Find a slot over the AM API on both deployments (mutual TLS, a ManualClock): with the aggregate filled now
and for hours by other slices, ListResources with slicex_find_slot answers the earliest window; an Allocate
with that geni_start_time gets it and one a minute before is refused. Bad questions (past the bounds too) get BADARGS,
a window without room the error of what is short, saying from when."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from rspec.slot import read_slot
from slicex.clock import rfc3339
from tests.factories import request_rspec, vm
from tests.integration.conftest import AUTHORITY, Running, User
from tests.integration.test_am_api import RSPEC_V3, code, ok

H = timedelta(hours=1)
BM1, BM2 = (f"urn:publicid:IDN+{AUTHORITY}+node+bm{i}" for i in (1, 2))


def bare_metal(*names: str, bound: tuple[str, ...] = ()) -> str:
    return request_rspec([{"client_id": n, "sliver_type": "raw-pc", **({"component_id": b} if b else {})}
                          for n, b in zip(names, bound or ("",) * len(names), strict=True)])


def find(user: User, rspec: str, **question) -> dict:
    """ListResources with slicex_find_slot, as an experimenter's client sends it."""
    return user.am.ListResources(user.user_credential(), {"geni_rspec_version": RSPEC_V3,
                                                          "slicex_find_slot": {"rspec": rspec, **question}})


def fill(running: Running, bob: User) -> None:
    """Both bare-metal hosts leased now for 3 hours, and bm1 booked again from 3 h to 5 h."""
    now = running.clock.now()
    urn, creds = bob.slice_credential("now")
    ok(bob.am.Allocate(urn, creds, bare_metal("a", "b"), {}))
    ok(bob.am.Provision([urn], creds, {"geni_end_time": rfc3339(now + 3 * H)}))
    later, later_creds = bob.slice_credential("later")
    ok(bob.am.Allocate(later, later_creds, bare_metal("c", bound=(BM1,)),
                       {"geni_start_time": rfc3339(now + 3 * H), "geni_end_time": rfc3339(now + 5 * H)}))


def test_find_slot_answers_the_earliest_window_a_following_allocate_gets(running: Running):
    alice, bob = running.user("alice"), running.user("bob")
    now = running.clock.now()
    fill(running, bob)
    two = bare_metal("x", "y")
    reply = find(alice, two, duration_seconds=6 * 3600)
    slot = read_slot(ok(reply))
    assert (slot["start"], slot["end"]) == (now + 5 * H, now + 11 * H)
    assert rfc3339(slot["start"]) in reply["output"] and slot["tried"] == 3  # now, 3 h, 5 h
    assert {n["host"] for n in slot["nodes"]} == {"bm1", "bm2"}

    urn, creds = alice.slice_credential("slot")
    early = alice.am.Allocate(urn, creds, two, {"geni_start_time": rfc3339(slot["start"] - timedelta(minutes=1)),
                                                "geni_end_time": rfc3339(slot["end"] - timedelta(minutes=1))})
    assert code(early) == 26, early["output"]  # a minute before, bm1 is still booked
    got = ok(alice.am.Allocate(urn, creds, two, {"geni_start_time": rfc3339(slot["start"]),
                                                 "geni_end_time": rfc3339(slot["end"])}))["geni_slivers"]
    assert {s["geni_start_time"] for s in got} == {rfc3339(slot["start"])}
    assert {s["geni_expires"] for s in got} == {rfc3339(slot["end"])}

    one = read_slot(ok(find(alice, bare_metal("z"), duration_seconds=3600)))
    assert one["start"] == now + 3 * H  # bm2 is free between bob's lease and alice's booking
    assert one["nodes"][0]["host"] == "bm2"
    long = read_slot(ok(find(alice, bare_metal("z"), duration_seconds=3 * 3600)))
    assert long["start"] == slot["end"]  # 3 hours do not fit in the 2 between: the next end weighed
    fits_now = read_slot(ok(find(alice, request_rspec([vm("v")]), duration_seconds=3600)))
    assert fits_now["start"] == now and fits_now["nodes"][0]["sliver_type"]


def test_a_window_without_room_is_the_error_of_what_is_short_and_from_when(running: Running):
    alice, bob = running.user("alice"), running.user("bob")
    now = running.clock.now()
    fill(running, bob)
    reply = find(alice, bare_metal("x", "y"), duration_seconds=3600, latest_end=rfc3339(now + 4 * H))
    assert code(reply) == 26, reply
    assert "no slot of 1 h" in reply["output"] and rfc3339(now + 3 * H) in reply["output"]
    never = find(alice, bare_metal("x", "y", "z"), duration_seconds=3600)
    assert code(never) == 26 and "never fits" in never["output"]


@pytest.mark.parametrize("question, expected, words", [
    ({"duration_seconds": 0}, 1, "positive"),
    ({"duration_seconds": "6h"}, 1, "positive"),
    ({"duration_seconds": 3600, "rspec": "<rspec"}, 1, "not well-formed"),
    ({"duration_seconds": 3600, "rspec": 42}, 1, "string of XML"),
    ({"duration_seconds": 3600, "rspec": '<!DOCTYPE r [<!ENTITY e "x">]><rspec type="request">&e;</rspec>'}, 1, "DTDs"),
    ({"duration_seconds": 3600, "rspec": request_rspec([vm("v")], kind="manifest")}, 1, "needs type=\"request\""),
    ({"duration_seconds": 3600, "latest_end": "2001-01-01T00:00:00Z"}, 1, "in the past"),
    ({"duration_seconds": 3600, "earliest_start": "tomorrow"}, 1, "RFC 3339"),
    ({"duration_seconds": 7200, "latest_end": "+1h"}, 1, "RFC 3339"),
    ({"duration_seconds": 3600, "hours": 6}, 1, "unknown field"),
    ({"duration_seconds": 400 * 24 * 3600}, 1, "am.max_lease"),
])
def test_bad_questions_get_clear_geni_codes(running: Running, question, expected, words):
    alice = running.user("alice")
    reply = find(alice, **{"rspec": request_rspec([vm("v")]), **question})
    assert code(reply) == expected, reply
    assert words in reply["output"]


def test_a_window_shorter_than_the_duration_is_badargs_and_the_option_must_be_a_struct(running: Running):
    alice = running.user("alice")
    now = running.clock.now()
    reply = find(alice, request_rspec([vm("v")]), duration_seconds=7200, latest_end=rfc3339(now + H))
    assert code(reply) == 1 and "shorter than" in reply["output"]
    reply = alice.am.ListResources(alice.user_credential(), {"geni_rspec_version": RSPEC_V3,
                                                             "slicex_find_slot": "soon"})
    assert code(reply) == 1 and "struct" in reply["output"]


def test_find_slot_needs_a_valid_user_credential(running: Running):
    alice, bob = running.user("alice"), running.user("bob")
    reply = alice.am.ListResources(bob.user_credential(), {"geni_rspec_version": RSPEC_V3, "slicex_find_slot": {
        "rspec": request_rspec([vm("v")]), "duration_seconds": 3600}})
    assert code(reply) != 0 and "slot" not in json.dumps(reply.get("value") or "")


def test_slicex_find_slot_asks_the_running_aggregate_as_the_user(running: Running, tmp_path, capsys):
    from cli.main import main

    bob = running.user("bob")
    now = running.clock.now()
    fill(running, bob)
    request = tmp_path / "two.xml"
    request.write_text(bare_metal("x", "y"))
    ep = running.deployment.endpoints
    where = ["--am", ep.am_url, "--sa", ep.sa_url]
    home = ["--home", str(running.home.root)]
    assert main([*home, "find-slot", str(request), "--hours", "6", "--user", "alice", *where]) == 0
    out = capsys.readouterr().out
    assert f"earliest slot: {rfc3339(now + 5 * H)} to {rfc3339(now + 11 * H)}" in out
    assert f"geni_start_time={rfc3339(now + 5 * H)}" in out and "node x" in out
    assert main([*home, "find-slot", str(request), "--hours", "1", "--within", "4h", *where]) == 1
    assert "no slot (GENI code 26)" in capsys.readouterr().err
    assert main([*home, "find-slot", str(tmp_path / "missing.xml"), "--hours", "1", *where]) == 2
    options = tmp_path / "find-slot.json"
    assert main([*home, "find-slot", str(request), "--hours", "6", "--omni-options", str(options)]) == 0
    asked = json.loads(options.read_text())["slicex_find_slot"]
    assert asked == {"rspec": request.read_text(), "duration_seconds": 6 * 3600}
