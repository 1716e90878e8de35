"""The VM form's pure parts: which kernel package, which modules the initramfs loads in which order, the cpio
archive the kernel unpacks, and merging a package into a merged-/usr tree."""

from __future__ import annotations

import gzip
import subprocess
from pathlib import Path

import pytest

from authority.substrate.vm_image import (
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
