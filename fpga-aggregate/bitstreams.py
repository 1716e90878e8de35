"""Per-user bitstream catalogue: upload, checksum, size limits, and refusing what does not fit the target.

Bitstreams are Xilinx .bit files: a header of tagged fields ('a' design, 'b' part, 'c' date, 'd' time,
'e' configuration data) that names the part it was built for. Blobs live on disk by SHA-256; the catalogue
lives in the store."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from pathlib import Path

from fpga_aggregate.boards import Fpga
from slicex.errors import BadArgs, SearchFailed, TooBig
from slicex.store import Store
from slicex.store.ownership import Actor, scoped

MAGIC = b"\x00\x09\x0f\xf0\x0f\xf0\x0f\xf0\x0f\xf0\x00\x00\x01"
TABLE = "bitstreams"
MAX_BITSTREAM_BYTES = 64 * 1024 * 1024
MAX_USER_BYTES = 1024 * 1024 * 1024


@dataclass(frozen=True)
class BitHeader:
    design: str
    part: str
    date: str
    time: str
    data_bytes: int


def _norm_part(part: str) -> str:
    p = part.lower()
    return p[2:] if p.startswith("xc") else p


def parse_bit_header(data: bytes) -> BitHeader:
    """Read a .bit header or raise BadArgs naming what is wrong."""
    if not data.startswith(MAGIC):
        raise BadArgs("not a Xilinx .bit file (header magic missing)")
    pos = len(MAGIC)
    fields: dict[str, str] = {}
    while pos < len(data):
        key = chr(data[pos])
        pos += 1
        if key == "e":
            if pos + 4 > len(data):
                raise BadArgs("bitstream header is truncated in its data length")
            (length,) = struct.unpack(">I", data[pos:pos + 4])
            pos += 4
            if len(data) - pos != length:
                raise BadArgs(f"bitstream declares {length} bytes of configuration data but carries {len(data) - pos}")
            return BitHeader(fields.get("a", ""), fields.get("b", ""), fields.get("c", ""), fields.get("d", ""),
                             length)
        if key not in "abcd" or pos + 2 > len(data):
            raise BadArgs(f"bitstream header has an unknown field {key!r}")
        (length,) = struct.unpack(">H", data[pos:pos + 2])
        pos += 2
        fields[key] = data[pos:pos + length].rstrip(b"\x00").decode("ascii", "replace")
        pos += length
    raise BadArgs("bitstream header has no configuration data field")


def build_bitfile(design: str, part: str, payload: bytes, date: str = "2026/01/01", time: str = "00:00:00") -> bytes:
    """A .bit file (for tests, examples and tools that generate bitstreams)."""
    out = bytearray(MAGIC)
    for key, value in (("a", design), ("b", part), ("c", date), ("d", time)):
        raw = value.encode() + b"\x00"
        out += key.encode() + struct.pack(">H", len(raw)) + raw
    out += b"e" + struct.pack(">I", len(payload)) + payload
    return bytes(out)


@dataclass(frozen=True)
class Bitstream:
    user: str
    name: str
    sha256: str
    size: int
    part: str
    design: str
    path: str

    @property
    def ref(self) -> str:
        return f"sha256:{self.sha256}"


class BitstreamCatalogue:
    """Each user's bitstreams: metadata in the store (table `bitstreams`, key user/digest), blobs on disk by
    digest (shared between users who upload the same file, never served to anyone else)."""

    def __init__(self, store: Store, directory: str | Path, max_bytes: int = MAX_BITSTREAM_BYTES,
                 max_user_bytes: int = MAX_USER_BYTES):
        self.store = scoped(store, Actor.FPGA)
        self.dir = Path(directory)
        self.max_bytes = max_bytes
        self.max_user_bytes = max_user_bytes

    def upload(self, user: str, name: str, data: bytes) -> Bitstream:
        if len(data) > self.max_bytes:
            raise TooBig(f"bitstream {name} is {len(data)} bytes; at most {self.max_bytes} are accepted")
        header = parse_bit_header(data)
        digest = hashlib.sha256(data).hexdigest()
        held = sum(b.size for b in self.list(user) if b.sha256 != digest)
        if held + len(data) > self.max_user_bytes:
            raise TooBig(f"bitstream {name} ({len(data)} bytes) would take {user}'s catalogue past its "
                         f"{self.max_user_bytes} bytes ({held} in use); delete some first")
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"{digest}.bit"
        if not path.exists():
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
        b = Bitstream(user, name, digest, len(data), header.part, header.design, str(path))
        self.store.put(TABLE, f"{user}/{digest}", b.__dict__)
        return b

    def get(self, user: str, ref: str) -> Bitstream:
        digest = ref.removeprefix("sha256:")
        doc = self.store.get(TABLE, f"{user}/{digest}")
        if doc is None:
            raise SearchFailed(f"no bitstream {ref} in {user}'s catalogue; upload it first (slicex fpga upload)")
        b = Bitstream(**doc)
        data = Path(b.path).read_bytes()
        if hashlib.sha256(data).hexdigest() != b.sha256:
            raise BadArgs(f"bitstream {ref} on disk no longer matches its checksum; upload it again")
        return b

    def list(self, user: str) -> list[Bitstream]:
        """The user's own, read by key prefix (every Allocate asks, for the parts of the user's bitstreams):
        the other users' catalogues are not read."""
        return sorted((Bitstream(**d) for d in self.store.scan(TABLE, f"{user}/") if d["user"] == user),
                      key=lambda b: b.name)

    def delete(self, user: str, ref: str) -> bool:
        """Forget a bitstream of this user; the blob goes when no other user's catalogue names it."""
        digest = ref.removeprefix("sha256:")
        if not self.store.delete(TABLE, f"{user}/{digest}"):
            return False
        if not any(d["sha256"] == digest for d in self.store.scan(TABLE)):
            (self.dir / f"{digest}.bit").unlink(missing_ok=True)
        return True

    @staticmethod
    def check_fits(b: Bitstream, fpga: Fpga) -> None:
        """Refuse a bitstream built for another part, or larger than the device's configuration memory."""
        if _norm_part(b.part) != _norm_part(fpga.model.device):
            raise BadArgs(f"bitstream {b.name} was built for {b.part}; {fpga.id} is a {fpga.model.device} "
                          f"({fpga.model.name})")
        header = parse_bit_header(Path(b.path).read_bytes())
        if header.data_bytes > fpga.model.bitstream_bytes:
            raise BadArgs(f"bitstream {b.name} carries {header.data_bytes} bytes of configuration; a "
                          f"{fpga.model.device} takes {fpga.model.bitstream_bytes}")
