"""Who may get an account on a slice's nodes, attacked over mutual TLS on both deployments.

The second attack of issue 20: bob provisions his own slice naming alice's user URN in `geni_users`, so his
services run as "her" account. geni_users (Provision) and geni_update_users (PerformOperationalAction) may
name only the caller and the slice's members at its slice authority; anyone else is FORBIDDEN (3) and nothing
is provisioned or changed. (On a netns aggregate a slice's accounts are also host uids no other slice shares:
tests/security/test_node_isolation.py.)"""

from __future__ import annotations

from tests.factories import request_rspec, vm
from tests.integration.conftest import AUTHORITY
from tests.integration.test_am_api import code, ok
from tests.integration.test_chapi import chapi_user
from tests.integration.test_chapi import ok as ch_ok

ALICE = f"urn:publicid:IDN+{AUTHORITY}+user+alice"


def _key(name: str) -> list[str]:
    return [f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI{name}key {name}@laptop"]


def test_naming_another_users_urn_in_geni_users_is_forbidden_and_provisions_nothing(running):
    bob = running.user("bob")
    urn, creds = bob.slice_credential("impostor")
    ok(bob.am.Allocate(urn, creds, request_rspec([vm("n1")]), {}))
    reply = bob.am.Provision([urn], creds, {"geni_users": [{"urn": ALICE, "keys": _key("bob")}]})
    assert code(reply) == 3, reply
    assert ALICE in reply["output"] and "neither you" in reply["output"]
    status = ok(bob.am.Status([urn], creds, {}))["geni_slivers"]
    assert [s["geni_allocation_status"] for s in status] == ["geni_allocated"]  # nothing was provisioned

    ok(bob.am.Provision([urn], creds, {"geni_users": [{"urn": bob.urn, "keys": _key("bob")}]}))  # himself: fine
    ok(bob.am.PerformOperationalAction([urn], creds, "geni_start", {}))
    reply = bob.am.PerformOperationalAction([urn], creds, "geni_update_users",
                                            {"geni_users": [{"urn": bob.urn, "keys": _key("bob")},
                                                            {"urn": ALICE, "keys": _key("bob")}]})
    assert code(reply) == 3, reply


def test_geni_users_must_be_user_urns(running):
    bob = running.user("bob")
    urn, creds = bob.slice_credential("badusers")
    ok(bob.am.Allocate(urn, creds, request_rspec([vm("n1")]), {}))
    for entry in ({"keys": _key("x")}, {"urn": "alice", "keys": []}, {"urn": urn, "keys": []},
                  {"urn": 7, "keys": []}):
        assert code(bob.am.Provision([urn], creds, {"geni_users": [entry]})) == 1, entry


def test_a_member_of_the_slice_may_be_given_an_account(running):
    """What omni's addMemberToSliceAndSlivers does: the member is added at the slice authority first."""
    alice = chapi_user(running, "alice")
    bob = chapi_user(running, "bob")
    urn = ch_ok(alice.sa.create_slice([], {"fields": {"SLICE_NAME": "shared"}}))["SLICE_URN"]
    creds = ch_ok(alice.sa.get_credentials(urn, [], {}))
    am = running.user("alice").am
    ok(am.Allocate(urn, creds, request_rspec([vm("n1")]), {}))
    users = [{"urn": alice.urn, "keys": _key("alice")}, {"urn": bob.urn, "keys": _key("bob")}]
    assert code(am.Provision([urn], creds, {"geni_users": users})) == 3  # bob is not a member yet
    ch_ok(alice.sa.modify_slice_membership(urn, [], {"members_to_add": [
        {"SLICE_MEMBER": bob.urn, "SLICE_ROLE": "MEMBER"}]}))
    slivers = ok(am.Provision([urn], creds, {"geni_users": users}))["geni_slivers"]
    assert [s["geni_allocation_status"] for s in slivers] == ["geni_provisioned"]
