"""A node's disk is its own (issue 34): a slice user filling it gets ENOSPC inside that node while another slice
still allocates and the aggregate's store is written; `df /` in a node shows the node's size; a node's mount
table names no host path; a node whose disk does not fit the layers' free space less the reserve is refused
naming the numbers; and a node being created or deleted when the authority dies with SIGKILL leaves no loop
device, mount or layer file after the restart. These run real container nodes (netns substrate)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from lxml import etree

from authority.substrate.container import loop_devices, lxc_missing, mounts_under
from authority.substrate.netns import NetnsDriver
from protocol.messages import SliverSpec
from rspec.manifest import SERVICES_EXT
from slicex import procs
from slicex.codec import encode
from slicex.errors import InsufficientDisk
from slicex.tls_xmlrpc import client
from tests.factories import RSPEC3, request_rspec, vm
from tests.integration.conftest import AUTHORITY, make_home
from tests.integration.netns_support import new_prefix, require_host, started_driver
from tests.integration.test_netns_am import ok, up_then_down
from tests.integration.test_netns_login import ssh

USES_HOST_NETWORK = True  # its nodes' switch: one userspace Open vSwitch per host (tests/conftest.py)
NOW = datetime.now(UTC)
GIB = 2**30


@pytest.fixture(autouse=True)
def _containers():
    require_host()
    missing = lxc_missing()
    if missing:
        pytest.skip("container nodes need: " + "; ".join(missing) + " (make test installs them)")


def _node(slice_tag: str, n: int, disk_gb: int) -> SliverSpec:
    return SliverSpec(f"urn:{slice_tag}:n{n}", "node", f"n{n}", details={
        "slice_urn": f"urn:slice:{slice_tag}", "cores": 1, "memory_mb": 256, "disk_gb": disk_gb, "interfaces": {}})


def _in_node(driver: NetnsDriver, spec: SliverSpec, command: str) -> str:
    rc, out = driver._container(driver._node_plan(spec)).attach(["sh", "-c", command], timeout=60)
    assert rc == 0, out
    return out.decode()


# ---- through the AM API, as two experimenters -----------------------------------------------------------------
SUBSTRATE = f"""
authority: {AUTHORITY}
switches:
  - name: sw1
    ports: [{{name: p1}}]
hosts:
  - name: pc1
    cores: 4
    memory_mb: 8192
    disk_gb: 100
    interfaces:
      - {{name: eth0, switch_port: "sw1:p1"}}
vm_sizes:
  - {{name: small-disk, cores: 1, memory_mb: 256, disk_gb: 1}}
"""


def test_a_slice_user_filling_the_node_disk_gets_enospc_and_another_slice_still_allocates(tmp_path: Path):
    prefix = new_prefix()
    (tmp_path / "substrate.yaml").write_text(SUBSTRATE)
    home = make_home(tmp_path / "home", substrate_driver="netns", netns={"prefix": prefix},
                     substrate=str(tmp_path / "substrate.yaml"), sa_port=0, am_port=0)
    with up_then_down(home, prefix) as up:
        am_url = up.start()
        sa_url = procs.read(home.pid_file).info["sa_url"]
        slices = {}
        for user in ("alice", "bob"):
            cert, key = str(home.user_cert(user)), str(home.user_key(user))
            urn = f"urn:publicid:IDN+{AUTHORITY}+slice+disk{user}"
            cred = [{"geni_type": "geni_sfa", "geni_version": "3",
                     "geni_value": client(sa_url, cert, key).CreateSlice(urn)}]
            slices[user] = (client(am_url, cert, key), urn, cred)
        am, urn, cred = slices["alice"]
        alice = {"urn": f"urn:publicid:IDN+{AUTHORITY}+user+alice", "keys": [home.user_ssh_pub("alice").read_text()]}
        ok(am.Allocate(urn, cred, request_rspec([vm("n1", sliver_type="small-disk")], []), {}))
        manifest = ok(am.Provision([urn], cred, {"geni_users": [alice]}))["geni_rspec"]
        ok(am.PerformOperationalAction([urn], cred, "geni_start", {}))
        node = next(etree.fromstring(manifest.encode()).iter(f"{{{RSPEC3}}}node"))
        port = int(next(node.iter(f"{{{RSPEC3}}}login")).get("port"))

        size = int(ssh(home, "alice", port, "df -B1 --output=size / | tail -1").stdout)
        assert 0.9 * GIB < size <= GIB  # the node's own disk, not the host's
        filled = ssh(home, "alice", port, "dd if=/dev/zero of=$HOME/fill bs=1M count=3000 2>&1; echo rc=$?")
        assert "No space left on device" in filled.stdout and "rc=1" in filled.stdout, filled.stdout

        # the aggregate's store and another slice are untouched: bob allocates and provisions a node
        am_b, urn_b, cred_b = slices["bob"]
        ok(am_b.Allocate(urn_b, cred_b, request_rspec([vm("m1", sliver_type="small-disk")], []), {}))
        ok(am_b.Provision([urn_b], cred_b, {"geni_users": []}))
        # what alice's node reports: its disk is used, its memory is not its page cache
        described = ok(am.Describe([urn], cred, {"geni_rspec_version": {"type": "GENI", "version": "3"}}))
        box = next(etree.fromstring(described["geni_rspec"].encode()).iter(f"{{{SERVICES_EXT}}}container"))
        assert box.get("disk_gb") == "1" and int(box.get("disk_used_bytes")) > 0.9 * GIB
        assert int(box.get("memory_bytes")) < 128 * 2**20  # the 1 GB written is page cache, not its use

        ok(am.Delete([urn], cred, {}))
        ok(am_b.Delete([urn_b], cred_b, {}))
        assert NetnsDriver(prefix).leftovers() == []


def test_provision_of_a_node_whose_disk_the_layers_cannot_hold_is_insufficient(tmp_path: Path):
    """Through the AM API: with the reserve leaving less than the node's 1 GB, Provision answers 26 naming the
    numbers and nothing of the node is left on the host."""
    prefix = new_prefix()
    (tmp_path / "substrate.yaml").write_text(SUBSTRATE)
    layers = tmp_path / "layers"
    layers.mkdir()
    st = os.statvfs(layers)
    reserve_mb = st.f_bavail * st.f_frsize // 2**20 - 512
    home = make_home(tmp_path / "home", substrate_driver="netns", substrate=str(tmp_path / "substrate.yaml"),
                     netns={"prefix": prefix, "layers_dir": str(layers), "layers_reserve_mb": reserve_mb},
                     sa_port=0, am_port=0)
    with up_then_down(home, prefix) as up:
        am_url = up.start()
        cert, key = str(home.user_cert("alice")), str(home.user_key("alice"))
        urn = f"urn:publicid:IDN+{AUTHORITY}+slice+diskfull"
        cred = [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": client(
            procs.read(home.pid_file).info["sa_url"], cert, key).CreateSlice(urn)}]
        am = client(am_url, cert, key)
        ok(am.Allocate(urn, cred, request_rspec([vm("n1", sliver_type="small-disk")], []), {}))
        refused = am.Provision([urn], cred, {"geni_users": []})
        assert refused["code"]["geni_code"] == 26, refused
        assert "a node disk of 1 GB does not fit" in refused["output"] and "GiB free" in refused["output"]
        assert str(layers) not in refused["output"]
        assert NetnsDriver(prefix, layers_dir=layers)._layer_files() == []


# ---- on the driver ----------------------------------------------------------------------------------------------
@pytest.fixture
def driver():
    with started_driver() as d:
        yield d


def test_df_in_a_node_shows_its_own_size_and_writes_past_it_fail_there_only(driver):
    small, other = _node("dfa", 1, 2), _node("dfb", 1, 1)
    st = {s.id: driver.modify(s, driver.create(s, NOW), "geni_start", NOW) for s in (small, other)}
    size = int(_in_node(driver, small, "df -B1 --output=size / | tail -1"))
    assert 1.8 * GIB < size <= 2 * GIB  # its own 2 GB disk less ext4's metadata; the host's disk is ~250 GB
    out = _in_node(driver, other, "dd if=/dev/zero of=/fill bs=1M count=2000 2>&1; echo rc=$?")
    assert "No space left on device" in out and "rc=1" in out
    assert _in_node(driver, small, "echo fine > /ok && cat /ok").strip() == "fine"  # the other node writes on
    view = driver.view(other, st[other.id])["container"]
    assert view["disk_gb"] == 1 and view["disk_used_bytes"] > 0.9 * GIB
    for s in (small, other):
        driver.destroy(s, st[s.id], NOW)
    assert driver.leftovers() == []


def test_a_nodes_mount_table_names_no_host_path(driver):
    spec = _node("mnt", 1, 1)
    st = driver.modify(spec, driver.create(spec, NOW), "geni_start", NOW)
    mountinfo = _in_node(driver, spec, "cat /proc/self/mountinfo")
    for host_path in (driver.state_dir, driver.uid_ranges.root, driver.images.root, driver.lxcpath,
                      driver.bases_dir, driver.layers_dir, "/var/lib", "/usr/sbin/init.lxc.static"):
        assert str(host_path) not in mountinfo, (host_path, mountinfo)
    assert driver.prefix not in mountinfo  # nor the deployment's prefix (its node names are the node's own)
    root = next(line for line in mountinfo.splitlines() if line.split()[4] == "/")
    assert "lowerdir=lower,upperdir=fs/upper,workdir=fs/work" in root
    driver.destroy(spec, st, NOW)


def test_a_node_whose_disk_does_not_fit_the_free_space_less_the_reserve_is_refused(driver):
    driver.layers_dir.mkdir(parents=True, exist_ok=True)
    st = os.statvfs(driver.layers_dir)
    free = st.f_bavail * st.f_frsize
    driver.layers_reserve_bytes = free - int(1.6 * GIB)  # room for one 1 GB node, not two
    first = _node("adm", 1, 1)
    status = driver.create(first, NOW)
    with pytest.raises(InsufficientDisk) as refused:
        driver.create(_node("adm", 2, 1), NOW)
    assert refused.value.code == 26
    assert "a node disk of 1 GB does not fit" in refused.value.message and "GiB free" in refused.value.message
    assert str(driver.layers_dir) not in refused.value.message  # no host path to the experimenter
    assert [f.name for f in driver._layer_files()] == [f"{status['netns']}.img"]  # nothing of the refused one
    driver.destroy(first, status, NOW)


CHILD = """
import json, sys
from datetime import UTC, datetime
from authority.substrate.netns import NetnsDriver
from protocol.messages import SliverSpec
from slicex.codec import decode
d = NetnsDriver(sys.argv[1])
d.start()
spec = decode(json.loads(sys.argv[2]), SliverSpec, "spec")
if sys.argv[3] == "delete":
    st = d.modify(spec, d.create(spec, datetime.now(UTC)), "geni_start", datetime.now(UTC))
    print("made", flush=True)
    sys.stdin.readline()
    d.destroy(spec, st, datetime.now(UTC))
else:
    print("started", flush=True)
    d.create(spec, datetime.now(UTC))
print("done", flush=True)
"""


def _kill_when(child: subprocess.Popen, cut: callable, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and child.poll() is None and not cut():
            time.sleep(0.002)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)


@pytest.mark.parametrize("when", ["create", "delete"])
def test_sigkill_while_a_node_is_created_or_deleted_leaks_no_loop_device_mount_or_layer(driver, when):
    """The authority's process dies with SIGKILL once the node's disk is attached (create) or once its root is
    unmounted (delete); the restarted driver, told the node is not live, leaves nothing of it."""
    spec = _node(f"kill{when}", 1, 1)
    driver.shutdown()  # the child starts (and owns) the switch and controller, as a crashed aggregate did
    child = subprocess.Popen([sys.executable, "-c", CHILD, driver.prefix, json.dumps(encode(spec)), when],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    container = driver._container(driver._node_plan(spec))
    assert child.stdout.readline().strip() in ("started", "made")
    if when == "create":
        _kill_when(child, lambda: bool(loop_devices(driver.layers_dir)))
    else:
        assert loop_devices(container.layer) and os.path.ismount(container.rootfs)
        child.stdin.write("go\n")
        child.stdin.flush()
        _kill_when(child, lambda: not os.path.ismount(container.rootfs))
    assert "done" not in child.stdout.read()  # cut in the middle, not after
    restarted = NetnsDriver(driver.prefix)
    restarted.start()
    restarted.reconcile([])
    assert loop_devices(restarted.layers_dir) == []
    assert mounts_under(restarted.lxcpath) == []
    assert restarted.leftovers() == []


def test_a_node_made_before_nodes_had_disks_keeps_its_layer_on_its_new_disk(tmp_path: Path):
    """An upgrade: a node whose upper layer is a plain host directory is adopted; its files move onto a disk
    of its size, its root shows them, and destroying it leaves no loop device or mount."""
    from authority.substrate.container import NodeContainer, NodeLimits

    lower = tmp_path / "image"
    (lower / "etc").mkdir(parents=True)
    (lower / "etc" / "from-image").write_text("image\n")
    c = NodeContainer(tmp_path / "state" / "lxc", "tzzzz-000000000001")
    (c.fs / "upper").mkdir(parents=True)
    (c.fs / "upper" / "written-by-the-node").write_text("kept\n")
    try:
        c.define("n1", lower, 100_000_000, "tzzzz-000000000001", NodeLimits(1, 256, "0", disk_gb=1))
        assert os.path.ismount(c.fs) and (c.fs / "upper" / "written-by-the-node").read_text() == "kept\n"
        assert (c.rootfs / "written-by-the-node").read_text() == "kept\n"
        assert (c.rootfs / "etc" / "from-image").read_text() == "image\n"
        assert not (c.dir / ".fs.new").exists()
    finally:
        c.destroy()
    assert loop_devices(c.layer) == [] and mounts_under(c.dir) == [] and not c.layer.exists()
