"""GENI AM API v2 over the same slice manager as the v3 endpoint (am/api.py).

Why it exists: omni's stitcher refuses an aggregate whose GetVersion lists no `"2"` in `geni_api_versions`,
and in its default (v2) mode it really calls CreateSliver/DeleteSliver at that URL (../shared/STITCHING.md
§0, §1.2). Listing a `"2"` URL that does not speak v2 makes omni recurse, so this endpoint is served for real,
at its own URL, and every v2 call is a composition of the v3 handlers: the same authorisation, the same
errors, the same slivers. v3's public operations (`AggregateManager.Allocate`, ...) are what it calls;
slicex/endpoint.py serves it.

v2 shapes (AM API v2): CreateSliver(slice, creds, rspec, users, options) -> manifest string; DeleteSliver,
Shutdown -> True; RenewSliver -> True with the slivers' new expiration as `output` (as gcf's v2 AM);
SliverStatus -> {geni_urn, geni_status, geni_expires, geni_resources: [{geni_urn, geni_status, geni_error}]}
with statuses configuring|ready|failed|unknown; ListResources with
`geni_slice_urn` -> the slice's manifest. ProtoGENI's image calls, which ProtoGENI serves at v2 and omni
sends to the v2 URL by default (no `-V3`), with the arguments omni gives both versions: CreateImage(slice,
image name, sliver, creds, {global}) -> the image's URN; ListImages(creator, creds, options) -> a list of
structs; DeleteImage(image, creds, options) -> True. Credentials are plain XML strings (v3's structs are
accepted too).
Every answer is `{code, value, output}`; failures are results, never faults; GetVersion says `geni_api: 2`."""

from __future__ import annotations

import logging
from typing import Any

from cryptography import x509

from am.api import AM_TYPE, AggregateManager, result
from slicex.endpoint import Endpoint, GeniResults, geni_options, public_methods
from slicex.errors import AlreadyExists, BadArgs
from slicex.slice_identity import check_same_slice, slice_uuid
from slicex.urn import canonical_urn

log = logging.getLogger("slicex.am.v2")

METHODS = ("GetVersion", "ListResources", "CreateSliver", "DeleteSliver", "SliverStatus", "RenewSliver", "Shutdown",
           "CreateImage", "ListImages", "DeleteImage")

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

    def endpoint(self) -> Endpoint:
        """AM API v2 on XML-RPC: each of `METHODS` is the public method of that name; failures are results."""
        answers = GeniResults(AM_TYPE, 2, "AM API v2", f"; this aggregate speaks AM API v3 at {self.v3.identity.url}")
        return Endpoint("am.v2", public_methods(self, METHODS, anonymous=("GetVersion",)), answers)

    def GetVersion(self, cert: x509.Certificate | None, options: Any = None) -> dict[str, Any]:
        value = dict(self.v3.GetVersion(cert)["value"])
        value["geni_api"] = 2
        value["geni_api_versions"] = {"2": self.url, "3": self.v3.identity.url}
        return result(value)

    def ListResources(self, cert, credentials, options) -> dict[str, Any]:
        options = geni_options(options)
        if "geni_slice_urn" not in options:
            return self.v3.ListResources(cert, credentials, options)
        slice_urn = options["geni_slice_urn"]
        if not isinstance(slice_urn, str):
            raise BadArgs("geni_slice_urn must be a slice URN string")
        rest = {k: v for k, v in options.items() if k != "geni_slice_urn"}
        described = self.v3.Describe(cert, [slice_urn], credentials, rest)
        if not described["value"]["geni_slivers"]:
            raise self.v3.no_slivers(canonical_urn(slice_urn, "slice"), self.v3.clock.now())
        return result(described["value"]["geni_rspec"])

    def CreateSliver(self, cert, slice_urn, credentials, rspec, users, options) -> dict[str, Any]:
        options = geni_options(options)
        if not isinstance(users, list):
            raise BadArgs("users must be a list of {'urn': ..., 'keys': [...]} structs")
        urn = canonical_urn(slice_urn, "slice")
        verified = self.v3.authorise(cert, credentials, urn, "createsliver", options)
        existing = self.v3.sm.slivers(urn, self.v3.clock.now())
        check_same_slice(urn, slice_uuid(verified.credential), (s.slice_uuid for s in existing))  # re-created?
        if existing:
            raise AlreadyExists(f"slice {urn} already has slivers here; DeleteSliver first (AM API v2 holds one "
                                f"sliver per slice), or use AM API v3 at {self.v3.identity.url} to add to it")
        allocate_opts = {k: v for k, v in options.items() if k in ("geni_speaking_for", "geni_start_time")}
        self.v3.Allocate(cert, slice_urn, credentials, rspec, allocate_opts)
        try:
            opts = {k: v for k, v in options.items() if k in ("geni_speaking_for", "geni_end_time")}
            opts["geni_users"] = users
            self.v3.Provision(cert, [urn], credentials, opts)
            self.v3.PerformOperationalAction(cert, [urn], credentials, "geni_start", opts)
        except BaseException:
            self._undo(urn)  # v2 CreateSliver is all or nothing: nothing stays allocated after a failure
            raise
        described = self.v3.Describe(cert, [urn], credentials, {"geni_rspec_version": GENI_RSPEC})
        return result(described["value"]["geni_rspec"])

    def _undo(self, slice_urn: str) -> None:
        now = self.v3.clock.now()
        try:
            left = [s.urn for s in self.v3.sm.slivers(slice_urn, now)]
            if left:
                self.v3.sm.delete(left, now)
        except Exception:  # noqa: BLE001 - the original failure is what the caller must see
            log.exception("could not release the slivers of a failed CreateSliver of %s", slice_urn)

    def DeleteSliver(self, cert, slice_urn, credentials, options) -> dict[str, Any]:
        self.v3.Delete(cert, [self._slice(slice_urn)], credentials, options)
        return result(True)

    def SliverStatus(self, cert, slice_urn, credentials, options) -> dict[str, Any]:
        status = self.v3.Status(cert, [self._slice(slice_urn)], credentials, options)["value"]
        slivers = status["geni_slivers"]
        resources = [{"geni_urn": s["geni_sliver_urn"], "geni_status": v2_status(s["geni_operational_status"]),
                      "geni_error": s["geni_error"]} for s in slivers]
        expires = min(s["geni_expires"] for s in slivers)  # RFC 3339 in UTC: text order is time order
        return result({"geni_urn": status["geni_urn"], "geni_status": slice_status([r["geni_status"] for r in resources]),
                       "geni_expires": expires, "geni_resources": resources})

    def RenewSliver(self, cert, slice_urn, credentials, expiration, options) -> dict[str, Any]:
        """True, and in `output` the expiration the slivers now have (as gcf's v2 aggregate answers): omni reads
        a time there after geni_extend_alap and records it; v3's sentence explaining a cut-short renewal is
        logged instead."""
        renewed = self.v3.Renew(cert, [self._slice(slice_urn)], credentials, expiration, options)
        if renewed["output"]:
            log.info("v2 RenewSliver of %s: %s", slice_urn, renewed["output"])
        return result(True, output=min(s["geni_expires"] for s in renewed["value"]))  # RFC 3339 UTC: text order

    def Shutdown(self, cert, slice_urn, credentials, options) -> dict[str, Any]:
        return self.v3.Shutdown(cert, self._slice(slice_urn), credentials, options)

    # ---- ProtoGENI's image calls: same arguments and answers at v2 as at v3 (omni sends them alike) -----------
    def CreateImage(self, cert, slice_urn, image_name, sliver_urn, credentials, options) -> dict[str, Any]:
        return self.v3.CreateImage(cert, slice_urn, image_name, sliver_urn, credentials, options)

    def ListImages(self, cert, creator_urn, credentials, options) -> dict[str, Any]:
        return self.v3.ListImages(cert, creator_urn, credentials, options)

    def DeleteImage(self, cert, image_urn, credentials, options) -> dict[str, Any]:
        return self.v3.DeleteImage(cert, image_urn, credentials, options)

    @staticmethod
    def _slice(slice_urn: Any) -> str:
        """v2 names a slice, never slivers."""
        if not isinstance(slice_urn, str):
            raise BadArgs(f"slice URN must be a string, got {type(slice_urn).__name__}")
        return canonical_urn(slice_urn, "slice")
