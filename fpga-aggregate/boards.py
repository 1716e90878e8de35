"""FPGA boards as the operator describes them (substrate file `fpga_boards:`), with the two models slicex
knows (DESIGN §8): BEE2 (4 user FPGAs, four 10GE ports each, inter-chip channels) and NetFPGA (one FPGA,
four 1GE ports, two 18-Mbit SRAM banks)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class BoardError(ValueError):
    pass


@dataclass(frozen=True)
class BoardModel:
    name: str
    fpgas: int
    ports_per_fpga: int
    port_mbps: int
    device: str  # Xilinx part of each user FPGA, as written in a bitstream header
    bitstream_bytes: int  # configuration size of that part
    sram_banks: int = 0
    sram_bank_bits: int = 0
    inter_chip_channels: bool = False


BEE2 = BoardModel("BEE2", fpgas=4, ports_per_fpga=4, port_mbps=10_000, device="2vp70ff1704",
                  bitstream_bytes=3_352_496, inter_chip_channels=True)
NETFPGA = BoardModel("NetFPGA", fpgas=1, ports_per_fpga=4, port_mbps=1_000, device="2vp50ff1152",
                     bitstream_bytes=2_381_632, sram_banks=2, sram_bank_bits=18 * 1024 * 1024)
MODELS = {m.name.lower(): m for m in (BEE2, NETFPGA)}

TABLE_PLANES = {"tcam": 4, "sram": 3}
"""Hardware virtual data planes per FPGA by forwarding-table variant (DESIGN §8: 4-5 with on-chip TCAM,
3 with the external-SRAM shared table)."""


@dataclass(frozen=True)
class Fpga:
    board: str
    index: int
    model: BoardModel
    table: str  # "tcam" | "sram"

    @property
    def id(self) -> str:
        return f"{self.board}/fpga{self.index}"

    @property
    def hardware_planes(self) -> int:
        return TABLE_PLANES[self.table]

    @property
    def line_rate_mbps(self) -> int:
        return self.model.port_mbps


@dataclass(frozen=True)
class Board:
    name: str
    model: BoardModel
    fpgas: tuple[Fpga, ...]


def boards_from_config(entries: list[dict[str, Any]] | tuple[dict[str, Any], ...]) -> list[Board]:
    """Boards from the substrate file's `fpga_boards:` list: {name, model: BEE2|NetFPGA, table: tcam|sram}."""
    boards = []
    seen = set()
    for e in entries:
        name = str(e.get("name", ""))
        if not name:
            raise BoardError(f"an FPGA board has no name: {e}")
        if name in seen:
            raise BoardError(f"two FPGA boards are named {name}")
        seen.add(name)
        model = MODELS.get(str(e.get("model", "")).lower())
        if model is None:
            raise BoardError(f"board {name}: model {e.get('model')!r} is not one of {', '.join(m.name for m in MODELS.values())}")
        table = str(e.get("table", "sram" if model is NETFPGA else "tcam")).lower()
        if table not in TABLE_PLANES:
            raise BoardError(f"board {name}: table {table!r} is not tcam or sram")
        boards.append(Board(name, model, tuple(Fpga(name, i, model, table) for i in range(model.fpgas))))
    return boards
