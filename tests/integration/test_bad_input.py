"""Bad input gets a clear GENI code and output; the server keeps serving and nothing is lost."""

from __future__ import annotations

import http.client
import ssl
import xmlrpc.client
from datetime import timedelta

import pytest

from slicex import pki
from slicex.clock import rfc3339
from slicex.credentials import create_credential
from tests.factories import request_rspec, vm
from tests.integration.conftest import AUTHORITY
from tests.integration.test_am_api import RSPEC_V3, code, ok

BOMB = """<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">]>
<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request"><node client_id="&lol2;"/></rspec>"""
XXE = """<?xml version="1.0"?>
<!DOCTYPE r [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>
<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request"><node client_id="&xxe;"/></rspec>"""


@pytest.fixture
def world(running):
    """A running deployment with alice holding one allocated slice, to check nothing is lost."""
    alice = running.user("alice")
    urn, creds = alice.slice_credential("keep")
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("kept")]), {}))
    yield running, alice, urn, creds
    # the server still serves and the slice is intact
    assert ok(alice.am.GetVersion())["geni_api"] == 3
    slivers = ok(alice.am.Status([urn], creds, {}))["geni_slivers"]
    assert [s["geni_allocation_status"] for s in slivers] == ["geni_allocated"]


def sfa(xml: str) -> list[dict]:
    return [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": xml}]


@pytest.mark.parametrize("rspec,expected", [
    ("<rspec", 1), (BOMB, 1), (XXE, 1),
    (request_rspec([vm("a")], kind="advertisement"), 1),
    (request_rspec([vm("a")], kind="manifest"), 1),
    (42, 1),
])
def test_bad_request_rspecs(world, rspec, expected):
    running, alice, _, _ = world
    urn, creds = alice.slice_credential("badreq")
    reply = alice.am.Allocate(urn, creds, rspec, {})
    assert code(reply) == expected and reply["output"]


def test_oversize_request_is_toobig(world):
    running, alice, _, _ = world
    urn, creds = alice.slice_credential("huge")
    reply = alice.am.Allocate(urn, creds, request_rspec([vm("a")], extra="<!--" + "x" * 3_000_000 + "-->"), {})
    assert code(reply) == 6


def test_oversize_http_body_is_toobig_not_a_dropped_connection(world):
    running, alice, _, _ = world
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.load_cert_chain(str(alice.cert), str(alice.key))
    host, port = running.deployment.endpoints.am_url.split("//")[1].rstrip("/").split(":")
    conn = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=10)
    conn.putrequest("POST", "/")
    conn.putheader("Content-Length", str(64 * 1024 * 1024))
    conn.putheader("Content-Type", "text/xml")
    conn.endheaders()
    reply = xmlrpc.client.loads(conn.getresponse().read())[0][0]
    assert reply["code"]["geni_code"] == 6


def test_xmlrpc_body_with_entities_is_badargs(world):
    running, alice, _, _ = world
    body = ('<?xml version="1.0"?><!DOCTYPE m [<!ENTITY a "b">]><methodCall><methodName>GetVersion'
            '</methodName></methodCall>')
    reply = alice.am._ServerProxy__transport.request(
        running.deployment.endpoints.am_url.split("//")[1].rstrip("/"), "/", body.encode())[0]
    assert reply["code"]["geni_code"] == 1


@pytest.mark.parametrize("options,expected", [
    ({}, 1),
    ({"geni_rspec_version": {"type": "ProtoGENI", "version": "2"}}, 4),
    ({"geni_rspec_version": "GENI 3"}, 4),
    ({"geni_rspec_version": RSPEC_V3, "geni_slice_urn": "urn:publicid:IDN+x+slice+y"}, 1),
])
def test_list_resources_rspec_version_rules(world, options, expected):
    running, alice, _, _ = world
    assert code(alice.am.ListResources(alice.user_credential(), options)) == expected


@pytest.mark.parametrize("slice_urn", ["urn:publicid:IDN+x+slice+bad_name", "not a urn",
                                       "urn:publicid:IDN+x+user+alice", ""])
def test_invalid_slice_urns(world, slice_urn):
    running, alice, _, creds = world
    assert code(alice.am.Allocate(slice_urn, creds, request_rspec([vm("a")]), {})) == 1


def test_unknown_sliver_is_searchfailed(world):
    running, alice, urn, creds = world
    reply = alice.am.Status([f"urn:publicid:IDN+{AUTHORITY}+sliver+doesnotexist"], creds, {})
    assert code(reply) == 12 and "no sliver" in reply["output"]


def test_urns_spanning_two_slices_are_badargs(world):
    running, alice, urn, creds = world
    other, ocreds = alice.slice_credential("other")
    ok(alice.am.Allocate(other, ocreds, request_rspec([vm("o")]), {}))
    mine = ok(alice.am.Status([urn], creds, {}))["geni_slivers"][0]["geni_sliver_urn"]
    theirs = ok(alice.am.Status([other], ocreds, {}))["geni_slivers"][0]["geni_sliver_urn"]
    reply = alice.am.Delete([mine, theirs], creds + ocreds, {})
    assert code(reply) == 1 and "span" in reply["output"]
    # with only one slice's credential the other slice's sliver is answered as unknown (existence not revealed)
    assert code(alice.am.Delete([mine, theirs], creds, {})) == 12


def test_unknown_operational_action_is_unsupported(world):
    running, alice, urn, creds = world
    reply = alice.am.PerformOperationalAction([urn], creds, "geni_explode", {})
    assert code(reply) == 13 and "geni_start" in reply["output"]


def _sa_signed(running, alice, creds, expires) -> str:
    """A slice credential signed by the deployment's own slice authority, with a chosen expiry."""
    from slicex.credentials import parse_credential

    home = running.home
    target = parse_credential(creds[0]["geni_value"]).target_gid[0].public_bytes(pki.serialization.Encoding.PEM)
    return create_credential(owner_cert=alice.cert.read_bytes(), target_cert=target, privileges={"*": True},
                             expires=expires, signer_cert_chain=[home.sa_cert.read_bytes(), home.ca_cert.read_bytes()],
                             signer_key_pem=home.sa_key.read_bytes())


def test_expired_credential(world):
    running, alice, urn, creds = world
    expired = _sa_signed(running, alice, creds, running.clock.now() - timedelta(minutes=1))
    reply = alice.am.Status([urn], sfa(expired), {})
    assert code(reply) == 21 and "expired" in reply["output"]


def test_credential_without_the_privilege_is_forbidden(world):
    running, alice, urn, creds = world
    from slicex.credentials import parse_credential

    home = running.home
    target = parse_credential(creds[0]["geni_value"]).target_gid[0].public_bytes(pki.serialization.Encoding.PEM)
    info_only = create_credential(owner_cert=alice.cert.read_bytes(), target_cert=target, privileges={"info": False},
                                  expires=running.clock.now() + timedelta(days=1),
                                  signer_cert_chain=[home.sa_cert.read_bytes(), home.ca_cert.read_bytes()],
                                  signer_key_pem=home.sa_key.read_bytes())
    assert code(alice.am.Status([urn], sfa(info_only), {})) == 0
    reply = alice.am.Delete([urn], sfa(info_only), {})
    assert code(reply) == 3 and "deleteslice" in reply["output"]


def test_altered_credential_is_invalid(world):
    running, alice, urn, creds = world
    xml = creds[0]["geni_value"].replace("<can_delegate>true</can_delegate>", "<can_delegate>false</can_delegate>", 1)
    assert xml != creds[0]["geni_value"]
    assert code(alice.am.Status([urn], sfa(xml), {})) == 20


def _rogue_slice_credential(tmp_path, alice, urn) -> str:
    ca, ca_key = pki.create_ca(AUTHORITY, "rogue CA")
    sa, sa_key = pki.issue_certificate(ca, ca_key, f"urn:publicid:IDN+{AUTHORITY}+authority+sa", "rogue sa", is_ca=True)
    target, _ = pki.issue_certificate(ca, ca_key, urn, "slice")
    return create_credential(owner_cert=alice.cert.read_bytes(), target_cert=target, privileges={"*": True},
                             expires=__import__("datetime").datetime.now(__import__("datetime").UTC)
                             + timedelta(days=1), signer_cert_chain=[sa, ca], signer_key_pem=sa_key)


def test_untrusted_signer(world, tmp_path):
    running, alice, urn, creds = world
    assert code(alice.am.Status([urn], sfa(_rogue_slice_credential(tmp_path, alice, urn)), {})) == 23


def test_wrong_owner(world):
    running, alice, urn, creds = world
    bob = running.user("bob")
    assert code(bob.am.Status([urn], creds, {})) == 22


def test_wrong_target(world):
    running, alice, urn, creds = world
    _other, ocreds = alice.slice_credential("elsewhere")
    assert code(alice.am.Status([urn], ocreds, {})) == 22


def test_unknown_credential_type(world):
    running, alice, urn, creds = world
    bogus = [{"geni_type": "geni_magic", "geni_version": "9", "geni_value": creds[0]["geni_value"]}]
    reply = alice.am.Status([urn], bogus, {})
    assert code(reply) == 20 and "geni_magic" in reply["output"]


@pytest.mark.parametrize("creds", [
    [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": "garbage"}],
    [{"geni_type": "geni_magic", "geni_version": "1", "geni_value": "<x/>"}],
    [],
    "not a list",
])
def test_list_resources_with_bad_credentials_is_rejected(world, creds):
    running, alice, _, _ = world
    reply = alice.am.ListResources(creds, {"geni_rspec_version": RSPEC_V3})
    assert code(reply) in (1, 20) and reply["output"]


def test_list_resources_with_untrusted_credential(world, tmp_path):
    running, alice, urn, _ = world
    reply = alice.am.ListResources(sfa(_rogue_slice_credential(tmp_path, alice, urn)),
                                   {"geni_rspec_version": RSPEC_V3})
    assert code(reply) == 23


def test_renew_beyond_credential_is_out_of_range(world):
    running, alice, urn, creds = world
    reply = alice.am.Renew([urn], creds, rfc3339(running.clock.now() + timedelta(days=100)), {})
    assert code(reply) == 19


def test_wrong_argument_count_is_badargs_not_a_fault(world):
    running, alice, urn, creds = world
    assert code(alice.am.Status([urn])) == 1


def test_unknown_method_is_a_result(world):
    running, alice, _, _ = world
    assert code(alice.am.CreateSliver("x")) == 13


def test_client_without_trusted_certificate_is_refused_at_tls(world, tmp_path):
    running, alice, _, _ = world
    ca, ca_key = pki.create_ca("evil.org", "evil CA")
    cert, key = pki.issue_certificate(ca, ca_key, "urn:publicid:IDN+evil.org+user+mallory", "mallory")
    (tmp_path / "m.pem").write_bytes(cert)
    (tmp_path / "m.key").write_bytes(key)
    from slicex.tls_xmlrpc import client

    mallory = client(running.deployment.endpoints.am_url, str(tmp_path / "m.pem"), str(tmp_path / "m.key"), timeout=5)
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        mallory.GetVersion()


def test_list_resources_refuses_expired_altered_and_foreign_credentials(world):
    running, alice, urn, creds = world
    expired = _sa_signed(running, alice, creds, running.clock.now() - timedelta(minutes=1))
    altered = creds[0]["geni_value"].replace("<can_delegate>true</can_delegate>",
                                             "<can_delegate>false</can_delegate>", 1)
    options = {"geni_rspec_version": RSPEC_V3}
    assert code(alice.am.ListResources(sfa(expired), options)) == 21
    assert code(alice.am.ListResources(sfa(altered), options)) == 20
    bob = running.user("bob")
    assert code(bob.am.ListResources(creds, options)) == 22  # alice's credential, bob's connection
    assert code(bob.am.ListResources(bob.user_credential(), options)) == 0
