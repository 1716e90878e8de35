"""CreateImage as an attack on the host (issue 34): a node's own files become catalogue files owned by host
root, so what a node's root plants there must not become a host privilege or fill the catalogue's disk.

- a sparse file (`truncate -s 4G`) is charged at its length before anything is copied, and a sparse file
  within the quota stays sparse in the image (the copy wrote 886 MiB of zeros until ENOSPC);
- the copy of the node's files stops at the bytes its owner has left, leaving nothing;
- a setuid shell the node made (`cp /bin/bash /rootsh; chmod 4755 /rootsh`) is no host root shell: the bit is
  dropped, and the catalogue is root's alone; file capabilities and device nodes are not copied.

Most cases build the node's overlay layer by hand (what the node's root could write there, owners in its
slice's uid range) over a small base image; the last one makes the files in a real container node."""

from __future__ import annotations

import json
import os
import stat
import struct
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from authority.substrate import images
from authority.substrate.container import lxc_missing, uid_base
from authority.substrate.images import DEFAULT_DIR, DEFAULT_IMAGE, ImageCatalogue, apply_layer
from protocol.messages import SliverSpec
from slicex.errors import TooBig
from tests.integration.netns_support import require_host, started_driver

USES_HOST_NETWORK = True  # the last case's node and switch (tests/conftest.py's host-wide lock)
ALICE = "urn:publicid:IDN+slicex.local+user+alice"
OFFSET = uid_base(4000)  # the slice's uid range: the node's root is this host uid
MiB = 1 << 20
NET_RAW_CAP = struct.pack("<IIIII", 0x02000001, 1 << 13, 0, 0, 0)  # vfs_cap_data v2: cap_net_raw+ep


def _catalogue(tmp_path: Path) -> tuple[ImageCatalogue, images.NodeImage]:
    """A catalogue holding one small operator's image ("base") with a shell in it."""
    cat = ImageCatalogue(tmp_path / "catalogue")
    rootfs = cat.root / "base" / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "bin").mkdir()
    (rootfs / "etc" / "hostname").write_text("base\n")
    (cat.root / "base" / "image.json").write_text(json.dumps({"name": "base", "suite": "bookworm",
                                                             "build_id": "b1", "size_bytes": 0}))
    base = cat.get("base")
    assert base is not None
    return cat, base


def _layer(tmp_path: Path) -> Path:
    layer = tmp_path / "upper"
    layer.mkdir()
    os.lchown(layer, OFFSET, OFFSET)
    return layer


def _node_file(path: Path, data: bytes = b"", mode: int = 0o644) -> Path:
    """A file the node's root made (owned by the slice's root uid)."""
    path.write_bytes(data)
    os.lchown(path, OFFSET, OFFSET)
    path.chmod(mode)
    return path


def _snapshot(cat: ImageCatalogue, base: images.NodeImage, layer: Path, name: str = "snap",
              quota: int = 1024 * MiB) -> images.NodeImage:
    return cat.snapshot(name, base, layer, OFFSET, ALICE, False, "test", quota)


def test_a_sparse_file_is_charged_at_its_length_before_anything_is_copied(tmp_path, monkeypatch):
    cat, base = _catalogue(tmp_path)
    layer = _layer(tmp_path)
    with open(_node_file(layer / "big.bin"), "r+b") as f:
        f.truncate(4 * 1024 * MiB)  # truncate -s 4G: no block allocated
    copied = []
    monkeypatch.setattr(images, "apply_layer", lambda *a, **k: copied.append(a))
    with pytest.raises(TooBig) as refused:
        _snapshot(cat, base, layer, quota=64 * MiB)
    assert copied == [], "the node's files were copied before the quota was checked"
    assert "holes counted" in refused.value.message
    assert cat.list() == [cat.get("base")] and not list(cat.root.glob(".build-*"))


def test_a_sparse_file_within_the_quota_stays_sparse_in_the_image(tmp_path):
    cat, base = _catalogue(tmp_path)
    layer = _layer(tmp_path)
    path = _node_file(layer / "big.bin")
    with open(path, "r+b") as f:
        f.truncate(300 * MiB)
        f.seek(200 * MiB)
        f.write(b"data in the middle")
    snap = _snapshot(cat, base, layer, quota=1024 * MiB)
    copy = snap.rootfs / "big.bin"
    assert copy.stat().st_size == 300 * MiB
    assert copy.stat().st_blocks * 512 < 4 * MiB, f"{copy.stat().st_blocks * 512} bytes written for the holes"
    with open(copy, "rb") as f:
        f.seek(200 * MiB)
        assert f.read(18) == b"data in the middle"
    assert snap.size_bytes >= 300 * MiB  # charged at its length


def test_the_copy_of_a_node_s_files_stops_at_its_cap(tmp_path):
    layer = _layer(tmp_path)
    _node_file(layer / "noise.bin", os.urandom(4 * MiB))
    target = tmp_path / "target"
    target.mkdir()
    with pytest.raises(TooBig):
        apply_layer(layer, target, OFFSET, cap=1 * MiB)
    assert (target / "noise.bin").stat().st_blocks * 512 <= 1 * MiB + 65536


def test_a_layer_that_grows_after_it_was_measured_is_refused_and_leaves_nothing(tmp_path, monkeypatch):
    """The node is frozen while it is copied, but the cap holds even if it were not: the layer measured
    small, then grew past the quota before the copy."""
    cat, base = _catalogue(tmp_path)
    layer = _layer(tmp_path)
    measure = images.logical_size

    def measured_before_growing(root: Path) -> int:
        if root == layer and not (layer / "late.bin").exists():
            size = measure(root)
            _node_file(layer / "late.bin", os.urandom(8 * MiB))
            return size
        return measure(root)

    monkeypatch.setattr(images, "logical_size", measured_before_growing)
    with pytest.raises(TooBig):
        _snapshot(cat, base, layer, quota=4 * MiB)
    assert cat.get("snap") is None and not list(cat.root.glob(".build-*"))


def test_a_setuid_shell_made_in_a_node_is_no_host_root_shell(tmp_path):
    cat, base = _catalogue(tmp_path)
    layer = _layer(tmp_path)
    _node_file(layer / "rootsh", Path("/bin/bash").read_bytes(), 0o4755)  # cp /bin/bash /rootsh; chmod 4755
    _node_file(layer / "groupsh", Path("/bin/bash").read_bytes(), 0o2755)
    snap = _snapshot(cat, base, layer)
    for name in ("rootsh", "groupsh"):
        st = (snap.rootfs / name).lstat()
        assert st.st_uid == 0 and st.st_mode & 0o6000 == 0, f"{name}: {oct(st.st_mode)} uid {st.st_uid}"
    assert stat.S_IMODE(cat.root.stat().st_mode) == 0o700
    assert stat.S_IMODE((cat.root / "snap").stat().st_mode) == 0o700
    out = subprocess.run(["runuser", "-u", "nobody", "--", str(snap.rootfs / "rootsh"), "-p", "-c", "id -u"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and out.stdout.strip() != "0", (out.stdout, out.stderr)


def test_file_capabilities_and_device_nodes_made_in_a_node_are_not_copied(tmp_path):
    cat, base = _catalogue(tmp_path)
    layer = _layer(tmp_path)
    pinger = _node_file(layer / "pinger", b"#!/bin/sh\n", 0o755)
    os.setxattr(pinger, "security.capability", NET_RAW_CAP)
    disk = layer / "disk"
    os.mknod(disk, stat.S_IFBLK | 0o666, os.makedev(7, 0))  # a loop device, by any name
    os.lchown(disk, OFFSET, OFFSET)
    mem = layer / "mem"
    os.mknod(mem, stat.S_IFCHR | 0o666, os.makedev(1, 1))  # /dev/mem
    os.lchown(mem, OFFSET, OFFSET)
    snap = _snapshot(cat, base, layer)
    assert (snap.rootfs / "pinger").is_file()
    assert "security.capability" not in os.listxattr(snap.rootfs / "pinger")
    assert not (snap.rootfs / "disk").exists() and not (snap.rootfs / "mem").exists()


def test_a_node_s_setuid_shell_and_sparse_file_through_a_real_snapshot(tmp_path):
    """The issue's attack as it was run: in a container node, a setuid copy of bash and a sparse file; the
    image holds neither a host root shell nor the holes written out."""
    require_host()
    if lxc_missing() or ImageCatalogue(DEFAULT_DIR).get(DEFAULT_IMAGE) is None:
        pytest.skip("needs LXC and the host's node image (slicex image build)")
    cat = ImageCatalogue(tmp_path / "images")
    cat.root.mkdir()
    (cat.root / DEFAULT_IMAGE).symlink_to(DEFAULT_DIR / DEFAULT_IMAGE)
    spec = SliverSpec("urn:attack:n1", "node", "n1", details={"slice_urn": "urn:attack", "owner": ALICE})
    now = datetime.now(UTC)
    with started_driver(images=cat) as d:
        status = d.modify(spec, d.create(spec, now), "geni_start", now)
        container = d._container(d._node_plan(spec))
        rc, out = container.attach(["sh", "-c", "cp /bin/bash /rootsh && chmod 4755 /rootsh && "
                                    "truncate -s 300M /big.bin"], timeout=20)
        assert rc == 0, out
        snap = d.snapshot(spec, status, "attack", ALICE, False, now)
        st = (snap.rootfs / "rootsh").lstat()
        assert st.st_uid == 0 and st.st_mode & 0o6000 == 0, oct(st.st_mode)
        assert (snap.rootfs / "big.bin").stat().st_blocks * 512 < MiB
        assert d.status(spec, status, now) == ("geni_ready", "")  # thawed after the copy
        d.destroy(spec, status, now)
        assert cat.remove("attack")
