"""GENI AM API v3: authenticate, authorise, parse options, call the slice manager, format results.

Every method returns `{code: {geni_code, am_type, am_code}, value, output}`; every failure is a result with
a GENI code and an `output` that says what to do, never an XML-RPC fault (DESIGN §3)."""

from __future__ import annotations

import base64
import logging
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from cryptography import x509

from am.find_slot import OPTION as FIND_SLOT
from am.find_slot import slot_question
from protocol import slice_manager as sm
from protocol.slice_manager import SliceManager, Sliver
from rspec import namespaces as ns
from rspec.manifest import SliverView, build_manifest, empty_manifest
from rspec.request import Request, parse_request
from rspec.slot import slot_rspec
from slicex import __version__, pki
from slicex.clock import Clock, parse_time, rfc3339
from slicex.credentials import credential_slices
from slicex.endpoint import Endpoint, GeniResults, geni_options, public_methods
from slicex.errors import (
    BadArgs,
    BadVersion,
    CredentialInvalid,
    Forbidden,
    GeniError,
    OutOfRange,
    Refused,
    SearchFailed,
    Unsupported,
    error_named,
)
from slicex.slice_identity import check_same_slice, slice_uuid
from slicex.term import Term
from slicex.urn import Urn, as_spelled, canonical_urn, parse_urn

log = logging.getLogger("slicex.am")
AM_TYPE = "slicex"

# What the aggregate acts on: stitching v2 hops (stitching/am_hops.py: each hop's tag is held on its port's
# wire and reported, translated where a port translates) and the Q-in-Q extension (the broker holds the
# S-tag on the port; the netns data plane pushes/pops it: docs/stitching.md).
REQUEST_EXTENSIONS = [ns.STITCH2, ns.QINQ, ns.SHARED_VLAN, ns.SHARED_VLAN_GENI, ns.OPSTATE,
                      "http://slicex.dev/rspec/ext/fpga/1", ns.PUBLIC, ns.MEASURE]


@dataclass
class AmPolicy:
    """Operator-tunable limits (slicex.yaml `am:` section)."""

    allocation_lifetime: timedelta = timedelta(minutes=10)
    default_lease: timedelta = timedelta(days=1)
    max_lease: timedelta = timedelta(days=30)
    max_request_bytes: int = 2 * 1024 * 1024
    max_urns: int = 1000
    operators: frozenset[str] = frozenset()  # canonical user URNs that may Shutdown any slice (`operators:`)


@dataclass
class AmIdentity:
    urn: str
    url: str
    hostname: str = "127.0.0.1"
    substrate_description: str = ""
    extra_version: dict[str, Any] = field(default_factory=dict)
    v2_url: str = ""  # where am/api_v2.py serves AM API v2 (listed under "2" only when served: omni recurses else)


class Verifier:
    """What the endpoint needs of credential verification (slicex.credentials.CredentialVerifier)."""

    def verify(self, credentials: list, caller_cert: x509.Certificate, target_urn: str | None, privilege: str,
               now: datetime, speaking_for: str | None = None) -> Any: ...


ANSWERS = GeniResults(AM_TYPE, 3, "this aggregate's AM API v3")
"""Every AM API v3 answer is a GENI result, failures too (never a fault)."""


def result(value: Any, code: int = 0, output: str = "") -> dict[str, Any]:
    return ANSWERS.result(value, code, output)


class AggregateManager:
    def __init__(self, identity: AmIdentity, slice_manager: SliceManager, verifier: Verifier, clock: Clock,
                 advertise: Callable[[bool, datetime], str], policy: AmPolicy | None = None,
                 metrics: Any = None, dry_run: Callable[..., dict[str, Any]] | None = None,
                 find_slot: Callable[..., Any] | None = None):
        self.identity = identity
        self.sm = slice_manager
        self.verifier = verifier
        self.clock = clock
        self.advertise = advertise
        self.policy = policy or AmPolicy()
        self.metrics = metrics  # operations.metrics.Metrics: every call counted and timed by method and GENI code
        # the slice manager's dry_run: Allocate with slicex_dry_run answers where the request would go, holding nothing
        self.dry_run = dry_run
        # the slice manager's find_slot: ListResources with slicex_find_slot answers when a request fits (am/find_slot.py)
        self.find_slot = find_slot
        # slicex.peers.PeerGate: what a federation peer's users may do here (docs/federation.md "Peers")
        self.peers: Any = None
        # operations.ledger.Ledger: usage records per sliver and the operator's service levels (docs/operator-guide.md)
        self.ledger: Any = None
        # slice URN -> its members' URNs at this deployment's slice authority (none for other authorities'
        # slices): who besides the caller may be named in geni_users
        self.slice_members: Callable[[str], Iterable[str]] | None = None
        # authority.substrate.images.UserImages: the node image catalogue as ListImages and DeleteImage see it
        # (None where the substrate keeps none: they answer UNSUPPORTED)
        self.images: Any = None
        # authority.substrate.datasets.UserDatasets: persistent datasets as ListDatasets and DeleteDataset see them
        self.datasets: Any = None

    # ---- the surface -----------------------------------------------------------------------------------------
    METHODS = ("GetVersion", "ListResources", "Describe", "Allocate", "Renew", "Provision", "Status",
               "PerformOperationalAction", "Delete", "Shutdown", "Update", "Cancel", "CreateImage", "DeleteImage",
               "ListImages", "ListDatasets", "DeleteDataset")

    def endpoint(self) -> Endpoint:
        """AM API v3 on XML-RPC: each of `METHODS` is the public method of that name; every call runs under a
        fresh request id (slicex.logs: it follows the call to the slice manager and the actors), is counted
        and timed by method and GENI code, and answers a GENI result whatever happens."""
        return Endpoint("am", public_methods(self, self.METHODS, anonymous=("GetVersion",)), ANSWERS,
                        observe=self.metrics.observe if self.metrics is not None else None)

    # ---- common helpers ------------------------------------------------------------------------------------
    @staticmethod
    def _cred_list(credentials: Any) -> list:
        """The credentials argument as a list. An empty list is a required argument left out, so BADARGS, as
        jFed's tester expects (testListResourcesBadCredential), not a credential that failed to verify
        (CREDENTIAL_INVALID is for what was sent and refused)."""
        if not isinstance(credentials, list):
            raise BadArgs(f"credentials must be a list, got {type(credentials).__name__}")
        if not credentials:
            raise BadArgs("no credentials were passed (an empty list); send your user credential, or the slice "
                          "credential for a slice")
        return credentials

    def authorise(self, cert: x509.Certificate, credentials: Any, target: str | None, privilege: str,
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

    def _named(self, urns: Any) -> tuple[str | None, list[Urn]]:
        """Parse a URN list without looking anything up: (the one slice URN named, canonical, or None; the
        sliver URNs named). Nothing here depends on what exists, so its errors reveal nothing."""
        if not isinstance(urns, list) or not urns:
            raise BadArgs("expected a non-empty list of slice or sliver URNs")
        if len(urns) > self.policy.max_urns:
            raise BadArgs(f"{len(urns)} URNs in one call; at most {self.policy.max_urns}")
        slices: dict[str, str] = {}
        slivers: list[Urn] = []
        for text in urns:
            urn = parse_urn(text)
            if urn.type == "slice":
                slices.setdefault(urn.canonical, text)
            elif urn.type == "sliver":
                slivers.append(urn)
            else:
                raise BadArgs(f"{text} is a {urn.type} URN; name a slice or slivers")
        if len(slices) > 1:
            raise BadArgs(f"URNs span {len(slices)} slices ({', '.join(sorted(slices.values()))}); one call acts "
                          f"on one slice")
        return next(iter(slices), None), slivers

    def _authorised_slivers(self, cert: x509.Certificate, urns: Any, credentials: Any, privilege: str,
                            options: dict[str, Any], now: datetime) -> tuple[str, list[Sliver], Any]:
        """Authorise first, then resolve: (canonical slice URN, slivers named, verified credential).

        The credential is checked against the slice named, or when only slivers are named, against the slice
        a credential passed is for; only then are slivers looked up, and a sliver of another slice is answered
        exactly as one that does not exist (SEARCHFAILED), so no caller learns which slivers exist elsewhere."""
        slice_urn, sliver_urns = self._named(urns)
        if slice_urn is not None:
            verified = self.authorise(cert, credentials, slice_urn, privilege, options)
        else:
            verified, slice_urn = self._authorise_any(cert, credentials, privilege, options)
        claimed = credential_slices(credentials) if sliver_urns else []
        slivers: dict[str, Sliver] = {}
        for urn in sliver_urns:
            s = self._sliver(urn, now)
            other = canonical_urn(s.slice_urn) if s is not None else slice_urn
            if s is not None and other != slice_urn and other in claimed \
                    and self._may(cert, credentials, other, privilege, options):
                raise BadArgs(f"URNs span 2 slices ({slice_urn}, {other}); one call acts on one slice")
            if s is None or other != slice_urn:
                raise SearchFailed(f"no sliver {urn} in slice {slice_urn} here (deleted, expired, never "
                                   f"allocated, or of another slice)")
            slivers[s.urn] = s
        if not sliver_urns:
            for s in self.sm.slivers(slice_urn, now):
                slivers[s.urn] = s
        # the slivers answer to the slice they were allocated for, not to a slice made again under its name
        check_same_slice(slice_urn, slice_uuid(verified.credential), (s.slice_uuid for s in slivers.values()))
        return slice_urn, list(slivers.values()), verified

    @staticmethod
    def _as_spelled(slice_urn: str, urns: list, verified: Any) -> str:
        """The slice URN as the caller spelled it: among the URNs named, else as the slice credential that
        authorised the call names it (slicex.urn.as_spelled)."""
        target = getattr(getattr(verified, "credential", None), "target_urn", None)
        return as_spelled(slice_urn, [*urns, target], "slice")

    def _may(self, cert: x509.Certificate, credentials: Any, slice_urn: str, privilege: str,
             options: dict[str, Any]) -> bool:
        """Whether the credentials passed also authorise this call on another slice (then, and only then, a
        caller may learn that the URNs named span two slices)."""
        try:
            self.authorise(cert, credentials, slice_urn, privilege, options)
        except GeniError:
            return False
        return True

    def _authorise_any(self, cert: x509.Certificate, credentials: Any, privilege: str,
                       options: dict[str, Any]) -> tuple[Any, str]:
        """Verify against each slice the credentials claim, first success wins; the refusal depends only on
        the credentials, never on the slivers named."""
        targets = credential_slices(credentials)
        if not targets:
            self._cred_list(credentials)
            raise CredentialInvalid("naming slivers needs a slice credential for their slice; none of the "
                                    "credentials passed is a slice credential")
        first: GeniError | None = None
        for target in targets:
            try:
                return self.authorise(cert, credentials, target, privilege, options), target
            except GeniError as err:
                first = first or err
        assert first is not None
        raise first

    def _sliver(self, urn: Urn, now: datetime) -> Sliver | None:
        """A sliver by URN: as spelled, else with this aggregate's spelling of its own authority (the
        authority part compares case-insensitively)."""
        found = self.sm.sliver(str(urn), now)
        ours = parse_urn(self.identity.urn).authority
        if found is None and urn.authority.lower() == ours.lower() and urn.authority != ours:
            found = self.sm.sliver(str(Urn(ours, urn.type, urn.name)), now)
        return found

    def no_slivers(self, slice_urn: str, now: datetime, what: str = "") -> SearchFailed:
        """SEARCHFAILED for a slice without slivers here, saying so when they ended by themselves (expired or
        failed) rather than leaving the user to guess."""
        ended = self.sm.ended(slice_urn, now)
        if ended:
            return SearchFailed(f"slice {slice_urn} has no slivers here {what}".rstrip() +
                                f": they ended by themselves ({ended}); Allocate again")
        return SearchFailed(f"slice {slice_urn} has no slivers here {what}".rstrip())

    @staticmethod
    def _struct(s: Sliver) -> dict[str, Any]:
        out = {"geni_sliver_urn": s.urn, "geni_allocation_status": s.allocation_state,
               "geni_operational_status": s.operational_state, "geni_expires": rfc3339(s.expires),
               "geni_error": s.error or "", "geni_client_id": s.client_id}
        if s.details.get("geni_start_time"):  # an advance reservation: when its term starts (as GCF shows it)
            out["geni_start_time"] = s.details["geni_start_time"]
        if s.details.get("update_action"):  # a staged Update's commit will keep, add, remove, replace it
            out["sx_update_action"] = s.details["update_action"]
        return out

    def _manifest(self, slice_urn: str, slivers: list[Sliver], now: datetime) -> str:
        if not slivers:
            return empty_manifest(now)
        views = [SliverView(s.client_id, s.urn, s.kind, s.component_id, s.details, s.operational_state)
                 for s in slivers]
        manifest = build_manifest([r.xml for r in self.sm.request_of(slice_urn)], views, self._cm_id(), now)
        substrate = getattr(self.sm, "substrate", None)
        if substrate is not None and substrate.external_links:
            from stitching.am_hops import annotate_manifest

            tags: dict[str, Any] = {s.client_id: s.details["vlan_tag"] for s in slivers
                                    if s.kind == "link" and s.details.get("vlan_tag") is not None}
            for s in slivers:  # each own hop's outer wire tag (translated, or the S-tag of a Q-in-Q port)
                if s.kind == "link" and s.details.get("uplinks"):
                    tags[s.client_id] = {u["port"].lower(): u["tags"][0][1] for u in s.details["uplinks"]}
            manifest = annotate_manifest(manifest, substrate, tags)  # own hops say the tag assigned
        return manifest

    def _request_here(self, rspec: Any) -> Request:
        """The part of a request RSpec for this aggregate (with its own stitching hops' tags); BADARGS when it
        is not XML, not a request, or has nothing here."""
        if not isinstance(rspec, str):
            raise BadArgs(f"rspec must be a string of XML, got {type(rspec).__name__}")
        whole = parse_request(rspec, self.policy.max_request_bytes)
        request = whole.for_aggregate(self._cm_id())
        substrate = getattr(self.sm, "substrate", None)
        if substrate is not None and substrate.external_links:
            from stitching.am_hops import apply_hops

            # own stitching hops: their tags become the links' VLANs (transit links included)
            request = apply_hops(substrate, request, whole)
        if not request.nodes and not request.links:
            raise BadArgs(f"the request has no nodes or links for this aggregate ({self._cm_id()}); check "
                          f"component_manager_id")
        return request

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

    def _start_time(self, options: dict[str, Any], now: datetime) -> datetime | None:
        """geni_start_time (the AM API draft's scheduling option, as GCF implements it): absent, now or past
        means start now (None); a future start is an advance reservation over [start, end), booked in the
        broker's calendar now. It must be an RFC 3339 time (BADARGS) and earlier than the latest end this
        aggregate grants (its calendar horizon: am.max_lease from now; OUTOFRANGE)."""
        asked = options.get("geni_start_time")
        if asked is None:
            return None
        try:
            start = parse_time(asked)
        except (BadArgs, TypeError, ValueError, AttributeError):
            raise BadArgs(f"geni_start_time {asked!r} is not an RFC 3339 time (e.g. 2030-01-01T12:00:00Z)") from None
        if start <= now:
            return None
        horizon = now + self.policy.max_lease
        if start >= horizon:
            raise OutOfRange(f"geni_start_time {rfc3339(start)} is beyond this aggregate's booking horizon: a "
                             f"reservation must end by {rfc3339(horizon)} ({self.policy.max_lease.days} days from "
                             f"now, am.max_lease)")
        return start

    def _window(self, options: dict[str, Any], now: datetime) -> Any:
        """ListResources' time window (geni_start_time, geni_end_time): the term whose availability the
        advertisement describes; None for now. Without geni_end_time, the moment geni_start_time names."""
        start = self._start_time(options, now)
        if start is None:
            if "geni_end_time" in options and "geni_start_time" not in options:
                raise BadArgs("ListResources: geni_end_time needs geni_start_time (the window's start)")
            return None
        end = self._asked_end(options, start + timedelta(seconds=1))
        if end <= start:
            raise BadArgs(f"geni_start_time {rfc3339(start)} is not before geni_end_time {rfc3339(end)}")
        return Term(start, end)

    @staticmethod
    def _asked_end(options: dict[str, Any], default: datetime) -> datetime:
        asked = options.get("geni_end_time")
        if asked is None:
            return default
        try:
            return parse_time(asked)
        except (BadArgs, TypeError, ValueError, AttributeError):
            raise BadArgs(f"geni_end_time {asked!r} is not an RFC 3339 time (e.g. 2030-01-01T12:00:00Z)") from None

    def _peer_policy(self, operation: str, verified: Any, slice_urn: str, now: datetime, end: datetime,
                     asked: bool, request: Any = None) -> datetime:
        """Refuse (FORBIDDEN, OUTOFRANGE or REFUSED, naming the peer and rule) what a federation peer's policy
        does not allow its users; the end to use (a default end is cut to the peer's maximum lease, an `asked`
        one past it refused). Local callers pass unchanged."""
        if self.peers is None:
            return end
        return self.peers.admit(operation, verified.effective_caller_urn, slice_urn, now, end, request, asked)

    @staticmethod
    def _cred_expiry(verified: Any) -> datetime:
        return verified.expires

    def _check_not_shut_down(self, slice_urn: str) -> None:
        if self.sm.is_shut_down(slice_urn):
            raise Refused(f"slice {slice_urn} has been shut down by the operator; contact them to restore it")

    def _users(self, options: dict[str, Any], slice_urn: str, verified: Any) -> list[dict[str, Any]]:
        """The accounts to make on the slice's nodes. Only the caller (the credential's owner, or the user a
        tool speaks for) and the slice's members at its slice authority may be named: a node account is
        that user's, and naming another slice's user must not make one (an account's files, keys and
        processes are theirs)."""
        users = options.get("geni_users", [])
        if not isinstance(users, list) or not all(isinstance(u, dict) for u in users):
            raise BadArgs("geni_users must be a list of {'urn': ..., 'keys': [...]} structs")
        allowed = {verified.effective_caller_urn.lower(), verified.credential.owner_urn.lower()}
        if users and self.slice_members is not None:
            allowed |= {m.lower() for m in self.slice_members(slice_urn)}
        for u in users:
            if not isinstance(u.get("keys", []), list):
                raise BadArgs(f"geni_users entry {u.get('urn')}: keys must be a list of public keys")
            urn = u.get("urn")
            try:
                parse_urn(urn, "user")
            except GeniError:
                raise BadArgs(f"geni_users entry {urn!r}: urn must be a user URN "
                              f"(urn:publicid:IDN+<authority>+user+<name>)") from None
            if urn.lower() not in allowed:
                raise Forbidden(f"geni_users names {urn}, who is neither you ({verified.effective_caller_urn}) nor "
                                f"a member of slice {slice_urn}; add them to the slice at its slice authority first")
        return users

    # ---- the methods -----------------------------------------------------------------------------------------
    def GetVersion(self, cert: x509.Certificate | None, options: Any = None) -> dict[str, Any]:
        rspec_versions = [{"type": "GENI", "version": "3", "schema": ns.REQUEST_XSD, "namespace": ns.RSPEC3,
                           "extensions": REQUEST_EXTENSIONS}]
        ad_versions = [{"type": "GENI", "version": "3", "schema": ns.AD_XSD, "namespace": ns.RSPEC3,
                        "extensions": REQUEST_EXTENSIONS}]
        value = {
            "geni_api": 3,
            "geni_api_versions": {"3": self.identity.url, **({"2": self.identity.v2_url} if self.identity.v2_url
                                                             else {})},
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
            # AM API Update and Cancel (GENI change set C, adopted for v4, offered on v3): docs/operator-guide.md §13
            "slicex_update": {"methods": ["Update", "Cancel"], "geni_updating": True,
                              "update_expires_seconds": int(self.policy.allocation_lifetime.total_seconds()),
                              "changes": ["add and remove nodes and links", "change link capacity"],
                              # per sliver of a staged Update: Status `sx_update_action`, and the manifest's
                              # `action` attribute in this namespace
                              "actions": list(sm.UPDATE_ACTIONS),
                              "manifest_namespace": ns.UPDATE,
                              "refused": ["stitched links", "shared VLANs", "FPGA slivers",
                                          "changing a kept node's type, image or host"]},
        }
        value.update(self.identity.extra_version)
        return result(value)

    def ListResources(self, cert, credentials, options) -> dict[str, Any]:
        options = geni_options(options)
        now = self.clock.now()
        verified = self.authorise(cert, credentials, None, "listresources", options)
        if "geni_slice_urn" in options:
            raise BadArgs("geni_slice_urn is not a ListResources option in AM API v3; use Describe for a slice")
        self._rspec_version(options)
        if FIND_SLOT in options:  # "when can I have this request for that long?" (am/find_slot.py)
            return self._find_slot(options, verified, now)
        window = self._window(options, now)
        if window is None:
            ad = self.advertise(bool(options.get("geni_available", False)), now)
        else:  # what is free over that future term (the broker's availability for it)
            ad = self.advertise(bool(options.get("geni_available", False)), now, window)
        return result(self._maybe_compress(ad, options))

    def _find_slot(self, options: dict[str, Any], verified: Any, now: datetime) -> dict[str, Any]:
        """The earliest slot for the request the option carries, as an advertisement naming it; no slot in
        the window is the error of what is short."""
        if self.find_slot is None:
            raise Unsupported(f"{FIND_SLOT} is not offered by this aggregate")
        rspec, query = slot_question(options[FIND_SLOT], now, self.policy.max_lease)
        answer = self.find_slot(self._request_here(rspec), verified.effective_caller_urn, query, now)
        if not answer.found:
            raise error_named(answer.error, answer.summary)
        report = answer.report
        ad = slot_rspec(answer.start, answer.end, answer.tried, answer.summary, report.get("nodes", ()),
                        report.get("links", ()), now)
        return result(self._maybe_compress(ad, options), output=answer.summary)

    def Describe(self, cert, urns, credentials, options) -> dict[str, Any]:
        options = geni_options(options)
        now = self.clock.now()
        slice_urn, slivers, verified = self._authorised_slivers(cert, urns, credentials, "getsliceresources", options,
                                                                now)
        self._rspec_version(options)
        manifest = self._manifest(slice_urn, slivers, now)
        value = {"geni_rspec": self._maybe_compress(manifest, options),
                 "geni_urn": self._as_spelled(slice_urn, urns, verified),
                 "geni_slivers": [self._struct(s) for s in slivers]}
        if options.get("slicex_measurement"):  # its counters, to whom may describe it (docs/substrate-netns.md)
            from am.measurement import slice_measurement

            value["slicex_measurement"] = slice_measurement(slivers)
        if options.get("slicex_console"):  # qemu-vm nodes' console logs, to whom may describe the slice
            value["slicex_console"] = {s.client_id: str(s.details.get("console") or "") for s in slivers
                                       if s.kind == "node" and "console" in s.details}
        return result(value)

    def Allocate(self, cert, slice_urn, credentials, rspec, options) -> dict[str, Any]:
        options = geni_options(options)
        now = self.clock.now()
        urn = canonical_urn(slice_urn, "slice")
        verified = self.authorise(cert, credentials, urn, "createsliver", options)
        identity = slice_uuid(verified.credential)  # recorded with the slivers; checked against the slice's
        self._check_not_shut_down(urn)
        start = self._start_time(options, now)
        request = self._request_here(rspec)
        if start is None:
            end = self._end_time(options, self.policy.allocation_lifetime, self._cred_expiry(verified), now,
                                 "Allocate")
            end = min(end, now + self.policy.allocation_lifetime)
        else:  # an advance reservation holds [start, geni_end_time), by default a lease's length from its start
            end = self._end_time(options, start + self.policy.default_lease - now, self._cred_expiry(verified), now,
                                 "Allocate")
            if end <= start:
                raise BadArgs(f"geni_start_time {rfc3339(start)} is not before the reservation's end {rfc3339(end)}"
                              + ("" if "geni_end_time" in options else " (the slice credential expires by then)"))
        if self.ledger is None or options.get("slicex_dry_run"):  # else the ledger admits it, counting atomically
            end = self._peer_policy("Allocate", verified, urn, now, end, "geni_end_time" in options, request)
        if options.get("slicex_dry_run"):
            if self.dry_run is None:
                raise Unsupported("slicex_dry_run is not offered by this aggregate")
            # where the request would go and what is short; nothing is held (docs/operator-guide.md §10)
            plan = self.dry_run(request, verified.effective_caller_urn, now, end)
            return result(plan, output="dry run: nothing was allocated" + ("" if plan["fits"] else
                                                                           "; " + plan["summary"]))
        owner = verified.effective_caller_urn
        later: dict[str, Any] = {"slice_uuid": identity}
        if start is not None:  # an advance reservation (geni_start_time)
            later["start"] = start
        if self.ledger is None:
            slivers = self.sm.allocate(urn, owner, request, end, now, **later)
        else:  # the peer's policy and the owner's and project's service levels (operations/quotas.py) checked, the
            # allocation made and recorded, as one step: concurrent Allocates cannot together pass a limit
            slivers = self.ledger.allocate(owner, urn, request, now, end, "geni_end_time" in options,
                                           lambda e: self.sm.allocate(urn, owner, request, e, now, **later),
                                           peers=self.peers)
        return result({"geni_rspec": self._manifest(urn, slivers, now),
                       "geni_slivers": [self._struct(s) for s in slivers]})

    def Renew(self, cert, urns, credentials, expiration, options) -> dict[str, Any]:
        options = geni_options(options)
        now = self.clock.now()
        slice_urn, slivers, verified = self._authorised_slivers(cert, urns, credentials, "renewsliver", options, now)
        self._check_not_shut_down(slice_urn)
        if not slivers:
            raise self.no_slivers(slice_urn, now, "to renew")
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
        capped = self._peer_policy("Renew", verified, slice_urn, now, end, not options.get("geni_extend_alap"))
        if capped < end:  # geni_extend_alap past a federation peer's maximum lease
            output, end = f"renewed to {rfc3339(capped)}, the latest the peer policy allows, instead of {expiration}", capped
        if self.ledger is not None:  # the owners' and projects' lease lengths (operations/quotas.py)
            end, cut = self.ledger.lease_end(slivers, now, end, bool(options.get("geni_extend_alap")))
            output = cut or output
        renewed = self.sm.renew([s.urn for s in slivers], end, now, bool(options.get("geni_best_effort")))
        if self.ledger is not None:
            self.ledger.extended(renewed)
        return result([self._struct(s) for s in renewed], output=output)

    def Provision(self, cert, urns, credentials, options) -> dict[str, Any]:
        options = geni_options(options)
        now = self.clock.now()
        slice_urn, slivers, verified = self._authorised_slivers(cert, urns, credentials, "createsliver", options, now)
        self._check_not_shut_down(slice_urn)
        users = self._users(options, slice_urn, verified)
        self._rspec_version(options) if "geni_rspec_version" in options else None
        if not slivers:
            raise self.no_slivers(slice_urn, now, "to provision; Allocate first")
        end = self._end_time(options, self.policy.default_lease, self._cred_expiry(verified), now, "Provision")
        booked = [s.expires for s in slivers if s.details.get("geni_start_time") and s.allocation_state == sm.ALLOCATED]
        if booked and "geni_end_time" not in options:
            end = min(booked)  # an advance reservation is leased for the term it booked (Renew extends it)
        end = self._peer_policy("Provision", verified, slice_urn, now, end, "geni_end_time" in options)
        if self.ledger is not None:  # the owners' and projects' lease lengths (operations/quotas.py)
            end, _ = self.ledger.lease_end(slivers, now, end, "geni_end_time" not in options)
        provisioned = self.sm.provision([s.urn for s in slivers], end, users, now)
        if self.ledger is not None:
            self.ledger.extended(provisioned)
        return result({"geni_rspec": self._manifest(slice_urn, provisioned, now),
                       "geni_slivers": [self._struct(s) for s in provisioned]})

    def Status(self, cert, urns, credentials, options) -> dict[str, Any]:
        options = geni_options(options)
        now = self.clock.now()
        slice_urn, slivers, verified = self._authorised_slivers(cert, urns, credentials, "getsliceresources", options,
                                                                now)
        if not slivers:
            raise self.no_slivers(slice_urn, now)
        return result({"geni_urn": self._as_spelled(slice_urn, urns, verified),
                       "geni_slivers": [self._struct(s) for s in slivers]})

    def PerformOperationalAction(self, cert, urns, credentials, action, options) -> dict[str, Any]:
        options = geni_options(options)
        now = self.clock.now()
        slice_urn, slivers, verified = self._authorised_slivers(cert, urns, credentials, "createsliver", options, now)
        self._check_not_shut_down(slice_urn)
        if not isinstance(action, str) or action not in sm.ACTIONS:
            raise Unsupported(f"operational action {action!r} is not supported; supported: {', '.join(sm.ACTIONS)}")
        if not slivers:
            raise self.no_slivers(slice_urn, now)
        users = self._users(options, slice_urn, verified) if action == "geni_update_users" else []
        done = self.sm.perform([s.urn for s in slivers], action, now, bool(options.get("geni_best_effort")), users)
        return result([self._struct(s) for s in done])

    def Delete(self, cert, urns, credentials, options) -> dict[str, Any]:
        options = geni_options(options)
        now = self.clock.now()
        slice_urn, slivers, _ = self._authorised_slivers(cert, urns, credentials, "deleteslice", options, now)
        if not slivers:
            raise self.no_slivers(slice_urn, now, "to delete")
        deleted = self.sm.delete([s.urn for s in slivers], now)
        if self.ledger is not None:
            self.ledger.ended([s.urn for s in deleted], now, "deleted")
        return result([self._struct(s) for s in deleted])

    def Update(self, cert, urns, credentials, rspec, options) -> dict[str, Any]:
        """Change the named slivers (or the slice's) to the complete desired RSpec (GENI change set C):
        allocated slivers change at once; when one is provisioned the change is staged (geni_updating) until
        Provision commits it or Cancel or its expiry reverts it (slice_manager/update.py)."""
        options = geni_options(options)
        now = self.clock.now()
        slice_urn, slivers, verified = self._authorised_slivers(cert, urns, credentials, "createsliver", options, now)
        self._check_not_shut_down(slice_urn)
        if not isinstance(rspec, str):
            raise BadArgs(f"rspec must be a string of XML, got {type(rspec).__name__}")
        if not slivers:
            raise self.no_slivers(slice_urn, now, "to update; Allocate first")
        whole = parse_request(rspec, self.policy.max_request_bytes)
        foreign = [lk.client_id for lk in whole.links
                   if any(canonical_urn(cm) != canonical_urn(self._cm_id()) for cm in lk.component_managers)]
        if foreign or ns.STITCH2 in rspec:
            which = ", ".join(foreign) or "the stitching extension"
            raise Unsupported(f"Update of stitched links is not supported here ({which}): Delete the stitched "
                              f"slivers and Allocate again")
        request = whole.for_aggregate(self._cm_id())
        limit = self._cred_expiry(verified)
        alloc_end = self._end_time(options, self.policy.allocation_lifetime, limit, now, "Update")
        alloc_end = min(alloc_end, now + self.policy.allocation_lifetime)
        update_end = min(now + self.policy.allocation_lifetime, limit)
        named = [s.urn for s in slivers] if any(parse_urn(u).type == "sliver" for u in urns) else []
        best_effort = bool(options.get("geni_best_effort"))
        caller = verified.effective_caller_urn
        if self.ledger is None:
            updated = self.sm.update(slice_urn, named, request, alloc_end, update_end, now, best_effort, caller)
        else:  # what the Update adds (new slivers, a replaced link's larger capacity) counts against the caller's
            # and the project's limits and the peer's policy, atomically as an Allocate (operations/ledger.py)
            updated = self.ledger.update(caller, slice_urn, request, slivers, now, alloc_end,
                                         lambda: self.sm.update(slice_urn, named, request, alloc_end, update_end,
                                                                now, best_effort, caller), peers=self.peers)
        return result({"geni_rspec": self._manifest(slice_urn, self.sm.slivers(slice_urn, now), now),
                       "geni_slivers": [self._struct(s) for s in updated]})

    def Cancel(self, cert, urns, credentials, options) -> dict[str, Any]:
        """Revert the slice's pending Update, or with none pending cancel the named allocated slivers' Allocate
        (as Delete); SEARCHFAILED when there is nothing to cancel."""
        options = geni_options(options)
        now = self.clock.now()
        slice_urn, slivers, _ = self._authorised_slivers(cert, urns, credentials, "createsliver", options, now)
        if not slivers:
            raise self.no_slivers(slice_urn, now, "to cancel")
        named = [s.urn for s in slivers] if any(parse_urn(u).type == "sliver" for u in urns) else []
        cancelled = self.sm.cancel(slice_urn, named, now)
        if self.ledger is not None:
            self.ledger.ended([s.urn for s in cancelled if s.allocation_state == sm.UNALLOCATED], now, "cancelled")
        return result({"geni_rspec": self._manifest(slice_urn, self.sm.slivers(slice_urn, now), now),
                       "geni_slivers": [self._struct(s) for s in cancelled]})

    def Shutdown(self, cert, slice_urn, credentials, options) -> dict[str, Any]:
        options = geni_options(options)
        now = self.clock.now()
        urn = canonical_urn(slice_urn, "slice")
        operator = self._operator(cert, options)
        try:
            verified = self.authorise(cert, credentials, urn, "shutdown", options)
            check_same_slice(urn, slice_uuid(verified.credential), (s.slice_uuid for s in self.sm.slivers(urn, now)))
        except GeniError:
            if operator is None:
                raise
            # an operator listed in slicex.yaml shuts down any slice on their own valid user credential
            self.authorise(cert, credentials, operator, "listresources", options)
        self.sm.shutdown(urn, now)
        if self.ledger is not None:
            self.ledger.shut_down(urn, now)
        return result(True)

    def _operator(self, cert: x509.Certificate, options: dict[str, Any]) -> str | None:
        """The caller's canonical user URN (the spoken-for user's with geni_speaking_for) when it is one of
        the operators configured in slicex.yaml; else None."""
        spoken = options.get("geni_speaking_for")
        text = spoken if isinstance(spoken, str) else pki.cert_urn(cert)
        try:
            urn = canonical_urn(text, "user")
        except BadArgs:
            return None
        return urn if urn in {canonical_urn(o) for o in self.policy.operators} else None

    # ---- ProtoGENI's image calls (omni createimage, deleteimage, listimages) --------------------------------
    def CreateImage(self, cert, slice_urn, image_name, sliver_urn, credentials, options) -> dict[str, Any]:
        """An image of a provisioned node, in this aggregate's catalogue, owned by the caller; private unless
        the `global` option is true (omni sends true unless told `false`). A node of a later request names it
        as its disk_image (by URN or name). Answers the image's URN."""
        options = geni_options(options)
        now = self.clock.now()
        if not all(isinstance(x, str) for x in (slice_urn, image_name, sliver_urn)):
            raise BadArgs("CreateImage takes a slice URN, an image name, the node's sliver URN, credentials and "
                          "options")
        parse_urn(sliver_urn, "sliver")  # the one node to snapshot, never "the slice's slivers"
        public = options.get("global", False)
        if not isinstance(public, bool):
            raise BadArgs(f"option global must be a boolean (whether others may boot the image), got {public!r}")
        urn, slivers, verified = self._authorised_slivers(cert, [slice_urn, sliver_urn], credentials,
                                                          "createsliver", options, now)
        self._check_not_shut_down(urn)
        record = self.sm.snapshot(slivers[0].urn, image_name, verified.effective_caller_urn, public, now)
        return result(record["urn"], output=f"image {record['name']} of node {slivers[0].client_id}: "
                                            f"{'public' if record['public'] else 'private'}, "
                                            f"{int(record['size_bytes']) // 2**20} MiB, from {record['base']}")

    def ListImages(self, cert, creator_urn, credentials, options) -> dict[str, Any]:
        """The images `creator_urn` (default: the caller) made here that the caller may see: their own, and
        others' public ones. Each: urn, name, owner, public, size_bytes, base, created, description."""
        options = geni_options(options)
        verified = self.authorise(cert, credentials, None, "listresources", options)
        caller = verified.effective_caller_urn
        creator = self._user_named(creator_urn, caller, "ListImages")
        return result(self._images().listed(creator, caller, self._operator(cert, options) is not None))

    def DeleteImage(self, cert, image_urn, credentials, options) -> dict[str, Any]:
        """Delete an image of the caller's (an operator: anyone's); nodes booted from it keep their copy."""
        options = geni_options(options)
        verified = self.authorise(cert, credentials, None, "listresources", options)
        try:
            urn = parse_urn(image_urn, "image")
        except GeniError:
            raise BadArgs(f"DeleteImage takes an image URN (ListImages shows them), got {image_urn!r}") from None
        if urn.authority.lower() != parse_urn(self.identity.urn).authority.lower():
            raise SearchFailed(f"{image_urn} is not an image of this aggregate ({self.identity.urn})")
        self._images().delete(str(urn), verified.effective_caller_urn, self._operator(cert, options) is not None)
        return result(True)

    @staticmethod
    def _user_named(urn: Any, caller: str, method: str) -> str:
        """The user a List call names (omni's creator argument), the caller when it names none."""
        try:
            return str(parse_urn(urn or caller, "user"))
        except GeniError:
            raise BadArgs(f"{method} takes a user URN (whose), got {urn!r}") from None

    def _images(self) -> Any:
        return self._kept(self.images, "image catalogue")

    def _kept(self, service: Any, what: str) -> Any:
        """What the substrate keeps beyond slices (images, datasets), or UNSUPPORTED where it keeps none."""
        if service is None:
            raise Unsupported(f"this aggregate keeps no {what} ({self.identity.substrate_description})")
        return service

    # ---- persistent datasets (emulab:blockstore in a request makes and mounts them) --------------------------
    def ListDatasets(self, cert, owner_urn, credentials, options) -> dict[str, Any]:
        """The caller's datasets (an operator: anyone's): name, owner, size_mb, created, in_use."""
        options = geni_options(options)
        verified = self.authorise(cert, credentials, None, "listresources", options)
        caller = verified.effective_caller_urn
        owner = self._user_named(owner_urn, caller, "ListDatasets")
        return result(self._datasets().listed(owner, caller, self._operator(cert, options) is not None))

    def DeleteDataset(self, cert, dataset, credentials, options) -> dict[str, Any]:
        """Delete one of the caller's datasets and its data (an operator: anyone's), when no node mounts it."""
        options = geni_options(options)
        verified = self.authorise(cert, credentials, None, "listresources", options)
        if not isinstance(dataset, str):
            raise BadArgs("DeleteDataset takes the dataset's name or URN")
        self._datasets().delete(dataset, verified.effective_caller_urn, self._operator(cert, options) is not None)
        return result(True)

    def _datasets(self) -> Any:
        return self._kept(self.datasets, "datasets")
