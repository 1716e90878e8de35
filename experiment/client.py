"""The AM API v3 as an experimenter's client speaks it: mutual TLS with the user's certificate, a slice
credential from the slice authority (CreateSlice, as omni's gcf framework does), then Allocate, Provision
(with the user's ssh key in geni_users), PerformOperationalAction geni_start, Status until every sliver is
ready, Describe and Delete. Every failure is a StepError naming the step, the GENI code and the AM's words."""

from __future__ import annotations

import time
import xmlrpc.client
from dataclasses import dataclass
from typing import Any

from slicex.tls_xmlrpc import client

RSPEC_V3 = {"type": "GENI", "version": "3"}


class StepError(Exception):
    """A step of a repetition failed: which, and why (the AM's output, or the exception)."""

    def __init__(self, step: str, message: str, code: int | None = None):
        super().__init__(f"{step}: {message}")
        self.step, self.message, self.code = step, message, code


@dataclass(frozen=True)
class Slice:
    name: str
    urn: str
    credentials: list[dict[str, str]]


class AmClient:
    """One user's connection to an aggregate and its slice authority."""

    def __init__(self, am_url: str, sa_url: str, cert: str, key: str, authority: str, user: str,
                 ssh_keys: list[str] | None = None, timeout: float = 120):
        self.am = client(am_url, cert, key, timeout=timeout)
        self.sa = client(sa_url, cert, key, timeout=timeout)
        self.authority = authority
        self.user_urn = f"urn:publicid:IDN+{authority}+user+{user}"
        self.ssh_keys = ssh_keys or []

    def _call(self, step: str, method: str, *args: Any) -> Any:
        try:
            reply = getattr(self.am, method)(*args)
        except (OSError, xmlrpc.client.Error) as exc:
            raise StepError(step, f"{method} did not answer: {exc}") from None
        code = reply.get("code", {}).get("geni_code")
        if code != 0:
            raise StepError(step, f"{method} answered code {code}: {reply.get('output') or ''}".strip(), code)
        return reply["value"]

    def create_slice(self, name: str) -> Slice:
        urn = f"urn:publicid:IDN+{self.authority}+slice+{name}"
        try:
            cred = self.sa.CreateSlice(urn)
        except (OSError, xmlrpc.client.Error) as exc:
            raise StepError("create_slice", f"slice authority: {exc}") from None
        return Slice(name, urn, [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": cred}])

    def allocate(self, s: Slice, rspec: str) -> str:
        return self._call("allocate", "Allocate", s.urn, s.credentials, rspec, {})["geni_rspec"]

    def provision(self, s: Slice) -> str:
        users = [{"urn": self.user_urn, "keys": self.ssh_keys}]
        return self._call("provision", "Provision", [s.urn], s.credentials, {"geni_users": users})["geni_rspec"]

    def start(self, s: Slice) -> None:
        self._call("start", "PerformOperationalAction", [s.urn], s.credentials, "geni_start", {})

    def status(self, s: Slice, step: str = "ready") -> list[dict[str, Any]]:
        return self._call(step, "Status", [s.urn], s.credentials, {})["geni_slivers"]

    def describe(self, s: Slice) -> str:
        return self._call("describe", "Describe", [s.urn], s.credentials, {"geni_rspec_version": RSPEC_V3})["geni_rspec"]

    def delete(self, s: Slice) -> None:
        self._call("delete", "Delete", [s.urn], s.credentials, {})

    def wait_ready(self, s: Slice, timeout: float, poll: float = 0.25) -> list[dict[str, Any]]:
        """Poll Status until every sliver is geni_ready; a failed sliver or the timeout is a StepError
        naming the slivers that were not ready and why."""
        deadline = time.monotonic() + timeout
        while True:
            slivers = self.status(s)
            failed = [x for x in slivers if x.get("geni_operational_status") == "geni_failed"]
            if failed:
                raise StepError("ready", "; ".join(f"{x['geni_sliver_urn']} failed: {x.get('geni_error', '')}"
                                                   for x in failed))
            if slivers and all(x.get("geni_operational_status") == "geni_ready" for x in slivers):
                return slivers
            if time.monotonic() > deadline:
                waiting = ", ".join(f"{x['geni_sliver_urn']} {x.get('geni_operational_status')}" for x in slivers
                                    if x.get("geni_operational_status") != "geni_ready")
                raise StepError("ready", f"not ready after {timeout:.0f} s: {waiting or 'no slivers'}")
            time.sleep(poll)
