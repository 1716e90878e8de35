import pytest
from hypothesis import given
from hypothesis import strategies as st

from slicex.errors import BadArgs
from slicex.urn import as_spelled, canonical_urn, is_valid_slice_name, parse_urn


def test_parse_slice_urn():
    u = parse_urn("urn:publicid:IDN+slicex.local:proj+slice+exp1", "slice")
    assert (u.authority, u.type, u.name, u.top_authority) == ("slicex.local:proj", "slice", "exp1", "slicex.local")


@pytest.mark.parametrize("text,reason", [
    ("not-a-urn", "must start with"),
    ("urn:publicid:IDN+a+slice", "expected"),
    ("urn:publicid:IDN+a+spaceship+x", "unknown URN type"),
    ("urn:publicid:IDN+a+slice+bad_name!", "slice name"),
    ("urn:publicid:IDN+a+slice+" + "x" * 20, "slice name"),
    ("urn:publicid:IDN+a b+slice+x", "authority"),
])
def test_invalid_urns_say_why(text, reason):
    with pytest.raises(BadArgs, match=reason):
        parse_urn(text)


def test_type_mismatch():
    with pytest.raises(BadArgs, match="slice URN is required"):
        parse_urn("urn:publicid:IDN+a+user+bob", "slice")


def test_non_string_is_bad_args():
    with pytest.raises(BadArgs):
        parse_urn(42)


def test_authority_compares_case_insensitively():
    a = parse_urn("urn:publicid:IDN+SliceX.Local+slice+x")
    b = parse_urn("urn:publicid:IDN+slicex.local+slice+x")
    assert a.same_as(b)


@given(st.text(max_size=40))
def test_parse_never_crashes(text):
    try:
        parse_urn(text)
    except BadArgs:
        pass


@given(st.from_regex(r"\A[a-zA-Z0-9][-a-zA-Z0-9]{0,18}\Z"))
def test_valid_slice_names_round_trip(name):
    assert is_valid_slice_name(name)
    assert parse_urn(f"urn:publicid:IDN+x.org+slice+{name}", "slice").name == name


@pytest.mark.parametrize("spelling", [
    "urn:publicid:IDN+slicex.local+slice+Exp1",
    "urn:publicid:IDN+SLICEX.LOCAL+slice+exp1",
    "urn:publicid:IDN+SliceX.Local+slice+EXP1",
])
def test_slice_urns_differing_only_in_case_have_one_canonical_form(spelling):
    assert canonical_urn(spelling, "slice") == "urn:publicid:IDN+slicex.local+slice+exp1"
    assert parse_urn(spelling).same_as(parse_urn("urn:publicid:IDN+slicex.local+slice+exp1"))


def test_canonical_form_folds_sub_authorities_but_keeps_non_slice_names():
    assert canonical_urn("urn:publicid:IDN+Rack.Net:Proj+sliver+AbC") == "urn:publicid:IDN+rack.net:proj+sliver+AbC"


def test_canonical_form_is_a_fixed_point():
    text = "urn:publicid:IDN+A.b:C+slice+MiXeD-1"
    assert canonical_urn(canonical_urn(text)) == canonical_urn(text)


def test_a_urn_is_answered_as_the_caller_spelled_it():
    canonical = "urn:publicid:IDN+a.test+slice+s17"
    spelled = "urn:publicid:IDN+A.test+slice+S17"
    assert as_spelled(canonical, ["not a urn", 7, spelled], "slice") == spelled
    assert as_spelled(canonical, ["urn:publicid:IDN+a.test+slice+other"], "slice") == canonical
