"""The CH API slice and member authority over mutual TLS on 127.0.0.1, called as omni's `chapi` framework
calls it (v1 names, its default) and as `speakv2 = true` and geni-lib call it (v2 generic), against both
deployments; and the one slice record the gcf interface shares."""

from __future__ import annotations

import xmlrpc.client
from dataclasses import dataclass
from datetime import timedelta

import pytest

from slicex.clock import parse_time, rfc3339
from slicex.tls_xmlrpc import client
from tests.factories import request_rspec, vm
from tests.integration.conftest import AUTHORITY
from tests.security.test_namespace_roots import with_peer  # noqa: F401 - the fixture

PROJECT = f"urn:publicid:IDN+{AUTHORITY}+project+proj1"
FILTER_SERVICE = {"filter": ["SERVICE_URN", "SERVICE_URL"]}


@dataclass
class Chapi:
    urn: str
    ch: xmlrpc.client.ServerProxy
    sa: xmlrpc.client.ServerProxy
    ma: xmlrpc.client.ServerProxy


def chapi_user(running, name: str) -> Chapi:
    base = running.deployment.chapi.url
    cert, key = str(running.home.user_cert(name)), str(running.home.user_key(name))
    return Chapi(f"urn:publicid:IDN+{AUTHORITY}+user+{name}",
                 *(client(f"{base}/{p}", cert, key) for p in ("CH", "SA", "MA")))


def ok(reply: dict):
    assert reply["code"] == 0, reply["output"]
    assert reply["output"] == ""
    return reply["value"]


def fails(reply: dict, code: int, text: str) -> str:
    assert reply["code"] == code, reply
    assert reply["value"] is None
    assert text in reply["output"], reply["output"]
    return reply["output"]


def slice_urn(name: str, project: str | None = "proj1") -> str:
    where = f"{AUTHORITY}:{project}" if project else AUTHORITY
    return f"urn:publicid:IDN+{where}+slice+{name}"


def new_slice(u: Chapi, name: str) -> str:
    ok(u.sa.create_slice([], {"fields": {"SLICE_NAME": name, "SLICE_PROJECT_URN": PROJECT}}))
    return slice_urn(name)


@pytest.fixture
def alice(running) -> Chapi:
    u = chapi_user(running, "alice")
    ok(u.sa.create_project([], {"fields": {"PROJECT_NAME": "proj1"}}))
    return u


def test_omni_v1_calls_create_a_slice_whose_credential_the_aggregate_accepts(running, alice):
    sas = ok(alice.ch.lookup_slice_authorities(FILTER_SERVICE))
    assert sas == [{"SERVICE_URN": f"urn:publicid:IDN+{AUTHORITY}+authority+sa",
                    "SERVICE_URL": f"{running.deployment.chapi.url}/SA"}]
    mas = ok(alice.ch.lookup_member_authorities(FILTER_SERVICE))
    assert mas[0]["SERVICE_URL"].endswith("/MA")
    fields = {"SLICE_NAME": "s1", "SLICE_PROJECT_URN": PROJECT}
    created = ok(alice.sa.create_slice([], {"fields": fields}))
    urn = slice_urn("s1")
    assert created["SLICE_URN"] == urn
    creds = ok(alice.sa.get_credentials(urn, [], {"fields": fields, "match": {"SLICE_URN": urn,
                                                                              "SLICE_EXPIRED": False}}))
    assert creds[0]["geni_type"] == "geni_sfa" and creds[0]["geni_version"] == "3"

    am = running.user("alice").am
    rspec = request_rspec([vm("n1")])
    allocated = am.Allocate(urn, creds, rspec, {})
    assert allocated["code"]["geni_code"] == 0, allocated["output"]
    sliver = allocated["value"]["geni_slivers"][0]["geni_sliver_urn"]
    provisioned = am.Provision([urn], creds, {"geni_users": [{"urn": alice.urn, "keys": []}]})
    assert provisioned["code"]["geni_code"] == 0, provisioned["output"]

    # provision's CH calls: members, their e-mail and keys, then the sliver record
    members = ok(alice.sa.lookup_slice_members(urn, [], {"match": {"SLICE_URN": urn}}))
    assert members == [{"SLICE_MEMBER": alice.urn, "SLICE_ROLE": "LEAD"}]
    info = ok(alice.ma.lookup_identifying_member_info([], {"filter": ["MEMBER_EMAIL"],
                                                           "match": {"MEMBER_URN": alice.urn}}))
    assert info == {alice.urn: {"MEMBER_EMAIL": f"alice@{AUTHORITY}"}}
    keys = ok(alice.ma.lookup_keys([], {"filter": ["KEY_PUBLIC"], "match": {"KEY_MEMBER": alice.urn}}))
    assert keys[alice.urn][0]["KEY_PUBLIC"].startswith("ssh-rsa ")
    now = running.clock.now()
    ok(alice.sa.create_sliver_info([], {"fields": {
        "SLIVER_INFO_URN": sliver, "SLIVER_INFO_SLICE_URN": urn,
        "SLIVER_INFO_AGGREGATE_URN": running.deployment.am_urn, "SLIVER_INFO_CREATOR_URN": alice.urn,
        "SLIVER_INFO_CREATION": now.replace(tzinfo=None).isoformat() + ".253682",
        "SLIVER_INFO_EXPIRATION": rfc3339(now + timedelta(days=1))}}))
    slivers = ok(alice.sa.lookup_sliver_info([], {"match": {"SLIVER_INFO_SLICE_URN": urn}}))
    assert list(slivers) == [sliver]
    assert slivers[sliver]["SLIVER_INFO_CREATION"] == rfc3339(now)

    assert running.user("alice").am.Delete([urn], creds, {})["code"]["geni_code"] == 0
    assert ok(alice.sa.delete_sliver_info(sliver, [], {})) is True
    assert ok(alice.sa.lookup_sliver_info([], {"match": {"SLIVER_INFO_SLICE_URN": urn}})) == {}


def test_renewslice_takes_omnis_naive_time_as_utc_and_never_shortens(running, alice):
    urn = new_slice(alice, "renew1")
    when = (running.clock.now() + timedelta(days=20)).replace(tzinfo=None)
    match = {"SLICE_URN": urn, "SLICE_EXPIRED": False}
    assert ok(alice.sa.update_slice(urn, [], {"fields": {"SLICE_EXPIRATION": when.isoformat()}, "match": match}))
    looked = ok(alice.sa.lookup_slices([], {"filter": ["SLICE_URN", "SLICE_EXPIRATION", "SLICE_EXPIRED"],
                                            "match": match}))
    assert looked == {urn: {"SLICE_URN": urn, "SLICE_EXPIRATION": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
                            "SLICE_EXPIRED": False}}
    earlier = rfc3339(running.clock.now() + timedelta(days=10))
    fails(alice.sa.update_slice(urn, [], {"fields": {"SLICE_EXPIRATION": earlier}}), 3, "never shortened")
    too_late = rfc3339(running.clock.now() + timedelta(days=400))
    fails(alice.sa.update_slice(urn, [], {"fields": {"SLICE_EXPIRATION": too_late}}), 3, "latest this slice")


def test_listslices_and_listprojects_rows_carry_omnis_expired_key(running, alice):
    urn = new_slice(alice, "mine1")
    rows = ok(alice.sa.lookup_slices_for_member(alice.urn, [], {"match": {"SLICE_EXPIRED": False}}))
    assert {"SLICE_URN": urn, "SLICE_ROLE": "LEAD", "EXPIRED": False}.items() <= rows[0].items()
    projects = ok(alice.sa.lookup_projects_for_member(alice.urn, [], {}))
    assert projects[0]["PROJECT_URN"] == PROJECT and projects[0]["PROJECT_ROLE"] == "LEAD"
    assert projects[0]["EXPIRED"] is False


def test_v2_generic_calls_as_speakv2_and_geni_lib_send_them(running, alice):
    services = ok(alice.ch.lookup("SERVICE", [], {"match": {"SERVICE_TYPE": "AGGREGATE_MANAGER"}}))
    assert services[0]["SERVICE_URN"] == running.deployment.am_urn
    assert services[0]["SERVICE_URL"] == running.deployment.endpoints.am_url
    assert {"SERVICE_DESCRIPTION", "SERVICE_NAME", "_GENI_SERVICE_SHORT_NAME"} <= services[0].keys()
    by_url = ok(alice.ch.lookup("SERVICE", [], {"filter": ["SERVICE_URN"], "match": {
        "SERVICE_TYPE": "AGGREGATE_MANAGER", "SERVICE_URL": running.deployment.endpoints.am_url}}))
    assert by_url == [{"SERVICE_URN": running.deployment.am_urn}]

    ucred = ok(alice.ma.get_credentials(alice.urn, [], {}))
    assert ucred[0]["geni_type"] == "geni_sfa"
    gl_cred = [{"geni_type": "geni_sfa", "geni_version": 3, "geni_value": ucred[0]["geni_value"]}]  # geni-lib's int
    end = rfc3339(running.clock.now() + timedelta(days=3))
    created = ok(alice.sa.create("SLICE", gl_cred, {"fields": {"SLICE_NAME": "v2s", "SLICE_PROJECT_URN": PROJECT,
                                                              "SLICE_EXPIRATION": end}}))
    urn = created["SLICE_URN"]
    assert urn == slice_urn("v2s") and created["SLICE_EXPIRATION"] == end
    assert ok(alice.sa.get_credentials(urn, gl_cred, {}))[0]["geni_value"].startswith("<?xml")
    later = rfc3339(running.clock.now() + timedelta(days=6))
    assert ok(alice.sa.update("SLICE", urn, gl_cred, {"fields": {"SLICE_EXPIRATION": later}}))
    assert ok(alice.sa.lookup("SLICE", gl_cred, {"match": {"SLICE_PROJECT_URN": PROJECT}}))[urn][
        "SLICE_EXPIRATION"] == later
    assert ok(alice.sa.lookup_for_member("SLICE", alice.urn, [], {"match": {"SLICE_EXPIRED": False}}))[0][
        "SLICE_URN"] == urn
    assert ok(alice.sa.lookup_members("SLICE", urn, [], {}))[0]["SLICE_MEMBER"] == alice.urn
    assert ok(alice.sa.lookup_for_member("PROJECT", alice.urn, [], {"match": {"PROJECT_EXPIRED": False}}))
    keys = ok(alice.ma.lookup("KEY", [], {"match": {"KEY_MEMBER": alice.urn}}))
    assert [k["KEY_MEMBER"] for k in keys.values()] == [alice.urn]
    assert ok(alice.ma.lookup("MEMBER", [], {"match": {"MEMBER_URN": alice.urn}}))[alice.urn]["MEMBER_USERNAME"] \
        == "alice"
    assert ok(alice.sa.get_version())["VERSION"] == "2"


def test_one_slice_record_for_both_interfaces(running, alice):
    gcf = running.user("alice")
    gcf_urn, _cred = gcf.slice_credential("viagcf")
    rows = ok(alice.sa.lookup_slices_for_member(alice.urn, [], {}))
    assert gcf_urn in {r["SLICE_URN"] for r in rows}
    assert ok(alice.sa.get_credentials(gcf_urn, [], {}))[0]["geni_type"] == "geni_sfa"

    chapi_urn = new_slice(alice, "viachapi")
    assert chapi_urn in gcf.sa.ListMySlices(alice.urn)
    assert "<signed-credential" in gcf.sa.CreateSlice(chapi_urn)  # the owner gets its credential, no new slice
    with pytest.raises(xmlrpc.client.Fault) as exc:
        running.user("bob").sa.CreateSlice(chapi_urn)
    assert exc.value.faultCode == 3 and "not a member" in exc.value.faultString  # the project's members only
    # a gcf-made slice's name is taken for the CH API too
    fails(alice.sa.create_slice([], {"fields": {"SLICE_NAME": "viagcf"}}), 5, "DUPLICATE_ERROR")


def test_errors_are_ch_results_with_the_strings_omni_recognises(running, alice):
    bob = chapi_user(running, "bob")
    urn = new_slice(alice, "owned")
    fails(alice.sa.create_slice([], {"fields": {"SLICE_NAME": "owned", "SLICE_PROJECT_URN": PROJECT}}), 5,
          "[DUPLICATE] DUPLICATE_ERROR (")
    fails(alice.sa.create_slice([], {"fields": {"SLICE_NAME": "x", "SLICE_PROJECT_URN":
                                                f"urn:publicid:IDN+{AUTHORITY}+project+nope"}}), 3, "Unknown project")
    fails(alice.sa.create_slice([], {"fields": {"SLICE_NAME": "bad_name!", "SLICE_PROJECT_URN": PROJECT}}), 3,
          "slice name")
    fails(alice.sa.get_credentials("not-a-urn", [], {}), 3, "ARGUMENT_ERROR (Unknown slice urn")
    fails(alice.sa.get_credentials(slice_urn("absent"), [], {}), 3, "ARGUMENT_ERROR (Unknown slice urn")
    fails(bob.sa.get_credentials(urn, [], {}), 2, "AUTHORIZATION_ERROR")
    fails(bob.sa.update_slice(urn, [], {"fields": {"SLICE_EXPIRATION": "2099-01-01T00:00:00Z"}}), 2, "not yours")
    fails(bob.sa.create_slice([], {"fields": {"SLICE_NAME": "bobs", "SLICE_PROJECT_URN": PROJECT}}), 2,
          "not a member")
    assert ok(bob.sa.lookup_slices([], {"match": {"SLICE_URN": urn}})) == {}
    fails(bob.sa.lookup_slices_for_member(alice.urn, [], {}), 2, "your own")
    fails(bob.ma.get_credentials(alice.urn, [], {}), 2, "your own")
    fails(alice.sa.update_sliver_info(f"urn:publicid:IDN+{AUTHORITY}+sliver+nope", [], {"fields": {}}), 3,
          "ARGUMENT_ERROR (Unknown sliver urn")
    fails(alice.sa.create_project([], {"fields": {"PROJECT_NAME": "proj1"}}), 5, "DUPLICATE_ERROR")
    fails(alice.sa.create("NOTATYPE", [], {}), 100, "not offered")
    fails(alice.ch.create_slice([], {}), 100, "not a method of the CH")
    fails(alice.sa.create_slice([], {"fields": {"SLICE_NAME": "x"}, "speaking_for": bob.urn}), 100, "speaks-for")
    base = running.deployment.chapi.url
    cert, key = str(running.home.user_cert("alice")), str(running.home.user_key("alice"))
    fails(client(f"{base}/XX", cert, key).get_version(), 3, "no CH API service at /XX")


def test_project_membership_lets_another_member_create_and_see_slices(running, alice):
    bob = chapi_user(running, "bob")
    ok(alice.sa.modify_project_membership(PROJECT, [], {"members_to_add": [
        {"PROJECT_MEMBER": bob.urn, "PROJECT_ROLE": "MEMBER"}]}))
    ok(bob.sa.create_slice([], {"fields": {"SLICE_NAME": "bobs", "SLICE_PROJECT_URN": PROJECT}}))
    assert slice_urn("bobs") in ok(alice.sa.lookup_slices([], {"match": {"SLICE_PROJECT_URN": PROJECT}}))
    fails(alice.sa.get_credentials(slice_urn("bobs"), [], {}), 2, "not a member of slice")
    ok(bob.sa.modify_slice_membership(slice_urn("bobs"), [], {"members_to_add": [
        {"SLICE_MEMBER": alice.urn, "SLICE_ROLE": "MEMBER"}]}))
    assert ok(alice.sa.get_credentials(slice_urn("bobs"), [], {}))[0]["geni_type"] == "geni_sfa"
    emails = ok(bob.ma.lookup_identifying_member_info([], {"match": {"MEMBER_URN": alice.urn}}))
    assert emails[alice.urn]["MEMBER_EMAIL"] == f"alice@{AUTHORITY}"


def test_without_projects_slices_take_the_gcf_urn_form(running):
    alice = chapi_user(running, "alice")
    created = ok(alice.sa.create_slice([], {"fields": {"SLICE_NAME": "noproj"}}))
    assert created["SLICE_URN"] == slice_urn("noproj", None)
    assert parse_time(created["SLICE_EXPIRATION"]) > running.clock.now()


def test_a_trusted_peers_users_get_nothing_from_our_sa_and_ma(with_peer, tmp_path):  # noqa: F811 - the fixture
    """TLS admits a trusted peer's users (for the AM); the CH API's SA and MA, like the gcf one, serve our own
    members only, so neither a peer user nor a peer-minted "alice" of our namespace gets a credential."""
    running, peer = with_peer
    alice = chapi_user(running, "alice")
    urn = new_slice_without_project(alice, "victim")
    for name, member in {"mallory": "urn:publicid:IDN+peer.test+user+mallory",
                         "fake-alice": alice.urn}.items():
        cert, key = peer.mint(member)
        (tmp_path / f"{name}.pem").write_bytes(cert)
        (tmp_path / f"{name}.key").write_bytes(key)
        base = running.deployment.chapi.url
        sa = client(f"{base}/SA", str(tmp_path / f"{name}.pem"), str(tmp_path / f"{name}.key"))
        ma = client(f"{base}/MA", str(tmp_path / f"{name}.pem"), str(tmp_path / f"{name}.key"))
        fails(sa.get_credentials(urn, [], {}), 1, "serves members of")
        fails(sa.create_slice([], {"fields": {"SLICE_NAME": f"{name[:4]}1"}}), 1, "serves members of")
        fails(ma.get_credentials(member, [], {}), 1, "serves members of")
        ch = client(f"{base}/CH", str(tmp_path / f"{name}.pem"), str(tmp_path / f"{name}.key"))
        assert ok(ch.lookup_aggregates({}))[0]["SERVICE_URN"] == running.deployment.am_urn  # the registry is public


def new_slice_without_project(u: Chapi, name: str) -> str:
    return ok(u.sa.create_slice([], {"fields": {"SLICE_NAME": name}}))["SLICE_URN"]
