"""The one rule for tests that read the third-party samples (tests/fixtures/__init__.py): absent, they skip
with where the samples go and where they come from; under SLICEX_REQUIRE_SAMPLES (CI) they fail naming the
folder; present, the path is returned."""

import pytest

import tests.fixtures as samples


@pytest.fixture
def absent(tmp_path, monkeypatch):
    folder = tmp_path / "shared" / "fixtures"
    monkeypatch.setattr(samples, "THIRD_PARTY", folder)
    monkeypatch.delenv(samples.REQUIRE_SAMPLES, raising=False)
    return folder


def test_absent_samples_skip_saying_where_they_go_and_come_from(absent):
    with pytest.raises(pytest.skip.Exception) as skipped:
        samples.third_party("credentials/untrusted-usercred.xml")
    assert str(absent) in skipped.value.msg
    assert "SOURCES.md" in skipped.value.msg and "geni-tools" in skipped.value.msg


@pytest.mark.parametrize("value", ["0", ""])
def test_a_zero_or_empty_requirement_still_skips(absent, monkeypatch, value):
    monkeypatch.setenv(samples.REQUIRE_SAMPLES, value)
    with pytest.raises(pytest.skip.Exception):
        samples.third_party()


def test_required_samples_that_are_absent_fail_naming_the_folder(absent, monkeypatch):
    monkeypatch.setenv(samples.REQUIRE_SAMPLES, "1")
    with pytest.raises(pytest.fail.Exception) as failed:
        samples.third_party()
    assert str(absent) in failed.value.msg and samples.REQUIRE_SAMPLES in failed.value.msg


def test_present_samples_are_returned_whether_required_or_not(absent, monkeypatch):
    (absent / "credentials").mkdir(parents=True)
    assert samples.third_party("credentials/x.xml") == absent / "credentials" / "x.xml"
    monkeypatch.setenv(samples.REQUIRE_SAMPLES, "1")
    assert samples.third_party() == absent / ""


def test_a_module_reading_absent_samples_at_import_is_skipped_unless_they_are_required(absent, monkeypatch):
    with pytest.raises(pytest.skip.Exception) as skipped:
        samples.third_party_at_import()
    assert skipped.value.allow_module_level and str(absent) in skipped.value.msg
    monkeypatch.setenv(samples.REQUIRE_SAMPLES, "1")
    assert samples.third_party_at_import() == absent  # collected, so that each of its tests fails naming it
