"""A slice member is not the slice's creator: what he adds to her slice through Update is his, as what he
Allocates is. On real container nodes, over mutual TLS: alice has a private dataset; bob, a member of her slice
(added at the slice authority, as omni's addMemberToSliceAndSlivers does), adds a node to her slice naming her
dataset, through Update and through Allocate. Both are refused (FORBIDDEN) and no node of the slice mounts it.
Likewise a node he adds through Update naming her private image is refused as an image not offered to him.

Before, the Update was committed: the node Update added took the slice creator as its owner, so the dataset was
mounted in bob's node and he read alice's files (her private images were booted for him the same way)."""

from __future__ import annotations

from lxml import etree

from slicex import procs
from slicex.tls_xmlrpc import client
from tests.factories import RSPEC3, request_rspec, vm
from tests.integration.conftest import AUTHORITY
from tests.integration.test_images_datasets_netns import (  # noqa: F401 - images_home is a fixture
    code,
    images_home,
    inside,
    node,
    people,
    slice_with,
)
from tests.integration.test_netns_am import ok

USES_HOST_NETWORK = True
DATASET = f"urn:publicid:IDN+{AUTHORITY}+ltdataset+private"


def two_nodes(blockstore: dict[str, str]) -> str:
    """alice's node n1 and a node n2 naming a dataset: the complete desired RSpec of an Update."""
    root = etree.fromstring(request_rspec([vm("n1"), vm("n2")]).encode())
    n2 = [n for n in root.findall(f"{{{RSPEC3}}}node") if n.get("client_id") == "n2"][0]
    etree.SubElement(n2, "{http://www.protogeni.net/resources/rspec/ext/emulab/1}blockstore", **blockstore)
    return etree.tostring(root).decode()


def test_a_slice_member_cannot_mount_the_slice_creators_dataset(images_home):  # noqa: F811 - the fixture
    home, up, prefix, _catalogue = images_home
    am_url = up.start()
    users = people(home, am_url)
    am_a, sa_a, alice, ucred_a = users["alice"]
    am_b, _sa_b, bob, _ucred_b = users["bob"]
    urn1, cred1, n1 = slice_with(am_a, sa_a, "ds1", node(name="bs", dataset=DATASET, mountpoint="/mydata",
                                                         size="64MB"))
    assert inside(prefix, n1, "sh", "-c", "echo alices-secret > /mydata/secret")[0] == 0
    ok(am_a.Delete([urn1], cred1, {}))

    # alice's slice with one node, bob a member of it at the slice authority (CH API), with its credential
    chapi = procs.read(home.pid_file).info["chapi_url"]
    ch = {name: client(f"{chapi}/SA", str(home.user_cert(name)), str(home.user_key(name))) for name in ("alice", "bob")}
    urn = ok_ch(ch["alice"].create_slice([], {"fields": {"SLICE_NAME": "shared"}}))["SLICE_URN"]
    cred_a = ok_ch(ch["alice"].get_credentials(urn, [], {}))
    ok(am_a.Allocate(urn, cred_a, request_rspec([vm("n1")]), {}))
    ok(am_a.Provision([urn], cred_a, {"geni_users": []}))
    ok(am_a.PerformOperationalAction([urn], cred_a, "geni_start", {}))
    ok_ch(ch["alice"].modify_slice_membership(urn, [], {"members_to_add": [
        {"SLICE_MEMBER": bob, "SLICE_ROLE": "MEMBER"}]}))
    cred_b = ok_ch(ch["bob"].get_credentials(urn, [], {}))

    # bob's Update adds n2 naming alice's dataset: staged (n1 is provisioned), then his Provision commits it
    desired = two_nodes({"name": "bs", "dataset": "private", "mountpoint": "/mydata"})
    updated = am_b.Update([urn], cred_b, desired, {})
    if code(updated) == 0:
        committed = am_b.Provision([urn], cred_b, {"geni_users": []})
        assert code(committed) == 3 and "belongs to another user" in committed["output"], committed
    else:
        assert code(updated) == 3 and "belongs to another user" in updated["output"], updated
    # bob Allocates n3 into her slice naming it: his own node, refused the same way
    third = request_rspec([vm("n3")]).replace(
        "</node>", '<emulab:blockstore xmlns:emulab="http://www.protogeni.net/resources/rspec/ext/emulab/1" '
                   'name="bs" dataset="private" mountpoint="/mydata"/></node>')
    allocated = am_b.Allocate(urn, cred_b, third, {})
    if code(allocated) == 0:
        provisioned = am_b.Provision([urn], cred_b, {"geni_users": []})
        assert code(provisioned) == 3 and "belongs to another user" in provisioned["output"], provisioned

    listed = ok(am_a.ListDatasets(alice, ucred_a, {}))
    assert [(d["name"], d["in_use"]) for d in listed] == [("private", False)]  # no node mounts it
    manifest = ok(am_a.Describe([urn], cred_a, {"geni_rspec_version": {"type": "GENI", "version": "3"}}))
    for n in etree.fromstring(manifest["geni_rspec"].encode()).findall(f"{{{RSPEC3}}}node"):
        if n.get("sliver_id"):
            rc, out = inside(prefix, n.get("sliver_id"), "cat", "/mydata/secret")
            assert "alices-secret" not in out, (n.get("client_id"), rc, out)
    ok(am_a.Delete([urn], cred_a, {}))
    assert ok(am_a.DeleteDataset(DATASET, ucred_a, {})) is True


def test_a_slice_member_cannot_boot_the_slice_creators_private_image_through_update(images_home):  # noqa: F811
    home, up, prefix, catalogue = images_home
    users = people(home, up.start())
    am_a, sa_a, _alice, ucred_a = users["alice"]
    am_b, _sa_b, bob, _ucred_b = users["bob"]
    urn1, cred1, n1 = slice_with(am_a, sa_a, "img1", node())
    assert inside(prefix, n1, "sh", "-c", "echo alices-image > /root/marker")[0] == 0
    image = ok(am_a.CreateImage(urn1, "private1", n1, cred1, {"global": False}))
    ok(am_a.Delete([urn1], cred1, {}))

    chapi = procs.read(home.pid_file).info["chapi_url"]
    ch = {name: client(f"{chapi}/SA", str(home.user_cert(name)), str(home.user_key(name))) for name in ("alice", "bob")}
    urn = ok_ch(ch["alice"].create_slice([], {"fields": {"SLICE_NAME": "shared-img"}}))["SLICE_URN"]
    cred_a = ok_ch(ch["alice"].get_credentials(urn, [], {}))
    ok(am_a.Allocate(urn, cred_a, request_rspec([vm("n1")]), {}))
    ok(am_a.Provision([urn], cred_a, {"geni_users": []}))
    ok_ch(ch["alice"].modify_slice_membership(urn, [], {"members_to_add": [
        {"SLICE_MEMBER": bob, "SLICE_ROLE": "MEMBER"}]}))
    cred_b = ok_ch(ch["bob"].get_credentials(urn, [], {}))

    desired = request_rspec([vm("n1"), vm("n2", image="private1")])
    updated = am_b.Update([urn], cred_b, desired, {})
    if code(updated) == 0:  # staged: his Provision would commit it
        committed = am_b.Provision([urn], cred_b, {"geni_users": []})
        assert code(committed) != 0, committed
    else:
        assert code(updated) == 1 and "not offered" in updated["output"], updated
    slivers = ok(am_a.Status([urn], cred_a, {}))["geni_slivers"]
    assert len(slivers) == 1, slivers  # only alice's n1: nothing booted her image for him
    ok(am_a.Delete([urn], cred_a, {}))
    assert ok(am_a.DeleteImage(image, ucred_a, {})) is True
    assert catalogue.get("private1") is None


def ok_ch(reply: dict):
    """The value of a CH API answer (code 0), else fail with its output."""
    assert reply["code"] == 0, reply
    return reply["value"]
