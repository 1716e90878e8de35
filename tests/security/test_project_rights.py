"""Who may do what in a project and a slice, attacked over mutual TLS on both deployments: the gcf slice
authority makes a project's slices for the project's members only (the check the CH API makes), and the CH
API's roles follow the Common Federation API (sliver info is the slice's members' business, nobody promotes
himself, a LEAD always remains, one public key per create_key)."""

from __future__ import annotations

import xmlrpc.client
from datetime import timedelta

import pytest

from slicex.clock import rfc3339
from tests.integration.conftest import AUTHORITY
from tests.integration.test_chapi import Chapi, chapi_user, fails, ok

PROJECT = f"urn:publicid:IDN+{AUTHORITY}+project+aproj"


def _project_slice(name: str, project: str = "aproj") -> str:
    return f"urn:publicid:IDN+{AUTHORITY}:{project}+slice+{name}"


@pytest.fixture
def alice(running) -> Chapi:
    u = chapi_user(running, "alice")
    ok(u.sa.create_project([], {"fields": {"PROJECT_NAME": "aproj"}}))
    return u


def _join(lead: Chapi, member: Chapi, role: str = "MEMBER", urn: str = PROJECT, kind: str = "PROJECT") -> None:
    method = lead.sa.modify_project_membership if kind == "PROJECT" else lead.sa.modify_slice_membership
    ok(method(urn, [], {"members_to_add": [{f"{kind}_MEMBER": member.urn, f"{kind}_ROLE": role}]}))


# ---- the gcf slice authority -----------------------------------------------------------------------------------
def test_gcf_slice_authority_makes_a_projects_slices_for_its_members_only(running, alice):
    """The reported attack: bob, in no role of alice's project, gets `<authority>:aproj+slice+paper`."""
    bob = running.user("bob")
    with pytest.raises(xmlrpc.client.Fault) as refused:
        bob.sa.CreateSlice(_project_slice("paper"))
    assert refused.value.faultCode == 3 and "not a member" in refused.value.faultString
    with pytest.raises(xmlrpc.client.Fault) as unknown:
        bob.sa.CreateSlice(_project_slice("paper", "noproj"))
    assert unknown.value.faultCode == 1 and "Unknown project" in unknown.value.faultString
    assert _project_slice("paper") not in bob.sa.ListMySlices(bob.urn)

    # the project's lead and, once added, its members get them; the CH API sees them in the project
    assert "<signed-credential" in running.user("alice").sa.CreateSlice(_project_slice("paper"))
    _join(alice, chapi_user(running, "bob"))
    assert "<signed-credential" in bob.sa.CreateSlice(_project_slice("bobpaper"))
    rows = ok(alice.sa.lookup_slices([], {"match": {"SLICE_PROJECT_URN": PROJECT}}))
    assert set(rows) == {_project_slice("paper"), _project_slice("bobpaper")}


def test_an_auditor_of_the_project_may_not_make_its_slices(running, alice):
    _join(alice, chapi_user(running, "bob"), "AUDITOR")
    with pytest.raises(xmlrpc.client.Fault) as refused:
        running.user("bob").sa.CreateSlice(_project_slice("audit"))
    assert refused.value.faultCode == 3 and "AUDITOR" in refused.value.faultString
    fails(chapi_user(running, "bob").sa.create_slice([], {"fields": {"SLICE_NAME": "audit2",
                                                                     "SLICE_PROJECT_URN": PROJECT}}), 2, "AUDITOR")


# ---- sliver info -------------------------------------------------------------------------------------------------
def test_a_project_member_outside_a_slice_cannot_change_or_delete_its_sliver_info(running, alice):
    bob = chapi_user(running, "bob")
    _join(alice, bob)
    ok(alice.sa.create_slice([], {"fields": {"SLICE_NAME": "hers", "SLICE_PROJECT_URN": PROJECT}}))
    urn = _project_slice("hers")
    sliver = f"urn:publicid:IDN+{AUTHORITY}+sliver+abc123"
    ok(alice.sa.create_sliver_info([], {"fields": {"SLIVER_INFO_URN": sliver, "SLIVER_INFO_SLICE_URN": urn,
                                                   "SLIVER_INFO_AGGREGATE_URN": running.deployment.am_urn}}))
    assert sliver in ok(bob.sa.lookup_sliver_info([], {"match": {"SLIVER_INFO_SLICE_URN": urn}}))  # he may look
    later = rfc3339(running.clock.now() + timedelta(days=3))
    fails(bob.sa.update_sliver_info(sliver, [], {"fields": {"SLIVER_INFO_EXPIRATION": later}}), 2,
          "not a member of slice")
    fails(bob.sa.delete_sliver_info(sliver, [], {}), 2, "not a member of slice")
    fails(bob.sa.delete("SLIVER_INFO", sliver, [], {}), 2, "not a member of slice")
    fails(bob.sa.create_sliver_info([], {"fields": {
        "SLIVER_INFO_URN": f"urn:publicid:IDN+{AUTHORITY}+sliver+fake1", "SLIVER_INFO_SLICE_URN": urn,
        "SLIVER_INFO_AGGREGATE_URN": running.deployment.am_urn}}), 2, "not a member of slice")
    assert ok(alice.sa.lookup_sliver_info([], {"match": {"SLIVER_INFO_URN": sliver}}))[sliver][
        "SLIVER_INFO_EXPIRATION"] == ""
    # once in the slice, he may
    _join(alice, bob, urn=urn, kind="SLICE")
    assert ok(bob.sa.update_sliver_info(sliver, [], {"fields": {"SLIVER_INFO_EXPIRATION": later}}))
    assert ok(bob.sa.delete_sliver_info(sliver, [], {}))


# ---- roles -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["SLICE", "PROJECT"])
def test_an_admin_cannot_promote_himself_or_depose_the_lead(running, alice, kind):
    bob = chapi_user(running, "bob")
    urn = PROJECT
    if kind == "SLICE":
        ok(alice.sa.create_slice([], {"fields": {"SLICE_NAME": "roles", "SLICE_PROJECT_URN": PROJECT}}))
        urn = _project_slice("roles")
    _join(alice, bob, "ADMIN", urn, kind)
    modify = bob.sa.modify_slice_membership if kind == "SLICE" else bob.sa.modify_project_membership
    me_lead = {f"{kind}_MEMBER": bob.urn, f"{kind}_ROLE": "LEAD"}
    fails(modify(urn, [], {"members_to_change": [me_lead]}), 2, "promote")
    fails(modify(urn, [], {"members_to_add": [me_lead]}), 2, "promote")
    fails(modify(urn, [], {"members_to_change": [{f"{kind}_MEMBER": alice.urn, f"{kind}_ROLE": "MEMBER"}]}), 2,
          "LEAD")
    fails(modify(urn, [], {"members_to_remove": [alice.urn]}), 2, "LEAD")
    lookup = alice.sa.lookup_slice_members if kind == "SLICE" else alice.sa.lookup_project_members
    roles = {m[f"{kind}_MEMBER"]: m[f"{kind}_ROLE"] for m in ok(lookup(urn, [], {}))}
    assert roles == {alice.urn: "LEAD", bob.urn: "ADMIN"}
    # the lead hands over: bob made LEAD by alice, then alice may step down, and the slice keeps a LEAD
    ok((alice.sa.modify_slice_membership if kind == "SLICE" else alice.sa.modify_project_membership)(
        urn, [], {"members_to_change": [me_lead]}))
    fails(modify(urn, [], {"members_to_remove": [bob.urn, alice.urn]}), 3, "no LEAD")


def test_a_creator_removed_by_the_new_lead_is_out_through_both_interfaces(running, alice):
    """The slice's creator hands the lead over and is removed: she is not a member any more, through the CH
    API or the gcf slice authority (before, the record's creator came back as LEAD on every read)."""
    bob = chapi_user(running, "bob")
    _join(alice, bob)
    ok(alice.sa.create_slice([], {"fields": {"SLICE_NAME": "handover", "SLICE_PROJECT_URN": PROJECT}}))
    urn = _project_slice("handover")
    _join(alice, bob, "LEAD", urn, "SLICE")
    ok(bob.sa.modify_slice_membership(urn, [], {"members_to_remove": [alice.urn]}))
    assert ok(bob.sa.lookup_slice_members(urn, [], {})) == [{"SLICE_MEMBER": bob.urn, "SLICE_ROLE": "LEAD"}]
    fails(alice.sa.get_credentials(urn, [], {}), 2, "not a member of slice")
    gcf = running.user("alice")
    with pytest.raises(xmlrpc.client.Fault) as refused:
        gcf.sa.CreateSlice(urn)
    assert refused.value.faultCode == 3 and "no longer a member" in refused.value.faultString
    assert urn not in gcf.sa.ListMySlices(alice.urn)
    with pytest.raises(xmlrpc.client.Fault):
        gcf.sa.RenewSlice(urn, rfc3339(running.clock.now() + timedelta(days=9)))
    assert ok(bob.sa.get_credentials(urn, [], {}))[0]["geni_type"] == "geni_sfa"


def test_the_only_lead_cannot_leave_or_step_down(running, alice):
    for change in ({"members_to_remove": [alice.urn]},
                   {"members_to_change": [{"PROJECT_MEMBER": alice.urn, "PROJECT_ROLE": "ADMIN"}]}):
        fails(alice.sa.modify_project_membership(PROJECT, [], change), 3, "no LEAD")


# ---- keys --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["ssh-ed25519 AAAAC3one alice\nssh-ed25519 AAAAC3two mallory",
                                  "ssh-ed25519 AAAAC3one alice\rssh-ed25519 AAAAC3two mallory",
                                  "ssh-ed25519 AAAAC3one alice\n\nssh-rsa AAAAB3two x"])
def test_create_key_takes_one_key_per_call(running, text):
    alice = chapi_user(running, "alice")
    fails(alice.ma.create_key(alice.urn, [], {"fields": {"KEY_PUBLIC": text}}), 3, "one key per call")
    keys = ok(alice.ma.lookup_keys([], {"match": {"KEY_MEMBER": alice.urn}}))[alice.urn]
    assert not any("AAAAC3two" in k["KEY_PUBLIC"] for k in keys)
    added = ok(alice.ma.create_key(alice.urn, [], {"fields": {"KEY_PUBLIC": "ssh-ed25519 AAAAC3one alice\n"}}))
    assert added["KEY_PUBLIC"] == "ssh-ed25519 AAAAC3one alice"  # a key file's final newline is not a second key
