"""The hardware backend seam: what the aggregate asks of FPGA boards. The default backend emulates them
faithfully (bitstreams are checked against the device, programming takes the measured time, tables are
compiled to real SRAM images) and says so; a hardware backend implements the same three calls."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from fpga_aggregate.bitstreams import parse_bit_header
from fpga_aggregate.boards import Fpga
from fpga_aggregate.programming import programming_seconds
from slicex.errors import BadArgs


class FpgaBackend(Protocol):
    description: str

    def program(self, fpgas: list[tuple[Fpga, str]]) -> float:
        """Program each FPGA with a bitstream file (concurrently); return seconds until all are configured."""

    def load_table(self, fpga: Fpga, export_dir: str) -> None:
        """Write an exported shared FIB (sram_l1.bin, sram_l2.bin, conflict_cam.bin) to the board."""

    def release(self, fpga: Fpga) -> None:
        """Return the FPGA to its idle configuration."""


class EmulatedFpgaBackend:
    description = ("emulated FPGA boards: bitstreams are checked against the device and 'programmed' with the "
                   "measured programming time on the actor clock; nothing is written to hardware")

    def __init__(self) -> None:
        self.loaded: dict[str, str] = {}  # fpga id → bitstream path or table directory

    def program(self, fpgas: list[tuple[Fpga, str]]) -> float:
        for fpga, path in fpgas:
            header = parse_bit_header(Path(path).read_bytes())
            if header.part.lower().removeprefix("xc") != fpga.model.device:
                raise BadArgs(f"{fpga.id} is a {fpga.model.device}; the bitstream is for {header.part}")
            self.loaded[fpga.id] = path
        return programming_seconds(len(fpgas))

    def load_table(self, fpga: Fpga, export_dir: str) -> None:
        for name in ("sram_l1.bin", "sram_l2.bin", "conflict_cam.bin", "fib.json"):
            if not (Path(export_dir) / name).exists():
                raise BadArgs(f"table export in {export_dir} lacks {name}")
        self.loaded[fpga.id] = export_dir

    def release(self, fpga: Fpga) -> None:
        self.loaded.pop(fpga.id, None)
