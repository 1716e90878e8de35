"""Persistent datasets without containers: the emulab:blockstore element read as untrusted input (names and
mountpoints that could reach a path outside, sizes), the dataset store's ownership, one holder at a time,
the per-user size limit, files moved into the uid range of the slice that mounts them, and deletion by the
owner only. The store's tests make real ext4 file systems on loop devices (root)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from lxml import etree

from authority.substrate.container import NodeLimits, container_config
from authority.substrate.datasets import DatasetStore, UserDatasets, shift_owners
from rspec.blockstore import Blockstore, check_mountpoint, dataset_name, parse_blockstores, size_mb
from rspec.namespaces import EMULAB, RSPEC3
from rspec.request import parse_request
from slicex.errors import BadArgs, Forbidden, Refused, SearchFailed, TooBig

ALICE = "urn:publicid:IDN+a.b+user+alice"
BOB = "urn:publicid:IDN+a.b+user+bob"
BASE1, BASE2 = 100_000_000, 100_065_536
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="mkfs, loop mounts and chown need root")


def _node(*blockstores: dict[str, str]) -> etree._Element:
    node = etree.Element(f"{{{RSPEC3}}}node", client_id="n1", nsmap={None: RSPEC3, "emulab": EMULAB})
    for attrs in blockstores:
        etree.SubElement(node, f"{{{EMULAB}}}blockstore", **attrs)
    return node


def test_a_blockstore_is_read_as_cloudlab_writes_it():
    got = parse_blockstores(_node({"name": "bs1", "mountpoint": "/mydata", "size": "1GB",
                                   "dataset": "urn:publicid:IDN+a.b:proj+ltdataset+proj//Results"}), "n1")
    assert got == (Blockstore("bs1", "results", "/mydata", 1024),)
    assert Blockstore.from_doc(got[0].to_doc()) == got[0]
    assert parse_blockstores(_node({"mountpoint": "/d", "dataset": "mine"}), "n1") == (Blockstore("mine", "mine", "/d"),)
    xml = ('<rspec xmlns="http://www.geni.net/resources/rspec/3" '
           'xmlns:emulab="http://www.protogeni.net/resources/rspec/ext/emulab/1" type="request">'
           '<node client_id="n1"><emulab:blockstore name="b" mountpoint="/data" size="64MB" dataset="d1"/></node>'
           '</rspec>')
    assert parse_request(xml).nodes[0].blockstores == (Blockstore("b", "d1", "/data", 64),)


@pytest.mark.parametrize("path", ["/../etc", "/data/../../etc", "relative", "/", "/etc", "/proc/x", "/run/slicex",
                                  "/a b", "/data\n", "/a/./b", "", "/dev/sda", "/usr"])
def test_a_mountpoint_that_leaves_or_hides_the_nodes_own_directories_is_refused(path):
    with pytest.raises(BadArgs):
        check_mountpoint(path, "here")


@pytest.mark.parametrize("name", ["../x", "a/b", "..", "", "x" * 41, "urn:publicid:IDN+a.b+ltdataset+../x",
                                  "urn:publicid:IDN+a.b+slice+x", "-x", "a b"])
def test_a_dataset_name_that_could_name_a_path_is_refused(name):
    with pytest.raises(BadArgs):
        dataset_name(name)


@pytest.mark.parametrize(("text", "mb"), [("512", 512), ("512MB", 512), ("2GB", 2048), ("1 GiB", 1024), ("1t", 1024**2)])
def test_sizes(text, mb):
    assert size_mb(text, "x") == mb


@pytest.mark.parametrize("text", ["0", "-1GB", "1e9", "1PB", "lots", "99999999999999"])
def test_sizes_refused(text):
    with pytest.raises(BadArgs):
        size_mb(text, "x")


def test_a_blockstore_without_a_dataset_or_twice_on_one_mountpoint_is_refused():
    with pytest.raises(BadArgs, match="persistent datasets only"):
        parse_blockstores(_node({"name": "b", "mountpoint": "/d", "size": "1GB"}), "n1")
    with pytest.raises(BadArgs, match="share"):
        parse_blockstores(_node({"mountpoint": "/d", "dataset": "a"}, {"mountpoint": "/d", "dataset": "b"}), "n1")


def test_the_node_binds_its_datasets_at_their_mountpoints():
    cfg = container_config("c", "n1", Path("/rootfs"), BASE1, "/run/netns/x", Path("/h"),
                           NodeLimits(1, 512, "0"), Path("/log"), mounts=[(Path("/ds/d1/mnt"), "/mydata")])
    assert "lxc.mount.entry = /ds/d1/mnt mydata none bind,nosuid,nodev,create=dir 0 0" in cfg.splitlines()


@root_only
def test_owners_follow_the_slice_that_mounts_the_dataset(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d/f").write_text("x")
    (tmp_path / "d/s").write_text("x")
    os.chown(tmp_path / "d/s", 0, 0)
    (tmp_path / "d/s").chmod(0o4755)
    os.chown(tmp_path / "d", 0, 0)
    shift_owners(tmp_path / "d", None, BASE1)  # a fresh file system: given to the slice's root
    assert (tmp_path / "d").stat().st_uid == BASE1 and (tmp_path / "d/s").stat().st_uid == BASE1
    os.chown(tmp_path / "d/f", BASE1 + 1000, BASE1 + 1000)
    shift_owners(tmp_path / "d", BASE1, BASE2)
    assert (tmp_path / "d/f").stat().st_uid == BASE2 + 1000 and (tmp_path / "d").stat().st_uid == BASE2
    assert (tmp_path / "d/s").stat().st_mode & 0o4000


@pytest.fixture
def store(tmp_path):
    s = DatasetStore(tmp_path / "datasets")
    yield s
    for d in s.list():
        s.release(d.holder) if d.holder else None


def _never_busy(holder: str) -> bool:
    return False


@root_only
def test_a_dataset_is_made_on_first_use_and_keeps_its_data_for_its_owner_alone(store):
    mnt = store.attach("d1", 16, ALICE, BASE1, "ns-a", 64, busy=_never_busy)
    assert os.path.ismount(mnt) and mnt.stat().st_uid == BASE1
    (mnt / "result").write_text("42\n")
    os.chown(mnt / "result", BASE1 + 2000, BASE1 + 2000)
    store.release("ns-a")
    assert not os.path.ismount(mnt) and store.get("d1").holder == ""
    with pytest.raises(Forbidden):  # another user's dataset: never mounted for them
        store.attach("d1", 16, BOB, BASE2, "ns-b", 64, busy=_never_busy)
    assert not os.path.ismount(mnt)
    again = store.attach("d1", None, ALICE, BASE2, "ns-c", 64, busy=_never_busy)  # a later slice of alice's
    assert (again / "result").read_text() == "42\n" and (again / "result").stat().st_uid == BASE2 + 2000
    with pytest.raises(Refused):  # one live node at a time
        store.attach("d1", None, ALICE, BASE2, "ns-d", 64, busy=lambda holder: holder == "ns-c")
    store.release("ns-c")


@root_only
def test_datasets_past_the_users_limit_or_unsized_are_refused_and_leave_nothing(store):
    with pytest.raises(BadArgs, match="give its size"):
        store.attach("new", None, ALICE, BASE1, "ns-a", 64, busy=_never_busy)
    store.attach("d1", 40, ALICE, BASE1, "ns-a", 64, busy=_never_busy)
    with pytest.raises(TooBig):
        store.attach("d2", 40, ALICE, BASE1, "ns-b", 64, busy=_never_busy)
    store.attach("d3", 40, BOB, BASE2, "ns-c", 64, busy=_never_busy)  # bob's limit is his own
    assert sorted(d.name for d in store.list()) == ["d1", "d3"]
    assert sorted(p.name for p in store.root.iterdir() if p.name != ".lock") == ["d1", "d3"]
    store.release("ns-a")
    store.release("ns-c")


@root_only
def test_only_the_owner_or_an_operator_deletes_a_dataset_and_not_while_mounted(store):
    store.attach("d1", 16, ALICE, BASE1, "ns-a", 64, busy=_never_busy)
    store.attach("d2", 16, ALICE, BASE1, "ns-b", 64, busy=_never_busy)
    datasets = UserDatasets(store, busy=lambda holder: holder in ("ns-a", "ns-b"))
    assert datasets.listed(ALICE, BOB, operator=False) == []  # nor does bob learn what alice keeps
    assert [d["name"] for d in datasets.listed(ALICE, ALICE, operator=False)] == ["d1", "d2"]
    with pytest.raises(SearchFailed):
        datasets.delete("d1", BOB, operator=False)
    with pytest.raises(Refused):
        datasets.delete("d1", ALICE, operator=False)
    store.release("ns-a")
    with pytest.raises(BadArgs):
        datasets.delete("../d2", ALICE, operator=False)
    assert datasets.delete("urn:publicid:IDN+a.b+ltdataset+d1", ALICE, operator=False)["name"] == "d1"
    store.release("ns-b")
    assert datasets.delete("d2", BOB, operator=True)["name"] == "d2"
    assert store.list() == [] and not (store.root / "d1").exists()


def test_a_substrate_without_datasets_refuses_a_node_that_asks_for_one():
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from authority.actor import EmulatedAdapter
    from protocol.messages import SliverSpec
    from slicex.errors import Unsupported

    made = []
    emulated = EmulatedAdapter(SimpleNamespace(description="emulated", provisioned=lambda kind, now: made.append(kind) or {}))
    asks = SliverSpec("r1", "node", "n1", details={"blockstores": [Blockstore("b", "d", "/d", 8).to_doc()]})
    with pytest.raises(Unsupported, match="no persistent datasets"):
        emulated.create(asks, datetime.now(UTC))
    assert made == []
    emulated.create(SliverSpec("r2", "node", "n2"), datetime.now(UTC))
    assert made == ["node"]
