"""Image, dataset and relay work cut by kill -9 on real container nodes (issue 34), and what Status says.

A child process (the aggregate, as far as the operation goes) runs CreateImage or a dataset's creation and is
killed with SIGKILL at a named step; the driver is then started again as a restarted aggregate starts it
(`start`, then `reconcile` with the live slivers). Each case ends whole: a replacing CreateImage leaves the
old image or the new one, listed once, bootable files, deletable; a node a cut CreateImage froze is reported
frozen, then thawed by the restart and ready; no build directory is left; a dataset's name is usable again.
A node's login relay killed is restored by geni_start and geni_restart; a node whose image cannot boot is
geni_failed with the reason."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from authority.substrate import images
from authority.substrate.container import lxc_missing, uid_base
from authority.substrate.datasets import DatasetStore
from authority.substrate.images import DEFAULT_DIR, DEFAULT_IMAGE, ImageCatalogue
from authority.substrate.netns import NetnsDriver
from protocol.messages import SliverSpec
from slicex.codec import encode
from slicex.errors import GeniError
from tests.integration.netns_support import require_host, started_driver

USES_HOST_NETWORK = True
NOW = datetime.now(UTC)
ALICE = "urn:publicid:IDN+slicex.local+user+alice"

# the aggregate's side of one operation, killed with SIGKILL right after the named step
CHILD = textwrap.dedent("""
    import json, os, shutil, signal, sys
    from datetime import UTC, datetime
    from pathlib import Path
    from authority.substrate import images
    from authority.substrate.datasets import DatasetStore
    from authority.substrate.images import ImageCatalogue
    from authority.substrate.netns import NetnsDriver
    from protocol.messages import SliverSpec
    from slicex.codec import decode
    prefix, step, catalogue, datasets, spec, status, name, owner = sys.argv[1:9]

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    def after(holder, fn, when=lambda *a: True):
        original = getattr(holder, fn)
        def cut(*a, **k):
            out = original(*a, **k)
            if when(*a):
                die()
            return out
        setattr(holder, fn, cut)

    if step == "copying":  # the node's files are in the build directory; the node is frozen
        after(images, "apply_layer")
    elif step == "exchanged":  # the new image has taken the old one's place, which is in the build directory
        after(images, "exchange")
    elif step == "removing-old":  # half of the replaced image removed
        remove = images.remove_tree
        def half(p):
            if p.name.startswith(".build-"):
                shutil.rmtree(p / "rootfs" / "usr", ignore_errors=True)
                die()
            remove(p)
        images.remove_tree = half
    elif step == "dataset-made":  # its file system exists, its record not yet
        DatasetStore._save = lambda *a, **k: die()
    elif step == "dataset-recorded":  # its record is written, the directory not yet under its name
        after(DatasetStore, "_save")
    now = datetime.now(UTC)
    if step.startswith("dataset"):
        DatasetStore(Path(datasets)).attach(name, 16, owner, 100_000_000, "nobody", 1024, busy=lambda ns: False)
    else:
        NetnsDriver(prefix, images=ImageCatalogue(Path(catalogue)), datasets=DatasetStore(Path(datasets))).snapshot(
            decode(json.loads(spec), SliverSpec, "spec"), json.loads(status), name, owner, False, now)
    print("not cut", flush=True)
""")


class Host:
    """A test's image catalogue (the host's default image linked in) and datasets directory."""

    def __init__(self, tmp_path: Path):
        self.catalogue = ImageCatalogue(tmp_path / "images")
        self.catalogue.root.mkdir()
        (self.catalogue.root / DEFAULT_IMAGE).symlink_to(DEFAULT_DIR / DEFAULT_IMAGE)
        self.datasets = DatasetStore(Path("/var/lib") / f"slicex-t{uuid.uuid4().hex[:6]}-datasets")

    def options(self) -> dict:
        return {"images": ImageCatalogue(self.catalogue.root), "datasets": DatasetStore(self.datasets.root)}

    def cut(self, prefix: str, step: str, name: str, spec: SliverSpec | None = None, status: dict | None = None) -> None:
        """Run the operation in a child process killed with SIGKILL after `step`."""
        out = subprocess.run([sys.executable, "-c", CHILD, prefix, step, str(self.catalogue.root),
                              str(self.datasets.root), json.dumps(encode(spec) if spec else {}),
                              json.dumps(status or {}), name, ALICE], capture_output=True, text=True, timeout=300,
                             cwd=os.getcwd())
        assert out.returncode == -signal.SIGKILL, (out.returncode, out.stdout, out.stderr[-2000:])

    def restart(self, d: NetnsDriver, live: list[tuple[SliverSpec, dict]]) -> NetnsDriver:
        """The aggregate's next start: a new driver over the same host, started, reconciled with the live slivers."""
        d.shutdown()
        r = NetnsDriver(d.prefix, **self.options())
        r.start()
        r.reconcile(live)
        return r

    def leftovers(self) -> list[str]:
        """What a cut operation left in the catalogue or the datasets directory."""
        return sorted(p.name for root in (self.catalogue.root, self.datasets.root) if root.is_dir()
                      for p in root.iterdir() if p.name.startswith((".build-", ".removed-", ".replaced-", ".new-")))

    def close(self) -> None:
        for mnt in self.datasets.root.glob("*/mnt"):
            subprocess.run(["umount", str(mnt)], capture_output=True)
        shutil.rmtree(self.datasets.root, ignore_errors=True)


@pytest.fixture
def host(tmp_path: Path):
    require_host()
    if lxc_missing() or ImageCatalogue(DEFAULT_DIR).get(DEFAULT_IMAGE) is None:
        pytest.skip("needs LXC and the host's node image (slicex image build)")
    h = Host(tmp_path)
    try:
        yield h
    finally:
        h.close()


def node(name: str = "n1", image: str = "") -> SliverSpec:
    details = {"slice_urn": f"urn:publicid:IDN+slicex.local+slice+{name}", "owner": ALICE}
    if image:
        details["disk_image"] = image
    return SliverSpec(f"urn:recovery:{name}:{uuid.uuid4().hex[:6]}", "node", name, details=details)


def started(d: NetnsDriver, spec: SliverSpec) -> dict:
    return d.modify(spec, d.create(spec, NOW), "geni_start", NOW)


def inside(d: NetnsDriver, spec: SliverSpec, script: str) -> str:
    rc, out = d._container(d._node_plan(spec)).attach(["sh", "-c", script], timeout=20)
    assert rc == 0, out
    return out.decode()


def paths(root: Path) -> set[str]:
    return {os.path.relpath(os.path.join(dp, f), root) for dp, ds, fs in os.walk(root) for f in [*ds, *fs]}


@pytest.mark.parametrize("step,kept", [("copying", "old"), ("exchanged", "new"), ("removing-old", "new")])
def test_a_replacing_create_image_cut_by_kill_9_leaves_the_old_or_the_new_image_whole(host, step, kept):
    with started_driver(**host.options()) as d:
        spec = node()
        status = started(d, spec)
        inside(d, spec, "echo old > /root/marker")
        d.snapshot(spec, status, "snap", ALICE, False, NOW)
        inside(d, spec, "echo new > /root/marker")
        host.cut(d.prefix, step, "snap", spec, status)
        state, error = d.status(spec, status, NOW)
        assert state == "geni_failed" and "frozen" in error, (state, error)  # not geni_ready: ssh would hang

        r = host.restart(d, [(spec, status)])
        assert r.status(spec, status, NOW) == ("geni_ready", "")
        assert inside(r, spec, "cat /root/marker") == "new\n"  # the node runs again
        assert host.leftovers() == []
        listed = [i.name for i in host.catalogue.list()]
        assert listed.count("snap") == 1, listed
        snap = host.catalogue.get("snap")
        assert (snap.rootfs / "root/marker").read_text() == f"{kept}\n"
        assert paths(host.catalogue.get(DEFAULT_IMAGE).rootfs) <= paths(snap.rootfs)  # whole, not half
        r.destroy(spec, status, NOW)
        assert host.catalogue.remove("snap") and host.catalogue.get("snap") is None


def test_a_new_create_image_cut_by_kill_9_leaves_no_image_and_the_node_thawed(host, monkeypatch):
    with started_driver(**host.options()) as d:
        spec = node()
        status = started(d, spec)
        host.cut(d.prefix, "copying", "fresh", spec, status)
        assert d._container(d._node_plan(spec)).frozen()
        assert d.status(spec, status, NOW)[0] == "geni_failed"

        r = host.restart(d, [(spec, status)])
        assert not r._container(r._node_plan(spec)).frozen()
        assert r.status(spec, status, NOW) == ("geni_ready", "")
        assert host.leftovers() == [] and host.catalogue.get("fresh") is None
        seen = []
        copy = images.apply_layer

        def copy_and_look(*a, **k) -> None:
            seen.append(r.status(spec, status, NOW))  # while the node is frozen for the copy
            copy(*a, **k)

        monkeypatch.setattr(images, "apply_layer", copy_and_look)
        assert r.snapshot(spec, status, "fresh", ALICE, False, NOW).name == "fresh"  # the name is free
        assert [state for state, _error in seen] == ["geni_ready_busy"]
        assert r.status(spec, status, NOW) == ("geni_ready", "")
        r.destroy(spec, status, NOW)
        assert host.catalogue.remove("fresh")


@pytest.mark.parametrize("step", ["dataset-made", "dataset-recorded"])
def test_a_dataset_whose_creation_was_cut_by_kill_9_can_be_made_again(host, step):
    with started_driver(**host.options()) as d:
        host.cut(d.prefix, step, "results")
        # a dataset directory without its record, as a version that made it in place left it
        (host.datasets.root / "older").mkdir(mode=0o711)
        (host.datasets.root / "older" / "disk.img").write_bytes(b"")
        assert host.datasets.get("results") is None

        host.restart(d, [])
        assert host.leftovers() == [] and not (host.datasets.root / "older").exists()
        for name in ("results", "older"):
            mnt = host.datasets.attach(name, 16, ALICE, uid_base(4001), "nobody", 1024, busy=lambda ns: False)
            assert os.path.ismount(mnt)
        assert sorted(x.name for x in host.datasets.list()) == ["older", "results"]
        host.datasets.release("nobody")
        for name in ("results", "older"):
            host.datasets.delete(name, ALICE, False, busy=lambda ns: False)
        assert host.datasets.list() == []


def _banner(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        return s.recv(64)


@pytest.mark.parametrize("action", ["geni_restart", "geni_start"])
def test_a_killed_login_relay_is_restored_by_start_and_restart(host, action):
    with started_driver(**host.options()) as d:
        spec = node()
        status = started(d, spec)
        port = status["login_port"]
        assert _banner(port).startswith(b"SSH-")
        relay = d._relay(d._node_plan(spec))
        os.kill(int((relay.dir / "forward.pid").read_text()), signal.SIGKILL)
        deadline = time.monotonic() + 10
        while relay.forward_running() and time.monotonic() < deadline:  # until the kill has taken effect
            time.sleep(0.05)
        state, error = d.status(spec, status, NOW)
        assert state == "geni_failed" and "no relay" in error

        status = d.modify(spec, status, action, NOW)
        assert status["login_port"] == port and relay.forward_running()
        assert d.status(spec, status, NOW) == ("geni_ready", "")
        assert _banner(port).startswith(b"SSH-")
        d.destroy(spec, status, NOW)


def test_a_node_whose_image_cannot_boot_is_failed_with_the_reason(host):
    broken = host.catalogue.root / "broken"
    broken.mkdir()
    subprocess.run(["cp", "-a", str(DEFAULT_DIR / DEFAULT_IMAGE / "rootfs"), str(broken / "rootfs")], check=True)
    (broken / "rootfs/usr/sbin/sshd").unlink()
    (broken / "image.json").write_text(json.dumps({"name": "broken", "suite": "bookworm", "build_id": "x1"}))
    with started_driver(**host.options()) as d:
        spec = node(image="broken")
        status = d.create(spec, NOW)
        with pytest.raises(GeniError):
            d.modify(spec, status, "geni_start", NOW)
        state, error = d.status(spec, status, NOW)
        assert state == "geni_failed" and "geni_start failed" in error and "sshd" in error, (state, error)
        d.destroy(spec, status, NOW)
