"""Persistent datasets in a request, as CloudLab and ProtoGENI write them: the emulab extension's
`<emulab:blockstore name=".." mountpoint="/data" size="1GB" dataset="urn:publicid:IDN+<authority>+ltdataset+<name>"/>`
inside a node. The dataset outlives the slice; a later request of its owner naming it sees its files
(authority/substrate/datasets.py). Everything here is untrusted input checked into plain data."""

from __future__ import annotations

import re
from dataclasses import dataclass

from lxml import etree

from rspec.namespaces import EMULAB, q
from slicex.errors import BadArgs

DATASET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{0,39}$")
MOUNTPOINT = re.compile(r"^(/[A-Za-z0-9_.-]+)+$")
RESERVED = ("/", "/proc", "/sys", "/dev", "/run", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/usr", "/boot",
            "/var", "/tmp")
UNITS = {"": 1, "m": 1, "mb": 1, "mib": 1, "g": 1024, "gb": 1024, "gib": 1024, "t": 1024 ** 2, "tb": 1024 ** 2,
         "tib": 1024 ** 2}
MAX_MB = 1024 ** 3  # 1 PiB: beyond anything a host holds; the aggregate's own limit is lower
DATASET_TYPES = ("dataset", "ltdataset", "imdataset", "stdataset")


@dataclass(frozen=True)
class Blockstore:
    """One dataset a node mounts: the dataset's name, where it appears in the node, and its size in MiB when
    this request creates it (None: an existing dataset keeps its own)."""

    name: str
    dataset: str
    mountpoint: str
    size_mb: int | None = None

    def to_doc(self) -> dict[str, str]:
        return {"name": self.name, "dataset": self.dataset, "mountpoint": self.mountpoint,
                "size_mb": "" if self.size_mb is None else str(self.size_mb)}

    @staticmethod
    def from_doc(d: dict[str, str]) -> Blockstore:
        return Blockstore(d["name"], d["dataset"], d["mountpoint"], int(d["size_mb"]) if d.get("size_mb") else None)


def dataset_name(spelled: str) -> str:
    """The dataset's name from a bare name or a URN (`...+ltdataset+name`, CloudLab's `...+ltdataset+proj//name`
    or `proj:name`); refused unless it is a plain name (nothing that could name a path)."""
    name = spelled
    if spelled.startswith("urn:publicid:IDN+"):
        parts = spelled.split("+")
        if len(parts) != 4 or parts[2] not in DATASET_TYPES:
            raise BadArgs(f"dataset {spelled!r}: expected urn:publicid:IDN+<authority>+ltdataset+<name>")
        name = parts[3].rsplit("//", 1)[-1].rsplit(":", 1)[-1]
    name = name.lower()
    if not DATASET_NAME.fullmatch(name):
        raise BadArgs(f"dataset name {spelled!r}: lowercase letters, digits, '.' and '-', at most 40, starting "
                      f"with a letter or digit")
    return name


def size_mb(text: str, where: str) -> int:
    """`10GB`, `512MB`, `512` (MiB) -> MiB; refused unless a whole positive size."""
    m = re.fullmatch(r"\s*(\d{1,12})\s*([A-Za-z]{0,3})\s*", text or "")
    if m is None or m.group(2).lower() not in UNITS:
        raise BadArgs(f"{where}: size {text!r} is not a size (e.g. 512MB, 10GB)")
    mb = int(m.group(1)) * UNITS[m.group(2).lower()]
    if not 0 < mb <= MAX_MB:
        raise BadArgs(f"{where}: size {text!r} is out of range")
    return mb


def check_mountpoint(path: str, where: str) -> str:
    """An absolute path of plain segments, not a system directory (a dataset must not hide the node's
    own), nor one with '.' or '..' segments."""
    if not MOUNTPOINT.fullmatch(path or "") or any(seg in (".", "..") for seg in path.split("/")):
        raise BadArgs(f"{where}: mountpoint {path!r} must be an absolute path of plain names (e.g. /mydata)")
    if path.rstrip("/") in RESERVED or path.startswith("/run/") or path.startswith("/proc/") \
            or path.startswith("/sys/") or path.startswith("/dev/"):
        raise BadArgs(f"{where}: mountpoint {path!r} is a system directory of the node; mount the dataset "
                      f"elsewhere (e.g. /mydata)")
    return path


def parse_blockstores(node: etree._Element, client_id: str) -> tuple[Blockstore, ...]:
    """The blockstores a request node asks for; BADARGS naming what is wrong."""
    out: list[Blockstore] = []
    for el in node.findall(q(EMULAB, "blockstore")):
        where = f"node {client_id} blockstore {el.get('name') or '?'}"
        if not el.get("dataset"):
            raise BadArgs(f"{where}: this aggregate offers persistent datasets only; name one with "
                          f"dataset=\"<name>\" (it is made on first use)")
        size = el.get("size")
        out.append(Blockstore(el.get("name") or dataset_name(el.get("dataset", "")),
                              dataset_name(el.get("dataset", "")),
                              check_mountpoint(el.get("mountpoint", ""), where),
                              size_mb(size, where) if size else None))
    mounts = [b.mountpoint for b in out]
    if len(set(mounts)) != len(mounts) or len({b.dataset for b in out}) != len(out):
        raise BadArgs(f"node {client_id}: two blockstores share a mountpoint or a dataset")
    return tuple(out)
