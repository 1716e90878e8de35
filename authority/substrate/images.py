"""The operator's catalogue of node images: root file systems that container nodes boot (netns substrate).

An image is a Debian root file system made with debootstrap (`--variant=minbase` plus sshd, iproute2, ping,
iperf3, procps, ethtool and sudo) from the host's Debian mirror, kept under the catalogue directory
(`/var/lib/slicex/images` by default, shared by every deployment on the host):

    <dir>/<name>/rootfs/      the file system, owned by host root (uid 0..65535 as in the image)
    <dir>/<name>/image.json   name, suite, packages, build id, size, when built

Containers never boot it directly: each slice boots a copy whose owners are shifted into the slice's own
uid range (`shift_copy`), so root in one slice's node is a host uid no other slice shares. `slicex image
build|list|remove` manages the catalogue; the first netns `up` that finds no image builds the default one."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import stat
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from slicex.errors import BadArgs, ServerError

DEFAULT_DIR = Path("/var/lib/slicex/images")
DEFAULT_IMAGE = "debian-12"
DEFAULT_SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("openssh-server", "iproute2", "iputils-ping", "iperf3", "procps", "ethtool", "sudo")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{0,39}$")
# the image's sudo rule: slice users are root inside their own node (an unprivileged container's root)
SUDOERS = "%slicex-users ALL=(ALL:ALL) NOPASSWD: ALL\n"
ProgressFn = Callable[[str], None]


@dataclass(frozen=True)
class NodeImage:
    """One image of the catalogue: what ListResources advertises and Allocate accepts as `disk_image`."""

    name: str
    rootfs: Path
    suite: str
    build_id: str
    packages: tuple[str, ...]
    size_bytes: int
    built: str
    description: str

    @property
    def version(self) -> str:
        return {"bookworm": "12", "trixie": "13", "bullseye": "11"}.get(self.suite, self.suite)


def image_urn(authority: str, name: str) -> str:
    return f"urn:publicid:IDN+{authority}+image+{name}"


def image_name(name_or_urn: str) -> str:
    """The catalogue name of `debian-12` or `urn:publicid:IDN+<authority>+image+debian-12`."""
    return name_or_urn.rsplit("+image+", 1)[-1] if "+image+" in name_or_urn else name_or_urn


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise BadArgs(f"image name {name!r}: lowercase letters, digits, '.' and '-', at most 40, starting with a "
                      f"letter or digit")
    return name


def host_mirror(sources: Path = Path("/etc/apt")) -> str:
    """The Debian mirror this host's apt uses (its first `debian` URI), else Debian's own."""
    texts = []
    for f in [sources / "sources.list", *sorted((sources / "sources.list.d").glob("*"))]:
        try:
            texts.append(f.read_text(errors="replace"))
        except OSError:
            continue
    for text in texts:
        for m in re.finditer(r"(?m)^(?:deb\s+(?:\[[^]]*\]\s+)?|URIs:\s*)(\S+)", text):
            uri = m.group(1).rstrip("/")
            if uri.startswith("http") and not uri.endswith("-security") and "security" not in uri.split("/")[-1]:
                return uri
    return DEFAULT_MIRROR


class ImageCatalogue:
    """The images under one directory; building and removing take a host-wide lock (two `up`s at once)."""

    def __init__(self, root: Path = DEFAULT_DIR):
        self.root = Path(root)

    @contextmanager
    def locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def list(self) -> list[NodeImage]:
        if not self.root.is_dir():
            return []
        out = [img for d in sorted(self.root.iterdir()) if (img := self._load(d)) is not None]
        return out

    def get(self, name_or_urn: str) -> NodeImage | None:
        name = image_name(name_or_urn)
        return self._load(self.root / name) if NAME_RE.match(name) else None

    def _load(self, d: Path) -> NodeImage | None:
        try:
            meta = json.loads((d / "image.json").read_text())
        except (OSError, ValueError):
            return None
        if not (d / "rootfs").is_dir():
            return None
        return NodeImage(str(meta["name"]), d / "rootfs", str(meta.get("suite", "")), str(meta.get("build_id", "")),
                         tuple(meta.get("packages", ())), int(meta.get("size_bytes", 0)), str(meta.get("built", "")),
                         str(meta.get("description", "")))

    def build(self, name: str = DEFAULT_IMAGE, suite: str = DEFAULT_SUITE, packages: tuple[str, ...] = PACKAGES,
              mirror: str | None = None, progress: ProgressFn | None = None, replace: bool = False) -> NodeImage:
        """debootstrap an image (a minute or less from a near mirror); an existing image is kept unless
        `replace`. Nodes already running keep the copy they booted."""
        check_name(name)
        if shutil.which("debootstrap") is None:
            raise ServerError("building a node image needs debootstrap (scripts/system-deps.sh installs it)")
        with self.locked():
            existing = self.get(name)
            if existing is not None and not replace:
                return existing
            work = self.root / f".build-{name}-{uuid.uuid4().hex[:6]}"
            try:
                rootfs = work / "rootfs"
                rootfs.mkdir(parents=True)
                mirror = mirror or host_mirror()
                cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", suite, str(rootfs),
                       mirror]
                _run_with_progress(cmd, progress, work / "debootstrap.log")
                _finish_image(rootfs)
                size = _tree_size(rootfs)
                meta = {"name": name, "suite": suite, "build_id": uuid.uuid4().hex[:8], "packages": list(packages),
                        "size_bytes": size, "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        "mirror": mirror, "description": f"Debian {suite} (minbase) with {', '.join(packages)}"}
                (work / "image.json").write_text(json.dumps(meta, indent=1) + "\n")
                (work / "debootstrap.log").unlink(missing_ok=True)
                target = self.root / name
                if target.exists():
                    remove_tree(target)
                work.rename(target)
            finally:
                if work.exists():
                    remove_tree(work)
            img = self.get(name)
            assert img is not None
            return img

    def remove(self, name: str) -> bool:
        """Remove an image; nodes booted from it keep their slice's copy until they are deleted."""
        with self.locked():
            d = self.root / image_name(name)
            if not NAME_RE.match(d.name) or not (d / "image.json").exists():
                return False
            remove_tree(d)
            return True


def _run_with_progress(cmd: list[str], progress: ProgressFn | None, log: Path) -> None:
    """Run debootstrap, handing each `I:` line to `progress`; its log names the cause when it fails."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"})
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            if progress is not None and line.startswith("I: "):
                progress(line[3:].strip())
        rc = proc.wait()
    if rc != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise ServerError(f"debootstrap exited with {rc}: {' | '.join(tail)}")


def _finish_image(rootfs: Path) -> None:
    """What every node needs and no node should share: no apt lists or caches (smaller), no ssh host keys
    (each node makes its own at first boot), the slice users' sudo rule, an empty machine-id."""
    for d in ("var/lib/apt/lists", "var/cache/apt/archives"):
        p = rootfs / d
        if p.is_dir():
            for child in p.iterdir():
                if child.is_file() or child.is_symlink():
                    child.unlink()
    for key in (rootfs / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    sudoers = rootfs / "etc/sudoers.d/slicex"
    sudoers.parent.mkdir(parents=True, exist_ok=True)
    sudoers.write_text(SUDOERS)
    sudoers.chmod(0o440)
    (rootfs / "etc/machine-id").write_text("")


def _tree_size(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
            except OSError:
                pass
    return total


def shift_copy(src: Path, dst: Path, offset: int) -> None:
    """Copy a root file system with every owner moved up by `offset` (uid 0 becomes `offset`), keeping
    setuid/setgid bits (chown clears them). What an unprivileged container whose ids map 0 -> offset boots."""
    tmp = dst.with_name(dst.name + ".tmp")
    if tmp.exists():
        remove_tree(tmp)
    subprocess.run(["cp", "-a", "--reflink=auto", str(src), str(tmp)], check=True, capture_output=True)
    for dirpath, dirs, files in os.walk(tmp):
        for name in (None, *dirs, *files):
            if name is None and dirpath != str(tmp):
                continue  # each directory is shifted as an entry of its parent
            p = dirpath if name is None else os.path.join(dirpath, name)
            st = os.lstat(p)
            os.lchown(p, st.st_uid + offset, st.st_gid + offset)
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o6000:
                os.chmod(p, stat.S_IMODE(st.st_mode))
    tmp.rename(dst)


def remove_tree(p: Path) -> None:
    """Remove a tree root may own under any mode (an image's 0o555 directories included)."""
    shutil.rmtree(p, ignore_errors=True)
    if p.exists():  # read-only bits inside an image (e.g. 0o440 sudoers in a 0o555 directory)
        subprocess.run(["rm", "-rf", "--one-file-system", str(p)], capture_output=True)


def offered_images(catalogue: ImageCatalogue, authority: str, default: str = DEFAULT_IMAGE) -> tuple:
    """The catalogue as the substrate's images (rspec.substrate.Image), the default first: what ListResources
    advertises under each sliver type and what a node naming no image gets."""
    from rspec.substrate import Image

    imgs = sorted(catalogue.list(), key=lambda i: (i.name != default, i.name))
    return tuple(Image(i.name, image_urn(authority, i.name), "Linux", i.version, i.description) for i in imgs)
