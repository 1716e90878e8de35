"""AM API Update and Cancel (GENI change set C) over mutual TLS on both deployments: a node and a link added
to a provisioned slice and committed by Provision, a second Update cancelled, an uncommitted Update reverted
by its expiry, on allocated slivers at once; and the refusals (another user's slice, malformed RSpec, slivers
not in the slice, nothing to cancel, stitched links)."""

from __future__ import annotations

from datetime import timedelta

from lxml import etree

from tests.factories import RSPEC3, request_rspec, vm
from tests.integration.conftest import AUTHORITY
from tests.integration.test_am_api import client_ids, code, ok

RSPEC_V3 = {"type": "GENI", "version": "3"}


def two_nodes(capacity: int | None = None) -> str:
    return request_rspec([vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0"])],
                         [{"client_id": "l1", "ifaces": ["n1:if0", "n2:if0"],
                           **({"capacity": capacity} if capacity else {})}])


def three_nodes(capacity: int | None = None) -> str:
    """two_nodes plus n3, linked to n2 by l2 (n2 gains an interface)."""
    return request_rspec([vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0", "n2:if1"]),
                          vm("n3", ifaces=["n3:if0"])],
                         [{"client_id": "l1", "ifaces": ["n1:if0", "n2:if0"],
                           **({"capacity": capacity} if capacity else {})},
                          {"client_id": "l2", "ifaces": ["n2:if1", "n3:if0"]}])


def provisioned_pair(user, name: str) -> tuple[str, list, dict[str, str]]:
    urn, creds = user.slice_credential(name)
    ok(user.am.Allocate(urn, creds, two_nodes(), {}))
    ok(user.am.Provision([urn], creds, {"geni_rspec_version": RSPEC_V3}))
    return urn, creds, slivers_of(user, urn, creds)


def slivers_of(user, urn: str, creds: list) -> dict[str, str]:
    """client_id -> sliver URN, from Describe's manifest."""
    manifest = ok(user.am.Describe([urn], creds, {"geni_rspec_version": RSPEC_V3}))["geni_rspec"]
    root = etree.fromstring(manifest.encode())
    return {el.get("client_id"): el.get("sliver_id") for el in root
            if el.tag in (f"{{{RSPEC3}}}node", f"{{{RSPEC3}}}link")}


def states(user, urn: str, creds: list) -> set[str]:
    return {s["geni_allocation_status"] for s in ok(user.am.Status([urn], creds, {}))["geni_slivers"]}


def test_get_version_advertises_update_and_cancel(running):
    v = ok(running.user("alice").am.GetVersion())
    assert v["slicex_update"]["methods"] == ["Update", "Cancel"]
    assert "stitched links" in v["slicex_update"]["refused"] and "FPGA slivers" in v["slicex_update"]["refused"]
    assert v["slicex_update"]["actions"] == ["kept", "rewired", "added", "removed", "replaced", "replacing"]
    assert v["slicex_update"]["manifest_namespace"] == "http://slicex.dev/rspec/ext/update/1"


def test_update_commit_then_cancel_restores_the_topology(running):
    alice = running.user("alice")
    urn, creds, before = provisioned_pair(alice, "upd")
    sm = running.deployment.sm
    units = {c: set(sm.sliver(before[c], running.clock.now()).details["keys"]) for c in ("n1", "n2")}
    value = ok(alice.am.Update([urn], creds, three_nodes(), {}))
    assert {s["geni_allocation_status"] for s in value["geni_slivers"]} == {"geni_updating"}
    assert client_ids(value["geni_rspec"]) == {"n1", "n2", "n3", "l1", "l2"}
    assert states(alice, urn, creds) == {"geni_updating"}
    # another Update while one is pending: INPROGRESS (16), saying how to go on
    again = alice.am.Update([urn], creds, two_nodes(), {})
    assert code(again) == 16 and "Provision" in again["output"]
    done = ok(alice.am.Provision([urn], creds, {"geni_rspec_version": RSPEC_V3}))
    assert {s["geni_allocation_status"] for s in done["geni_slivers"]} == {"geni_provisioned"}
    after = slivers_of(alice, urn, creds)
    assert set(after) == {"n1", "n2", "n3", "l1", "l2"}
    assert {k: after[k] for k in before} == before  # what is kept keeps its slivers and its units
    assert {c: set(sm.sliver(before[c], running.clock.now()).details["keys"]) for c in ("n1", "n2")} == units
    added = set(sm.sliver(after["n3"], running.clock.now()).details["keys"])
    assert added and added <= sm.usage_keys() and not added & set().union(*units.values())
    manifest = ok(alice.am.Describe([urn], creds, {"geni_rspec_version": RSPEC_V3}))["geni_rspec"]
    n2 = next(el for el in etree.fromstring(manifest.encode()).iter(f"{{{RSPEC3}}}node") if el.get("client_id") == "n2")
    ifaces = {i.get("client_id"): i for i in n2.iter(f"{{{RSPEC3}}}interface")}
    assert set(ifaces) == {"n2:if0", "n2:if1"}
    # a second Update (n3 and l2 removed, l1's capacity changed), cancelled: the committed topology is back
    ok(alice.am.Update([urn], creds, two_nodes(capacity=200000), {}))
    cancelled = ok(alice.am.Cancel([urn], creds, {}))
    assert {s["geni_allocation_status"] for s in cancelled["geni_slivers"]} <= {"geni_provisioned", "geni_unallocated"}
    given_back = [s for s in cancelled["geni_slivers"] if s["geni_allocation_status"] == "geni_unallocated"]
    assert [s["geni_client_id"] for s in given_back] == ["l1"]  # the replacement l1 the Update had placed
    assert given_back[0]["geni_sliver_urn"] not in after.values()
    assert slivers_of(alice, urn, creds) == after
    assert states(alice, urn, creds) == {"geni_provisioned"}
    # and once more, committed: n3 and l2 are gone, l1 is a new sliver with the new capacity
    ok(alice.am.Update([urn], creds, two_nodes(capacity=200000), {}))
    ok(alice.am.Provision([urn], creds, {"geni_rspec_version": RSPEC_V3}))
    final = slivers_of(alice, urn, creds)
    assert set(final) == {"n1", "n2", "l1"} and final["n1"] == before["n1"] and final["l1"] != before["l1"]
    assert not added & sm.usage_keys()  # what the commit removed was released
    status = ok(alice.am.Status([urn], creds, {}))["geni_slivers"]
    assert len(status) == 3


def test_uncommitted_update_reverts_at_its_expiry(running):
    alice = running.user("alice")
    urn, creds, before = provisioned_pair(alice, "updexp")
    ok(alice.am.Update([urn], creds, three_nodes(), {}))
    # a running sliver the Update concerns still takes its operational actions meanwhile
    started = ok(alice.am.PerformOperationalAction([before["n1"]], creds, "geni_start", {}))
    assert started[0]["geni_allocation_status"] == "geni_updating" and not started[0]["geni_error"]
    running.clock.advance(timedelta(minutes=11))  # past the update's expiry (the allocation lifetime)
    running.deployment.sm.reap(running.clock.now())
    assert slivers_of(alice, urn, creds) == before
    assert states(alice, urn, creds) == {"geni_provisioned"}
    assert code(alice.am.Cancel([urn], creds, {})) == 12  # nothing left to cancel


def test_update_of_allocated_slivers_applies_at_once(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("updalloc")
    ok(alice.am.Allocate(urn, creds, two_nodes(), {}))
    value = ok(alice.am.Update([urn], creds, three_nodes(), {}))
    assert {s["geni_allocation_status"] for s in value["geni_slivers"]} == {"geni_allocated"}
    assert set(slivers_of(alice, urn, creds)) == {"n1", "n2", "n3", "l1", "l2"}
    back = ok(alice.am.Update([urn], creds, two_nodes(), {}))  # and back: n3 and l2 given back at once
    assert {s["geni_client_id"] for s in back["geni_slivers"] if s["geni_allocation_status"] == "geni_unallocated"} \
        == {"n3", "l2"}
    assert set(slivers_of(alice, urn, creds)) == {"n1", "n2", "l1"}
    ok(alice.am.Provision([urn], creds, {"geni_rspec_version": RSPEC_V3}))
    assert states(alice, urn, creds) == {"geni_provisioned"}
    # Cancel of allocated slivers with no Update pending acts as Delete
    urn2, creds2 = alice.slice_credential("updalloc2")
    ok(alice.am.Allocate(urn2, creds2, two_nodes(), {}))
    gone = ok(alice.am.Cancel([urn2], creds2, {}))
    assert {s["geni_allocation_status"] for s in gone["geni_slivers"]} == {"geni_unallocated"}


def test_update_refusals_have_clear_codes(running):
    alice, bob = running.user("alice"), running.user("bob")
    urn, creds, before = provisioned_pair(alice, "updbad")
    _, bob_creds = bob.slice_credential("updbob")
    # another user's slice: bob's credential is not for alice's slice
    stranger = bob.am.Update([urn], bob_creds, three_nodes(), {})
    assert code(stranger) == 22 and "updbob" in stranger["output"]  # CREDENTIAL_MISMATCH: his slice, not hers
    assert code(bob.am.Cancel([urn], bob_creds, {})) == 22
    # naming her sliver with his credential: as if it did not exist (nothing learnt of other slices)
    assert code(bob.am.Update([before["n1"]], bob_creds, three_nodes(), {})) == 12
    assert code(bob.am.Cancel([before["n1"]], bob_creds, {})) == 12
    # malformed RSpec
    bad = alice.am.Update([urn], creds, "<rspec", {})
    assert code(bad) == 1 and bad["output"]
    # a link naming an interface no node has
    stray = request_rspec([vm("n1", ifaces=["n1:if0"])], [{"client_id": "l1", "ifaces": ["n1:if0", "zz:if0"]}])
    reply = alice.am.Update([urn], creds, stray, {})
    assert code(reply) == 1 and "zz:if0" in reply["output"]
    # a kept node may not change its type in place
    retyped = request_rspec([vm("n1", ifaces=["n1:if0"], sliver_type="XOLarge"), vm("n2", ifaces=["n2:if0"])],
                            [{"client_id": "l1", "ifaces": ["n1:if0", "n2:if0"]}])
    reply = alice.am.Update([urn], creds, retyped, {})
    assert code(reply) == 1 and "n1" in reply["output"] and "sliver_type" in reply["output"]
    # slivers not in the slice
    other, ocreds, theirs = provisioned_pair(alice, "updother")
    reply = alice.am.Update([urn, theirs["n1"]], creds, three_nodes(), {})
    assert code(reply) == 12 and theirs["n1"] in reply["output"]
    ghost = f"urn:publicid:IDN+{AUTHORITY}+sliver+0123456789abcdef"
    assert code(alice.am.Update([ghost], creds, three_nodes(), {})) == 12
    # a stitched link (another aggregate's interface) is refused, naming it
    stitched = request_rspec([vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0"])],
                             [{"client_id": "l1", "ifaces": ["n1:if0", "n2:if0"]}]).replace(
        '<link client_id="l1">',
        '<link client_id="l1"><component_manager name="urn:publicid:IDN+other.net+authority+am"/>')
    reply = alice.am.Update([urn], creds, stitched, {})
    assert code(reply) == 13 and "l1" in reply["output"]
    # an FPGA sliver (a virtual router) is refused, naming it
    router = three_nodes().replace(
        '<node client_id="n3">', '<node client_id="n3"><fpga:sliver xmlns:fpga="http://slicex.dev/rspec/ext/fpga/1" '
        'type="virtual-router" bandwidth_mbps="2"/>')
    reply = alice.am.Update([urn], creds, router, {})
    assert code(reply) == 13 and "n3: it is an FPGA sliver" in reply["output"]
    # nothing pending and nothing only allocated: Cancel says so
    reply = alice.am.Cancel([urn], creds, {})
    assert code(reply) == 12 and "nothing to cancel" in reply["output"]
    # after all of that, the slice is as it was
    assert slivers_of(alice, urn, creds) == before and states(alice, urn, creds) == {"geni_provisioned"}


def test_update_is_all_or_nothing_unless_best_effort(running):
    alice, bob = running.user("alice"), running.user("bob")
    bm = f"urn:publicid:IDN+{AUTHORITY}+node+bm1"
    burn, bcreds = bob.slice_credential("updbm")
    ok(bob.am.Allocate(burn, bcreds, request_rspec([{"client_id": "b", "component_id": bm,
                                                       "sliver_type": "raw-pc"}]), {}))
    urn, creds, before = provisioned_pair(alice, "updbe")
    wanted = request_rspec([vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0", "n2:if1"]),
                            vm("n3", ifaces=["n3:if0", "n3:if1"]),
                            {"client_id": "b", "component_id": bm, "sliver_type": "raw-pc", "ifaces": ["b:if0"]}],
                           [{"client_id": "l1", "ifaces": ["n1:if0", "n2:if0"]},
                            {"client_id": "l2", "ifaces": ["n2:if1", "n3:if0"]},
                            {"client_id": "l3", "ifaces": ["n3:if1", "b:if0"]}])
    refused = alice.am.Update([urn], creds, wanted, {})
    assert code(refused) == 26 and "b" in refused["output"] and "nothing was changed" in refused["output"]
    assert slivers_of(alice, urn, creds) == before and states(alice, urn, creds) == {"geni_provisioned"}
    value = ok(alice.am.Update([urn], creds, wanted, {"geni_best_effort": True}))
    errors = {s["geni_client_id"]: s["geni_error"] for s in value["geni_slivers"] if s["geni_error"]}
    assert set(errors) == {"b", "l3"} and "bm1" in errors["b"] and "b" in errors["l3"]
    ok(alice.am.Provision([urn], creds, {"geni_rspec_version": RSPEC_V3}))
    assert set(slivers_of(alice, urn, creds)) == {"n1", "n2", "n3", "l1", "l2"}
    assert states(alice, urn, creds) == {"geni_provisioned"}


def test_deleting_the_slivers_of_a_staged_update_leaves_no_update_pending(running):
    alice = running.user("alice")
    urn, creds, _ = provisioned_pair(alice, "upddel")
    ok(alice.am.Update([urn], creds, three_nodes(), {}))
    ok(alice.am.Delete([urn], creds, {}))
    ok(alice.am.Allocate(urn, creds, two_nodes(), {}))
    ok(alice.am.Provision([urn], creds, {"geni_rspec_version": RSPEC_V3}))
    value = ok(alice.am.Update([urn], creds, three_nodes(), {}))  # was INPROGRESS: the deleted slice's Update
    assert {s["geni_allocation_status"] for s in value["geni_slivers"]} == {"geni_updating"}


def test_update_of_an_advance_reservation_is_refused_naming_its_start(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("updadv")
    start = running.clock.now() + timedelta(days=2)
    ok(alice.am.Allocate(urn, creds, two_nodes(), {"geni_start_time": start.strftime("%Y-%m-%dT%H:%M:%SZ")}))
    reply = alice.am.Update([urn], creds, three_nodes(), {})
    assert code(reply) == 1 and "advance reservation" in reply["output"]


def test_status_and_describe_say_what_a_staged_update_will_do(running):
    """Per sliver, in Status (`sx_update_action`) and in the manifest (`update:action`): a node left alone is
    kept, nodes whose ports change are rewired, a node and a link left out are removed, a new node added, and
    the link whose capacity changes has two slivers under one client_id, told apart: replaced and replacing
    (in the manifest, whose client_ids are unique, the replacing one is the replaced link's replacement)."""
    from rspec.namespaces import UPDATE
    from rspec.validate import validate_rspec

    alice = running.user("alice")
    urn, creds = alice.slice_credential("updsay")
    before = request_rspec([vm("n0"), vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0", "n2:if1"]),
                            vm("n3", ifaces=["n3:if0"])],
                           [{"client_id": "l1", "ifaces": ["n1:if0", "n2:if0"]},
                            {"client_id": "l2", "ifaces": ["n2:if1", "n3:if0"]}])
    ok(alice.am.Allocate(urn, creds, before, {}))
    ok(alice.am.Provision([urn], creds, {"geni_rspec_version": RSPEC_V3}))
    old = slivers_of(alice, urn, creds)
    desired = request_rspec([vm("n0"), vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0"]), vm("n4")],
                            [{"client_id": "l1", "ifaces": ["n1:if0", "n2:if0"], "capacity": 200000}])
    ok(alice.am.Update([urn], creds, desired, {}))
    status = ok(alice.am.Status([urn], creds, {}))["geni_slivers"]
    said = sorted((s["geni_client_id"], s["sx_update_action"]) for s in status)
    assert said == [("l1", "replaced"), ("l1", "replacing"), ("l2", "removed"), ("n0", "kept"), ("n1", "rewired"),
                    ("n2", "rewired"), ("n3", "removed"), ("n4", "added")]
    assert {s["geni_allocation_status"] for s in status} == {"geni_updating"}
    replaced = next(s["geni_sliver_urn"] for s in status if s["sx_update_action"] == "replaced")
    assert replaced == old["l1"]
    replacing = next(s["geni_sliver_urn"] for s in status if s["sx_update_action"] == "replacing")
    manifest = ok(alice.am.Describe([urn], creds, {"geni_rspec_version": RSPEC_V3}))["geni_rspec"]
    root = etree.fromstring(manifest.encode())
    links = {el.get("client_id"): el for el in root.iter(f"{{{RSPEC3}}}link")}
    assert len(list(root.iter(f"{{{RSPEC3}}}link"))) == 2  # client_ids stay unique: l1 and l2
    assert links["l1"].get("sliver_id") == old["l1"] and links["l1"].get(f"{{{UPDATE}}}action") == "replaced"
    assert links["l2"].get(f"{{{UPDATE}}}action") == "removed"
    box = links["l1"].find(f"{{{UPDATE}}}replacement")
    assert box.get("sliver_id") == replacing and replacing not in old.values()
    assert {p.get("capacity") for p in box.iter(f"{{{RSPEC3}}}property")} == {"200000"}
    assert "200000" not in {p.get("capacity") for p in links["l1"].findall(f"{{{RSPEC3}}}property")}
    assert validate_rspec(manifest, "manifest") == []
    nodes = {el.get("client_id"): el.get(f"{{{UPDATE}}}action") for el in root.iter(f"{{{RSPEC3}}}node")}
    assert nodes == {"n0": "kept", "n1": "rewired", "n2": "rewired", "n3": "removed", "n4": "added"}
    # committed: nothing is updating any more, and neither says an action
    ok(alice.am.Provision([urn], creds, {"geni_rspec_version": RSPEC_V3}))
    status = ok(alice.am.Status([urn], creds, {}))["geni_slivers"]
    assert all("sx_update_action" not in s for s in status)
    assert sorted(s["geni_client_id"] for s in status) == ["l1", "n0", "n1", "n2", "n4"]
    manifest = ok(alice.am.Describe([urn], creds, {"geni_rspec_version": RSPEC_V3}))["geni_rspec"]
    assert UPDATE not in manifest


def addresses(user, urn: str, creds: list) -> dict[str, str]:
    """interface client_id -> its address, from Describe's manifest."""
    manifest = ok(user.am.Describe([urn], creds, {"geni_rspec_version": RSPEC_V3}))["geni_rspec"]
    root = etree.fromstring(manifest.encode())
    return {i.get("client_id"): ip.get("address") for i in root.iter(f"{{{RSPEC3}}}interface")
            for ip in i.iter(f"{{{RSPEC3}}}ip")}


def test_an_update_keeps_the_addresses_of_the_interfaces_it_keeps(running):
    """Extending a link (n3 joins l1, named first) renumbered the nodes already on it (n1 10.10.0.1 ->
    10.10.1.1): now they keep theirs and n3 gets a free address of the same subnet; then n1 leaves the link and
    n4 joins: n4 takes the address n1 gave back, n2 and n3 keep theirs."""
    alice = running.user("alice")
    urn, creds, _ = provisioned_pair(alice, "updaddr")
    before = addresses(alice, urn, creds)
    assert set(before) == {"n1:if0", "n2:if0"} and before["n1:if0"] != before["n2:if0"]
    subnet = before["n1:if0"].rsplit(".", 1)[0]
    wider = request_rspec([vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0"]), vm("n3", ifaces=["n3:if0"])],
                          [{"client_id": "l1", "ifaces": ["n3:if0", "n1:if0", "n2:if0"]}])
    ok(alice.am.Update([urn], creds, wider, {}))
    ok(alice.am.Provision([urn], creds, {"geni_rspec_version": RSPEC_V3}))
    after = addresses(alice, urn, creds)
    assert {k: after[k] for k in before} == before
    assert after["n3:if0"].rsplit(".", 1)[0] == subnet and after["n3:if0"] not in before.values()
    moved = request_rspec([vm("n2", ifaces=["n2:if0"]), vm("n3", ifaces=["n3:if0"]), vm("n4", ifaces=["n4:if0"])],
                          [{"client_id": "l1", "ifaces": ["n4:if0", "n3:if0", "n2:if0"]}])
    ok(alice.am.Update([urn], creds, moved, {}))
    ok(alice.am.Provision([urn], creds, {"geni_rspec_version": RSPEC_V3}))
    last = addresses(alice, urn, creds)
    assert last == {"n2:if0": after["n2:if0"], "n3:if0": after["n3:if0"], "n4:if0": before["n1:if0"]}
    # the authority's driver was given the same addresses the manifest shows
    sm, now = running.deployment.sm, running.clock.now()
    n4 = next(s for s in sm.slivers(urn, now) if s.client_id == "n4")
    assert n4.details["interfaces"]["n4:if0"]["ip"] == before["n1:if0"]
