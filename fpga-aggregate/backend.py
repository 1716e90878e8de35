"""The hardware backend seam: what the aggregate asks of FPGA boards. The default backend emulates them
faithfully (bitstreams are checked against the device, programming takes the measured time, tables are
compiled to real SRAM images and read back) and says so; a hardware backend implements the same calls."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from fpga_aggregate.bitstreams import _norm_part, parse_bit_header
from fpga_aggregate.boards import Fpga
from fpga_aggregate.fib import ExportedImage, Route
from fpga_aggregate.programming import programming_seconds
from slicex.errors import BadArgs

TABLE_FILES = ("sram_l1.bin", "sram_l2.bin", "owner_tags.bin", "conflict_cam.bin", "fib.json")


class FpgaBackend(Protocol):
    description: str
    emulated: bool

    def program(self, fpgas: list[tuple[Fpga, str]], concurrent: int | None = None) -> float:
        """Program each FPGA with a bitstream file (concurrently); return seconds until all are configured.
        `concurrent`: how many FPGAs are being programmed at once in all (these and others asked for by
        separate calls of the same provisioning); default: these."""

    def load_table(self, fpga: Fpga, export_dir: str) -> None:
        """Write an exported shared FIB (SharedFib.export: SRAM banks, owner tags, CAM) to the board."""

    def read_counters(self, fpga: Fpga) -> dict[str, int | str]:
        """What the board reports: its configuration and its counters."""

    def release(self, fpga: Fpga) -> None:
        """Return the FPGA to its idle configuration."""


class EmulatedFpgaBackend:
    description = ("emulated FPGA boards: bitstreams are checked against the device and 'programmed' with the "
                   "measured programming time on the actor clock; forwarding tables are compiled to real SRAM "
                   "images and read back; nothing is written to hardware")
    emulated = True

    def __init__(self) -> None:
        self.loaded: dict[str, str] = {}  # fpga id → bitstream path or table directory
        self.designs: dict[str, str] = {}  # fpga id → design name from the bitstream header
        self.images: dict[str, ExportedImage] = {}  # fpga id → the table as the board would hold it
        self.counters: dict[str, dict[str, int]] = {}

    def program(self, fpgas: list[tuple[Fpga, str]], concurrent: int | None = None) -> float:
        headers = []
        for fpga, path in fpgas:  # check everything before touching anything
            header = parse_bit_header(Path(path).read_bytes())
            if _norm_part(header.part) != _norm_part(fpga.model.device):
                raise BadArgs(f"{fpga.id} is a {fpga.model.device}; the bitstream is for {header.part}")
            if header.data_bytes > fpga.model.bitstream_bytes:
                raise BadArgs(f"{fpga.id} takes {fpga.model.bitstream_bytes} bytes of configuration; the bitstream "
                              f"carries {header.data_bytes}")
            headers.append(header)
        for (fpga, path), header in zip(fpgas, headers, strict=True):
            self.loaded[fpga.id] = path
            self.designs[fpga.id] = header.design
            self.images.pop(fpga.id, None)
            self._count(fpga, "programmings")
        return programming_seconds(max(concurrent or 0, len(fpgas)))

    def load_table(self, fpga: Fpga, export_dir: str) -> None:
        for name in TABLE_FILES:
            if not (Path(export_dir) / name).exists():
                raise BadArgs(f"table export in {export_dir} lacks {name}")
        self.images[fpga.id] = ExportedImage(export_dir)
        self.loaded.setdefault(fpga.id, export_dir)
        self._count(fpga, "table_loads")

    def lookup(self, fpga: Fpga, vid: int, address: int) -> Route | None:
        """A lookup in the table the board holds: the exported SRAM/CAM files as last loaded (emulation only;
        a hardware backend has no such call and the aggregate answers from its compiled table)."""
        image = self.images.get(fpga.id)
        if image is None:
            raise BadArgs(f"{fpga.id} holds no forwarding table")
        self._count(fpga, "lookups")
        return image.lookup(vid, address)

    def read_counters(self, fpga: Fpga) -> dict[str, int | str]:
        return {"design": self.designs.get(fpga.id, ""), **self.counters.get(fpga.id, {})}

    def release(self, fpga: Fpga) -> None:
        self.loaded.pop(fpga.id, None)
        self.designs.pop(fpga.id, None)
        self.images.pop(fpga.id, None)

    def _count(self, fpga: Fpga, key: str) -> None:
        c = self.counters.setdefault(fpga.id, {})
        c[key] = c.get(key, 0) + 1
