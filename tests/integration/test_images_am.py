"""The image and dataset calls at an aggregate whose substrate has neither (the emulated one), in both
deployments over mutual TLS: CreateImage reaches the authority (over the actors' RPC when distributed) and
answers UNSUPPORTED saying why, never a fake image; malformed calls are BADARGS before anything is looked up;
a node asking for a dataset is refused at Provision instead of running without its data. The real thing on
container nodes: test_images_datasets_netns.py."""

from __future__ import annotations

from lxml import etree

from rspec.namespaces import EMULAB
from tests.factories import RSPEC3, request_rspec, vm
from tests.integration.conftest import AUTHORITY, Running
from tests.integration.test_am_api import code, ok


def _provisioned_node(running: Running, name: str) -> tuple:
    alice = running.user("alice")
    urn, cred = alice.slice_credential(name)
    ok(alice.am.Allocate(urn, cred, request_rspec([vm("n1")]), {}))
    manifest = ok(alice.am.Provision([urn], cred, {"geni_users": []}))["geni_rspec"]
    return alice, urn, cred, etree.fromstring(manifest.encode()).find(f"{{{RSPEC3}}}node").get("sliver_id")


def test_an_aggregate_that_cannot_snapshot_says_so(running: Running):
    alice, urn, cred, sliver = _provisioned_node(running, "emu")
    reply = alice.am.CreateImage(urn, "snap", sliver, cred, {"global": True})
    assert code(reply) == 13 and "cannot make images" in reply["output"], reply
    ucred = alice.user_credential()
    for reply in (alice.am.ListImages("", ucred, {}), alice.am.ListDatasets("", ucred, {}),
                  alice.am.DeleteImage(f"urn:publicid:IDN+{AUTHORITY}+image+snap", ucred, {}),
                  alice.am.DeleteDataset("results", ucred, {})):
        assert code(reply) == 13, reply


def test_malformed_image_calls_are_bad_arguments_and_others_slices_are_refused(running: Running):
    alice, urn, cred, sliver = _provisioned_node(running, "emu2")
    ucred = alice.user_credential()
    assert code(alice.am.CreateImage(urn, "snap", sliver, cred, {"global": "yes"})) == 1
    assert code(alice.am.CreateImage(urn, 7, sliver, cred, {})) == 1
    assert code(alice.am.CreateImage(urn, "snap", urn, cred, {})) == 1  # a slice URN where the node's goes
    assert code(alice.am.DeleteImage(f"urn:publicid:IDN+{AUTHORITY}+slice+emu2", ucred, {})) == 1
    assert code(alice.am.ListImages("not-a-urn", ucred, {})) == 1
    bob = running.user("bob")
    _urn_b, cred_b = bob.slice_credential("emub")
    refused = bob.am.CreateImage(urn, "steal", sliver, cred_b, {"global": True})  # alice's slice, bob's credential
    assert code(refused) == 22 and "credential is for" in refused["output"], refused  # nothing was snapshot
    assert code(alice.am.CreateImage(urn, "snap", f"urn:publicid:IDN+{AUTHORITY}+sliver+{'0' * 16}", cred, {})) == 12


def test_a_node_asking_for_a_dataset_is_refused_where_there_are_none(running: Running):
    alice = running.user("alice")
    urn, cred = alice.slice_credential("emuds")
    root = etree.fromstring(request_rspec([vm("n1")]).encode())
    etree.SubElement(root.find(f"{{{RSPEC3}}}node"), f"{{{EMULAB}}}blockstore", name="bs", dataset="results",
                     mountpoint="/data", size="64MB")
    ok(alice.am.Allocate(urn, cred, etree.tostring(root).decode(), {}))
    refused = alice.am.Provision([urn], cred, {"geni_users": []})
    assert code(refused) == 13 and "no persistent datasets" in refused["output"], refused


def test_only_a_provisioned_node_is_made_an_image_of(running: Running):
    alice = running.user("alice")
    urn, cred = alice.slice_credential("emu3")
    rspec = request_rspec([vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0"])],
                          [{"client_id": "l0", "ifaces": ["n1:if0", "n2:if0"]}])
    slivers = {s["geni_client_id"]: s["geni_sliver_urn"] for s in ok(alice.am.Allocate(urn, cred, rspec, {}))["geni_slivers"]}
    reply = alice.am.CreateImage(urn, "snap", slivers["n1"], cred, {})
    assert code(reply) == 1 and "not provisioned" in reply["output"], reply
    ok(alice.am.Provision([urn], cred, {"geni_users": []}))
    reply = alice.am.CreateImage(urn, "snap", slivers["l0"], cred, {})
    assert code(reply) == 1 and "an image is made of a node" in reply["output"], reply
