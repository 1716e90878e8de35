"""FPGAs: a whole FPGA programmed with the requester's bitstream, or a virtual router (a data plane in
hardware on a shared FPGA, or in software) on a board.

Units: `fpga:<board>/fpgaN` a whole FPGA, and `router:<board>:<k>` one of a board's router slots: as many as
the board's FPGAs have hardware planes, plus its software planes. The broker counts slots per board; which
plane a router runs in is the FPGA model's choice alone (fpga_aggregate/placement.py `schedule`, run by the
authority's FPGA driver), which also moves routers between planes as others come and go. A slot never names
a plane, so a lease cannot name a plane its router is not on. A whole FPGA takes its own key and as many of
its board's slots as it has hardware planes, so the routers the broker promises on a board always fit in
what is left (the model moves routers off an FPGA that is taken whole)."""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import Any

from fpga_aggregate.aggregate import SOFTWARE_PLANES_PER_BOARD
from fpga_aggregate.boards import Board, boards_from_config
from fpga_aggregate.programming import programming_seconds
from protocol.delegation import Pool
from resources.kind import Amounts, Constraints, Offer, Placement
from rspec.request import RequestNode
from rspec.substrate import Substrate
from slicex.errors import BadArgs, InsufficientNodes

WHOLE_FPGA = "fpga-bitstream"
VIRTUAL_ROUTER = "virtual-router"


def whole_fpga(fpga_id: str) -> str:
    return f"fpga:{fpga_id}"


def router_slots(board: Board) -> tuple[str, ...]:
    """Every router slot of a board: its FPGAs' hardware planes plus its software planes."""
    n = sum(f.hardware_planes for f in board.fpgas) + SOFTWARE_PLANES_PER_BOARD
    return tuple(f"router:{board.name}:{k}" for k in range(n))


class Fpgas:
    name = "fpga"
    unit_kinds = ("fpga", "router")

    def claims(self, node: RequestNode) -> bool:
        return node.fpga is not None

    def placed(self, details: Mapping[str, Any]) -> bool:
        return details.get("sliver_type") in (WHOLE_FPGA, VIRTUAL_ROUTER) or bool(details.get("fpga"))

    def offer(self, substrate: Substrate) -> Offer:
        pools: list[Pool] = []
        for b in boards_from_config(substrate.fpga_boards):
            pools.append(Pool(f"router:{b.name}", "router", router_slots(b), b.name))
            pools += [Pool(whole_fpga(f.id), "fpga", (whole_fpga(f.id),), b.name) for f in b.fpgas]
        return Offer(tuple(pools))

    def _boards(self, substrate: Substrate, node: RequestNode) -> list[Board]:
        req = node.fpga
        assert req is not None
        boards = [b for b in boards_from_config(substrate.fpga_boards) if not req.board or b.name == req.board]
        if not boards:
            raise InsufficientNodes(f"node {node.client_id}: no FPGA board{' ' + req.board if req.board else ''} "
                                    f"here")
        return boards

    def place(self, substrate: Substrate, node: RequestNode, taken: Set[str], given: Constraints) -> Placement:
        req = node.fpga
        assert req is not None
        boards = self._boards(substrate, node)
        urn = f"urn:publicid:IDN+{substrate.authority}+node+"
        if req.kind == WHOLE_FPGA:
            part = given.bitstream_parts.get(req.bitstream)
            if part is None:
                raise BadArgs(f"node {node.client_id}: bitstream {req.bitstream} is not in your catalogue; upload "
                              f"it first (slicex fpga upload)")
            device = part.lower().removeprefix("xc")
            crowded = []
            for b in boards:
                slots = [k for k in router_slots(b) if k not in taken]
                for f in b.fpgas:
                    if f.model.device != device or whole_fpga(f.id) in taken:
                        continue
                    if len(slots) < f.hardware_planes:
                        crowded.append(b.name)
                        continue
                    return Placement(node.client_id, "node", urn + b.name,
                                     (whole_fpga(f.id), *slots[: f.hardware_planes]),
                                     {"fpga": f.id, "board": b.name, "board_model": f.model.name,
                                      "bitstream": req.bitstream, "sliver_type": WHOLE_FPGA, "exclusive": True,
                                      "boot_seconds": programming_seconds(1)})
            models = sorted({f.model.device for b in boards for f in b.fpgas})
            why = f"; virtual routers fill {', '.join(dict.fromkeys(crowded))}" if crowded else ""
            raise InsufficientNodes(f"node {node.client_id}: no free FPGA of part {part} (boards here have "
                                    f"{', '.join(models)}; matching ones are all in use{why})")
        for b in boards:  # first fit over boards; the FPGA model picks the plane on the board
            slot = next((k for k in router_slots(b) if k not in taken), None)
            if slot is not None:
                return Placement(node.client_id, "node", urn + b.name, (slot,),
                                 {"demand_mbps": req.bandwidth_mbps, "table_size": req.table_size,
                                  "routes": list(req.routes), "board": b.name, "board_model": b.model.name,
                                  "sliver_type": VIRTUAL_ROUTER, "exclusive": False, "boot_seconds": 5.0})
        raise InsufficientNodes(f"node {node.client_id}: asked for a virtual router of {req.bandwidth_mbps} Mbps; "
                                f"every hardware and software plane of {', '.join(b.name for b in boards)} is "
                                f"promised")

    def needs(self, substrate: Substrate, node: RequestNode, taken: Set[str]) -> list[dict[str, Any]]:
        req = node.fpga
        assert req is not None
        site_of = {str(b.get("name")): str(b.get("site", "")) for b in substrate.fpga_boards}
        free: dict[str, int] = {}
        for b in boards_from_config(substrate.fpga_boards):
            if req.board and b.name != req.board:
                continue
            slots = sum(1 for k in router_slots(b) if k not in taken)
            if req.kind == WHOLE_FPGA:
                n = sum(1 for f in b.fpgas if whole_fpga(f.id) not in taken and slots >= f.hardware_planes)
            else:
                n = slots
            site = site_of.get(b.name, "")
            free[site] = free.get(site, 0) + n
        what = "FPGAs" if req.kind == WHOLE_FPGA else "FPGA or software planes"
        return [{"resource": what, "site": site, "asked": 1, "available": n} for site, n in free.items()] or \
            [{"resource": what, "site": "", "asked": 1, "available": 0}]

    def asked(self, substrate: Substrate, node: RequestNode) -> Amounts:
        return Amounts(nodes=1, fpgas=1)

    def held(self, details: Mapping[str, Any]) -> Amounts:
        return Amounts(nodes=1, fpgas=1)

    def bin_of(self, key: str) -> str:
        kind, _, rest = key.partition(":")
        return rest.split("/", 1)[0] if kind == "fpga" else rest.rsplit(":", 1)[0]
