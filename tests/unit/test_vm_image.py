"""The VM form's pure parts: which kernel package, which modules the initramfs loads in which order, the cpio
archive the kernel unpacks, merging a package into a merged-/usr tree, and how the guest reads a cloud's config
drive."""

from __future__ import annotations

import gzip
import subprocess
from pathlib import Path

import pytest

from authority.substrate.vm_image import (
    CONFIG_DRIVE_INIT,
    CONFIG_DRIVE_PARSE,
    GUEST_INIT,
    cpio_newc,
    fs_size_bytes,
    kernel_package,
    merge_into,
    module_closure,
    raw_size,
)
from slicex.errors import ServerError

DEP = """kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_legacy_dev.ko kernel/drivers/virtio/virtio_pci_modern_dev.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio_pci_legacy_dev.ko:
kernel/drivers/virtio/virtio_pci_modern_dev.ko:
kernel/drivers/net/dummy.ko:
"""


def test_kernel_package_is_the_versioned_dependency_of_the_meta_package():
    out = "linux-image-cloud-amd64\n  Depends: linux-image-6.1.0-57-cloud-amd64\n"
    assert kernel_package(out) == "linux-image-6.1.0-57-cloud-amd64"
    assert kernel_package("linux-image-cloud-amd64\n") is None


def test_module_closure_loads_each_module_after_what_it_needs_once():
    order = [Path(p).stem for p in module_closure(DEP, ("virtio_pci", "virtio_blk"))]
    assert order.count("virtio_ring") == 1 and order.count("virtio") == 1
    for before, after in (("virtio_ring", "virtio"), ("virtio", "virtio_pci"), ("virtio_pci_modern_dev", "virtio_pci"),
                          ("virtio", "virtio_blk")):
        assert order.index(before) < order.index(after)
    assert "dummy" not in order


def test_module_closure_names_a_module_the_kernel_lacks():
    with pytest.raises(ServerError, match="no module virtio_gpu"):
        module_closure(DEP, ("virtio_gpu",))


def test_cpio_newc_entries_lead_one_to_the_next(tmp_path):
    data = cpio_newc([("bin", 0o40755, b""), ("bin/x", 0o100755, b"#!/bin/sh\necho hi\n"), ("init", 0o100644, b"abc")])
    assert len(data) % 4 == 0 and data.startswith(b"070701") and b"TRAILER!!!" in data
    # python's own reading of the format: each header's name and size lead to the next entry
    pos, names = 0, []
    while True:
        head = data[pos:pos + 110]
        namesize, filesize = int(head[94:102], 16), int(head[54:62], 16)
        name = data[pos + 110:pos + 110 + namesize - 1].decode()
        if name == "TRAILER!!!":
            break
        names.append(name)
        pos = pos + 110 + namesize
        pos += -pos % 4
        if name == "init":
            assert data[pos:pos + filesize] == b"abc"
        pos += filesize
        pos += -pos % 4
    assert names == ["bin", "bin/x", "init"]
    gzip.compress(data)  # what the build writes


def test_fs_size_leaves_room_and_is_whole_mib():
    size = fs_size_bytes(150 * 2**20)
    assert size % 2**20 == 0 and size > 150 * 2**20 * 1.2


def test_merge_into_keeps_a_merged_usr_trees_links(tmp_path):
    tree, pkg = tmp_path / "tree", tmp_path / "pkg"
    (tree / "usr" / "bin").mkdir(parents=True)
    (tree / "bin").symlink_to("usr/bin")
    (pkg / "bin").mkdir(parents=True)
    (pkg / "bin" / "kmod").write_text("x")
    (pkg / "sbin").mkdir()
    (pkg / "sbin" / "modprobe").symlink_to("/bin/kmod")
    merge_into(pkg, tree)
    assert (tree / "bin").is_symlink() and (tree / "usr" / "bin" / "kmod").read_text() == "x"
    assert (tree / "sbin" / "modprobe").is_symlink()


def test_raw_size_reads_a_qcow2_header(tmp_path):
    f = tmp_path / "d.qcow2"
    try:
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(f), "3G"], check=True)
    except FileNotFoundError:
        pytest.skip("qemu-img is not installed (scripts/system-deps.sh installs qemu-utils)")
    assert raw_size(f) == 3 * 2**30
    (tmp_path / "plain").write_bytes(b"x" * 64)
    assert raw_size(tmp_path / "plain") == 0


# Nova Zed's config drive files as a server of the all-in-one cloud got them (one network; the second link and
# network of the two-interface case follow the same shape)
NETWORK_DATA = (
    '{"links": [{"id": "tap478e4827-7f", "vif_id": "478e4827-7f9a-418e-a733-fa48d9a6dcb5", "type": "ovs", '
    '"mtu": 1500, "ethernet_mac_address": "02:96:04:71:c1:9e"}, {"id": "tap5a0c11d2-03", "vif_id": '
    '"5a0c11d2-0344-4c57-9d8e-2f0c0e8a7b11", "type": "ovs", "mtu": 1500, "ethernet_mac_address": '
    '"fa:16:3e:12:34:56"}], "networks": [{"id": "network0", "type": "ipv4", "link": "tap478e4827-7f", '
    '"ip_address": "10.10.0.1", "netmask": "255.255.255.0", "routes": [], "network_id": '
    '"ecfff8a3-47f7-48e0-b8af-8ed12762f687", "services": []}, {"id": "network1", "type": "ipv4", "link": '
    '"tap5a0c11d2-03", "ip_address": "10.10.1.2", "netmask": "255.255.255.0", "routes": [], "network_id": '
    '"0d9c2f4e-54a8-4d35-8d7e-3a1b2c3d4e5f", "services": []}], "services": []}')
META_DATA = (
    '{"uuid": "98e6cdcd-df5d-48d3-adf4-825af2aba780", "meta": {"slicex": "slicex-tc99428", "slicex_sliver": '
    '"slicex-tc99428-sliver-3a0122d5f2ba", "slicex_client_id": "n1"}, "admin_pass": "ir4JB2uSNmLb", '
    '"public_keys": {"tc99428-3a0122d5f2ba": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKugUraVERK alice@aio"}, '
    '"keys": [{"name": "tc99428-3a0122d5f2ba", "type": "ssh", "data": '
    '"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKugUraVERK alice@aio"}], "hostname": '
    '"tc99428-3a0122d5f2ba.novalocal", "name": "tc99428-3a0122d5f2ba", "launch_index": 0, '
    '"availability_zone": "nova", "project_id": "a984f0bd4f0a4f259210fbd80b8a20d8", "devices": []}')


def config_drive(tmp_path: Path, call: str) -> str:
    """Run one of the guest's config-drive readers (CONFIG_DRIVE_PARSE) on Nova's files with the host's sh."""
    (tmp_path / "network_data.json").write_text(NETWORK_DATA)
    (tmp_path / "meta_data.json").write_text(META_DATA)
    out = subprocess.run(["sh", "-c", CONFIG_DRIVE_PARSE + call], cwd=tmp_path, capture_output=True, text=True,
                         check=True)
    return out.stdout


def test_the_guest_reads_each_networks_link_address_mask_and_mac_from_novas_network_data(tmp_path):
    assert config_drive(tmp_path, "cd_networks network_data.json").splitlines() == [
        "tap478e4827-7f 10.10.0.1 255.255.255.0 02:96:04:71:c1:9e",
        "tap5a0c11d2-03 10.10.1.2 255.255.255.0 fa:16:3e:12:34:56"]


def test_the_guest_reads_its_host_name_and_keys_from_novas_meta_data(tmp_path):
    assert config_drive(tmp_path, "cd_hostname meta_data.json") == "tc99428-3a0122d5f2ba\n"
    assert config_drive(tmp_path, "cd_keys meta_data.json") == "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKugUraVERK alice@aio\n"


def test_the_image_runs_the_config_drive_init_only_when_there_is_no_slicex_seed():
    seed, cloud = GUEST_INIT.index("exec /bin/sh /run/slicex/vm-init"), GUEST_INIT.index("/sbin/slicex-config-drive")
    assert seed < cloud
    assert CONFIG_DRIVE_INIT.startswith("#!/bin/sh") and CONFIG_DRIVE_PARSE in CONFIG_DRIVE_INIT
