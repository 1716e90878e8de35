"""The emulated substrate driver: the embedded default. No VMs are started; nodes "boot" on the actor
clock (notready → configuring → ready after the substrate's provisioning delay), links come up at once,
and tests can inject failures. It says it emulates, in GetVersion and in the README."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from protocol.messages import REWIRE
from rspec.substrate import Substrate
from slicex.clock import parse_time, rfc3339

DESCRIPTION = ("emulated substrate: resources are accounted exactly (cores, memory, bare-metal nodes, VLAN tags, "
               "bandwidth) but no VM, node or VLAN is created; boot and stop follow a time model on the actor clock")


@dataclass
class FailurePlan:
    """Client ids whose next start fails, with the reason shown to the user (tests only)."""

    fail_on_start: dict[str, str] = field(default_factory=dict)


class EmulatedDriver:
    description = DESCRIPTION

    def __init__(self, substrate: Substrate, failures: FailurePlan | None = None):
        self.substrate = substrate
        self.failures = failures or FailurePlan()

    def boot_delay(self, kind: str) -> timedelta:
        return timedelta(seconds=self.substrate.provisioning_seconds if kind == "node" else 0)

    def provisioned(self, kind: str, now: datetime) -> dict[str, Any]:
        return {"state": "geni_notready", "since": rfc3339(now), "until": None, "then": None}

    def act(self, op: dict[str, Any], kind: str, client_id: str, action: str, now: datetime,
            boot_seconds: float | None = None) -> dict[str, Any]:
        """New operational record after `action`; the caller checked the action is allowed. `boot_seconds`
        overrides the substrate's delay (FPGA programming time)."""
        delay = timedelta(seconds=boot_seconds) if boot_seconds is not None else self.boot_delay(kind)
        if action in ("geni_start", "geni_restart"):
            failure = self.failures.fail_on_start.get(client_id)
            return {"state": "geni_configuring", "since": rfc3339(now), "until": rfc3339(now + delay),
                    "then": "geni_failed" if failure else "geni_ready", "error": failure or ""}
        if action == "geni_stop":
            return {"state": "geni_stopping", "since": rfc3339(now), "until": rfc3339(now + delay / 2),
                    "then": "geni_notready"}
        if action == REWIRE:  # an Update changed the node's interfaces: nothing physical to change here
            return dict(op)
        if action == "geni_update_users":
            return {"state": "geni_ready_busy", "since": rfc3339(now), "until": rfc3339(now + timedelta(seconds=1)),
                    "then": "geni_ready"}
        raise ValueError(action)

    @staticmethod
    def current(op: dict[str, Any], now: datetime) -> tuple[str, str]:
        """(operational state, error) as of `now`, following the record's timed transition."""
        if op.get("until") and now >= parse_time(op["until"]):
            return op["then"], op.get("error", "")
        return op["state"], ""
