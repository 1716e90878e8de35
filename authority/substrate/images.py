"""The operator's catalogue of node images: root file systems that container nodes boot (netns substrate).

An image is a Debian root file system made with debootstrap (`--variant=minbase` plus sshd, iproute2, ping,
iperf3, procps, ethtool and sudo) from the host's Debian mirror, kept under the catalogue directory
(`/var/lib/slicex/images` by default, shared by every deployment on the host):

    <dir>/<name>/rootfs/      the file system, owned by host root (uid 0..65535 as in the image)
    <dir>/<name>/image.json   name, suite, packages, build id, size, when built; for a user's snapshot also
                              its owner (user URN), whether it is public, and the image it was made from

The directory and each image in it are root's alone (0700): an image's setuid files are host root's, so no
other host user may reach them. An image is built in `<dir>/.build-<name>-<id>/` and published by one rename
(a replaced image is exchanged with the new one in one step, then removed), so a cut build leaves the old
image or the new one, never half of either; a removed image is first renamed to `.removed-<name>-<id>`.
`recover` (each start of a netns deployment) removes what a cut build or removal left.

An operator's image (`slicex image build`) has no owner and any slice may boot it. A user's image is a
snapshot of a container node (`snapshot`, AM API CreateImage): the image the node booted with the node's own
overlay layer applied, owners shifted back out of the slice's uid range. It is private to its owner unless
made public; only its owner (or an operator) deletes it (`may_use`, `check_delete`).

Containers never boot it directly: each slice boots a copy whose owners are shifted into the slice's own
uid range (`shift_copy`), so root in one slice's node is a host uid no other slice shares. `slicex image
build|list|remove` manages the catalogue; the first netns `up` that finds no image builds the default one."""

from __future__ import annotations

import ctypes
import errno
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
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from authority.substrate.vm_image import build_vm_form, vm_form
from slicex.errors import AlreadyExists, BadArgs, Forbidden, SearchFailed, ServerError, TooBig

DEFAULT_DIR = Path("/var/lib/slicex/images")
DEFAULT_IMAGE = "debian-12"
DEFAULT_SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("openssh-server", "iproute2", "iputils-ping", "iperf3", "procps", "ethtool", "sudo")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{0,39}$")
DEFAULT_MAX_USER_BYTES = 4 * 1024 ** 3  # what one user's snapshots may hold together (slicex.yaml netns.image_quota_gb)
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
    owner: str = ""  # the user URN of a snapshot's owner; "" for the operator's images
    public: bool = True  # whether slices of other users may boot it (an operator's image always)
    base: str = ""  # the image a snapshot was made from

    def to_record(self) -> dict[str, object]:
        """What ListImages and `slicex image list` show of it (with its URN, which names the aggregate)."""
        return {"name": self.name, "owner": self.owner,
                "public": self.public, "size_bytes": self.size_bytes, "base": self.base, "created": self.built,
                "description": self.description}

    @property
    def version(self) -> str:
        return {"bookworm": "12", "trixie": "13", "bullseye": "11"}.get(self.suite, self.suite)


def image_urn(authority: str, name: str) -> str:
    return f"urn:publicid:IDN+{authority}+image+{name}"


def image_name(name_or_urn: str) -> str:
    """The catalogue name of `debian-12` or `urn:publicid:IDN+<authority>+image+debian-12`, also as ProtoGENI
    and CloudLab users write an image of theirs (`...+image+PROJECT//name`, `...+image+PROJECT:name`): names
    are case-insensitive (omni asks for alphanumeric names; the catalogue keeps them in lower case)."""
    name = name_or_urn.rsplit("+image+", 1)[-1] if "+image+" in name_or_urn else name_or_urn
    name = name.rsplit("//", 1)[-1]
    return name.rsplit(":", 1)[-1].lower() if "+image+" in name_or_urn else name.lower()


def same_user(a: str, b: str) -> bool:
    return bool(a) and a.lower() == b.lower()


def may_use(image: NodeImage, user: str) -> bool:
    """Whether a slice of `user` may boot `image`: an operator's or a public image, or the user's own."""
    return not image.owner or image.public or same_user(image.owner, user)


def check_delete(image: NodeImage | None, name: str, user: str, operator: bool) -> NodeImage:
    """The image `user` asks to delete, if they may: its owner, or an operator. Another user's private image
    is answered as one that does not exist (its name tells nobody else anything)."""
    if image is None or not (may_use(image, user) or operator):
        raise SearchFailed(f"no image {name} here that you can see (ListImages lists yours)")
    if not image.owner and not operator:
        raise Forbidden(f"image {name} is one of the operator's images; only an operator removes it "
                        f"(slicex image remove)")
    if image.owner and not same_user(image.owner, user) and not operator:
        raise Forbidden(f"image {name} belongs to {image.owner}; only its owner or an operator deletes it")
    return image


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name):
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


@contextmanager
def locked_dir(root: Path, mode: int | None = None) -> Iterator[None]:
    """A host-wide lock on a directory (made, with `mode` when given, if missing): two `slicex up` on one host
    change an image catalogue or a dataset directory one at a time."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700 if mode is None else mode)
    if mode is not None:
        root.chmod(mode)
    with open(root / ".lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class ImageCatalogue:
    """The images under one directory; building and removing take a host-wide lock (two `up`s at once)."""

    def __init__(self, root: Path = DEFAULT_DIR):
        self.root = Path(root)

    def locked(self) -> AbstractContextManager[None]:
        return locked_dir(self.root, 0o700)  # root's alone: images hold host-root setuid files

    def list(self) -> list[NodeImage]:
        """The published images (a build or a removal in progress, named with a leading dot, is none)."""
        if not self.root.is_dir():
            return []
        return [img for d in sorted(self.root.iterdir()) if NAME_RE.fullmatch(d.name) and (img := self._load(d))]

    def recover(self) -> list[str]:
        """What a cut build, replacement or removal left (kill -9, a power cut), made whole: unfinished builds
        and half-removed images go; an image moved aside by a replacement whose new image never arrived (the
        two-rename fallback) comes back. Taken under the catalogue's lock, so no build is running. Returns
        what it did."""
        done: list[str] = []
        if not self.root.is_dir():
            return done
        with self.locked():
            for d in sorted(self.root.iterdir()):
                kind, _, rest = d.name.partition("-")
                if not d.is_dir() or kind not in (".build", ".removed", ".replaced"):
                    continue
                name = rest.rsplit("-", 1)[0]
                if kind == ".replaced" and NAME_RE.fullmatch(name) and not (self.root / name).exists():
                    d.rename(self.root / name)
                    done.append(f"restored image {name}")
                    continue
                remove_tree(d)
                done.append(f"removed {d.name}")
        return done

    def get(self, name_or_urn: str) -> NodeImage | None:
        name = image_name(name_or_urn)
        return self._load(self.root / name) if NAME_RE.fullmatch(name) else None

    def _load(self, d: Path) -> NodeImage | None:
        try:
            meta = json.loads((d / "image.json").read_text())
        except (OSError, ValueError):
            return None
        if not (d / "rootfs").is_dir():
            return None
        return NodeImage(str(meta["name"]), d / "rootfs", str(meta.get("suite", "")), str(meta.get("build_id", "")),
                         tuple(meta.get("packages", ())), int(meta.get("size_bytes", 0)), str(meta.get("built", "")),
                         str(meta.get("description", "")), str(meta.get("owner", "")),
                         bool(meta.get("public", True)), str(meta.get("base", "")))

    def build(self, name: str = DEFAULT_IMAGE, suite: str = DEFAULT_SUITE, packages: tuple[str, ...] = PACKAGES,
              mirror: str | None = None, progress: ProgressFn | None = None, replace: bool = False,
              vm: bool = False) -> NodeImage:
        """debootstrap an image (a minute or less from a near mirror); an existing image is kept unless
        `replace`. With `vm`, also its VM form (vm_image.py: Debian's cloud kernel, an initramfs, a qcow2 base)
        when it has none of this build. Nodes already running keep the copy they booted."""
        check_name(name)
        if shutil.which("debootstrap") is None:
            raise ServerError("building a node image needs debootstrap (scripts/system-deps.sh installs it)")
        with self.locked():
            existing = self.get(name)
            if existing is not None and not replace:
                return self._with_vm_form(existing, progress) if vm else existing
            work = self.root / f".build-{name}-{uuid.uuid4().hex[:6]}"
            try:
                rootfs = work / "rootfs"
                rootfs.mkdir(parents=True)
                mirror = mirror or host_mirror()
                cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", suite, str(rootfs),
                       mirror]
                _run_with_progress(cmd, progress, work / "debootstrap.log")
                _finish_image(rootfs)
                size = logical_size(rootfs)
                meta = {"name": name, "suite": suite, "build_id": uuid.uuid4().hex[:8], "packages": list(packages),
                        "size_bytes": size, "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        "mirror": mirror, "description": f"Debian {suite} (minbase) with {', '.join(packages)}"}
                (work / "image.json").write_text(json.dumps(meta, indent=1) + "\n")
                (work / "debootstrap.log").unlink(missing_ok=True)
                img = self._publish(work, name)
            finally:
                if work.exists():
                    remove_tree(work)
            return self._with_vm_form(img, progress) if vm else img

    def _with_vm_form(self, image: NodeImage, progress: ProgressFn | None) -> NodeImage:
        """The image with its VM form (vm_image.py) made when it has none of its build; call it locked."""
        form = vm_form(image.rootfs.parent)
        if form is None or form.get("image_build_id") != image.build_id:
            work = self.root / f".build-{image.name}-vm{uuid.uuid4().hex[:6]}"
            try:
                build_vm_form(image.rootfs.parent, image.rootfs, image.build_id, work, progress)
            finally:
                if work.exists():
                    remove_tree(work)
        return image

    def snapshot(self, name: str, base: NodeImage, layer: Path, offset: int, owner: str, public: bool,
                 description: str, max_user_bytes: int = DEFAULT_MAX_USER_BYTES) -> NodeImage:
        """A user's image of a container node: `base` (what the node booted) with the node's overlay `layer`
        applied and its owners moved down by `offset` (the slice's uid range), so another slice boots it like
        any catalogue image. A name the owner already holds is replaced (as ProtoGENI's CreateImage does); the
        name of an operator's or another user's image is refused. Refused, leaving nothing, when the owner's
        snapshots would hold more than `max_user_bytes` together: sizes are logical (a sparse file counts
        at its length, as a later copy of it might write it), checked before anything is copied, and the copy
        of the node's files stops at what is left (`apply_layer`'s cap), so a layer that grows meanwhile
        cannot fill the catalogue's file system either. Files of the node's own lose setuid/setgid bits and
        file capabilities, and its device nodes are not copied (`apply_layer`)."""
        name = check_name(name.lower())
        with self.locked():
            existing = self.get(name)
            if existing is not None and not (existing.owner and same_user(existing.owner, owner)):
                raise AlreadyExists(f"image name {name} is taken in this aggregate's catalogue; choose another")
            held = sum(i.size_bytes for i in self.list() if same_user(i.owner, owner) and i.name != name)

            def check_room(size: int, what: str) -> None:
                if held + size > max_user_bytes:
                    raise TooBig(f"image {name} would be {size} bytes ({what}); with the {held} bytes of {owner}'s "
                                 f"other images that passes the {max_user_bytes} bytes a user's images may hold; "
                                 f"delete some first (DeleteImage)")

            base_size = logical_size(base.rootfs)
            check_room(base_size + logical_size(layer), "its base image and the node's own files, holes counted")
            work = self.root / f".build-{name}-{uuid.uuid4().hex[:6]}"
            try:
                work.mkdir(mode=0o700)
                rootfs = work / "rootfs"
                subprocess.run(["cp", "-a", "--reflink=auto", "--sparse=always", str(base.rootfs), str(rootfs)],
                               check=True, capture_output=True)
                apply_layer(layer, rootfs, offset, cap=max_user_bytes - held - base_size,
                            what=f"image {name} (the node's own files)")
                _finish_image(rootfs)
                size = logical_size(rootfs)
                check_room(size, "measured")
                meta = {"name": name, "suite": base.suite, "build_id": uuid.uuid4().hex[:8],
                        "packages": list(base.packages), "size_bytes": size,
                        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "description": description,
                        "owner": owner, "public": bool(public), "base": base.name}
                (work / "image.json").write_text(json.dumps(meta, indent=1) + "\n")
                return self._publish(work, name)
            except subprocess.CalledProcessError as exc:
                raise ServerError(f"copying image {base.name} for {name} failed: "
                                  f"{exc.stderr.decode(errors='replace')[-300:]}") from None
            finally:
                if work.exists():
                    remove_tree(work)

    def _publish(self, work: Path, name: str) -> NodeImage:
        """A finished build directory becomes image `name` in one step; one it replaces is exchanged with it
        in the same step (it is then in `work`, removed after). Call it locked."""
        target = self.root / name
        work.chmod(0o700)
        if not target.exists():
            work.rename(target)
        elif not exchange(work, target):  # no RENAME_EXCHANGE here: move the old aside first (recover undoes)
            aside = self.root / f".replaced-{name}-{uuid.uuid4().hex[:6]}"
            target.rename(aside)
            work.rename(target)
            aside.rename(work)
        remove_tree(work)
        img = self.get(name)
        assert img is not None
        return img

    def shifted(self, image: NodeImage, index: int, offset: int) -> Path:
        """The image's copy with every owner moved up by `offset` for uid range `index`, kept beside the
        catalogue (`<root>-shifted/<index>/<name>-<build id>`, root's alone) and made once per build and range
        for every deployment of the host: a deployment's own copy for the range is hard-linked from it in a
        moment instead of copied and shifted again (seconds for a Debian image). Made under a lock per range;
        earlier builds of the image are dropped from that range then (deployments keep their own links)."""
        holder = self._shifted_root / str(index)
        path = holder / f"{image.name}-{image.build_id}"
        if path.is_dir():
            return path
        holder.parent.mkdir(parents=True, exist_ok=True)
        holder.parent.chmod(0o700)
        with locked_dir(holder, 0o700):
            if not path.is_dir():
                self._drop_shifted(holder, image.name)
                shift_copy(image.rootfs, path, offset)
        return path

    def remove(self, name: str) -> bool:
        """Remove an image and its shifted copies; nodes booted from it keep their deployment's copy (hard
        links: the files stay while a copy names them) until they are deleted."""
        with self.locked():
            d = self.root / image_name(name)
            if not NAME_RE.fullmatch(d.name) or not (d / "image.json").exists():
                return False
            gone = self.root / f".removed-{d.name}-{uuid.uuid4().hex[:6]}"
            d.rename(gone)  # unlisted at once; a cut removal leaves it for `recover`
            remove_tree(gone)
        for holder in sorted(p for p in self._shifted_root.glob("*") if p.is_dir()):
            with locked_dir(holder, 0o700):
                self._drop_shifted(holder, d.name)
        return True

    @property
    def _shifted_root(self) -> Path:
        return Path(f"{self.root}-shifted")

    @staticmethod
    def _drop_shifted(holder: Path, name: str) -> None:
        """Remove every build of image `name` from a range's shifted copies; the caller holds the range's lock."""
        for old in image_copies(holder, name):
            remove_tree(old)


def image_copies(holder: Path, name: str) -> list[Path]:
    """The copies of image `name` in a directory of copies, each `<name>-<build id>`: not those of an image
    whose name merely starts with it (`snap` is not `snap-2`, whose copies are `snap-2-<build id>`)."""
    pattern = re.compile(rf"{re.escape(name)}-[0-9a-zA-Z]+")
    return sorted(p for p in holder.iterdir() if pattern.fullmatch(p.name)) if holder.is_dir() else []


OPAQUE = ("trusted.overlay.opaque", "user.overlay.opaque")
XWHITEOUT = ("trusted.overlay.whiteout", "user.overlay.whiteout")
NOBODY = 65534


def _xattr(path: str, names: tuple[str, ...]) -> bytes | None:
    for name in names:
        try:
            return os.getxattr(path, name, follow_symlinks=False)
        except OSError:
            continue
    return None


def _remove(p: Path) -> None:
    if p.is_symlink() or (p.exists() and not p.is_dir()):
        p.unlink()
    elif p.exists():
        remove_tree(p)


def apply_layer(layer: Path, target: Path, offset: int, span: int = 65536, cap: int | None = None,
                what: str = "the node's files") -> None:
    """Apply an overlayfs upper `layer` to `target`, a copy of its lower layer, so `target` holds what the
    merged view showed: a whiteout (a 0/0 character device, or a file marked as one) removes the entry below,
    an opaque directory replaces the one below, anything else replaces what is below. Owners move down by
    `offset`; an owner outside [offset, offset + span) becomes nobody. Nothing is followed: an entry in
    `target` is removed before it is written, so a link the node planted cannot lead a write out of `target`;
    overlay's own attributes are not copied.

    What the node made cannot become a privilege on the host, where its owners are now host root's: its
    files lose setuid and setgid bits, no `security.*` attribute (file capabilities) is copied, and device
    nodes are left out. Files are copied sparse (holes stay holes), and the copy stops with TooBig once it
    has written `cap` bytes."""
    layer, target = Path(layer), Path(target)
    made: list[tuple[Path, os.stat_result]] = []
    budget = [cap if cap is not None else -1]

    def owner(i: int) -> int:
        return i - offset if offset <= i < offset + span else NOBODY

    for dirpath, dirs, files in os.walk(layer):
        here = target / os.path.relpath(dirpath, layer)
        for name in sorted([*dirs, *files]):
            src = os.path.join(dirpath, name)
            dst = here / name
            st = os.lstat(src)
            mode = stat.S_IMODE(st.st_mode)
            if (stat.S_ISCHR(st.st_mode) and st.st_rdev == 0) or (
                    stat.S_ISREG(st.st_mode) and st.st_size == 0 and _xattr(src, XWHITEOUT) is not None):
                _remove(dst)
                continue
            if stat.S_ISDIR(st.st_mode):
                if _xattr(src, OPAQUE) == b"y" or dst.is_symlink() or (dst.exists() and not dst.is_dir()):
                    _remove(dst)
                if not dst.is_dir():
                    dst.mkdir()
                os.lchown(dst, owner(st.st_uid), owner(st.st_gid))
                os.chmod(dst, mode)
                made.append((dst, st))
                continue
            _remove(dst)
            if stat.S_ISREG(st.st_mode):
                copy_sparse(src, dst, budget, what)
            elif stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(src), dst)
            elif stat.S_ISFIFO(st.st_mode):
                os.mkfifo(dst)
            else:
                continue  # a device node (a host device once its owner is root) or a socket
            os.lchown(dst, owner(st.st_uid), owner(st.st_gid))
            if not stat.S_ISLNK(st.st_mode):
                os.chmod(dst, mode & ~(stat.S_ISUID | stat.S_ISGID))
                for attr in os.listxattr(src, follow_symlinks=False):
                    if attr.startswith("user.") and ".overlay." not in attr:
                        os.setxattr(dst, attr, os.getxattr(src, attr, follow_symlinks=False))
            os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
    for d, st in reversed(made):  # a directory's time after what was written into it
        os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns))


def copy_sparse(src: str, dst: Path, budget: list[int], what: str = "the copy") -> None:
    """Copy regular file `src` to a new file `dst` (never through a link) writing only its data: holes stay
    holes (SEEK_DATA/SEEK_HOLE; a file system without them is read whole, runs of zeros skipped).
    `budget[0]` is what may still be written (-1: no bound); passing it raises TooBig."""
    chunk = 1 << 20
    fd_in = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        fd_out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            size = os.fstat(fd_in).st_size
            pos = 0
            while pos < size:
                try:
                    start = os.lseek(fd_in, pos, os.SEEK_DATA)
                    end = os.lseek(fd_in, start, os.SEEK_HOLE)
                except OSError as exc:
                    if exc.errno == errno.ENXIO:  # only a hole is left
                        break
                    if exc.errno != errno.EINVAL:
                        raise
                    start, end = pos, size
                while start < end:
                    data = os.pread(fd_in, min(chunk, end - start), start)
                    if not data:
                        break
                    if data.count(0) != len(data):
                        if 0 <= budget[0] < len(data):
                            raise TooBig(f"{what}: the copy passed the bytes left to its owner's images; "
                                         f"nothing was kept (delete some images first, DeleteImage)")
                        if budget[0] >= 0:
                            budget[0] -= len(data)
                        os.pwrite(fd_out, data, start)
                    start += len(data)
                pos = max(end, start)
            os.ftruncate(fd_out, size)
        finally:
            os.close(fd_out)
    finally:
        os.close(fd_in)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (renameat2 RENAME_EXCHANGE); False where the kernel or file system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, f"exchanging {a} and {b}: {os.strerror(err)}")


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


def logical_size(root: Path) -> int:
    """The bytes of a tree's files by their lengths (a sparse file at its full length, not the blocks it
    holds): what a copy of it could write, and what an image is charged for."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
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
    chown_tree(tmp, lambda i: i + offset)
    tmp.rename(dst)


def link_copy(src: Path, dst: Path) -> None:
    """A copy of the tree `src` whose files are hard links to its own (directories made anew, owners and modes
    kept): for a tree nobody writes, such as an overlay's lower layer."""
    tmp = dst.with_name(dst.name + ".tmp")
    if tmp.exists():
        remove_tree(tmp)
    subprocess.run(["cp", "-a", "--link", str(src), str(tmp)], check=True, capture_output=True)
    tmp.rename(dst)


def chown_tree(root: Path, moved: Callable[[int], int]) -> None:
    """Give every entry under `root` (itself included, links not followed) the owner and group `moved` maps
    its own to, keeping setuid/setgid bits (chown clears them)."""
    for dirpath, dirs, files in os.walk(root):
        for name in (None, *dirs, *files):
            if name is None and dirpath != str(root):
                continue  # each directory is moved as an entry of its parent
            p = dirpath if name is None else os.path.join(dirpath, name)
            st = os.lstat(p)
            uid, gid = moved(st.st_uid), moved(st.st_gid)
            if (uid, gid) != (st.st_uid, st.st_gid):
                os.lchown(p, uid, gid)
                if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o6000:
                    os.chmod(p, stat.S_IMODE(st.st_mode))


def remove_tree(p: Path) -> None:
    """Remove a tree root may own under any mode (an image's 0o555 directories included)."""
    shutil.rmtree(p, ignore_errors=True)
    if p.exists():  # read-only bits inside an image (e.g. 0o440 sudoers in a 0o555 directory)
        subprocess.run(["rm", "-rf", "--one-file-system", str(p)], capture_output=True)


def offered_images(catalogue: ImageCatalogue, authority: str, default: str = DEFAULT_IMAGE) -> tuple:
    """The catalogue as the substrate's images (rspec.substrate.Image), the default first: what ListResources
    advertises under each sliver type and what a node naming no image gets. A user's private image is not
    advertised (the slice manager vouches for it to the broker for its owner's requests: `usable_image`)."""
    from rspec.substrate import Image

    imgs = sorted((i for i in catalogue.list() if not i.owner or i.public), key=lambda i: (i.name != default, i.name))
    return tuple(Image(i.name, image_urn(authority, i.name), "Linux", i.version, i.description) for i in imgs)


def usable_image(catalogue: ImageCatalogue, authority: str, user: str, spelled: str) -> str | None:
    """The URN of the user's image (or a public one) `spelled` names, when `user` may boot it; None for
    names the catalogue does not hold, operators' images (the substrate offers those) and others' private
    images."""
    img = catalogue.get(spelled)
    return image_urn(authority, img.name) if img is not None and img.owner and may_use(img, user) else None


class UserImages:
    """What the AM edge asks of the catalogue for ListImages and DeleteImage, with the trust decisions made
    here for the caller: a user sees their own images and others' public ones (an operator every one), and
    deletes only their own (`check_delete`)."""

    def __init__(self, catalogue: ImageCatalogue, authority: str):
        self.catalogue = catalogue
        self.authority = authority

    def record(self, image: NodeImage) -> dict[str, object]:
        return {**image.to_record(), "urn": image_urn(self.authority, image.name)}

    def listed(self, creator: str, caller: str, operator: bool) -> list[dict[str, object]]:
        """The images `creator` made that `caller` may see."""
        return [self.record(i) for i in self.catalogue.list()
                if same_user(i.owner, creator) and (operator or may_use(i, caller))]

    def delete(self, name_or_urn: str, caller: str, operator: bool) -> dict[str, object]:
        """Remove the caller's image (an operator: anyone's); its record. Nodes booted from it keep their
        slice's copy until they are deleted."""
        name = image_name(name_or_urn)
        image = check_delete(self.catalogue.get(name), name, caller, operator)
        self.catalogue.remove(image.name)
        return self.record(image)
