"""The FPGA aggregate as a service the AM's substrate driver calls: FPGA slivers (a whole FPGA with the user's
bitstream) and virtual-router slivers (a data plane in hardware on a shared FPGA, or in a software
container), with the AM API's life cycle:

  Allocate                  allocate()   reserve an FPGA, or a plane chosen by the placement scheduler
  Provision                 provision()  program FPGAs (together: the measured concurrent times), load tables
  PerformOperationalAction  perform()    geni_start / geni_stop / geni_restart
  Status, Describe          status(), placement_of()
  Delete                    delete()     release; the scheduler re-runs and moves what should move
  ListResources             advertise()

Virtual routers are re-placed whenever networks come or go, and when a board goes into or
out of maintenance; moving a running network and reconfiguring an FPGA under running networks are timed
steps on the actor clock (migration.py). All state that must survive a restart is in the store (tables
`fpga_slivers`, `fpga_maintenance`); tables are recompiled from it.

This is the one FPGA model: the AM's authority drives it through its substrate driver (authority/substrate/fpga.py),
one lease at a time (the broker picks the FPGA of a whole-FPGA sliver and the board of a virtual router), and
the tests and bench/fpga.py drive it directly."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from fpga_aggregate.backend import FpgaBackend
from fpga_aggregate.bitstreams import BitstreamCatalogue, build_bitfile
from fpga_aggregate.boards import Board, Fpga
from fpga_aggregate.dataplane import SoftwareTable
from fpga_aggregate.fib import L2_SETS_PER_BANK, SharedFib, TableFull
from fpga_aggregate.migration import (
    HW_TO_SW_SECONDS,
    SW_TO_HW_SECONDS,
    Step,
    migration_steps,
    reconfiguration_plan,
)
from fpga_aggregate.placement import SOFTWARE, Capacity, HardwareSlot, Placement, VirtualNetwork, schedule
from rspec.fpga_ext import FpgaRequest
from slicex.clock import Clock, SystemClock, parse_time, rfc3339
from slicex.errors import BadArgs, InsufficientBandwidth, InsufficientNodes, SearchFailed, Unsupported
from slicex.store import Store
from slicex.store.ownership import Actor, scoped

TABLE = "fpga_slivers"
MAINTENANCE = "fpga_maintenance"
SOFTWARE_PLANES_PER_BOARD = 16
ROUTER_DESIGN = "slicex-virtual-router"
ACTIONS = ("geni_start", "geni_stop", "geni_restart")

ALLOCATED, PROVISIONED, STOPPED = "allocated", "provisioned", "stopped"


@dataclass
class FpgaSliver:
    urn: str
    owner: str  # user URN; bitstreams come from this user's catalogue
    kind: str  # "fpga-bitstream" | "virtual-router"
    state: str = ALLOCATED  # allocated | provisioned | stopped
    fpga: str = ""  # FPGA id, or "software"
    placement: str = ""  # "exclusive" | "hardware" | "software"
    bitstream: str = ""
    bandwidth_mbps: float = 0.0
    table_size: int = 0
    board: str = ""
    delivered_mbps: float = 0.0
    ready_at: str = ""  # configuring until then (RFC 3339)
    vid: int = -1  # virtual router id in the FPGA's shared table
    routes: list[list[int]] = field(default_factory=list)  # [prefix, length, port, next hop]
    moves: list[dict[str, Any]] = field(default_factory=list)  # timed migration steps under way

    def request(self) -> FpgaRequest:
        return FpgaRequest(self.kind, self.bitstream, self.bandwidth_mbps, self.table_size, self.board)


class FpgaAggregate:
    def __init__(self, boards: list[Board], catalogue: BitstreamCatalogue, backend: FpgaBackend, clock: Clock | None,
                 store: Store, workdir: str | Path, software_planes_per_board: int = SOFTWARE_PLANES_PER_BOARD,
                 l2_sets: int = L2_SETS_PER_BANK):
        self.boards = boards
        self.fpgas: dict[str, Fpga] = {f.id: f for b in boards for f in b.fpgas}
        self.catalogue = catalogue
        self.backend = backend
        self.clock = clock or SystemClock()
        self.store = scoped(store, Actor.FPGA)
        self.workdir = Path(workdir)
        self.software_planes = software_planes_per_board * len(boards)
        self.l2_sets = l2_sets
        self.fibs: dict[str, SharedFib] = {}
        self.software: dict[str, SoftwareTable] = {}
        self.down: dict[str, tuple[datetime, datetime]] = {}  # FPGA → reprogramming window
        self._lock = threading.RLock()
        self._restore()

    # ---- AM API life cycle ---------------------------------------------------------------------------------------
    def allocate(self, sliver_urn: str, owner: str, req: FpgaRequest, now: datetime | None = None,
                 fpga: str = "") -> FpgaSliver:
        """Reserve: a free FPGA of the bitstream's part (`fpga`: the one the broker chose), or a data plane
        where the scheduler puts it. Virtual routers on a chosen FPGA are moved off it first."""
        now = now or self.clock.now()
        with self._lock:
            self._settle(now)
            if self._load(sliver_urn) is not None:
                raise BadArgs(f"sliver {sliver_urn} already exists")
            if req.board and not any(b.name == req.board for b in self.boards):
                raise SearchFailed(f"no FPGA board {req.board} here (boards: {', '.join(b.name for b in self.boards)})")
            s = FpgaSliver(sliver_urn, owner, req.kind, bitstream=req.bitstream, bandwidth_mbps=req.bandwidth_mbps,
                           table_size=req.table_size, board=req.board)
            if req.kind == "fpga-bitstream":
                s.fpga = (self._chosen_fpga_for(s, fpga) if fpga else self._free_fpga_for(s)).id
                s.placement = "exclusive"
                self._save(s)
                self._evacuate(s, now)
            elif req.kind == "virtual-router":
                self._rebalance(now, new=s)
            else:
                raise BadArgs(f"unknown FPGA sliver type {req.kind!r}")
            return s

    def provision(self, sliver_urns: list[str], now: datetime | None = None,
                  routes: dict[str, list[tuple[int, int, int, int]]] | None = None,
                  concurrent: int | None = None) -> list[FpgaSliver]:
        """Program the FPGAs of bitstream slivers together (the time of k concurrent programmings; `concurrent`:
        k when other calls program more FPGAs of the same Provision) and bring virtual routers up with their
        routes (`routes` by sliver URN; empty tables otherwise)."""
        now = now or self.clock.now()
        routes = routes or {}
        with self._lock:
            self._settle(now)
            slivers = [self._require(u) for u in sliver_urns]
            new = [s for s in slivers if s.state == ALLOCATED]
            exclusive = [s for s in new if s.kind == "fpga-bitstream"]
            if exclusive:
                jobs = []
                for s in exclusive:
                    b = self.catalogue.get(s.owner, s.bitstream)
                    self.catalogue.check_fits(b, self.fpgas[s.fpga])
                    jobs.append((self.fpgas[s.fpga], b.path))
                seconds = self.backend.program(jobs, concurrent=concurrent)
                for s in exclusive:
                    self._ready_in(s, now, seconds)
            for s in slivers:
                if s.kind == "virtual-router" and (s.urn in routes or s.state == ALLOCATED):
                    if s.urn in routes:
                        s.routes = [list(map(int, r)) for r in routes[s.urn]]
                    self._bring_up(s, now, first=s.state == ALLOCATED)
            for s in new:
                s.state = PROVISIONED
                self._save(s)
            return slivers

    def perform(self, sliver_urns: list[str], action: str, now: datetime | None = None) -> list[FpgaSliver]:
        """geni_stop releases the FPGA or takes the plane out of forwarding; geni_start brings it back;
        geni_restart does both (an FPGA is programmed again)."""
        now = now or self.clock.now()
        if action not in ACTIONS:
            raise Unsupported(f"action {action!r} is not supported by FPGA slivers; use one of {', '.join(ACTIONS)}")
        with self._lock:
            self._settle(now)
            slivers = [self._require(u) for u in sliver_urns]
            for s in slivers:
                if s.state == ALLOCATED:
                    raise BadArgs(f"sliver {s.urn} is allocated but not provisioned; provision it first")
            if action in ("geni_stop", "geni_restart"):
                for s in slivers:
                    self._take_down(s)
                    s.state = STOPPED
                    s.ready_at = ""
                    self._save(s)
            if action in ("geni_start", "geni_restart"):
                exclusive = [s for s in slivers if s.kind == "fpga-bitstream" and s.state == STOPPED]
                if exclusive:
                    seconds = self.backend.program([(self.fpgas[s.fpga], self.catalogue.get(s.owner, s.bitstream).path)
                                                    for s in exclusive])
                    for s in exclusive:
                        self._ready_in(s, now, seconds)
                for s in slivers:
                    if s.kind == "virtual-router" and s.state == STOPPED:
                        self._bring_up(s, now, first=True)
                for s in slivers:
                    s.state = PROVISIONED
                    self._save(s)
            return slivers

    def delete(self, sliver_urns: list[str], now: datetime | None = None) -> list[str]:
        """Release the slivers (unknown ones are ignored: delete is idempotent); the scheduler then re-runs
        for the networks that stay. Returns the URNs deleted."""
        now = now or self.clock.now()
        with self._lock:
            self._settle(now)
            gone = []
            for u in sliver_urns:
                s = self._load(u)
                if s is None:
                    continue
                if s.state != ALLOCATED:
                    self._take_down(s)
                self.store.delete(TABLE, u)
                gone.append(u)
            if any(True for _ in self._virtual_routers()):
                self._rebalance(now)
            return gone

    def status(self, sliver_urn: str, now: datetime | None = None) -> dict[str, Any]:
        """What Status reports: GENI allocation and operational state, plus where the sliver runs now."""
        now = now or self.clock.now()
        with self._lock:
            self._settle(now)
            s = self._require(sliver_urn)
            return {"geni_sliver_urn": s.urn, "geni_allocation_status": _ALLOCATION[s.state],
                    "geni_operational_status": self.operational_state(s, now), "geni_error": "",
                    "fpga": s.fpga, "placement": s.placement, "engine": self.engine_at(s, now),
                    "delivered_mbps": s.delivered_mbps, "moves": list(s.moves)}

    def placement_of(self, sliver_urn: str) -> dict[str, Any]:
        """Where a sliver landed, for its manifest: `fpga` (board/fpgaN, or board/software for a router in a
        software plane), `placement` (hardware|software), what it gets, and for a router in hardware the size
        of the Conflict CAM its FPGA's shared table has allocated (entries, bits, this router's entries)."""
        with self._lock:
            s = self._require(sliver_urn)
            software = s.placement == SOFTWARE
            out: dict[str, Any] = {"fpga": f"{s.board}/software" if software and s.board else s.fpga,
                                   "placement": "software" if software else "hardware", "board": self._board_of(s)}
            if s.kind == "virtual-router":
                out["delivered_mbps"] = s.delivered_mbps
                fib = self.fibs.get(s.fpga)
                if not software and fib is not None and s.vid >= 0:
                    mine = [e for e in fib.cam_entries() if e.vid == s.vid]
                    out.update(cam_entries=len(fib.cam), cam_bits=len(fib.cam) * fib.cam_entry_bits(),
                               router_cam_entries=len(mine))
            return out

    def advertise(self) -> list[dict[str, Any]]:
        """Boards and what is free on each (for the advertisement and NDL)."""
        with self._lock:
            exclusive = {s.fpga for s in self._all() if s.kind == "fpga-bitstream"}
            planes = {}
            for s in self._virtual_routers():
                planes[s.fpga] = planes.get(s.fpga, 0) + 1
            out = []
            for b in self.boards:
                m = b.model
                out.append({"name": b.name, "model": m.name, "device": m.device, "fpgas": m.fpgas,
                            "ports_per_fpga": m.ports_per_fpga, "port_mbps": m.port_mbps, "table": b.fpgas[0].table,
                            "hardware_planes": b.fpgas[0].hardware_planes, "sram_banks": m.sram_banks,
                            "sram_bank_bits": m.sram_bank_bits, "inter_chip_channels": m.inter_chip_channels,
                            "software_planes": self.software_planes // max(1, len(self.boards)),
                            "emulated": bool(getattr(self.backend, "emulated", False)),
                            "fpga_state": [{"id": f.id, "available": f.id not in exclusive and f.id not in planes,
                                            "planes_free": 0 if f.id in exclusive else f.hardware_planes - planes.get(f.id, 0)}
                                           for f in b.fpgas]})
            return out

    # ---- maintenance ---------------------------------------------------------------------------------------------
    def start_maintenance(self, board: str, now: datetime | None = None) -> list[Step]:
        """Take a board's FPGAs out of the scheduler's hardware (the operator services it): the virtual
        routers on them move by the usual timed steps to where the scheduler now puts them (a software plane
        for a router bound to the board). A board with whole-FPGA slivers is refused: those cannot move."""
        now = now or self.clock.now()
        with self._lock:
            self._settle(now)
            if not any(b.name == board for b in self.boards):
                raise SearchFailed(f"no FPGA board {board} here (boards: {', '.join(b.name for b in self.boards)})")
            held = [s.urn for s in self._all() if s.kind == "fpga-bitstream" and self.fpgas[s.fpga].board == board]
            if held:
                raise InsufficientNodes(f"board {board} runs whole-FPGA slivers ({', '.join(held)}); they end "
                                        f"before it can go into maintenance")
            self.store.put(MAINTENANCE, board, {"board": board, "since": rfc3339(now)})
            return self._rebalance(now) if any(True for _ in self._virtual_routers()) else []

    def end_maintenance(self, board: str, now: datetime | None = None) -> list[Step]:
        """Give the board's FPGAs back to the scheduler; routers that gain by it move back to hardware."""
        now = now or self.clock.now()
        with self._lock:
            self._settle(now)
            self.store.delete(MAINTENANCE, board)
            return self._rebalance(now) if any(True for _ in self._virtual_routers()) else []

    def sliver(self, sliver_urn: str) -> FpgaSliver | None:
        """A sliver's record, or None if there is none."""
        return self._load(sliver_urn)

    def in_maintenance(self) -> set[str]:
        return {d["board"] for d in self.store.scan(MAINTENANCE)}

    # ---- virtual routers ---------------------------------------------------------------------------------------
    def forward(self, sliver_urn: str, address: int, now: datetime | None = None) -> tuple[int, int] | None:
        """Where a packet to `address` leaves a virtual router now: (port, next hop), or None for no route.
        Goes through the engine serving the network at `now` (the FPGA's compiled table or the software
        plane's copy)."""
        now = now or self.clock.now()
        with self._lock:
            self._settle(now)
            s = self._require_router(sliver_urn)
            if s.state != PROVISIONED or now < parse_time(s.ready_at):
                raise BadArgs(f"virtual router {s.urn} is not forwarding yet (state {self.operational_state(s, now)})")
            engine = self.engine_at(s, now)
            if engine == SOFTWARE:
                return self.software[s.urn](address)
            window = self.down.get(engine)
            if window and window[0] <= now < window[1]:
                raise InsufficientNodes(f"{engine} is being reprogrammed until {rfc3339(window[1])} and "
                                        f"{s.urn} is still on it")
            vid = s.vid if engine == s.fpga else next(m["vid"] for m in s.moves if m["source"] == engine)
            board_lookup = getattr(self.backend, "lookup", None)  # what the board holds (the exported image)
            r = board_lookup(self.fpgas[engine], vid, address) if board_lookup else self.fibs[engine].lookup(vid, address)
            return None if r is None else (r.port, r.next_hop)

    def reconfigure(self, fpga_id: str, now: datetime | None = None) -> list[Step]:
        """Reprogram a shared FPGA without stopping its networks: each moves to software, the FPGA is
        programmed, each moves back (DESIGN §8's ~12/5/3 s); returns the steps, timed from `now` in seconds."""
        now = now or self.clock.now()
        with self._lock:
            self._settle(now)
            fpga = self._fpga(fpga_id)
            on = [s for s in self._virtual_routers() if s.fpga == fpga_id and s.placement == "hardware"
                  and s.state == PROVISIONED]
            in_software = sum(1 for s in self._virtual_routers() if s.placement == SOFTWARE)
            if in_software + len(on) > self.software_planes:
                raise InsufficientNodes(f"reconfiguring {fpga_id} needs {len(on)} software planes to keep its networks "
                                        f"forwarding; {self.software_planes - in_software} are free")
            self.backend.program([(fpga, self._router_design(fpga))])
            steps = reconfiguration_plan(fpga_id, [s.urn for s in on])
            for st in steps:
                if st.action == "reprogram":
                    self.down[fpga_id] = (now + timedelta(seconds=st.start), now + timedelta(seconds=st.end))
            for s in on:  # the same plane comes back: its table entries stay (the SRAM is off-chip)
                s.moves = [_move(st, now) for st in steps if st.network == s.urn]
                self.software[s.urn] = SoftwareTable([tuple(r) for r in s.routes])
                self._save(s)
            if fpga_id in self.fibs:
                self.backend.load_table(fpga, str(self._export(fpga_id)))
            return steps

    # ---- state -------------------------------------------------------------------------------------------------
    def operational_state(self, s: FpgaSliver, now: datetime) -> str:
        if s.state == ALLOCATED:
            return "geni_pending_allocation"
        if s.state == STOPPED:
            return "geni_notready"
        if s.ready_at and now < parse_time(s.ready_at):
            return "geni_configuring"
        if s.moves and now < parse_time(s.moves[-1]["end"]):
            return "geni_ready_busy"
        return "geni_ready"

    def engine_at(self, s: FpgaSliver, now: datetime) -> str:
        """The engine forwarding for a network at `now`, following its timed moves."""
        if s.kind != "virtual-router":
            return s.fpga
        if not s.moves:
            return SOFTWARE if s.placement == SOFTWARE else s.fpga
        engine = s.moves[0]["source"]
        for m in s.moves:
            if parse_time(m["end"]) <= now:
                engine = m["target"]
        return engine

    # ---- internals ---------------------------------------------------------------------------------------------
    def _free_fpga_for(self, s: FpgaSliver) -> Fpga:
        b = self.catalogue.get(s.owner, s.bitstream)  # SearchFailed names the catalogue
        taken = {x.fpga for x in self._all() if x.placement in ("exclusive", "hardware")}
        candidates = [f for f in self.fpgas.values() if not s.board or f.board == s.board]
        matching = [f for f in candidates if _part(f.model.device) == _part(b.part)]
        if not matching:
            devices = sorted({f.model.device for f in candidates})
            raise InsufficientNodes(f"bitstream {b.name} is for {b.part}; the FPGAs here are {', '.join(devices)}")
        for f in matching:
            if f.id not in taken:
                self.catalogue.check_fits(b, f)
                return f
        raise InsufficientNodes(f"all {len(matching)} FPGAs of part {b.part} are in use (by bitstream slivers or "
                                f"virtual routers); try again later")

    def _chosen_fpga_for(self, s: FpgaSliver, fpga_id: str) -> Fpga:
        """The FPGA the broker chose for a whole-FPGA sliver, checked: its part, and no other whole sliver."""
        f = self._fpga(fpga_id)
        b = self.catalogue.get(s.owner, s.bitstream)
        if _part(f.model.device) != _part(b.part):
            raise InsufficientNodes(f"bitstream {b.name} is for {b.part}; {f.id} is a {f.model.device}")
        other = next((x.urn for x in self._all() if x.kind == "fpga-bitstream" and x.fpga == f.id), None)
        if other is not None:
            raise InsufficientNodes(f"{f.id} already runs whole-FPGA sliver {other}")
        self.catalogue.check_fits(b, f)
        return f

    def _evacuate(self, s: FpgaSliver, now: datetime) -> None:
        """Move virtual routers off the FPGA a whole-FPGA sliver now holds (it is out of the scheduler's
        capacity). They move at once: the FPGA is reprogrammed for its new holder, so nothing is left on it to
        forward from during a move; InsufficientNodes (and no sliver) if they cannot all go elsewhere."""
        if not any(r.fpga == s.fpga for r in self._virtual_routers()):
            return
        self._rebalance(now)
        if any(r.fpga == s.fpga for r in self._virtual_routers()):
            self.store.delete(TABLE, s.urn)
            self._rebalance(now)
            raise InsufficientNodes(f"{s.fpga} runs virtual routers that fit nowhere else now")
        for r in self._virtual_routers():
            if any(m["source"] == s.fpga for m in r.moves):
                r.moves = [{**m, "end": rfc3339(now)} if m["source"] == s.fpga else m for m in r.moves]
                self._save(r)
        self._settle(now)

    def _capacity(self) -> Capacity:
        exclusive = {s.fpga for s in self._all() if s.kind == "fpga-bitstream"}
        out = self.in_maintenance()
        return Capacity(tuple(HardwareSlot(f.id, f.hardware_planes, float(f.line_rate_mbps))
                              for f in self.fpgas.values() if f.id not in exclusive and f.board not in out),
                        self.software_planes)

    def _rebalance(self, now: datetime, new: FpgaSliver | None = None) -> list[Step]:
        """Re-run the scheduler over every virtual router (and a new one); apply its placement. A network
        that is running moves by timed steps; one only allocated just changes its reservation."""
        routers = list(self._virtual_routers())
        nets = [VirtualNetwork(s.urn, s.bandwidth_mbps, s.table_size,
                               frozenset(f for f, x in self.fpgas.items() if x.board == s.board) if s.board else frozenset())
                for s in routers + ([new] if new else [])]
        current = {s.urn: (SOFTWARE if s.placement == SOFTWARE else s.fpga) for s in routers}
        placement, migrations = schedule(nets, self._capacity(), current)
        if new is not None and new.urn in placement.unplaced:
            raise _no_room(new, self._capacity(), routers)
        stuck = [u for u in placement.unplaced if u in current]
        if stuck:  # never evict a network that has a plane; keep it where it is
            placement = _keep(placement, stuck, current)
        if new is not None:
            self._assign(new, placement)
            self._save(new)
        steps = migration_steps(migrations)
        for s in routers:
            if s.urn in stuck:
                continue
            target = placement.where[s.urn]
            moved = target != current[s.urn]
            s.delivered_mbps = placement.delivered_mbps[s.urn]
            if moved and s.state == PROVISIONED:  # the source keeps forwarding until the move ends
                step = next(st for st in steps if st.network == s.urn)
                s.moves = [_move(step, now, s.vid if s.placement == "hardware" else -1)]
                s.vid = -1
                self._assign(s, placement)
                self._install(s)
            elif moved:
                self._assign(s, placement)
            self._save(s)
        return steps

    def _assign(self, s: FpgaSliver, placement: Placement) -> None:
        where = placement.where[s.urn]
        s.placement = SOFTWARE if where == SOFTWARE else "hardware"
        s.fpga = where
        s.delivered_mbps = placement.delivered_mbps[s.urn]

    def _bring_up(self, s: FpgaSliver, now: datetime, first: bool) -> None:
        """Start a virtual router's data plane: program a shared FPGA that does not run the router design
        yet, compile and load its table; a software plane starts its container."""
        seconds = 0.0
        if s.placement == "hardware":
            fpga = self.fpgas[s.fpga]
            if self.backend.read_counters(fpga).get("design") != ROUTER_DESIGN:
                seconds += self.backend.program([(fpga, self._router_design(fpga))])
            seconds += SW_TO_HW_SECONDS
        else:
            seconds += HW_TO_SW_SECONDS
        self._install(s)
        if first:
            self._ready_in(s, now, seconds)

    def _install(self, s: FpgaSliver) -> None:
        """Put a virtual router's current routes where it runs (and in software while it moves)."""
        table = [tuple(r) for r in s.routes]
        if s.placement == SOFTWARE or s.moves:
            self.software[s.urn] = SoftwareTable(table)
        if s.placement != "hardware":
            return
        fpga = self.fpgas[s.fpga]
        fib = self.fibs.get(s.fpga)
        if fib is None:
            fib = self.fibs[s.fpga] = SharedFib(routers=fpga.hardware_planes,
                                                l2_sets=L2_SETS_PER_BANK if fpga.table == "sram" else self.l2_sets)
        if s.vid < 0 or s.vid >= fib.routers or s.vid in self._vids_in_use(s.fpga, but=s.urn):
            s.vid = min(set(range(fib.routers)) - self._vids_in_use(s.fpga, but=s.urn))
        fib.clear(s.vid)
        try:
            fib.load(s.vid, table)
        except TableFull as exc:
            fib.clear(s.vid)
            raise InsufficientNodes(f"the {len(table)} routes of {s.urn} do not fit the shared forwarding table of "
                                    f"{s.fpga}: {exc}") from None
        self.backend.load_table(fpga, str(self._export(s.fpga)))
        self._save(s)  # the table slot is taken from now on

    def _take_down(self, s: FpgaSliver) -> None:
        if s.kind == "fpga-bitstream":
            self.backend.release(self.fpgas[s.fpga])
            return
        held = [(m["source"], m["vid"]) for m in s.moves if m.get("vid", -1) >= 0]
        if s.placement == "hardware" and s.vid >= 0:
            held.append((s.fpga, s.vid))
        for fpga, vid in held:
            if fpga in self.fibs:
                self.fibs[fpga].clear(vid)
                self.backend.load_table(self.fpgas[fpga], str(self._export(fpga)))
        s.vid = -1
        s.moves = []
        self.software.pop(s.urn, None)

    def _settle(self, now: datetime) -> None:
        """Finish moves whose last step has ended: the source gives up its table entries and a network back
        in hardware no longer needs its software copy."""
        for s in self._virtual_routers():
            if not s.moves or now < parse_time(s.moves[-1]["end"]):
                continue
            for m in s.moves:
                if m.get("vid", -1) >= 0 and m["source"] in self.fibs:
                    self.fibs[m["source"]].clear(m["vid"])
                    self.backend.load_table(self.fpgas[m["source"]], str(self._export(m["source"])))
            s.moves = []
            if s.placement == "hardware":
                self.software.pop(s.urn, None)
            self._save(s)
        for fpga, (_, end) in list(self.down.items()):
            if end <= now:
                del self.down[fpga]

    def _vids_in_use(self, fpga: str, but: str) -> set[int]:
        """Table slots of an FPGA held by its planes, and by planes still moving away from it."""
        used = set()
        for x in self._virtual_routers():
            if x.urn == but:
                continue
            if x.fpga == fpga and x.vid >= 0:
                used.add(x.vid)
            used.update(m["vid"] for m in x.moves if m["source"] == fpga and m.get("vid", -1) >= 0)
        return used

    def _export(self, fpga_id: str) -> Path:
        d = self.workdir / "tables" / fpga_id.replace("/", "_")
        self.fibs[fpga_id].export(d)
        return d

    def _router_design(self, fpga: Fpga) -> str:
        """The shared virtual-router design for this part (emulated: a bitstream the backend accepts)."""
        path = self.workdir / "designs" / f"{ROUTER_DESIGN}-{fpga.model.device}.bit"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(build_bitfile(ROUTER_DESIGN, "xc" + fpga.model.device, b"\x00" * 4096))
        return str(path)

    def _ready_in(self, s: FpgaSliver, now: datetime, seconds: float) -> None:
        s.ready_at = rfc3339(now + timedelta(seconds=round(seconds)))

    def _board_of(self, s: FpgaSliver) -> str:
        return self.fpgas[s.fpga].board if s.fpga in self.fpgas else s.board

    def _fpga(self, fpga_id: str) -> Fpga:
        if fpga_id not in self.fpgas:
            raise SearchFailed(f"no FPGA {fpga_id} here (FPGAs: {', '.join(sorted(self.fpgas))})")
        return self.fpgas[fpga_id]

    def _require(self, urn: str) -> FpgaSliver:
        s = self._load(urn)
        if s is None:
            raise SearchFailed(f"no FPGA sliver {urn}")
        return s

    def _require_router(self, urn: str) -> FpgaSliver:
        s = self._require(urn)
        if s.kind != "virtual-router":
            raise BadArgs(f"sliver {urn} is a whole FPGA, not a virtual router")
        return s

    def _load(self, urn: str) -> FpgaSliver | None:
        doc = self.store.get(TABLE, urn)
        return FpgaSliver(**doc) if doc else None

    def _save(self, s: FpgaSliver) -> None:
        self.store.put(TABLE, s.urn, asdict(s))

    def _all(self) -> list[FpgaSliver]:
        return [FpgaSliver(**d) for d in self.store.scan(TABLE)]

    def _virtual_routers(self):
        return (s for s in self._all() if s.kind == "virtual-router")

    def _restore(self) -> None:
        """After a restart: recompile the tables of running virtual routers from the store."""
        for s in self._virtual_routers():
            if s.state == PROVISIONED:
                self._install(s)
                self._save(s)


_ALLOCATION = {ALLOCATED: "geni_allocated", PROVISIONED: "geni_provisioned", STOPPED: "geni_provisioned"}


def _part(device: str) -> str:
    return device.lower().removeprefix("xc")


def _move(step: Step, now: datetime, vid: int = -1) -> dict[str, Any]:
    """A step with clock times; `vid` is the table slot the source FPGA keeps until the move ends."""
    return {"action": step.action, "source": step.source, "target": step.target, "vid": vid,
            "start": rfc3339(now + timedelta(seconds=step.start)), "end": rfc3339(now + timedelta(seconds=step.end))}


def _keep(placement: Placement, stuck: list[str], current: dict[str, str]) -> Placement:
    out = Placement(dict(placement.where), dict(placement.delivered_mbps),
                    [u for u in placement.unplaced if u not in stuck])
    for u in stuck:
        out.where[u] = current[u]
        out.delivered_mbps[u] = 0.0
    return out


def _no_room(s: FpgaSliver, cap: Capacity, routers: list[FpgaSliver]) -> Exception:
    """Why a new virtual router does not fit, in numbers the requester can act on."""
    used_planes: dict[str, int] = {}
    used_mbps: dict[str, float] = {}
    for r in routers:
        used_planes[r.fpga] = used_planes.get(r.fpga, 0) + 1
        used_mbps[r.fpga] = used_mbps.get(r.fpga, 0.0) + r.delivered_mbps
    free_planes = sum(max(0, h.planes - used_planes.get(h.fpga, 0)) for h in cap.hardware)
    free_mbps = sum(max(0.0, h.line_rate_mbps - used_mbps.get(h.fpga, 0.0)) for h in cap.hardware
                    if h.planes > used_planes.get(h.fpga, 0))
    free_sw = max(0, cap.software_planes - used_planes.get(SOFTWARE, 0))
    where = (f"{free_planes} hardware planes are free with {free_mbps:g} Mbps of line rate left between them, "
             f"and {free_sw} of {cap.software_planes} software planes ({cap.software_mbps_per_plane:g} Mbps each)")
    if s.bandwidth_mbps > cap.software_mbps_per_plane:
        return InsufficientBandwidth(f"no room for a virtual router of {s.bandwidth_mbps:g} Mbps: {where}")
    return InsufficientNodes(f"no data plane for a virtual router of {s.bandwidth_mbps:g} Mbps: {where}")
