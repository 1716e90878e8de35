import pytest
from hypothesis import given
from hypothesis import strategies as st

from slicex.errors import BadArgs
from slicex.urn import is_valid_slice_name, parse_urn


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
