"""Persistent datasets of container nodes (netns substrate): data that outlives the slice that wrote it.

A dataset is an ext4 file system in a sparse file of the size its owner asked for (the kernel enforces the
size: a full dataset is ENOSPC inside the node, never the host's disk), kept under the datasets directory
(`/var/lib/slicex/datasets` by default, shared by the deployments of the host like the image catalogue):

    <dir>/<name>/disk.img       the file system
    <dir>/<name>/dataset.json   name, owner (user URN), size, when made, the uid range its files are in, the
                                node that has it mounted
    <dir>/<name>/mnt/           where the host mounts it while a node uses it (bound into the node)

A node whose request names a dataset (rspec/blockstore.py) gets it mounted at its mountpoint: made on first
use, owned by the slice's owner; a later slice of the same owner sees the files. Another user's request
naming it is refused, as is a second node while one holds it. Its files follow the slice: they are moved
into the uid range of the slice that mounts it. Only its owner (or an operator) deletes it
(AM API DeleteDataset, `slicex dataset delete`).

A new dataset is made in `<dir>/.new-<name>-<id>/` and renamed to its name once its file system and record
exist, so a cut creation (kill -9) never holds the name; `recover` (each start of a netns deployment) removes
such leftovers, and a dataset directory without its record (from a version that made it in place)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path

from authority.substrate.images import chown_tree, locked_dir, remove_tree, same_user
from rspec.blockstore import DATASET_NAME, dataset_name
from slicex.errors import BadArgs, Forbidden, Refused, SearchFailed, ServerError, TooBig

DEFAULT_DIR = Path("/var/lib/slicex/datasets")
DEFAULT_QUOTA_MB = 10 * 1024  # what one user's datasets may hold together (slicex.yaml netns.dataset_quota_mb)
SPAN = 65536  # ids of one slice's uid range


@dataclass(frozen=True)
class Dataset:
    name: str
    owner: str
    size_mb: int
    created: str
    base: int | None = None  # the host uid its files' root is (the uid range of the slice that last mounted it)
    holder: str = ""  # the node (namespace) that has it mounted; "" when none

    def to_record(self) -> dict[str, object]:
        """What ListDatasets and `slicex dataset list` show."""
        return {"name": self.name, "owner": self.owner, "size_mb": self.size_mb, "created": self.created,
                "in_use": bool(self.holder)}


def shift_owners(root: Path, old: int | None, new: int) -> None:
    """Move every owner in [old, old + SPAN) to the same id in [new, new + SPAN), keeping setuid bits; a
    fresh file system (`old` None) is given to the new range's root. Links are not followed."""
    def moved(i: int) -> int:
        if old is None:
            return new + i if i < SPAN else i
        return i - old + new if old <= i < old + SPAN else i
    chown_tree(root, moved)


class DatasetStore:
    """The datasets under one directory; every change takes a host-wide lock on it."""

    def __init__(self, root: Path = DEFAULT_DIR):
        self.root = Path(root)

    def locked(self) -> AbstractContextManager[None]:
        return locked_dir(self.root, 0o711)  # a node's root passes through to its mount point, lists nothing

    def get(self, name: str) -> Dataset | None:
        if not DATASET_NAME.fullmatch(name):
            return None
        try:
            return Dataset(**json.loads((self.root / name / "dataset.json").read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def list(self) -> list[Dataset]:
        if not self.root.is_dir():
            return []
        return [d for p in sorted(self.root.iterdir()) if (d := self.get(p.name)) is not None]

    def _save(self, d: Dataset, where: Path | None = None) -> None:
        where = where or self.root / d.name
        tmp = where / ".dataset.json.tmp"
        tmp.write_text(json.dumps(asdict(d), indent=1) + "\n")
        tmp.replace(where / "dataset.json")

    def recover(self) -> list[str]:
        """Remove what a cut creation left (a `.new-*` directory, or a dataset directory without its record):
        the Provision that made it never answered, so no one holds it, and its name is free again. Taken
        under the lock, so no creation is running. Returns what it removed."""
        done: list[str] = []
        if not self.root.is_dir():
            return done
        with self.locked():
            for d in sorted(self.root.iterdir()):
                if not d.is_dir() or not (d.name.startswith(".new-") or (
                        DATASET_NAME.fullmatch(d.name) and not (d / "dataset.json").exists())):
                    continue  # a record this version cannot read is still a dataset: its data stays
                if os.path.ismount(d / "mnt"):
                    subprocess.run(["umount", "-l", str(d / "mnt")], capture_output=True, timeout=60)
                remove_tree(d)
                done.append(f"removed dataset directory {d.name} (a cut creation)")
        return done

    def attach(self, name: str, size_mb: int | None, owner: str, base: int, holder: str, quota_mb: int,
               busy: Callable[[str], bool]) -> Path:
        """Mount the dataset for node `holder` of `owner`'s slice (uid range at `base`) and answer where, making
        it on first use (`size_mb` asked; the owner's datasets together at most `quota_mb`). Refused when
        another user owns it, or another live node (`busy`) holds it."""
        if not owner:
            raise BadArgs(f"dataset {name}: its slice names no owner")
        with self.locked():
            d = self.get(name)
            if d is None:
                d = self._make(name, size_mb, owner, quota_mb)
            elif not same_user(d.owner, owner):
                raise Forbidden(f"dataset {name} belongs to another user; name a dataset of yours")
            elif d.holder and d.holder != holder and busy(d.holder):
                raise Refused(f"dataset {name} is mounted by another node ({d.holder}); delete that node first")
            mnt = self.root / name / "mnt"
            mnt.mkdir(exist_ok=True)
            if not os.path.ismount(mnt):
                out = subprocess.run(["mount", "-o", "loop,nosuid,nodev", str(self.root / name / "disk.img"),
                                      str(mnt)], capture_output=True, text=True, timeout=60)
                if out.returncode != 0:
                    raise ServerError(f"dataset {name}: mounting its file system failed: {out.stderr.strip()[-300:]}")
            if d.base != base:
                shift_owners(mnt, d.base, base)
            self._save(Dataset(d.name, d.owner, d.size_mb, d.created, base, holder))
            return mnt

    def _make(self, name: str, size_mb: int | None, owner: str, quota_mb: int) -> Dataset:
        if size_mb is None:
            raise BadArgs(f"dataset {name} does not exist yet; give its size (size=\"1GB\") to make it")
        held = sum(d.size_mb for d in self.list() if same_user(d.owner, owner))
        if held + size_mb > quota_mb:
            raise TooBig(f"dataset {name} of {size_mb} MB: with the {held} MB of your other datasets that passes "
                         f"the {quota_mb} MB a user's datasets may hold; delete some first (DeleteDataset)")
        d = self.root / f".new-{name}-{uuid.uuid4().hex[:6]}"
        d.mkdir(mode=0o711)
        try:
            fd = os.open(d / "disk.img", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # host root's alone
            with os.fdopen(fd, "wb") as f:
                f.truncate(size_mb * 2**20)  # sparse: the host's disk holds what was written
            out = subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(d / "disk.img")], capture_output=True,
                                 text=True, timeout=120)
            if out.returncode != 0:
                raise ServerError(f"dataset {name}: making its file system failed: {out.stderr.strip()[-300:]}")
            made = Dataset(name, owner, size_mb, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            self._save(made, d)
            d.rename(self.root / name)  # the name is taken only by a whole dataset
            return made
        except BaseException:
            remove_tree(d)
            raise

    def release(self, holder: str) -> None:
        """Unmount what node `holder` held (its node is gone or going); the data stays."""
        with self.locked():
            for d in self.list():
                if d.holder == holder:
                    self._unmount(d.name)
                    self._save(Dataset(d.name, d.owner, d.size_mb, d.created, d.base, ""))

    def _unmount(self, name: str) -> None:
        mnt = self.root / name / "mnt"
        if os.path.ismount(mnt):
            if subprocess.run(["umount", str(mnt)], capture_output=True, timeout=60).returncode != 0:
                subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=60)

    def delete(self, spelled: str, caller: str, operator: bool, busy: Callable[[str], bool]) -> Dataset:
        """Remove a dataset and its data: by its owner or an operator, when no live node holds it. Another
        user's dataset is answered as one that does not exist."""
        name = dataset_name(spelled)
        with self.locked():
            d = self.get(name)
            if d is None or not (operator or same_user(d.owner, caller)):
                raise SearchFailed(f"no dataset {name} of yours here (ListDatasets lists them)")
            if d.holder and busy(d.holder):
                raise Refused(f"dataset {name} is mounted by node {d.holder}; delete that node first")
            self._unmount(name)
            remove_tree(self.root / name)
            return d


class UserDatasets:
    """What the AM edge asks for ListDatasets and DeleteDataset: a user sees and deletes their own datasets
    (an operator anyone's)."""

    def __init__(self, datasets: DatasetStore, busy: Callable[[str], bool]):
        self.datasets = datasets
        self.busy = busy

    def listed(self, owner: str, caller: str, operator: bool) -> list[dict[str, object]]:
        if not (operator or same_user(owner, caller)):
            return []
        return [d.to_record() for d in self.datasets.list() if same_user(d.owner, owner)]

    def delete(self, spelled: str, caller: str, operator: bool) -> dict[str, object]:
        return self.datasets.delete(spelled, caller, operator, self.busy).to_record()

