"""The authority's substrate driver for FPGA slivers: whole FPGAs are programmed through the FpgaBackend when
their lease is created and returned to idle when it ends (Delete, expiry, a failed redeem never programs),
so the actor that owns the boards is the one that touches them. Everything else — compute nodes, links,
virtual-router planes, and the operational time model — is the inner driver's.

A Provision of several whole FPGAs redeems one lease per FPGA; the slice manager tells each how many are
being programmed together (`programming_batch` in the sliver's details), so each takes the measured time of
that many concurrent programmings (DESIGN §8: 11/17/24/30 s for 1-4)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from am.authority import SliverSpec, SubstrateDriver
from fpga_aggregate.backend import FpgaBackend
from fpga_aggregate.bitstreams import BitstreamCatalogue
from fpga_aggregate.boards import Board
from slicex.errors import SearchFailed

WHOLE_FPGA = "fpga-bitstream"


class FpgaDriver:
    def __init__(self, inner: SubstrateDriver, boards: list[Board], catalogue: BitstreamCatalogue,
                 backend: FpgaBackend):
        self.inner = inner
        self.fpgas = {f.id: f for b in boards for f in b.fpgas}
        self.catalogue = catalogue
        self.backend = backend
        self.description = f"{inner.description}; FPGA boards: {backend.description}"

    @staticmethod
    def _whole_fpga(spec: SliverSpec) -> bool:
        return spec.kind == "node" and spec.details.get("sliver_type") == WHOLE_FPGA

    def _program(self, spec: SliverSpec, concurrent: int) -> float:
        fpga = self.fpgas.get(spec.details.get("fpga", ""))
        if fpga is None:
            raise SearchFailed(f"no FPGA {spec.details.get('fpga')!r} on this aggregate's boards "
                               f"({', '.join(sorted(self.fpgas))})")
        bitstream = self.catalogue.get(spec.details.get("owner", ""), spec.details.get("bitstream", ""))
        self.catalogue.check_fits(bitstream, fpga)
        return self.backend.program([(fpga, bitstream.path)], concurrent=concurrent)

    def _with_programming_time(self, spec: SliverSpec, status: dict[str, Any]) -> SliverSpec:
        seconds = status.get("programming_seconds")
        return spec if seconds is None else replace(spec, details={**spec.details, "boot_seconds": seconds})

    def create(self, spec: SliverSpec, now: datetime) -> dict[str, Any]:
        status = self.inner.create(spec, now)
        if self._whole_fpga(spec):
            seconds = self._program(spec, max(1, int(spec.details.get("programming_batch", 1))))
            status = {**status, "programming_seconds": seconds, "idle": False}
        return status

    def modify(self, spec: SliverSpec, status: dict[str, Any], action: str, now: datetime) -> dict[str, Any]:
        if self._whole_fpga(spec):
            if action == "geni_stop":
                self.backend.release(self.fpgas[spec.details["fpga"]])
                status = {**status, "idle": True}
            elif action == "geni_restart" or (action == "geni_start" and status.get("idle")):
                status = {**status, "programming_seconds": self._program(spec, 1), "idle": False}
        new = self.inner.modify(self._with_programming_time(spec, status), status, action, now)
        return {**new, **{k: status[k] for k in ("programming_seconds", "idle") if k in status}}

    def destroy(self, spec: SliverSpec, status: dict[str, Any], now: datetime) -> None:
        if self._whole_fpga(spec) and spec.details.get("fpga") in self.fpgas:
            self.backend.release(self.fpgas[spec.details["fpga"]])
        self.inner.destroy(spec, status, now)

    def status(self, spec: SliverSpec, status: dict[str, Any], now: datetime) -> tuple[str, str]:
        return self.inner.status(spec, status, now)
