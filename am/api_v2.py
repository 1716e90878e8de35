"""GENI AM API v2 over the same slice manager as the v3 endpoint (am/api.py).

Why it exists: omni's stitcher refuses an aggregate whose GetVersion lists no `"2"` in `geni_api_versions`,
and in its default (v2) mode it really calls CreateSliver/DeleteSliver at that URL (../shared/STITCHING.md
§0, §1.2). Listing a `"2"` URL that does not speak v2 makes omni recurse, so this endpoint is served for real,
at its own URL, and every v2 call is a composition of the v3 handlers: the same authorisation, the same
errors, the same slivers.

v2 shapes (AM API v2): CreateSliver(slice, creds, rspec, users, options) -> manifest string; DeleteSliver,
Shutdown -> True; RenewSliver -> True with the slivers' new expiration as `output` (as gcf's v2 AM);
SliverStatus -> {geni_urn, geni_status, geni_expires, geni_resources: [{geni_urn, geni_status, geni_error}]}
with statuses configuring|ready|failed|unknown; ListResources with
`geni_slice_urn` -> the slice's manifest. Credentials are plain XML strings (v3's structs are accepted too).
Every answer is `{code, value, output}`; failures are results, never faults; GetVersion says `geni_api: 2`."""

from __future__ import annotations

import logging
import traceback
from typing import Any

from cryptography import x509

from am.api import AggregateManager, error_result, result
from slicex.errors import AlreadyExists, BadArgs, GeniError, ServerError, Unsupported
from slicex.slice_identity import check_same_slice, slice_uuid
from slicex.urn import canonical_urn

log = logging.getLogger("slicex.am.v2")

ARITY: dict[str, tuple[int, int]] = {
    "GetVersion": (0, 1), "ListResources": (2, 2), "CreateSliver": (5, 5), "DeleteSliver": (3, 3),
    "SliverStatus": (3, 3), "RenewSliver": (4, 4), "Shutdown": (3, 3)}

GENI_RSPEC = {"type": "GENI", "version": "3"}


def v2_status(operational: str) -> str:
    """A v3 operational state as the one word AM API v2 has for it."""
    if operational in ("geni_ready", "geni_ready_busy"):
        return "ready"
    if operational == "geni_failed":
        return "failed"
    if operational in ("geni_pending_allocation", "geni_notready", "geni_configuring", "geni_stopping"):
        return "configuring"
    return "unknown"


def slice_status(statuses: list[str]) -> str:
    """The slice's v2 status from its slivers': any failed is failed, all ready is ready."""
    if not statuses:
        return "unknown"
    if "failed" in statuses:
        return "failed"
    if all(s == "ready" for s in statuses):
        return "ready"
    return "configuring" if "configuring" in statuses else "unknown"


class AggregateManagerV2:
    """AM API v2 calls, each mapped onto the v3 handlers of `v3` (CreateSliver = Allocate + Provision +
    geni_start, all or nothing; DeleteSliver = Delete of the slice)."""

    def __init__(self, v3: AggregateManager, url: str):
        self.v3 = v3
        self.url = url

    def dispatch(self, method: str, params: tuple, caller_cert: x509.Certificate | None) -> dict[str, Any]:
        """Run one AM API v2 call; whatever happens, return a GENI result."""
        try:
            if method not in ARITY:
                raise Unsupported(f"method {method!r} is not part of AM API v2 ({', '.join(ARITY)}); this "
                                  f"aggregate speaks AM API v3 at {self.v3.identity.url}")
            low, high = ARITY[method]
            if not low <= len(params) <= high:
                raise BadArgs(f"{method} takes {low} arguments, got {len(params)}")
            if method != "GetVersion" and caller_cert is None:
                raise BadArgs("no client certificate: AM API calls need mutual TLS")
            out = getattr(self, "_" + method)(caller_cert, *params)
        except GeniError as err:
            log.info("v2 %s -> %s %s", method, type(err).__name__, err.message)
            out = error_result(err)
        except Exception as exc:  # noqa: BLE001 - the boundary: nothing escapes as a fault
            log.error("v2 %s failed: %s", method, traceback.format_exc())
            out = error_result(ServerError(f"internal error in {method}: {type(exc).__name__}: {exc}; "
                                           f"the operator's log has the details"))
        if method == "GetVersion":
            out["geni_api"] = 2
        return out

    def _GetVersion(self, cert: x509.Certificate | None, options: Any = None) -> dict[str, Any]:
        value = dict(self.v3._GetVersion(cert)["value"])
        value["geni_api"] = 2
        value["geni_api_versions"] = {"2": self.url, "3": self.v3.identity.url}
        return result(value)

    def _ListResources(self, cert, credentials, options) -> dict[str, Any]:
        options = self.v3._options(options)
        if "geni_slice_urn" not in options:
            return self.v3._ListResources(cert, credentials, options)
        slice_urn = options["geni_slice_urn"]
        if not isinstance(slice_urn, str):
            raise BadArgs("geni_slice_urn must be a slice URN string")
        rest = {k: v for k, v in options.items() if k != "geni_slice_urn"}
        described = self.v3._Describe(cert, [slice_urn], credentials, rest)
        if not described["value"]["geni_slivers"]:
            raise self.v3._no_slivers(canonical_urn(slice_urn, "slice"), self.v3.clock.now())
        return result(described["value"]["geni_rspec"])

    def _CreateSliver(self, cert, slice_urn, credentials, rspec, users, options) -> dict[str, Any]:
        options = self.v3._options(options)
        if not isinstance(users, list):
            raise BadArgs("users must be a list of {'urn': ..., 'keys': [...]} structs")
        urn = canonical_urn(slice_urn, "slice")
        verified = self.v3._authorise(cert, credentials, urn, "createsliver", options)
        existing = self.v3.sm.slivers(urn, self.v3.clock.now())
        check_same_slice(urn, slice_uuid(verified.credential), (s.slice_uuid for s in existing))  # re-created?
        if existing:
            raise AlreadyExists(f"slice {urn} already has slivers here; DeleteSliver first (AM API v2 holds one "
                                f"sliver per slice), or use AM API v3 at {self.v3.identity.url} to add to it")
        allocate_opts = {k: v for k, v in options.items() if k in ("geni_speaking_for", "geni_start_time")}
        self.v3._Allocate(cert, slice_urn, credentials, rspec, allocate_opts)
        try:
            opts = {k: v for k, v in options.items() if k in ("geni_speaking_for", "geni_end_time")}
            opts["geni_users"] = users
            self.v3._Provision(cert, [urn], credentials, opts)
            self.v3._PerformOperationalAction(cert, [urn], credentials, "geni_start", opts)
        except BaseException:
            self._undo(urn)  # v2 CreateSliver is all or nothing: nothing stays allocated after a failure
            raise
        described = self.v3._Describe(cert, [urn], credentials, {"geni_rspec_version": GENI_RSPEC})
        return result(described["value"]["geni_rspec"])

    def _undo(self, slice_urn: str) -> None:
        now = self.v3.clock.now()
        try:
            left = [s.urn for s in self.v3.sm.slivers(slice_urn, now)]
            if left:
                self.v3.sm.delete(left, now)
        except Exception:  # noqa: BLE001 - the original failure is what the caller must see
            log.exception("could not release the slivers of a failed CreateSliver of %s", slice_urn)

    def _DeleteSliver(self, cert, slice_urn, credentials, options) -> dict[str, Any]:
        self.v3._Delete(cert, [self._slice(slice_urn)], credentials, options)
        return result(True)

    def _SliverStatus(self, cert, slice_urn, credentials, options) -> dict[str, Any]:
        status = self.v3._Status(cert, [self._slice(slice_urn)], credentials, options)["value"]
        slivers = status["geni_slivers"]
        resources = [{"geni_urn": s["geni_sliver_urn"], "geni_status": v2_status(s["geni_operational_status"]),
                      "geni_error": s["geni_error"]} for s in slivers]
        expires = min(s["geni_expires"] for s in slivers)  # RFC 3339 in UTC: text order is time order
        return result({"geni_urn": status["geni_urn"], "geni_status": slice_status([r["geni_status"] for r in resources]),
                       "geni_expires": expires, "geni_resources": resources})

    def _RenewSliver(self, cert, slice_urn, credentials, expiration, options) -> dict[str, Any]:
        """True, and in `output` the expiration the slivers now have (as gcf's v2 aggregate answers): omni reads
        a time there after geni_extend_alap and records it; v3's sentence explaining a cut-short renewal is
        logged instead."""
        renewed = self.v3._Renew(cert, [self._slice(slice_urn)], credentials, expiration, options)
        if renewed["output"]:
            log.info("v2 RenewSliver of %s: %s", slice_urn, renewed["output"])
        return result(True, output=min(s["geni_expires"] for s in renewed["value"]))  # RFC 3339 UTC: text order

    def _Shutdown(self, cert, slice_urn, credentials, options) -> dict[str, Any]:
        return self.v3._Shutdown(cert, self._slice(slice_urn), credentials, options)

    @staticmethod
    def _slice(slice_urn: Any) -> str:
        """v2 names a slice, never slivers."""
        if not isinstance(slice_urn, str):
            raise BadArgs(f"slice URN must be a string, got {type(slice_urn).__name__}")
        return canonical_urn(slice_urn, "slice")
