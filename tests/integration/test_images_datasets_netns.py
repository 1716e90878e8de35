"""Users' images and persistent datasets on real container nodes, over mutual TLS. Images, with the
arguments omni sends: CreateImage of a node with a file written in it, a later slice booting that image (by
name, as a ProtoGENI user writes it) sees the file; ListImages and DeleteImage; another user can neither boot
nor delete the private image; (an aggregate whose substrate cannot snapshot: test_images_am.py). Datasets: a
file written in a dataset (emulab:blockstore) in one slice is read in a later slice of its owner; another
user cannot mount or delete it. `slicex up --substrate netns` runs in a process of its own, with an image
catalogue (the host's default image linked into it) and a datasets directory of the test's own."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from lxml import etree

from authority.substrate.container import NodeContainer
from authority.substrate.images import DEFAULT_DIR, DEFAULT_IMAGE, ImageCatalogue
from authority.substrate.netns import NetnsDriver
from authority.substrate.netns_plan import netns_name
from rspec.namespaces import EMULAB
from slicex import procs
from slicex.tls_xmlrpc import client
from tests.factories import RSPEC3, request_rspec, vm
from tests.integration.conftest import AUTHORITY, make_home
from tests.integration.netns_support import cleanup, new_prefix, require_host
from tests.integration.test_netns_am import Up, ok

USES_HOST_NETWORK = True
V3 = {"geni_rspec_version": {"type": "GENI", "version": "3"}}


def code(reply: dict) -> int:
    return reply["code"]["geni_code"]


def node(image: str | None = None, **blockstore: str) -> str:
    """A one-node request, with a disk_image and an emulab:blockstore (name, dataset, mountpoint, size) if given."""
    root = etree.fromstring(request_rspec([vm("n1")]).encode())
    n = root.find(f"{{{RSPEC3}}}node")
    if image is not None:
        etree.SubElement(n.find(f"{{{RSPEC3}}}sliver_type"), f"{{{RSPEC3}}}disk_image").set("name", image)
    if blockstore:
        etree.SubElement(n, f"{{{EMULAB}}}blockstore", **blockstore)
    return etree.tostring(root).decode()


@pytest.fixture
def images_home(tmp_path: Path):
    require_host()
    host = ImageCatalogue(DEFAULT_DIR)
    if host.get(DEFAULT_IMAGE) is None:
        host.build(DEFAULT_IMAGE)  # what the first netns `up` of this host does anyway
    catalogue = tmp_path / "images"
    catalogue.mkdir()
    (catalogue / DEFAULT_IMAGE).symlink_to(DEFAULT_DIR / DEFAULT_IMAGE)  # the operator's image, not copied
    prefix = new_prefix()
    datasets = Path("/var/lib") / f"slicex-{prefix}-datasets"  # a node's root passes through it (not tmp_path's 0700)
    home = make_home(tmp_path / "home", substrate_driver="netns",
                     netns={"prefix": prefix, "images_dir": str(catalogue), "image_quota_mb": 1024,
                            "datasets_dir": str(datasets), "dataset_quota_mb": 256})
    up = Up(home)
    try:
        yield home, up, prefix, ImageCatalogue(catalogue)
    finally:
        up.stop()
        subprocess.run([sys.executable, "-m", "cli", "--home", str(home.root), "down"], capture_output=True,
                       timeout=60)
        cleanup(NetnsDriver(prefix))
        for mnt in datasets.glob("*/mnt"):
            subprocess.run(["umount", str(mnt)], capture_output=True)
        shutil.rmtree(datasets, ignore_errors=True)


def people(home, am_url: str) -> dict[str, tuple]:
    """Per user: AM client, SA client, user URN, user credential (as omni sends it)."""
    sa_url = procs.read(home.pid_file).info["sa_url"]
    out = {}
    for name in ("alice", "bob"):
        cert, key = str(home.user_cert(name)), str(home.user_key(name))
        sa = client(sa_url, cert, key)
        out[name] = (client(am_url, cert, key), sa, f"urn:publicid:IDN+{AUTHORITY}+user+{name}",
                     [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": sa.CreateUserCredential()}])
    return out


def new_slice(sa, name: str) -> tuple[str, list]:
    urn = f"urn:publicid:IDN+{AUTHORITY}+slice+{name}"
    return urn, [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": sa.CreateSlice(urn)}]


def slice_with(am, sa, name: str, rspec: str) -> tuple[str, list, str]:
    """A started one-node slice: its URN, credentials and the node's sliver URN."""
    urn, cred = new_slice(sa, name)
    ok(am.Allocate(urn, cred, rspec, {}))
    manifest = ok(am.Provision([urn], cred, {"geni_users": []}))["geni_rspec"]
    ok(am.PerformOperationalAction([urn], cred, "geni_start", {}))
    return urn, cred, etree.fromstring(manifest.encode()).find(f"{{{RSPEC3}}}node").get("sliver_id")


def inside(prefix: str, sliver: str, *argv: str) -> tuple[int | None, str]:
    """Run a command in a node as its root."""
    rc, out = NodeContainer(NetnsDriver(prefix).lxcpath, netns_name(prefix, sliver)).attach(list(argv))
    return rc, out.decode()


def test_an_image_of_a_node_boots_in_a_later_slice_of_its_owner_and_no_one_elses(images_home):
    home, up, prefix, catalogue = images_home
    users = people(home, up.start())
    am_a, sa_a, alice, ucred_a = users["alice"]
    am_b, sa_b, bob, ucred_b = users["bob"]

    urn1, cred1, n1 = slice_with(am_a, sa_a, "img1", node())
    assert inside(prefix, n1, "sh", "-c", "echo made-in-slice-1 > /root/marker && rm /etc/motd")[0] == 0
    # as omni createimage sends it: slice URN, image name, sliver URN, credentials, {global: makePublic}
    image = ok(am_a.CreateImage(urn1, "Snap1", n1, cred1, {"global": False}))
    assert image == f"urn:publicid:IDN+{AUTHORITY}+image+snap1"
    snap = catalogue.get("snap1")
    assert (snap.owner, snap.public, snap.base) == (alice, False, DEFAULT_IMAGE)
    assert (snap.rootfs / "root/marker").stat().st_uid == 0  # owners moved back out of the slice's uid range
    listed = ok(am_a.ListImages(alice, ucred_a, {}))
    assert [(i["urn"], i["owner"], i["public"]) for i in listed] == [(image, alice, False)]
    assert listed[0]["size_bytes"] > 0 and listed[0]["base"] == DEFAULT_IMAGE
    assert ok(am_b.ListImages(alice, ucred_b, {})) == []  # bob does not see alice's private image
    assert ok(am_a.ListImages("", ucred_a, {})) == listed  # omni passes the caller when no creator is named

    # another user's private image: refused at Allocate as if it did not exist, and it is not advertised
    bob_urn, bob_cred = new_slice(sa_b, "imgb")
    refused = am_b.Allocate(bob_urn, bob_cred, node("snap1"), {})
    assert code(refused) == 1 and "not offered" in refused["output"], refused
    refused = am_b.Allocate(bob_urn, bob_cred, node(image), {})
    assert code(refused) == 1 and "snap1" not in refused["output"].split("offered:")[-1]
    assert "snap1" not in ok(am_b.ListResources(ucred_b, V3))
    # nor deleted by him: answered as an image that does not exist
    assert code(am_b.DeleteImage(image, ucred_b, {})) == 12
    assert code(am_b.CreateImage(urn1, "steal", n1, bob_cred, {"global": True})) != 0  # not his slice

    # a later slice of alice's boots it by name and sees the file written in the first
    urn2, cred2, n2 = slice_with(am_a, sa_a, "img2", node("snap1"))
    status = ok(am_a.Status([urn2], cred2, {}))
    assert {s["geni_operational_status"] for s in status["geni_slivers"]} == {"geni_ready"}, status
    assert inside(prefix, n2, "cat", "/root/marker") == (0, "made-in-slice-1\n")
    assert inside(prefix, n2, "test", "-e", "/etc/motd")[0] == 1  # and what was deleted there stays deleted
    manifest = ok(am_a.Describe([urn2], cred2, V3))["geni_rspec"]
    assert "snap1" in manifest

    # an image made public is advertised to everyone at once (not after the aggregate's next start), and is
    # gone from the advertisement once deleted
    shared = ok(am_a.CreateImage(urn2, "Shared", n2, cred2, {"global": True}))
    assert "image+shared" in ok(am_b.ListResources(ucred_b, V3))
    assert ok(am_a.DeleteImage(shared, ucred_a, {})) is True
    assert "image+shared" not in ok(am_b.ListResources(ucred_b, V3))

    ok(am_a.Delete([urn1], cred1, {}))
    ok(am_a.Delete([urn2], cred2, {}))
    assert ok(am_a.DeleteImage(image, ucred_a, {})) is True
    assert catalogue.get("snap1") is None and ok(am_a.ListImages(alice, ucred_a, {})) == []
    assert code(am_a.DeleteImage(image, ucred_a, {})) == 12
    assert NetnsDriver(prefix).leftovers() == []


def test_a_dataset_written_in_one_slice_is_read_in_a_later_slice_of_its_owner_alone(images_home):
    home, up, prefix, _catalogue = images_home
    users = people(home, up.start())
    am_a, sa_a, alice, ucred_a = users["alice"]
    am_b, sa_b, _bob, ucred_b = users["bob"]
    dataset = f"urn:publicid:IDN+{AUTHORITY}+ltdataset+results"
    urn1, cred1, n1 = slice_with(am_a, sa_a, "ds1", node(name="bs", dataset=dataset, mountpoint="/mydata",
                                                         size="64MB"))
    assert inside(prefix, n1, "sh", "-c", "echo 42 > /mydata/answer && mkdir /mydata/runs")[0] == 0
    rc, df = inside(prefix, n1, "df", "-m", "/mydata")
    assert rc == 0 and int(df.splitlines()[1].split()[1]) <= 64, df  # the size asked, enforced by its file system
    manifest = ok(am_a.Describe([urn1], cred1, V3))["geni_rspec"]
    shown = etree.fromstring(manifest.encode()).find(f"{{{RSPEC3}}}node/{{{EMULAB}}}blockstore")
    assert shown is not None and shown.get("dataset") == dataset and shown.get("mountpoint") == "/mydata"
    ok(am_a.Delete([urn1], cred1, {}))
    listed = ok(am_a.ListDatasets(alice, ucred_a, {}))
    assert [(d["name"], d["owner"], d["size_mb"], d["in_use"]) for d in listed] == [("results", alice, 64, False)]

    # bob names alice's dataset: his node is refused and never sees it; he cannot list or delete it
    bob_urn, bob_cred = new_slice(sa_b, "dsb")
    ok(am_b.Allocate(bob_urn, bob_cred, node(name="bs", dataset="results", mountpoint="/mydata"), {}))
    refused = am_b.Provision([bob_urn], bob_cred, {"geni_users": []})
    assert code(refused) == 3 and "belongs to another user" in refused["output"], refused
    assert ok(am_b.ListDatasets(alice, ucred_b, {})) == []
    assert code(am_b.DeleteDataset("results", ucred_b, {})) == 12

    urn2, cred2, n2 = slice_with(am_a, sa_a, "ds2", node(name="bs", dataset="results", mountpoint="/data"))
    assert inside(prefix, n2, "cat", "/data/answer") == (0, "42\n")
    assert inside(prefix, n2, "sh", "-c", "echo more > /data/runs/2")[0] == 0  # its root owns the files
    assert code(am_a.DeleteDataset("results", ucred_a, {})) == 7  # not while a node mounts it
    ok(am_a.Delete([urn2], cred2, {}))
    assert ok(am_a.DeleteDataset(dataset, ucred_a, {})) is True
    assert ok(am_a.ListDatasets(alice, ucred_a, {})) == []
    assert NetnsDriver(prefix).leftovers() == []

