"""Every GENI v3 document among the shared third-party samples parses; each is valid against slicex's
schemas or is rejected with a stated reason. The samples stay in ../shared/fixtures (their own licences)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rspec.request import parse_request
from rspec.validate import validate_rspec
from slicex.errors import BadArgs
from slicex.xmlsafe import parse_xml

FIXTURES = (Path(__file__).resolve().parents[2] / ".." / "shared" / "fixtures").resolve()
RSPEC3 = "{http://www.geni.net/resources/rspec/3}rspec"

# Known-invalid samples and why: real ExoGENI ads of 2014 emit <hardware_type/> without the required name.
EXPECTED_INVALID = {
    "rspec-exogeni-net.xml": "hardware_type",
    "rspec-exogeni-net-bbnvmsite.xml": "hardware_type",
    "rspec-exogeni-net-rcivmsite.xml": "hardware_type",
}


def _geni_v3_documents() -> list[Path]:
    if not FIXTURES.exists():
        return []
    out = []
    for f in sorted(FIXTURES.rglob("*.xml")):
        try:
            root = parse_xml(f.read_bytes(), f.name, 10_000_000)
        except BadArgs:
            continue
        if root.tag == RSPEC3:
            out.append(f)
    return out


DOCUMENTS = _geni_v3_documents()


def test_fixtures_are_present_or_we_say_so():
    if not FIXTURES.exists():
        pytest.skip(f"shared fixtures not found at {FIXTURES}; these third-party samples live outside the repo")
    assert len(DOCUMENTS) >= 25


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.name)
def test_geni_v3_sample_is_valid_or_rejected_with_reason(path):
    problems = validate_rspec(path.read_bytes())
    if path.name in EXPECTED_INVALID:
        assert problems and EXPECTED_INVALID[path.name] in " ".join(problems)
    else:
        assert problems == []


@pytest.mark.parametrize("path", [p for p in DOCUMENTS if b'type="request"' in p.read_bytes()], ids=lambda p: p.name)
def test_sample_requests_parse(path):
    req = parse_request(path.read_bytes())
    assert req.nodes or req.links


@pytest.mark.parametrize("path", [p for p in DOCUMENTS if b'type="request"' not in p.read_bytes()],
                         ids=lambda p: p.name)
def test_ads_and_manifests_are_refused_as_requests(path):
    if path.stat().st_size > 2 * 1024 * 1024:
        pytest.skip("larger than the request size limit; refused as TooBig before its type is read")
    with pytest.raises(BadArgs, match="not a request"):
        parse_request(path.read_bytes())
