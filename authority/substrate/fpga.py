"""The authority's substrate driver for FPGA slivers, in front of the compute driver. It drives the one FPGA
model, `fpga_aggregate.aggregate.FpgaAggregate`, one lease at a time, so the actor that owns the boards is the
one that touches them:

- a whole FPGA (`fpga-bitstream`) is taken on the FPGA the broker ticketed and programmed with the user's
  bitstream when its lease is created; a Provision of several takes the measured time of that many concurrent
  programmings (the slice manager says how many in `programming_batch`; DESIGN §8: 11/17/24/30 s for 1-4);
  `geni_stop` returns it to idle, `geni_start`/`geni_restart` program it again, the lease's end releases it;
- a virtual router is placed by the model's scheduler on the board the broker ticketed (a hardware plane on
  one of its FPGAs or a software plane: the plane is the model's choice alone), its routes (from the request's <fpga:route> elements) compiled into
  the FPGA's shared forwarding table and loaded as SRAM/CAM images; when a lease ends (Delete, expiry) the
  scheduler re-runs and the routers that stay migrate where it now puts them (e.g. software -> a hardware
  plane that freed up), as the model's timed steps. `view` tells the manifest where each one is now.

The broker's units for virtual routers are router slots of a board (`router:<board>:k`, resources/fpga.py),
which name no plane: the broker never promises more routers on a board than it has planes (hardware planes
of FPGAs not held whole, plus software planes), so the model can always place every router; a whole FPGA
ticketed on an FPGA the model used for routers moves them off it first.

Compute nodes, links and the operational time model are the inner driver's."""

from __future__ import annotations

import threading
from datetime import datetime
from functools import cached_property
from typing import Any

import msgspec

from authority.actor import SubstrateDriver
from fpga_aggregate.aggregate import ACTIONS, FpgaAggregate
from fpga_aggregate.backend import FpgaBackend
from fpga_aggregate.bitstreams import BitstreamCatalogue
from fpga_aggregate.boards import Board
from fpga_aggregate.programming import programming_seconds
from protocol.messages import SliverSpec
from rspec.fpga_ext import FpgaRequest, route_of, route_text
from slicex.clock import parse_time
from slicex.errors import BadArgs, Unsupported

WHOLE_FPGA = "fpga-bitstream"
VIRTUAL_ROUTER = "virtual-router"


class FpgaDriver:
    def __init__(self, inner: SubstrateDriver, boards: list[Board], catalogue: BitstreamCatalogue,
                 backend: FpgaBackend):
        self.inner = inner
        self.boards = boards
        self.catalogue = catalogue
        self.backend = backend
        self.description = f"{inner.description}; FPGA boards: {backend.description}"
        self._lock = threading.Lock()

    @cached_property
    def aggregate(self) -> FpgaAggregate:
        """The FPGA model, on the catalogue's store; built on first use (it recompiles running routers' tables
        from the store, which only the process serving leases needs)."""
        with self._lock:
            return FpgaAggregate(self.boards, self.catalogue, self.backend, None, self.catalogue.store,
                                 self.catalogue.dir.parent / "fpga-tables")

    @staticmethod
    def _kind(spec: SliverSpec) -> str:
        return str(spec.details.get("sliver_type", "")) if spec.kind == "node" else ""

    def _request(self, spec: SliverSpec) -> FpgaRequest:
        d = spec.details
        if self._kind(spec) == WHOLE_FPGA:
            return FpgaRequest(WHOLE_FPGA, str(d.get("bitstream", "")))
        board = str(d.get("board") or str(d.get("fpga", "")).split("/", 1)[0])
        try:
            routes = tuple(route_text(route_of(str(r))) for r in d.get("routes") or ())
            return FpgaRequest(VIRTUAL_ROUTER, "", float(d.get("demand_mbps", d.get("bandwidth_mbps", 0.0))),
                               int(d.get("table_size", max(1000, len(routes)))), board, routes)
        except (TypeError, ValueError):
            raise BadArgs(f"virtual router {spec.client_id or spec.id}: malformed demand or routes in its "
                          f"reservation") from None

    def create(self, spec: SliverSpec, now: datetime) -> dict[str, Any]:
        status = self.inner.create(spec, now)
        kind = self._kind(spec)
        if kind not in (WHOLE_FPGA, VIRTUAL_ROUTER):
            return status
        agg = self.aggregate
        try:
            if agg.sliver(spec.id) is None:  # asked again after a lost answer: it is already there
                req = self._request(spec)
                agg.allocate(spec.id, str(spec.details.get("owner", "")), req, now,
                             fpga=str(spec.details.get("fpga", "")) if kind == WHOLE_FPGA else "")
                try:
                    agg.provision([spec.id], now, routes={spec.id: req.table()},
                                  concurrent=max(1, int(spec.details.get("programming_batch", 1))))
                except BaseException:
                    agg.delete([spec.id], now)
                    raise
        except BaseException:
            self.inner.destroy(spec, status, now)
            raise
        if kind == WHOLE_FPGA:
            status = {**status, "programming_seconds": self._seconds_to_ready(spec.id, now), "idle": False}
        return status

    def _seconds_to_ready(self, urn: str, now: datetime) -> float:
        s = self.aggregate.sliver(urn)
        if s is None or not s.ready_at:
            return 0.0
        return max(0.0, (parse_time(s.ready_at) - now).total_seconds())

    def modify(self, spec: SliverSpec, status: dict[str, Any], action: str, now: datetime) -> dict[str, Any]:
        kind = self._kind(spec)
        if kind in (WHOLE_FPGA, VIRTUAL_ROUTER) and action in ACTIONS and self.aggregate.sliver(spec.id):
            was_idle = status.get("idle")
            self.aggregate.perform([spec.id], action, now)
            if kind == WHOLE_FPGA and action == "geni_stop":
                status = {**status, "idle": True}
            elif kind == WHOLE_FPGA and (action == "geni_restart" or was_idle):
                status = {**status, "programming_seconds": programming_seconds(1), "idle": False}
        seconds = status.get("programming_seconds")
        inner_spec = spec if seconds is None else msgspec.structs.replace(spec, details={**spec.details, "boot_seconds": seconds})
        new = self.inner.modify(inner_spec, status, action, now)
        return {**new, **{k: status[k] for k in ("programming_seconds", "idle") if k in status}}

    def destroy(self, spec: SliverSpec, status: dict[str, Any], now: datetime) -> None:
        """Release the sliver; the scheduler re-runs and the routers that stay move where it puts them."""
        if self._kind(spec) in (WHOLE_FPGA, VIRTUAL_ROUTER):
            self.aggregate.delete([spec.id], now)
        self.inner.destroy(spec, status, now)

    def status(self, spec: SliverSpec, status: dict[str, Any], now: datetime) -> tuple[str, str]:
        op, err = self.inner.status(spec, status, now)
        if self._kind(spec) == VIRTUAL_ROUTER and op == "geni_ready":
            s = self.aggregate.sliver(spec.id)
            if s is not None:  # a router migrating between planes is ready but busy until its move ends
                op = self.aggregate.status(spec.id, now)["geni_operational_status"]
                op = op if op in ("geni_ready", "geni_ready_busy") else "geni_ready"
        return op, err

    def view(self, spec: SliverSpec, status: dict[str, Any]) -> dict[str, Any]:
        """What the manifest shows of a leased FPGA sliver: where the model placed it now (and the CAM size of
        its FPGA's shared table), plus whatever the inner driver shows."""
        inner_view = getattr(self.inner, "view", None)
        out = dict(inner_view(spec, status)) if inner_view is not None else {}
        if self._kind(spec) in (WHOLE_FPGA, VIRTUAL_ROUTER) and self.aggregate.sliver(spec.id) is not None:
            out.update(self.aggregate.placement_of(spec.id))
        return out

    def snapshot(self, spec: SliverSpec, status: dict[str, Any], name: str, owner: str, public: bool,
                 now: datetime) -> Any:
        """CreateImage is the inner driver's (an FPGA has no disk to snapshot)."""
        inner = getattr(self.inner, "snapshot", None)
        if inner is None or self._kind(spec) in (WHOLE_FPGA, VIRTUAL_ROUTER):
            raise Unsupported(f"{spec.client_id or spec.id}: this aggregate cannot make an image of it "
                              f"({self.inner.description if inner is None else 'an FPGA sliver has no disk'})")
        return inner(spec, status, name, owner, public, now)

    def start_maintenance(self, board: str, now: datetime) -> list[Any]:
        """A board goes into maintenance: its routers migrate off its FPGAs through the model."""
        return self.aggregate.start_maintenance(board, now)

    def end_maintenance(self, board: str, now: datetime) -> list[Any]:
        return self.aggregate.end_maintenance(board, now)
