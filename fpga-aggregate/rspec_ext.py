"""slicex's FPGA RSpec extension (namespace http://slicex.dev/rspec/ext/fpga/1).

In a request node:
  <fpga:sliver type="fpga-bitstream" bitstream="sha256:<digest>"/>            a whole FPGA, your bitstream
  <fpga:sliver type="virtual-router" bandwidth_mbps="200" table_size="5000"/> a data plane on a shared FPGA
Optional `board="NAME"` binds to a board. Manifests repeat the element with `fpga="board/fpgaN"` and
`placement="hardware|software"`; advertisements list boards as nodes with hardware_type BEE2 or NetFPGA."""

from __future__ import annotations

from dataclasses import dataclass

from lxml import etree

from slicex.errors import BadArgs

FPGA_NS = "http://slicex.dev/rspec/ext/fpga/1"
KINDS = ("fpga-bitstream", "virtual-router")


@dataclass(frozen=True)
class FpgaRequest:
    kind: str
    bitstream: str = ""
    bandwidth_mbps: float = 0.0
    table_size: int = 1000
    board: str = ""


def parse_fpga_request(node: etree._Element, client_id: str) -> FpgaRequest | None:
    el = node.find(f"{{{FPGA_NS}}}sliver")
    if el is None:
        return None
    kind = el.get("type", "")
    if kind not in KINDS:
        raise BadArgs(f"node {client_id}: fpga sliver type {kind!r} is not one of {', '.join(KINDS)}")
    try:
        bw = float(el.get("bandwidth_mbps", "0"))
        table = int(el.get("table_size", "1000"))
    except ValueError:
        raise BadArgs(f"node {client_id}: bandwidth_mbps and table_size must be numbers") from None
    if bw < 0 or table < 1:
        raise BadArgs(f"node {client_id}: bandwidth_mbps must be >= 0 and table_size >= 1")
    bitstream = el.get("bitstream", "")
    if kind == "fpga-bitstream" and not bitstream.startswith("sha256:"):
        raise BadArgs(f"node {client_id}: an fpga-bitstream sliver needs bitstream=\"sha256:<digest>\" of a "
                      f"bitstream in your catalogue (slicex fpga upload)")
    return FpgaRequest(kind, bitstream, bw, table, el.get("board", ""))
