"""Every GENI v3 request, advertisement and manifest among the shared third-party samples parses, and is
either valid against slicex's schemas or rejected for a reason stated here (EXPECTED_INVALID). Requests are
parsed the way Allocate parses them. RSpecs embedded in XML-RPC samples (plain or geni_compressed) count too.

The samples stay in the shared fixtures folder beside the checkout (their own licences; provenance in its
SOURCES.md): without it the module is skipped, or fails naming the folder under SLICEX_REQUIRE_SAMPLES
(tests/fixtures/__init__.py)."""

from __future__ import annotations

import base64
import re
import zlib

import pytest
from lxml import etree

from rspec.namespaces import OPSTATE, PGV2, RSPEC3, STITCH2
from rspec.request import parse_request
from rspec.validate import SCHEMA_DIR, validate_rspec
from slicex.errors import BadArgs, BadVersion, GeniError
from slicex.xmlsafe import parse_xml
from tests.fixtures import third_party, third_party_at_import

RSPEC_TAG = f"{{{RSPEC3}}}rspec"
STITCH01 = "http://hpn.east.isi.edu/rspec/ext/stitch/0.1/"

# Samples that are GENI v3 but not valid, the part of the problem that must be reported, and why they are wrong.
EXPECTED_INVALID = {
    "ads/geni-portal/rspec-exogeni-net.xml":
        ("'hardware_type': The attribute 'name' is required", "ORCA's 2014 ads write <hardware_type/> without a name"),
    "ads/geni-portal/rspec-exogeni-net-bbnvmsite.xml":
        ("'hardware_type': The attribute 'name' is required", "same ORCA quirk"),
    "ads/geni-portal/rspec-exogeni-net-rcivmsite.xml":
        ("'hardware_type': The attribute 'name' is required", "same ORCA quirk"),
    "amapi-xmlrpc/fiteagle/responses/dummy-allocate.xml#0":
        ("'node': The attribute 'client_id' is required", "FITeagle's dummy manifest nodes carry no client_id"),
    "amapi-xmlrpc/fiteagle/responses/dummy-provision.xml#0":
        ("'node': The attribute 'client_id' is required", "FITeagle's dummy manifest nodes carry no client_id"),
    "amapi-xmlrpc/fiteagle/responses/dummy-listresources.xml#0":
        ("'location': The attribute 'country' is required", "FITeagle's dummy ad has locations without a country"),
    "stitching/geni-tools-2013/ahtest-scs-ComputePath-oingo-dragon-maxgigapop-net-8081-geni.xml#0":
        ("'stitching': This element is not expected", "the 2013 SCS put <stitching> in the core RSpec namespace "
                                                      "(the bug geni-tools worked around)"),
}
# Not well-formed, so no RSpec at all (the parser must refuse them cleanly).
NOT_WELL_FORMED = {
    "geni-tools/gib-rspec-examples/gib-advert.rspec": "prefix emulab",
    "schemas/protogeni-rspec-2/ext/delay/1/examples/request.xml": "not well-formed",
}


def _embedded(root: etree._Element):
    """RSpecs carried as XML-RPC strings: plain XML, or zlib + base64 (geni_compressed)."""
    for n, s in enumerate(root.iter("string")):
        text = (s.text or "").strip()
        if text.startswith("<") and "rspec" in text:
            yield n, text.encode()
        elif len(text) > 100 and re.fullmatch(r"[A-Za-z0-9+/=\s]+", text):
            try:
                yield n, zlib.decompressobj().decompress(base64.b64decode(text))
            except (ValueError, zlib.error):
                continue


def _documents() -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for f in sorted(FIXTURES.rglob("*")):
        if f.suffix not in (".xml", ".rspec"):
            continue
        rel = str(f.relative_to(FIXTURES))
        try:
            root = parse_xml(f.read_bytes(), rel, 10_000_000)
        except GeniError:
            continue
        if root.tag == RSPEC_TAG:
            out[rel] = f.read_bytes()
        elif root.tag in ("methodCall", "methodResponse"):
            found = [d for _n, d in _embedded(root)]
            for k, d in enumerate(found):
                try:
                    if parse_xml(d, rel, 10_000_000).tag == RSPEC_TAG:
                        out[f"{rel}#{k}"] = d
                except GeniError:
                    continue
    return out


FIXTURES = third_party_at_import()  # without the samples: the module skipped, or each test failed when required


@pytest.fixture(autouse=True)
def _samples_required():
    third_party()


DOCUMENTS = _documents()


def _kind(doc: bytes) -> str:
    return parse_xml(doc, "sample", 10_000_000).get("type")


def test_fixtures_are_present_and_cover_every_kind():
    kinds = {_kind(d) for d in DOCUMENTS.values()}
    assert kinds == {"request", "advertisement", "manifest"}
    assert len(DOCUMENTS) >= 45
    assert set(EXPECTED_INVALID) <= set(DOCUMENTS), "an expected-invalid sample is no longer found"


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_geni_v3_sample_is_valid_or_rejected_with_its_reason(name):
    problems = validate_rspec(DOCUMENTS[name])
    if name in EXPECTED_INVALID:
        needle, why = EXPECTED_INVALID[name]
        assert problems, f"{name} was expected invalid ({why})"
        assert needle in " ".join(problems), problems
    else:
        assert problems == []


@pytest.mark.parametrize("name", sorted(n for n, d in DOCUMENTS.items() if _kind(d) == "request"))
def test_sample_request_is_parsed_or_refused_with_its_reason(name):
    if name in EXPECTED_INVALID:
        with pytest.raises(BadArgs, match="not valid GENI v3.*" + re.escape(EXPECTED_INVALID[name][0][:20])):
            parse_request(DOCUMENTS[name])
        return
    req = parse_request(DOCUMENTS[name])
    assert req.nodes or req.links
    root = parse_xml(DOCUMENTS[name], name, 10_000_000)
    assert {n.client_id for n in req.nodes} == {n.get("client_id") for n in root.findall(f"{{{RSPEC3}}}node")}


@pytest.mark.parametrize("name", sorted(n for n, d in DOCUMENTS.items() if _kind(d) != "request"))
def test_ads_and_manifests_are_refused_as_requests(name):
    doc = DOCUMENTS[name]
    if len(doc) > 2 * 1024 * 1024:
        pytest.skip("larger than the request size limit; refused as TooBig before its type is read")
    with pytest.raises(BadArgs, match="not a request"):
        parse_request(doc)


@pytest.mark.parametrize("name", sorted(NOT_WELL_FORMED))
def test_not_well_formed_samples_are_refused_by_the_parser(name):
    with pytest.raises(BadArgs, match=NOT_WELL_FORMED[name]):
        parse_request((FIXTURES / name).read_bytes())


def test_protogeni_v2_request_is_refused_as_the_wrong_version():
    with pytest.raises(BadVersion, match="ProtoGENI v2"):
        parse_request((FIXTURES / "geni-tools/acceptance/request_pgv2.xml").read_bytes())
    assert etree.QName(parse_xml((FIXTURES / "geni-tools/acceptance/request_pgv2.xml").read_bytes())).namespace == PGV2


def test_real_opstate_extensions_are_checked_by_slicex_opstate_schema():
    """The InstaGENI ad's rspec_opstate is valid; the same ad with one action's `next` removed is not, which
    shows the opstate schema is applied (not skipped as an unknown extension)."""
    doc = (FIXTURES / "ads/geni-portal/rspec-instageni-gpolab-bbn-com.xml").read_bytes()
    assert validate_rspec(doc, "advertisement") == []
    root = parse_xml(doc, "ad", 10_000_000)
    action = root.find(f"{{{OPSTATE}}}rspec_opstate/{{{OPSTATE}}}state/{{{OPSTATE}}}action")
    del action.attrib["next"]
    assert any("'next' is required" in p for p in validate_rspec(root, "advertisement"))


def _stitch_v2_schema() -> etree.XMLSchema:
    return etree.XMLSchema(etree.parse(str(SCHEMA_DIR / "stitch-2.xsd"), etree.XMLParser(no_network=True)))


def _as_stitch_v2(el: etree._Element) -> etree._Element:
    """A copy of a stitch 0.1 element tree in the v2 namespace (the element structure did not change)."""
    text = etree.tostring(el).replace(STITCH01.encode(), STITCH2.encode())
    return etree.fromstring(text)


def test_real_stitching_documents_fit_slicex_stitching_v2_schema():
    """No public stitch v2 instance exists, but ads, manifests and the SCS-expanded request of 2013–2014 use the
    same structure under the 0.1 namespace: each validates against stitch-2.xsd once moved to v2."""
    schema = _stitch_v2_schema()
    checked = 0
    for name, doc in DOCUMENTS.items():
        for el in parse_xml(doc, name, 10_000_000).iter(f"{{{STITCH01}}}stitching"):
            ok = schema.validate(_as_stitch_v2(el))
            assert ok, (name, [e.message for e in schema.error_log][:3])
            checked += 1
    assert checked >= 8


def test_stitching_v2_schema_rejects_a_bad_vlan_range():
    doc = (FIXTURES / "stitching/geni-tools-2013/scs-expanded-request-rspec.xml").read_bytes()
    el = _as_stitch_v2(next(parse_xml(doc).iter(f"{{{STITCH01}}}stitching")))
    el.find(f".//{{{STITCH2}}}vlanRangeAvailability").text = "100-abc"
    assert not _stitch_v2_schema().validate(el)
