"""What jFed's automated AM API v3 tester (Fed4FIRE's monitoring runs it, `TestAggregateManager3`) checks,
over mutual TLS on 127.0.0.1, on both deployments. The checks are read off an older public copy of that
class (FEDERATION.md §3.5 of the shared design notes); current jFed may check more."""

from __future__ import annotations

import base64
import socket
import ssl
import zlib
from datetime import timedelta
from urllib.parse import urlsplit

import pytest
from cryptography import x509
from lxml import etree

from slicex.clock import parse_time, rfc3339
from tests.factories import RSPEC3, request_rspec, vm
from tests.integration.conftest import deployment
from tests.integration.test_am_api import RSPEC_V3, ok


def failed(reply: dict, geni_code: int) -> None:
    """jFed's check of every reply (testAM3CorrectnessXmlRpcResult): an int geni_code, a value, and on failure
    an output string; then the code expected."""
    assert isinstance(reply["code"]["geni_code"], int) and reply["value"] is not None, reply
    assert isinstance(reply["output"], str) and reply["output"], reply
    assert reply["code"]["geni_code"] == geni_code, reply


def jfed_time(when) -> str:
    """How jFed writes a time (RFC3339Util.dateToRFC3339String): seconds, a numeric zone, never `Z`."""
    return when.strftime("%Y-%m-%dT%H:%M:%S+00:00")


def test_list_resources_with_an_empty_credential_list_is_bad_args(running):
    """testListResourcesBadCredential: ListResources with no credentials at all must fail with BADARGS (1):
    the list is a required argument left empty, not a credential that failed to verify."""
    alice = running.user("alice")
    failed(alice.am.ListResources([], {"geni_rspec_version": RSPEC_V3, "geni_available": True,
                                       "geni_compressed": True}), 1)


def test_every_method_takes_an_empty_credential_list_as_bad_args(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("nocreds")
    sliver = ok(alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {}))["geni_slivers"][0]["geni_sliver_urn"]
    end = rfc3339(running.clock.now() + timedelta(hours=1))
    for reply in (alice.am.Describe([urn], [], {"geni_rspec_version": RSPEC_V3}),
                  alice.am.Allocate(urn, [], request_rspec([vm("b")]), {}),
                  alice.am.Renew([urn], [], end, {}),
                  alice.am.Provision([sliver], [], {}),
                  alice.am.Status([sliver], [], {}),
                  alice.am.PerformOperationalAction([urn], [], "geni_start", {}),
                  alice.am.Delete([urn], [], {}),
                  alice.am.Shutdown(urn, [], {})):
        failed(reply, 1)
    assert ok(alice.am.Status([urn], creds, {}))["geni_slivers"][0]["geni_allocation_status"] == "geni_allocated"


def test_status_of_a_slice_without_slivers_fails_with_search_failed(running):
    """testStatusNoSliverSlice: a slice that exists at its slice authority but has no slivers here; Status
    must fail (SEARCHFAILED 12), while Describe of it succeeds with an empty manifest
    (testDescribeNoSliverSlice: shorter than 30 characters, compressed or not)."""
    alice = running.user("alice")
    urn, creds = alice.slice_credential("nosliver")
    failed(alice.am.Status([urn], creds, {}), 12)
    for compressed in (False, True):
        value = ok(alice.am.Describe([urn], creds, {"geni_rspec_version": RSPEC_V3, "geni_compressed": compressed}))
        assert value["geni_slivers"] == []
    plain = ok(alice.am.Describe([urn], creds, {"geni_rspec_version": RSPEC_V3}))["geni_rspec"]
    assert etree.fromstring(plain.encode()).get("type") == "manifest"


def test_describe_by_sliver_urn_answers_for_that_sliver(running):
    """testDescribeExistingSliver: Describe given the sliver URN (not the slice's), compressed, answers the
    slice URN, a manifest, and exactly that sliver."""
    alice = running.user("alice")
    urn, creds = alice.slice_credential("bysliver")
    slivers = ok(alice.am.Allocate(urn, creds, request_rspec([vm("a"), vm("b")]), {}))["geni_slivers"]
    ok(alice.am.Provision([urn], creds, {"geni_users": [{"urn": alice.urn, "keys": ["ssh-rsa AAAA a@t"]}]}))
    ok(alice.am.PerformOperationalAction([urn], creds, "geni_start", {}))
    first = slivers[0]["geni_sliver_urn"]
    value = ok(alice.am.Describe([first], creds, {"geni_rspec_version": RSPEC_V3, "geni_compressed": True}))
    assert value["geni_urn"] == urn
    assert [s["geni_sliver_urn"] for s in value["geni_slivers"]] == [first]
    manifest = etree.fromstring(zlib.decompress(base64.b64decode(value["geni_rspec"])))
    assert manifest.get("type") == "manifest"
    nodes = [n.get("client_id") for n in manifest.iter(f"{{{RSPEC3}}}node")]
    assert nodes == [slivers[0]["geni_client_id"]]


def test_status_and_describe_answer_the_slice_urn_as_the_caller_spelled_it(running):
    """jFed names its test slices `S<millis>` and checks that Status and Describe (by slice and by sliver URN)
    answer geni_urn equal to that string (validSuccesStatus, checkDescribeExistingSliver). URNs compare
    case-insensitively but keep their case (Fed4FIRE Federation AM API, general.adoc): slicex finds the slice
    whatever its spelling and answers in the caller's."""
    alice = running.user("alice")
    urn, creds = alice.slice_credential("S1764186000123")
    slivers = ok(alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {}))["geni_slivers"]
    ok(alice.am.Provision([urn], creds, {}))
    assert ok(alice.am.Status([urn], creds, {}))["geni_urn"] == urn
    assert ok(alice.am.Describe([urn], creds, {"geni_rspec_version": RSPEC_V3}))["geni_urn"] == urn
    by_sliver = ok(alice.am.Describe([slivers[0]["geni_sliver_urn"]], creds, {"geni_rspec_version": RSPEC_V3}))
    assert by_sliver["geni_urn"] == urn
    assert ok(alice.am.Status([slivers[0]["geni_sliver_urn"]], creds, {}))["geni_urn"] == urn
    other = urn.replace("+slice+S", "+slice+s")  # the same slice under another spelling: found, named so
    assert ok(alice.am.Status([other], creds, {}))["geni_urn"] == other


def test_status_after_renew_reports_exactly_the_renewed_expiry(running):
    """testRenewSliver: read the expiry from Status, Renew the slice to it plus 5 minutes (written as jFed
    writes times), and Status then reports that time for every sliver; the Renew reply says the same."""
    alice = running.user("alice")
    urn, creds = alice.slice_credential("renewexact")
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("a"), vm("b")]), {}))
    ok(alice.am.Provision([urn], creds, {}))
    ok(alice.am.PerformOperationalAction([urn], creds, "geni_start", {}))
    running.clock.advance(timedelta(seconds=30))
    before = ok(alice.am.Status([urn], creds, {}))["geni_slivers"]
    start = parse_time(before[0]["geni_expires"])
    asked = start + timedelta(minutes=5, seconds=7)
    renewed = ok(alice.am.Renew([urn], creds, jfed_time(asked), {}))
    assert {parse_time(s["geni_expires"]) for s in renewed} == {asked}
    running.clock.advance(timedelta(seconds=2))
    after = ok(alice.am.Status([urn], creds, {}))["geni_slivers"]
    assert len(after) == 2
    assert [s["geni_expires"] for s in after] == [rfc3339(asked)] * 2
    # a second Renew by one sliver URN moves that sliver only, to exactly what was asked
    again = asked + timedelta(minutes=5)
    ok(alice.am.Renew([after[0]["geni_sliver_urn"]], creds, rfc3339(again), {}))
    expiry = {s["geni_sliver_urn"]: s["geni_expires"] for s in ok(alice.am.Status([urn], creds, {}))["geni_slivers"]}
    assert expiry == {after[0]["geni_sliver_urn"]: rfc3339(again), after[1]["geni_sliver_urn"]: rfc3339(asked)}


@pytest.mark.parametrize("kind", ["embedded", "distributed"])
def test_get_version_under_a_public_hostname_names_no_loopback_url(kind, pki_home, tmp_path):
    """testGetVersionResultApiVersionsCorrectness: no URL in geni_api_versions may have host localhost or
    127.0.0.1. With `public_hostname` set, GetVersion advertises it while the deployment still listens on
    `host` (127.0.0.1 here, where this test calls it)."""
    for running in deployment(kind, pki_home, tmp_path, public_hostname="am.testbed.example.org"):
        alice = running.user("alice")
        reply = alice.am.GetVersion()
        value = ok(reply)
        urls = dict(value["geni_api_versions"])
        assert set(urls) == {"2", "3"}
        for url in urls.values():
            assert urlsplit(url).hostname == "am.testbed.example.org", urls
        port = urlsplit(running.deployment.endpoints.am_url).port
        assert urls["3"] == f"https://am.testbed.example.org:{port}/"
        assert value["hostname"] == "am.testbed.example.org"
        loopback = [k for k, v in _strings(value) if "127.0.0.1" in v or "localhost" in v]
        assert loopback == [], loopback
        # the aggregate the slice authority lists is the one GetVersion names
        assert dict(alice.sa.ListAggregates()) == {value["urn"]: urls["3"]}
        # and the certificate the AM answers TLS with carries the name (`slicex up` issued it again)
        served = x509.load_der_x509_certificate(_served_certificate(running.deployment.endpoints.am_url, alice))
        sans = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert sans.get_values_for_type(x509.DNSName) == ["am.testbed.example.org"]
        assert value["urn"] in sans.get_values_for_type(x509.UniformResourceIdentifier)


def _served_certificate(url: str, user) -> bytes:
    parts = urlsplit(url)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # omni does not check it either
    context.load_cert_chain(str(user.cert), str(user.key))
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as raw, \
            context.wrap_socket(raw) as tls:
        return tls.getpeercert(binary_form=True)


def _strings(value, path=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, f"{path}[{i}]")
    elif isinstance(value, str):
        yield path, value
