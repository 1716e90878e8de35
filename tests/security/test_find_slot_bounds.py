"""Bad input to the find-slot question (ListResources with `slicex_find_slot`, am/find_slot.py; `slicex
find-slot`, cli/find_slot.py): durations and windows are bounded at the edge and refused with BADARGS naming
the bound. Before, `duration_seconds: 1e300` (or NaN, infinity, an integer past what a timedelta holds) was
SERVERERROR (5, OverflowError or ValueError) from deep in the broker, and a time such as
`0001-01-01T00:00:00+01:00` or `--hours nan` crashed the same way."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from am.find_slot import FIELDS, OPTION, slot_question
from broker.slots import search_window
from slicex.clock import rfc3339
from slicex.errors import BadArgs
from tests.factories import request_rspec, vm
from tests.integration.conftest import Running
from tests.integration.test_am_api import RSPEC_V3, code

NOW = datetime(2030, 1, 1, 12, tzinfo=UTC)
MAX_LEASE = timedelta(days=30)
RSPEC = request_rspec([vm("v")])

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-(10 ** 400), max_value=10 ** 400),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40), st.binary(max_size=20),
    st.datetimes(timezones=st.one_of(st.none(), st.timezones())),
    st.sampled_from(["2030-01-01T12:00:00Z", "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00",
                     "9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z", "1e300", "nan", "", " ", RSPEC]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=6)
questions = st.one_of(values, st.dictionaries(st.sampled_from([*FIELDS, "hours", "windows"]), values, max_size=5),
                      st.fixed_dictionaries({"rspec": st.just(RSPEC), "duration_seconds": scalars},
                                            optional={"earliest_start": scalars, "latest_end": scalars}))


@settings(max_examples=600, deadline=None)
@given(question=questions)
def test_no_find_slot_option_raises_anything_but_badargs(question):
    """Whatever the option holds, the parser answers a question within the aggregate's bounds or BADARGS; and
    a question it lets through reaches the broker's window check with nothing that overflows there."""
    try:
        rspec, query = slot_question(question, NOW, MAX_LEASE)
    except BadArgs:
        return
    assert rspec == question["rspec"]
    assert timedelta(0) < query.duration <= MAX_LEASE
    assert query.earliest <= NOW + MAX_LEASE and query.latest <= NOW + MAX_LEASE
    try:
        window = search_window(query, NOW)
    except BadArgs:  # in the past, or shorter than the duration; never OUTOFRANGE: the bounds were checked
        return
    assert NOW <= window.start and window.start + query.duration <= window.end <= NOW + MAX_LEASE


@pytest.mark.parametrize("duration, words", [
    (1e300, "am.max_lease"), (10 ** 400, "am.max_lease"), (math.inf, "am.max_lease"), (MAX_LEASE.days * 86400 + 1,
                                                                                      "2592000 s (30 days"),
    (math.nan, "positive"), (-math.inf, "positive"), (-5, "positive"), ("21600", "positive"), (True, "positive"),
    ([3600], "positive"),
])
def test_durations_past_the_longest_reservation_or_not_a_number_are_badargs_naming_the_bound(duration, words):
    with pytest.raises(BadArgs, match=words.replace("(", r"\(")):
        slot_question({"rspec": RSPEC, "duration_seconds": duration}, NOW, MAX_LEASE)


def test_a_window_starting_past_the_booking_horizon_is_badargs_and_one_ending_past_it_ends_there():
    for start, duration in (("2030-03-01T00:00:00Z", 3600), ("2030-01-20T00:00:00Z", 20 * 86400)):
        with pytest.raises(BadArgs, match="booking horizon.*am.max_lease"):
            slot_question({"rspec": RSPEC, "duration_seconds": duration, "earliest_start": start}, NOW, MAX_LEASE)
    for t in ("0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"):
        with pytest.raises(BadArgs, match="RFC 3339"):
            slot_question({"rspec": RSPEC, "duration_seconds": 3600, "latest_end": t}, NOW, MAX_LEASE)
    _, query = slot_question({"rspec": RSPEC, "duration_seconds": 3600, "latest_end": "9999-12-31T23:59:59Z"}, NOW,
                             MAX_LEASE)
    assert query.latest == NOW + MAX_LEASE


def test_the_aggregate_answers_badargs_to_overflowing_questions(running: Running):
    """Over mutual TLS, as a client sends them: each was SERVERERROR (5) before."""
    alice = running.user("alice")
    late = running.clock.now() + timedelta(days=20)  # 20 days from then end past the 30-day horizon
    for question, words in [({"duration_seconds": 1e300}, "am.max_lease"), ({"duration_seconds": math.inf},
                                                                             "am.max_lease"),
                            ({"duration_seconds": math.nan}, "positive"),
                            ({"duration_seconds": 3600, "earliest_start": "0001-01-01T00:00:00+01:00"}, "RFC 3339"),
                            ({"duration_seconds": 3600, "earliest_start": "9000-01-01T00:00:00Z"}, "horizon"),
                            ({"duration_seconds": 20 * 86400, "earliest_start": rfc3339(late)}, "horizon")]:
        reply = alice.am.ListResources(alice.user_credential(), {"geni_rspec_version": RSPEC_V3,
                                                                 OPTION: {"rspec": RSPEC, **question}})
        assert code(reply) == 1, (question, reply)
        assert words in reply["output"], (question, reply)


@pytest.mark.parametrize("argv, words", [
    (["--hours", "nan"], "--hours must be positive"), (["--hours", "inf"], "--hours must be positive"),
    (["--hours", "1e300"], "--hours must be positive"), (["--hours", "-1"], "--hours must be positive"),
    (["--hours", "1", "--within", "99999999999w"], "longer than"),
    (["--hours", "1", "--after", "9999-12-31T23:00:00Z", "--within", "1w"], "past the last time"),
    (["--hours", "1", "--after", "0001-01-01T00:00:00+01:00"], "neither a date"),
])
def test_the_command_refuses_lengths_and_times_it_cannot_send_without_a_traceback(tmp_path, capsys, argv, words):
    from cli.main import main

    request = tmp_path / "r.xml"
    request.write_text(RSPEC)
    try:
        rc = main(["--home", str(tmp_path / "home"), "find-slot", str(request), *argv,
                   "--omni-options", str(tmp_path / "o.json")])
    except SystemExit as exc:  # argparse's own refusal of an argument
        rc = exc.code
    assert rc == 2
    assert words in capsys.readouterr().err
