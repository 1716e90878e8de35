"""GENI AM API v3: authenticate, authorise, parse options, call the slice manager, format results.

Every method returns `{code: {geni_code, am_type, am_code}, value, output}`; every failure is a result with
a GENI code and an `output` that says what to do, never an XML-RPC fault (DESIGN §3)."""

from __future__ import annotations

import base64
import logging
import traceback
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from cryptography import x509

from am import slice_manager as sm
from am.slice_manager import SliceManager, Sliver
from rspec import namespaces as ns
from rspec.manifest import SliverView, build_manifest, empty_manifest
from rspec.request import parse_request
from slicex import __version__
from slicex.clock import Clock, parse_time, rfc3339
from slicex.errors import (
    BadArgs,
    BadVersion,
    GeniError,
    OutOfRange,
    Refused,
    SearchFailed,
    ServerError,
    Unsupported,
)
from slicex.urn import parse_urn

log = logging.getLogger("slicex.am")
AM_TYPE = "slicex"

REQUEST_EXTENSIONS = [ns.STITCH2, ns.SHARED_VLAN, ns.SHARED_VLAN_GENI, ns.OPSTATE, ns.QINQ,
                      "http://slicex.dev/rspec/ext/fpga/1"]


@dataclass
class AmPolicy:
    """Operator-tunable limits (slicex.yaml `am:` section)."""

    allocation_lifetime: timedelta = timedelta(minutes=10)
    default_lease: timedelta = timedelta(days=1)
    max_lease: timedelta = timedelta(days=30)
    max_request_bytes: int = 2 * 1024 * 1024
    max_urns: int = 1000


@dataclass
class AmIdentity:
    urn: str
    url: str
    hostname: str = "127.0.0.1"
    substrate_description: str = ""
    extra_version: dict[str, Any] = field(default_factory=dict)


class Verifier:
    """What the endpoint needs of credential verification (slicex.credentials.CredentialVerifier)."""

    def verify(self, credentials: list, caller_cert: x509.Certificate, target_urn: str | None, privilege: str,
               now: datetime, speaking_for: str | None = None) -> Any: ...


def result(value: Any, code: int = 0, output: str = "") -> dict[str, Any]:
    return {"code": {"geni_code": code, "am_type": AM_TYPE, "am_code": code}, "value": value, "output": output}


def error_result(err: GeniError) -> dict[str, Any]:
    return result(0, err.code, err.message)


class AggregateManager:
    def __init__(self, identity: AmIdentity, slice_manager: SliceManager, verifier: Verifier, clock: Clock,
                 advertise: Callable[[bool, datetime], str], policy: AmPolicy | None = None):
        self.identity = identity
        self.sm = slice_manager
        self.verifier = verifier
        self.clock = clock
        self.advertise = advertise
        self.policy = policy or AmPolicy()

    # ---- dispatch ---------------------------------------------------------------------------------------------
    METHODS = ("GetVersion", "ListResources", "Describe", "Allocate", "Renew", "Provision", "Status",
               "PerformOperationalAction", "Delete", "Shutdown")

    def dispatch(self, method: str, params: tuple, caller_cert: x509.Certificate | None) -> dict[str, Any]:
        """Run one AM API call; whatever happens, return a GENI result."""
        try:
            if method not in self.METHODS:
                raise Unsupported(f"method {method!r} is not part of this aggregate's AM API v3 "
                                  f"({', '.join(self.METHODS)})")
            handler = getattr(self, "_" + method)
            arity = {"GetVersion": (0, 1), "ListResources": (2, 2), "Describe": (3, 3), "Allocate": (4, 4),
                     "Renew": (4, 4), "Provision": (3, 3), "Status": (3, 3),
                     "PerformOperationalAction": (4, 4), "Delete": (3, 3), "Shutdown": (3, 3)}[method]
            if not arity[0] <= len(params) <= arity[1]:
                raise BadArgs(f"{method} takes {arity[0]} arguments, got {len(params)}")
            if method != "GetVersion" and caller_cert is None:
                raise BadArgs("no client certificate: AM API calls need mutual TLS")
            out = handler(caller_cert, *params)
            if method == "GetVersion":
                out["geni_api"] = 3
            return out
        except GeniError as err:
            log.info("%s -> %s %s", method, type(err).__name__, err.message)
            out = error_result(err)
        except Exception as exc:  # noqa: BLE001 - the boundary: nothing escapes as a fault
            log.error("%s failed: %s", method, traceback.format_exc())
            out = error_result(ServerError(f"internal error in {method}: {type(exc).__name__}: {exc}; "
                                           f"the operator's log has the details"))
        if method == "GetVersion":
            out["geni_api"] = 3
        return out

    # ---- common helpers ------------------------------------------------------------------------------------
    @staticmethod
    def _options(options: Any) -> dict[str, Any]:
        if options is None:
            return {}
        if not isinstance(options, dict):
            raise BadArgs(f"options must be a struct, got {type(options).__name__}")
        return options

    @staticmethod
    def _cred_list(credentials: Any) -> list:
        if not isinstance(credentials, list):
            raise BadArgs(f"credentials must be a list, got {type(credentials).__name__}")
        if not credentials:
            from slicex.errors import CredentialInvalid

            raise CredentialInvalid("no credentials were passed; send your user or slice credential")
        return credentials

    def _authorise(self, cert: x509.Certificate, credentials: Any, target: str | None, privilege: str,
                   options: dict[str, Any]) -> Any:
        speaking_for = options.get("geni_speaking_for")
        if speaking_for is not None and not isinstance(speaking_for, str):
            raise BadArgs("geni_speaking_for must be a user URN string")
        return self.verifier.verify(self._cred_list(credentials), cert, target, privilege, self.clock.now(),
                                    speaking_for=speaking_for)

    def _rspec_version(self, options: dict[str, Any]) -> None:
        version = options.get("geni_rspec_version")
        if version is None:
            raise BadArgs("option geni_rspec_version is required: {'type': 'GENI', 'version': '3'}")
        if not isinstance(version, dict) or str(version.get("type", "")).lower() != "geni" \
                or str(version.get("version", "")) != "3":
            raise BadVersion(f"RSpec version {version!r} is not supported; use {{'type': 'GENI', 'version': '3'}}")

    def _resolve(self, urns: Any, now: datetime) -> tuple[str, list[Sliver], bool]:
        """(slice URN, slivers named, whether a whole slice was named) for a URN list; one slice only."""
        if not isinstance(urns, list) or not urns:
            raise BadArgs("expected a non-empty list of slice or sliver URNs")
        if len(urns) > self.policy.max_urns:
            raise BadArgs(f"{len(urns)} URNs in one call; at most {self.policy.max_urns}")
        slice_urns: set[str] = set()
        slivers: dict[str, Sliver] = {}
        whole = False
        for text in urns:
            urn = parse_urn(text)
            if urn.type == "slice":
                slice_urns.add(str(urn))
                whole = True
            elif urn.type == "sliver":
                s = self.sm.sliver(str(urn), now)
                if s is None:
                    raise SearchFailed(f"no sliver {text} here (deleted, expired or never allocated)")
                slice_urns.add(s.slice_urn)
                slivers[s.urn] = s
            else:
                raise BadArgs(f"{text} is a {urn.type} URN; name a slice or slivers")
        canonical = {u.lower() for u in slice_urns}
        if len(canonical) > 1:
            raise BadArgs(f"URNs span {len(canonical)} slices ({', '.join(sorted(slice_urns))}); one call acts "
                          f"on one slice")
        slice_urn = next(iter(slice_urns))
        if whole:
            for s in self.sm.slivers(slice_urn, now):
                slivers[s.urn] = s
        return slice_urn, list(slivers.values()), whole

    @staticmethod
    def _struct(s: Sliver) -> dict[str, Any]:
        return {"geni_sliver_urn": s.urn, "geni_allocation_status": s.allocation_state,
                "geni_operational_status": s.operational_state, "geni_expires": rfc3339(s.expires),
                "geni_error": s.error or "", "geni_client_id": s.client_id}

    def _manifest(self, slice_urn: str, slivers: list[Sliver], now: datetime) -> str:
        if not slivers:
            return empty_manifest(now)
        views = [SliverView(s.client_id, s.urn, s.kind, s.component_id, s.details) for s in slivers]
        return build_manifest([r.xml for r in self.sm.request_of(slice_urn)], views, self._cm_id(), now)

    def _cm_id(self) -> str:
        return self.identity.urn

    @staticmethod
    def _maybe_compress(text: str, options: dict[str, Any]) -> str:
        if options.get("geni_compressed"):
            return base64.b64encode(zlib.compress(text.encode("utf-8"))).decode("ascii")
        return text

    def _end_time(self, options: dict[str, Any], default: timedelta, cred_expires: datetime, now: datetime,
                  what: str) -> datetime:
        """The expiry for new or provisioned slivers: asked-for, else default; never past the credential."""
        limit = min(cred_expires, now + self.policy.max_lease)
        asked = options.get("geni_end_time")
        if asked is None:
            return min(now + default, limit)
        end = parse_time(asked)
        if end <= now:
            raise BadArgs(f"geni_end_time {asked} is in the past")
        if end > limit:
            raise OutOfRange(f"{what}: geni_end_time {rfc3339(end)} is after {rfc3339(limit)}, the latest allowed "
                             f"(slice credential expires {rfc3339(cred_expires)}; aggregate maximum "
                             f"{self.policy.max_lease.days} days)")
        return end

    @staticmethod
    def _cred_expiry(verified: Any) -> datetime:
        return verified.expires

    def _check_not_shut_down(self, slice_urn: str) -> None:
        if self.sm.is_shut_down(slice_urn):
            raise Refused(f"slice {slice_urn} has been shut down by the operator; contact them to restore it")

    def _users(self, options: dict[str, Any]) -> list[dict[str, Any]]:
        users = options.get("geni_users", [])
        if not isinstance(users, list) or not all(isinstance(u, dict) for u in users):
            raise BadArgs("geni_users must be a list of {'urn': ..., 'keys': [...]} structs")
        for u in users:
            if not isinstance(u.get("keys", []), list):
                raise BadArgs(f"geni_users entry {u.get('urn')}: keys must be a list of public keys")
        return users

    # ---- the methods -----------------------------------------------------------------------------------------
    def _GetVersion(self, cert: x509.Certificate | None, options: Any = None) -> dict[str, Any]:
        rspec_versions = [{"type": "GENI", "version": "3", "schema": ns.REQUEST_XSD, "namespace": ns.RSPEC3,
                           "extensions": REQUEST_EXTENSIONS}]
        ad_versions = [{"type": "GENI", "version": "3", "schema": ns.AD_XSD, "namespace": ns.RSPEC3,
                        "extensions": REQUEST_EXTENSIONS}]
        value = {
            "geni_api": 3,
            "geni_api_versions": {"3": self.identity.url},
            "geni_request_rspec_versions": rspec_versions,
            "geni_ad_rspec_versions": ad_versions,
            "geni_credential_types": [{"geni_type": "geni_sfa", "geni_version": "3"},
                                      {"geni_type": "geni_sfa", "geni_version": "2"},
                                      {"geni_type": "geni_abac", "geni_version": "1"}],
            "geni_single_allocation": 0,
            "geni_allocate": "geni_many",
            "geni_am_type": AM_TYPE,
            "geni_am_code": __version__,
            "urn": self.identity.urn,
            "hostname": self.identity.hostname,
            "slicex_substrate": self.identity.substrate_description,
            "slicex_extensions": {"qinq": ns.QINQ},
        }
        value.update(self.identity.extra_version)
        return result(value)

    def _ListResources(self, cert, credentials, options) -> dict[str, Any]:
        options = self._options(options)
        now = self.clock.now()
        self._authorise(cert, credentials, None, "listresources", options)
        if "geni_slice_urn" in options:
            raise BadArgs("geni_slice_urn is not a ListResources option in AM API v3; use Describe for a slice")
        self._rspec_version(options)
        ad = self.advertise(bool(options.get("geni_available", False)), now)
        return result(self._maybe_compress(ad, options))

    def _Describe(self, cert, urns, credentials, options) -> dict[str, Any]:
        options = self._options(options)
        now = self.clock.now()
        slice_urn, slivers, _ = self._resolve(urns, now)
        self._authorise(cert, credentials, slice_urn, "getsliceresources", options)
        self._rspec_version(options)
        manifest = self._manifest(slice_urn, slivers, now)
        return result({"geni_rspec": self._maybe_compress(manifest, options), "geni_urn": slice_urn,
                       "geni_slivers": [self._struct(s) for s in slivers]})

    def _Allocate(self, cert, slice_urn, credentials, rspec, options) -> dict[str, Any]:
        options = self._options(options)
        now = self.clock.now()
        urn = str(parse_urn(slice_urn, "slice"))
        verified = self._authorise(cert, credentials, urn, "createsliver", options)
        self._check_not_shut_down(urn)
        if not isinstance(rspec, str):
            raise BadArgs(f"rspec must be a string of XML, got {type(rspec).__name__}")
        request = parse_request(rspec, self.policy.max_request_bytes).for_aggregate(self._cm_id())
        if not request.nodes and not request.links:
            raise BadArgs(f"the request has no nodes or links for this aggregate ({self._cm_id()}); check "
                          f"component_manager_id")
        end = self._end_time(options, self.policy.allocation_lifetime, self._cred_expiry(verified), now, "Allocate")
        end = min(end, now + self.policy.allocation_lifetime)
        slivers = self.sm.allocate(urn, verified.effective_caller_urn, request, end, now)
        return result({"geni_rspec": self._manifest(urn, slivers, now),
                       "geni_slivers": [self._struct(s) for s in slivers]})

    def _Renew(self, cert, urns, credentials, expiration, options) -> dict[str, Any]:
        options = self._options(options)
        now = self.clock.now()
        slice_urn, slivers, _ = self._resolve(urns, now)
        verified = self._authorise(cert, credentials, slice_urn, "renewsliver", options)
        self._check_not_shut_down(slice_urn)
        if not slivers:
            raise SearchFailed(f"slice {slice_urn} has no slivers here to renew")
        end = parse_time(expiration)
        if end <= now:
            raise BadArgs(f"renewal time {expiration} is in the past")
        limit = min(self._cred_expiry(verified), now + self.policy.max_lease)
        output = ""
        if end > limit:
            if not options.get("geni_extend_alap"):
                raise OutOfRange(f"cannot renew to {rfc3339(end)}: the latest allowed is {rfc3339(limit)} "
                                 f"(slice credential expires {rfc3339(self._cred_expiry(verified))}; aggregate "
                                 f"maximum {self.policy.max_lease.days} days). Renew the slice first, or pass "
                                 f"geni_extend_alap")
            output = f"renewed to {rfc3339(limit)}, the latest allowed, instead of {rfc3339(end)}"
            end = limit
        renewed = self.sm.renew([s.urn for s in slivers], end, now, bool(options.get("geni_best_effort")))
        return result([self._struct(s) for s in renewed], output=output)

    def _Provision(self, cert, urns, credentials, options) -> dict[str, Any]:
        options = self._options(options)
        now = self.clock.now()
        slice_urn, slivers, _ = self._resolve(urns, now)
        verified = self._authorise(cert, credentials, slice_urn, "createsliver", options)
        self._check_not_shut_down(slice_urn)
        self._rspec_version(options) if "geni_rspec_version" in options else None
        if not slivers:
            raise SearchFailed(f"slice {slice_urn} has no slivers here to provision; Allocate first")
        end = self._end_time(options, self.policy.default_lease, self._cred_expiry(verified), now, "Provision")
        provisioned = self.sm.provision([s.urn for s in slivers], end, self._users(options), now)
        return result({"geni_rspec": self._manifest(slice_urn, provisioned, now),
                       "geni_slivers": [self._struct(s) for s in provisioned]})

    def _Status(self, cert, urns, credentials, options) -> dict[str, Any]:
        options = self._options(options)
        now = self.clock.now()
        slice_urn, slivers, _ = self._resolve(urns, now)
        self._authorise(cert, credentials, slice_urn, "getsliceresources", options)
        if not slivers:
            raise SearchFailed(f"slice {slice_urn} has no slivers here")
        return result({"geni_urn": slice_urn, "geni_slivers": [self._struct(s) for s in slivers]})

    def _PerformOperationalAction(self, cert, urns, credentials, action, options) -> dict[str, Any]:
        options = self._options(options)
        now = self.clock.now()
        slice_urn, slivers, _ = self._resolve(urns, now)
        self._authorise(cert, credentials, slice_urn, "createsliver", options)
        self._check_not_shut_down(slice_urn)
        if not isinstance(action, str) or action not in sm.ACTIONS:
            raise Unsupported(f"operational action {action!r} is not supported; supported: {', '.join(sm.ACTIONS)}")
        if not slivers:
            raise SearchFailed(f"slice {slice_urn} has no slivers here")
        done = self.sm.perform([s.urn for s in slivers], action, now, bool(options.get("geni_best_effort")),
                               self._users(options))
        return result([self._struct(s) for s in done])

    def _Delete(self, cert, urns, credentials, options) -> dict[str, Any]:
        options = self._options(options)
        now = self.clock.now()
        slice_urn, slivers, _ = self._resolve(urns, now)
        self._authorise(cert, credentials, slice_urn, "deleteslice", options)
        if not slivers:
            raise SearchFailed(f"slice {slice_urn} has no slivers here to delete")
        deleted = self.sm.delete([s.urn for s in slivers], now)
        return result([self._struct(s) for s in deleted])

    def _Shutdown(self, cert, slice_urn, credentials, options) -> dict[str, Any]:
        options = self._options(options)
        now = self.clock.now()
        urn = str(parse_urn(slice_urn, "slice"))
        self._authorise(cert, credentials, urn, "shutdown", options)
        self.sm.shutdown(urn, now)
        return result(True)
