"""The CH API core (clearinghouse/chapi.py): result shapes, options, times, slice URNs and expirations, roles,
and the v2 → v1 method mapping."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clearinghouse import chapi
from slicex.errors import AlreadyExists, BadArgs, CredentialSignerUntrusted, Forbidden, Unavailable

NOW = datetime(2030, 1, 1, tzinfo=UTC)
AUTH = "slicex.test"
ALICE = f"urn:publicid:IDN+{AUTH}+user+alice"
BOB = f"urn:publicid:IDN+{AUTH}+user+bob"


@contextmanager
def raises(code: int, text: str) -> Iterator[None]:
    with pytest.raises(chapi.ChError, match=text) as exc:
        yield
    assert exc.value.code == code


def test_error_output_is_geni_ch_shaped_so_omni_recognises_it():
    out = chapi.error(chapi.ChError(chapi.DUPLICATE, "slice s1 exists"))
    assert out == {"code": 5, "value": None, "output": "[DUPLICATE] DUPLICATE_ERROR (slice s1 exists)"}
    assert chapi.error(chapi.argument("Unknown slice urn x"))["output"].startswith(
        "[ARGUMENT] ARGUMENT_ERROR (Unknown sli")
    assert chapi.ok(True) == {"code": 0, "value": True, "output": ""}


@pytest.mark.parametrize("exc, code", [(BadArgs("x"), 3), (AlreadyExists("x"), 5), (Forbidden("x"), 2),
                                       (CredentialSignerUntrusted("x"), 1), (Unavailable("x"), 4)])
def test_geni_errors_map_to_ch_codes(exc, code):
    assert chapi.from_geni(exc).code == code


def test_match_is_and_over_keys_or_over_list_values_and_urns_ignore_case():
    rec = {"SLICE_URN": f"urn:publicid:IDN+{AUTH}:p+slice+S1", "SLICE_EXPIRED": False}
    assert chapi.matches(rec, {"SLICE_URN": f"urn:publicid:IDN+{AUTH.upper()}:p+slice+s1", "SLICE_EXPIRED": False})
    assert chapi.matches(rec, {"SLICE_URN": ["urn:publicid:IDN+x+slice+y", rec["SLICE_URN"]]})
    assert not chapi.matches(rec, {"SLICE_URN": rec["SLICE_URN"], "SLICE_EXPIRED": True})
    assert not chapi.matches({"SLICE_NAME": "A"}, {"SLICE_NAME": "a"})  # plain strings are exact


@given(st.dictionaries(st.sampled_from(["A", "B", "C"]), st.integers(0, 3)),
       st.dictionaries(st.sampled_from(["A", "B", "C"]), st.lists(st.integers(0, 3), min_size=1, max_size=3)))
def test_match_with_lists_is_any_of(rec, match):
    expected = all(rec.get(k) in v for k, v in match.items())
    assert chapi.matches(rec, match) == expected


def test_filter_none_gives_everything_and_empty_gives_empty_records():
    records = {"u": {"A": 1, "B": 2}}
    assert chapi.select(records, {}) == records
    assert chapi.select(records, {"filter": []}) == {"u": {}}
    assert chapi.select(records, {"filter": ["B", "Z"]}) == {"u": {"B": 2}}


def test_times_without_zone_are_utc_and_fractions_are_dropped():
    assert chapi.when("2029-12-31T23:00:00", "t") == datetime(2029, 12, 31, 23, tzinfo=UTC)
    assert chapi.when("2026-11-23T18:45:57.253682", "t") == datetime(2026, 11, 23, 18, 45, 57, tzinfo=UTC)
    assert chapi.when("2029-12-31T23:00:00Z", "t") == chapi.when("2030-01-01T00:00:00+01:00", "t")
    with raises(3, "is not a time"):
        chapi.when("tomorrow", "SLICE_EXPIRATION")


def test_slice_urns_are_the_ones_omni_builds():
    assert str(chapi.slice_urn_for(AUTH, "s1", "proj1")) == f"urn:publicid:IDN+{AUTH}:proj1+slice+s1"
    assert str(chapi.slice_urn_for(AUTH, "s1", None)) == f"urn:publicid:IDN+{AUTH}+slice+s1"
    with raises(3, "slice name"):
        chapi.slice_urn_for(AUTH, "a" * 20, "proj1")
    with raises(3, "must be a string"):
        chapi.slice_urn_for(AUTH, 7, None)


def test_slice_expiry_defaults_caps_and_never_shortens():
    policy = chapi.SlicePolicy(timedelta(days=7), timedelta(days=60))
    assert chapi.slice_expiry(None, NOW, policy, None) == NOW + timedelta(days=7)
    project = {"expires": "2030-01-03T00:00:00Z"}
    assert chapi.slice_expiry(None, NOW, policy, project) == datetime(2030, 1, 3, tzinfo=UTC)
    with raises(3, "not past its project"):
        chapi.slice_expiry("2030-01-05T00:00:00", NOW, policy, project)
    with raises(3, "at most 60 days"):
        chapi.slice_expiry("2030-06-01T00:00:00Z", NOW, policy, None)
    with raises(3, "not in the future"):
        chapi.slice_expiry("2029-12-31T00:00:00Z", NOW, policy, None)
    with raises(3, "never shortened"):
        chapi.slice_expiry("2030-01-05T00:00:00Z", NOW, policy, None, current=NOW + timedelta(days=7))
    with raises(3, "no SLICE_EXPIRATION"):
        chapi.slice_expiry(None, NOW, policy, None, current=NOW)


def test_gcf_slices_have_their_owner_as_lead_and_a_stable_uid():
    rec = {"urn": f"urn:publicid:IDN+{AUTH}+slice+g", "owner": ALICE, "expires": "2030-01-02T00:00:00Z"}
    assert chapi.role_of(rec, ALICE.upper().replace("URN:PUBLICID:IDN", "urn:publicid:IDN")) == "LEAD"
    fields = chapi.slice_fields(rec, NOW)
    assert fields["SLICE_UID"] == chapi.slice_fields(rec, NOW)["SLICE_UID"]
    assert fields["SLICE_PROJECT_URN"] == "" and fields["SLICE_EXPIRED"] is False
    row = chapi.for_member(fields, "SLICE", "LEAD")
    assert row["EXPIRED"] is False and row["SLICE_EXPIRED"] is False


def test_membership_changes_keep_a_lead_and_our_users_only():
    rec = {"urn": "urn:publicid:IDN+x+project+p", "lead": ALICE, "members": {ALICE.lower(): "LEAD"}}
    members = chapi.membership_changes(rec, {"members_to_add": [{"PROJECT_MEMBER": BOB, "PROJECT_ROLE": "admin"}]},
                                       "PROJECT", AUTH, ALICE)
    assert members == {ALICE.lower(): "LEAD", BOB.lower(): "ADMIN"}
    with raises(3, "no LEAD"):
        chapi.membership_changes(rec, {"members_to_remove": [ALICE]}, "PROJECT", AUTH, ALICE)
    with raises(3, "serves its own users"):
        chapi.membership_changes(rec, {"members_to_add": [{"PROJECT_MEMBER": "urn:publicid:IDN+peer.test+user+p"}]},
                                 "PROJECT", AUTH, ALICE)
    with raises(3, "not one of"):
        chapi.membership_changes(rec, {"members_to_add": [{"PROJECT_MEMBER": BOB, "PROJECT_ROLE": "OWNER"}]},
                                 "PROJECT", AUTH, ALICE)


CAROL = f"urn:publicid:IDN+{AUTH}+user+carol"


def test_nobody_raises_their_own_role_and_only_a_lead_makes_or_unmakes_a_lead():
    rec = {"urn": "urn:publicid:IDN+x+slice+s", "owner": ALICE,
           "members": {ALICE.lower(): "LEAD", BOB.lower(): "ADMIN", CAROL.lower(): "MEMBER"}}

    def change(caller: str, urn: str, role: str) -> dict:
        return chapi.membership_changes(rec, {"members_to_change": [{"SLICE_MEMBER": urn, "SLICE_ROLE": role}]},
                                        "SLICE", AUTH, caller)

    for caller, role in ((BOB, "LEAD"), (CAROL, "ADMIN"), (CAROL, "LEAD")):
        with raises(2, "promote themselves"):
            change(caller, caller, role)
    with raises(2, "only a LEAD makes a LEAD"):
        change(BOB, CAROL, "LEAD")  # an admin crowning an accomplice
    with raises(2, "only a LEAD makes a LEAD"):
        change(BOB, ALICE, "MEMBER")
    with raises(2, "only a LEAD removes a LEAD"):
        chapi.membership_changes(rec, {"members_to_remove": [ALICE]}, "SLICE", AUTH, BOB)
    assert change(BOB, CAROL, "ADMIN")[CAROL.lower()] == "ADMIN"  # an admin may raise others below LEAD
    assert change(BOB, BOB, "MEMBER")[BOB.lower()] == "MEMBER"  # and step down himself
    assert change(ALICE, CAROL, "LEAD")[CAROL.lower()] == "LEAD"


def test_one_public_key_takes_one_line():
    assert chapi.one_public_key("ssh-ed25519 AAAA a\n") == "ssh-ed25519 AAAA a"
    for text in ("ssh-ed25519 AAAA a\nssh-ed25519 BBBB b", "ssh-ed25519 AAAA a\rssh-rsa B", "x\nssh-rsa A"):
        with raises(3, "one key per call"):
            chapi.one_public_key(text)
    with raises(3, "OpenSSH public key line"):
        chapi.one_public_key("not a key")


def test_require_role_says_who_may_not_do_what():
    rec = {"urn": "urn:publicid:IDN+x+slice+s", "owner": ALICE}
    chapi.require_role(rec, ALICE, ("LEAD",), "update")
    with raises(2, "you are not a member"):
        chapi.require_role(rec, BOB, ("LEAD",), "update")


def test_v2_generic_calls_map_to_v1_names():
    assert chapi.v1_name("create", ("SLICE", [], {"fields": {}})) == ("create_slice", ([], {"fields": {}}))
    assert chapi.v1_name("update", ("slice", "u", [], {})) == ("update_slice", ("u", [], {}))
    assert chapi.v1_name("lookup", ("SERVICE", [], {}))[0] == "lookup_services"
    assert chapi.v1_name("lookup_slices", ([], {})) == ("lookup_slices", ([], {}))
    with raises(100, "not offered"):
        chapi.v1_name("create", ("MEMBER", [], {}))
    with raises(3, "object type first"):
        chapi.v1_name("lookup", ())


def test_service_lookup_is_a_list_matched_by_type_name_or_number_and_exact_url():
    services = [chapi.service("SLICE_AUTHORITY", "urn:sa", "https://h/SA", "sa", "d"),
                chapi.service("AGGREGATE_MANAGER", "urn:am", "https://h:1/", "am", "d", "ui_other_am")]
    assert [s["SERVICE_URN"] for s in chapi.lookup_services(services, {}, "AGGREGATE_MANAGER")] == ["urn:am"]
    assert chapi.lookup_services(services, {"match": {"SERVICE_TYPE": 1}, "filter": ["SERVICE_URL"]}) == [
        {"SERVICE_URL": "https://h/SA"}]
    assert chapi.lookup_services(services, {"match": {"SERVICE_URL": "https://h:1"}}, "AGGREGATE_MANAGER") == []


def test_sliver_info_needs_its_urns_and_takes_omnis_times():
    rec = chapi.new_sliver_info({"SLIVER_INFO_URN": f"urn:publicid:IDN+{AUTH}+sliver+1",
                                 "SLIVER_INFO_SLICE_URN": f"urn:publicid:IDN+{AUTH}:p+slice+s",
                                 "SLIVER_INFO_AGGREGATE_URN": f"urn:publicid:IDN+{AUTH}+authority+am",
                                 "SLIVER_INFO_CREATION": "2030-01-01T00:00:01.5"}, ALICE, NOW)
    assert rec["SLIVER_INFO_CREATION"] == "2030-01-01T00:00:01Z" and rec["SLIVER_INFO_CREATOR_URN"] == ALICE
    with raises(3, "missing field"):
        chapi.new_sliver_info({"SLIVER_INFO_URN": f"urn:publicid:IDN+{AUTH}+sliver+1"}, ALICE, NOW)
    with raises(3, "sliver URN is required"):
        chapi.new_sliver_info({"SLIVER_INFO_URN": f"urn:publicid:IDN+{AUTH}+slice+s",
                               "SLIVER_INFO_SLICE_URN": f"urn:publicid:IDN+{AUTH}+slice+s",
                               "SLIVER_INFO_AGGREGATE_URN": "urn:publicid:IDN+x+authority+am"}, ALICE, NOW)


def test_projects_have_names_omni_can_put_in_a_urn():
    rec = chapi.new_project(AUTH, {"PROJECT_NAME": "proj_1"}, ALICE, NOW)
    assert rec["urn"] == f"urn:publicid:IDN+{AUTH}+project+proj_1" and chapi.role_of(rec, ALICE) == "LEAD"
    with raises(3, "project name"):
        chapi.new_project(AUTH, {"PROJECT_NAME": "bad name"}, ALICE, NOW)
    assert not chapi.project_expired(rec, NOW)
    with raises(3, "Unknown project"):
        chapi.project_name_of("urn:publicid:IDN+x+slice+s")


def test_a_slice_record_without_its_uid_takes_the_one_its_certificate_carries():
    """Records made before they kept the UUID: a reissued certificate must name the slice its slivers know."""
    import uuid

    from slicex import pki

    ca, ca_key = pki.create_ca(AUTH, "CA")
    named = str(uuid.uuid4())
    cert, _ = pki.issue_certificate(ca, ca_key, f"urn:publicid:IDN+{AUTH}+slice+old", "old", subject_uuid=named)
    assert chapi.slice_uid({"urn": f"urn:publicid:IDN+{AUTH}+slice+old", "cert": cert.decode()}) == named
    assert chapi.slice_uid({"urn": f"urn:publicid:IDN+{AUTH}+slice+old", "cert": cert.decode(), "uid": "u1"}) == "u1"
