"""Resource kinds as plug-ins (resources/): each kind names, offers, places and counts its own units, the kernel's
claim namespaces are exactly the kinds' own, a kind added outside resources/ is placed and delegated like the
built-in ones, and the FPGA kind never promises a router the FPGA model cannot place."""

from __future__ import annotations

from collections.abc import Mapping, Set
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.placement import dry_run, plan
from fpga_aggregate.aggregate import SOFTWARE_PLANES_PER_BOARD
from fpga_aggregate.boards import boards_from_config
from fpga_aggregate.placement import Capacity, HardwareSlot, VirtualNetwork, schedule
from protocol.delegation import Pool
from resources import STANDARD, Kinds, export_substrate
from resources.fpga import router_slots
from resources.kind import Amounts, Constraints, Offer, Placement
from rspec.fpga_ext import FpgaRequest
from rspec.request import Request, RequestNode
from rspec.substrate import Substrate, load_substrate
from slicex.errors import InsufficientNodes
from slicex.inventory import UNIT_KINDS

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
FPGA_SITE = load_substrate(EXAMPLES / "fpga-site.yaml")
TWO_RACKS = load_substrate(EXAMPLES / "two-rack-site.yaml")
PART = "xc2vp70ff1704"  # the BEE2's part
BIT = "sha256:" + "ab" * 32


def test_the_stores_claim_namespaces_are_the_kinds_own():
    assert set(STANDARD.unit_kinds) == set(UNIT_KINDS)


def test_every_offered_unit_belongs_to_a_kind_and_lives_on_its_pools_bin():
    for substrate in (FPGA_SITE, TWO_RACKS):
        d = export_substrate(substrate, "auth", "broker")
        assert d.pools and (d.label_sets or not substrate.switches)
        for pool in d.pools:
            for unit in pool.units:
                assert unit.startswith(pool.name + ":") or unit == pool.name
                assert STANDARD.is_unit(unit), unit
                kind, where = STANDARD.bin_of(unit)
                assert kind == pool.resource_type
                if kind in ("core", "mem", "node", "router", "fpga"):  # bins of hosts and boards
                    assert where in (pool.bin, pool.bin.split("/", 1)[0]), (unit, pool.bin)
        for ls in d.label_sets:
            assert STANDARD.is_unit(ls.key(next(ls.values())))


def test_locks_lease_markers_and_slice_names_are_not_units():
    for key in ("sm-lock:slice", "leased:core:pc1:0", "sa_slice:x", "quota-lock:alice", "ticket:abc"):
        assert not STANDARD.is_unit(key)


# ---- a kind from outside: placed, refused, delegated and counted like the built-in ones ------------------------
class Scratch:
    """A toy node kind: scratch disks of a storage server, `disk:<server>:<i>`, asked by sliver type."""

    name = "scratch"
    unit_kinds = ("disk",)
    disks = 3

    def claims(self, node: RequestNode) -> bool:
        return node.sliver_type == "scratch-disk"

    def placed(self, details: Mapping[str, Any]) -> bool:
        return details.get("sliver_type") == "scratch-disk"

    def offer(self, substrate: Substrate) -> Offer:
        return Offer((Pool("disk:store1", "disk", tuple(f"disk:store1:{i}" for i in range(self.disks)), "store1"),))

    def place(self, substrate: Substrate, node: RequestNode, taken: Set[str], given: Constraints) -> Placement:
        free = [f"disk:store1:{i}" for i in range(self.disks) if f"disk:store1:{i}" not in taken]
        if not free:
            raise InsufficientNodes(f"node {node.client_id}: no scratch disk free")
        return Placement(node.client_id, "node", "store1", (free[0],), {"sliver_type": "scratch-disk"})

    def needs(self, substrate: Substrate, node: RequestNode, taken: Set[str]) -> list[dict[str, Any]]:
        free = sum(f"disk:store1:{i}" not in taken for i in range(self.disks))
        return [{"resource": "scratch disks", "site": "", "asked": 1, "available": free}]

    def asked(self, substrate: Substrate, node: RequestNode) -> Amounts:
        return Amounts(nodes=1)

    def held(self, details: Mapping[str, Any]) -> Amounts:
        return Amounts(nodes=1)

    def bin_of(self, key: str) -> str:
        return key.split(":")[1]


WITH_SCRATCH = Kinds(nodes=(Scratch(), *STANDARD.nodes), links=STANDARD.links)


def test_a_kind_plugged_in_is_placed_delegated_counted_and_reported_short():
    request = Request((RequestNode("d1", sliver_type="scratch-disk"), RequestNode("vm1")), ())
    placed = plan(TWO_RACKS, request, set(), kinds=WITH_SCRATCH)
    assert placed[0].keys == ("disk:store1:0",) and placed[1].keys[0].startswith("core:")
    assert "disk:store1" in export_substrate(TWO_RACKS, "a", "b", WITH_SCRATCH).names()
    assert WITH_SCRATCH.asked(TWO_RACKS, request).nodes == 2
    assert WITH_SCRATCH.held("node", {"sliver_type": "scratch-disk"}) == Amounts(nodes=1)
    assert WITH_SCRATCH.bin_of("disk:store1:2") == ("disk", "store1")
    full = {f"disk:store1:{i}" for i in range(3)}
    answer = dry_run(TWO_RACKS, request, full, kinds=WITH_SCRATCH)
    assert not answer["fits"] and answer["short"][0]["needs"] == [
        {"resource": "scratch disks", "site": "", "asked": 1, "available": 0}]


# ---- FPGAs: the plane is the model's choice, and the broker never promises one it cannot give ------------------
def fpga_node(i: int, kind: str, board: str = "") -> RequestNode:
    if kind == "whole":
        return RequestNode(f"f{i}", fpga=FpgaRequest("fpga-bitstream", BIT, board=board))
    return RequestNode(f"r{i}", fpga=FpgaRequest("virtual-router", "", 300.0 if kind == "fast" else 2.0,
                                                 board=board))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["whole", "fast", "slow"]), st.sampled_from(["", "nf-1", "bee2-1"])),
                min_size=1, max_size=60))
def test_every_router_the_broker_promises_has_a_plane_the_model_gives_it(asks):
    """Place whatever fits, one node at a time, as the broker would; then the FPGA model's scheduler, given
    the boards less the FPGAs held whole, places every promised router (none unplaced) on its own board."""
    boards = boards_from_config(FPGA_SITE.fpga_boards)
    taken: set[str] = set()
    routers: list[tuple[str, str, float]] = []  # (id, board, demand)
    whole: set[str] = set()
    for i, (kind, board) in enumerate(asks):
        node = fpga_node(i, kind, board)
        try:
            [p] = plan(FPGA_SITE, Request((node,), ()), taken, bitstream_parts={BIT: PART})
        except InsufficientNodes:
            continue
        taken |= set(p.keys)
        assert not any(k.startswith(("vplane:", "swplane:")) for k in p.keys)  # no unit names a plane
        if kind == "whole":
            whole.add(p.details["fpga"])
        else:
            routers.append((node.client_id, p.details["board"], node.fpga.bandwidth_mbps))
    for b in boards:
        held = sum(f.hardware_planes for f in b.fpgas if f.id in whole)
        on_board = sum(1 for _r, where, _d in routers if where == b.name)
        assert on_board + held <= len(router_slots(b))
    fpgas = {f.id: f for b in boards for f in b.fpgas}
    capacity = Capacity(tuple(HardwareSlot(f.id, f.hardware_planes, float(f.line_rate_mbps))
                              for f in fpgas.values() if f.id not in whole),
                        SOFTWARE_PLANES_PER_BOARD * len(boards))
    nets = [VirtualNetwork(r, demand, 1000, frozenset(f for f, x in fpgas.items() if x.board == where))
            for r, where, demand in routers]
    placement, _moves = schedule(nets, capacity)
    assert placement.unplaced == []
    for r, where, _d in routers:
        assert placement.where[r] == "software" or fpgas[placement.where[r]].board == where


def test_a_whole_fpga_is_refused_naming_the_routers_that_fill_its_board():
    routers = [RequestNode(f"r{i}", fpga=FpgaRequest("virtual-router", "", 2.0, board="bee2-1"))
               for i in range(len(router_slots(boards_from_config(FPGA_SITE.fpga_boards)[1])) - 3)]
    taken = {k for p in plan(FPGA_SITE, Request(tuple(routers), ()), set()) for k in p.keys}
    whole = RequestNode("f", fpga=FpgaRequest("fpga-bitstream", BIT, board="bee2-1"))
    try:
        plan(FPGA_SITE, Request((whole,), ()), taken, bitstream_parts={BIT: PART})
    except InsufficientNodes as exc:
        assert "virtual routers fill bee2-1" in exc.message
    else:
        raise AssertionError("a whole FPGA was promised on a board whose router slots are all but 3 taken")
