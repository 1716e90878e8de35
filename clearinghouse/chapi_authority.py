"""slicex's slice authority, member authority and clearinghouse on the Common Federation API v2 (CHAPI), for
omni's `chapi` framework and geni-lib, beside the gcf-style SliceAuthority.

They live here, next to the gcf slice authority, because they are the same authority seen through another
protocol: one slice record per slice (the `sa_slices` table, created through `SliceAuthority.claim_slice` with
its atomic name claim), the same members rule (users our CA certified in our namespace), the same slice and
user credentials. A slice made through either interface is visible through the other. The CH API's records,
options and permission rules are the pure functions of clearinghouse/chapi.py; this module reads and writes the
store and calls them.

Every method answers `{code, value, output}` (clearinghouse.chapi.ok/error), never a fault: the edge
(clearinghouse/chapi_edge.py) makes a method's value, its refusal or its failure one."""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cryptography import x509

from clearinghouse import chapi
from clearinghouse.chapi import ChError, argument, authorization
from clearinghouse.projects import PROJECTS, live_project, require_slice_maker
from clearinghouse.slice_authority import SLICES, SliceAuthority
from slicex import pki
from slicex.clock import parse_time, rfc3339
from slicex.endpoint import Method, method
from slicex.errors import GeniError
from slicex.urn import parse_urn

log = logging.getLogger("slicex.chapi")
PROJECT_CLAIM = "ch_project:"  # + lower-cased project URN
SLIVER_INFO = "ch_sliver_info"
KEYS = "ma_keys"
SFA = "geni_sfa"


@dataclass(frozen=True)
class Member:
    """A user of this deployment as the member authority knows them (from their certificate and ssh key)."""

    urn: str
    username: str
    email: str
    ssh_keys: tuple[str, ...] = ()


Directory = Callable[[], list[Member]]


def _cred(xml: str) -> dict[str, str]:
    return {"geni_type": SFA, "geni_version": "3", "geni_value": xml}


class ChapiAuthority:
    """CH, SA and MA of one deployment. `methods(service)` is the whole interface (served by
    clearinghouse/chapi_edge.py)."""

    def __init__(self, sa: SliceAuthority, directory: Directory, urls: dict[str, str], aggregates: dict[str, str],
                 policy: chapi.SlicePolicy | None = None):
        self.sa = sa
        self.store = sa.store
        self.clock = sa.clock
        self.authority = sa.authority
        self.directory = directory
        self.urls = urls  # "CH" | "SA" | "MA" → URL
        self.aggregates = aggregates  # URN → URL
        self.policy = policy or chapi.SlicePolicy(sa.policy.slice_lifetime, sa.policy.max_slice_lifetime)
        self.urns = {"CH": f"urn:publicid:IDN+{self.authority}+authority+ch", "SA": sa.urn,
                     "MA": f"urn:publicid:IDN+{self.authority}+authority+ma"}

    # ---- the methods of each service -----------------------------------------------------------------------------------
    SERVICES: dict[str, tuple[str, ...]] = {
        "CH": ("get_version", "lookup_slice_authorities", "lookup_member_authorities", "lookup_aggregates",
               "lookup_services", "lookup_authorities_for_urns", "get_trust_roots"),
        "SA": ("get_version", "create_slice", "lookup_slices", "update_slice", "lookup_slices_for_member",
               "lookup_slice_members", "modify_slice_membership", "get_credentials", "create_project",
               "lookup_projects", "update_project", "lookup_projects_for_member", "lookup_project_members",
               "modify_project_membership", "create_sliver_info", "lookup_sliver_info", "update_sliver_info",
               "delete_sliver_info"),
        "MA": ("get_version", "get_credentials", "lookup_public_member_info", "lookup_identifying_member_info",
               "lookup_private_member_info", "lookup_member_info", "lookup_keys", "lookup_keys_by_id",
               "create_key", "delete_key"),
    }

    def methods(self, service: str) -> list[Method]:
        """The methods of the CH, SA or MA: each `_<service>_<name>`, else `_<name>`, taking the caller first."""
        return [method(name, getattr(self, f"_{service.lower()}_{name}", None) or getattr(self, f"_{name}"))
                for name in self.SERVICES[service]]

    # ---- who is calling ----------------------------------------------------------------------------------------
    def _member(self, caller: x509.Certificate) -> str:
        """The caller's URN once shown to be a member (our CA, our namespace); AUTHENTICATION otherwise."""
        return self.sa._caller_urn(caller)

    def _refuse_speaks_for(self, options: dict[str, Any]) -> None:
        if options.get("speaking_for"):
            raise ChError(chapi.NOT_IMPLEMENTED, "speaks-for (options['speaking_for']) is not supported by this "
                                                 "clearinghouse yet; call with your own certificate")

    # ---- get_version -------------------------------------------------------------------------------------------
    def _ch_get_version(self, caller: x509.Certificate) -> dict[str, Any]:
        return self._version("CH", ["SERVICE"])

    def _sa_get_version(self, caller: x509.Certificate) -> dict[str, Any]:
        return self._version("SA", ["SLICE", "PROJECT", "SLICE_MEMBER", "PROJECT_MEMBER", "SLIVER_INFO"])

    def _ma_get_version(self, caller: x509.Certificate) -> dict[str, Any]:
        return self._version("MA", ["MEMBER", "KEY"])

    def _version(self, service: str, services: list[str]) -> dict[str, Any]:
        return {"VERSION": "2", "URN": self.urns[service], "IMPLEMENTATION": {"code_tag": "slicex"},
                "SERVICES": services, "CREDENTIAL_TYPES": [{"type": SFA, "version": "3"}],
                "ROLES": list(chapi.ROLES), "API_VERSIONS": {"1": self.urls[service], "2": self.urls[service]},
                "FIELDS": {}}

    # ---- clearinghouse: the service registry -------------------------------------------------------------------
    def _services(self) -> list[dict[str, Any]]:
        out = [chapi.service("SLICE_AUTHORITY", self.urns["SA"], self.urls["SA"], f"{self.authority} SA",
                             "slicex slice authority"),
               chapi.service("MEMBER_AUTHORITY", self.urns["MA"], self.urls["MA"], f"{self.authority} MA",
                             "slicex member authority")]
        out += [chapi.service("AGGREGATE_MANAGER", urn, url, parse_urn(urn).authority, "slicex aggregate (AM API v3)",
                              "ui_other_am") for urn, url in sorted(self.aggregates.items())]
        return out

    def _lookup_services(self, caller: x509.Certificate, *args: Any) -> list[dict[str, Any]]:
        options = chapi.options_of(args[-1] if args else {})
        return chapi.lookup_services(self._services(), options)

    def _lookup_slice_authorities(self, caller: x509.Certificate, options: Any = None) -> list[dict[str, Any]]:
        return chapi.lookup_services(self._services(), chapi.options_of(options), "SLICE_AUTHORITY")

    def _lookup_member_authorities(self, caller: x509.Certificate, options: Any = None) -> list[dict[str, Any]]:
        return chapi.lookup_services(self._services(), chapi.options_of(options), "MEMBER_AUTHORITY")

    def _lookup_aggregates(self, caller: x509.Certificate, options: Any = None) -> list[dict[str, Any]]:
        return chapi.lookup_services(self._services(), chapi.options_of(options), "AGGREGATE_MANAGER")

    def _lookup_authorities_for_urns(self, caller: x509.Certificate, urns: Any) -> dict[str, str]:
        """The SA URL for URNs in our namespace; others are not ours to answer for."""
        if not isinstance(urns, list):
            raise argument("lookup_authorities_for_urns takes a list of URNs")
        out = {}
        for text in urns:
            try:
                if parse_urn(text).top_authority == self.authority.lower():
                    out[text] = self.urls["SA"]
            except GeniError as exc:
                raise argument(exc.message) from None
        return out

    def _get_trust_roots(self, caller: x509.Certificate) -> list[str]:
        return [self.sa.ca_cert_pem.decode()]

    # ---- projects ----------------------------------------------------------------------------------------------
    def _project(self, urn_text: Any) -> dict[str, Any]:
        """A live project record, or ARGUMENT "Unknown project" (the phrase omni recognises)."""
        return live_project(self.store, self.authority, urn_text, self.clock.now())

    def _create_project(self, caller: x509.Certificate, credentials: Any, options: Any) -> dict[str, Any]:
        lead = self._member(caller)
        options = chapi.options_of(options)
        self._refuse_speaks_for(options)
        now = self.clock.now()
        rec = chapi.new_project(self.authority, chapi.fields_of(options, ("PROJECT_NAME",)), lead, now)
        key = rec["urn"].lower()
        if not self.store.claim(PROJECT_CLAIM + key, rec["uid"]):
            raise ChError(chapi.DUPLICATE, f"project {rec['name']} already exists at {self.authority}")
        self.store.put(PROJECTS, key, rec)
        return chapi.project_fields(rec, now)

    def _update_project(self, caller: x509.Certificate, urn: Any, credentials: Any, options: Any) -> bool:
        member = self._member(caller)
        rec = self._project(urn)
        chapi.require_role(rec, member, (chapi.LEAD, chapi.ADMIN), "update")
        fields = chapi.fields_of(chapi.options_of(options))
        if "PROJECT_DESCRIPTION" in fields:
            rec["description"] = str(fields["PROJECT_DESCRIPTION"])
        if fields.get("PROJECT_EXPIRATION"):
            end = chapi.when(fields["PROJECT_EXPIRATION"], "PROJECT_EXPIRATION")
            if end <= self.clock.now():
                raise argument(f"PROJECT_EXPIRATION {rfc3339(end)} is not in the future")
            rec["expires"] = rfc3339(end)
        self.store.put(PROJECTS, rec["urn"].lower(), rec)
        return True

    def _lookup_projects(self, caller: x509.Certificate, credentials: Any, options: Any = None) -> dict[str, Any]:
        """Every project is listed to members (names are not secret; joining one is the lead's decision)."""
        self._member(caller)
        now = self.clock.now()
        return chapi.select({r["urn"]: chapi.project_fields(r, now) for r in self.store.scan(PROJECTS)},
                            chapi.options_of(options))

    def _lookup_projects_for_member(self, caller: x509.Certificate, member_urn: Any, credentials: Any,
                                    options: Any = None) -> list[dict[str, Any]]:
        member = self._self_only(caller, member_urn)
        now = self.clock.now()
        rows = [chapi.for_member(chapi.project_fields(r, now), "PROJECT", chapi.role_of(r, member) or "")
                for r in self.store.scan(PROJECTS) if chapi.role_of(r, member)]
        match = chapi.options_of(options).get("match")
        return [r for r in rows if chapi.matches(r, match)]

    def _lookup_project_members(self, caller: x509.Certificate, urn: Any, credentials: Any,
                                options: Any = None) -> list[dict[str, Any]]:
        member = self._member(caller)
        rec = self._project(urn)
        if chapi.role_of(rec, member) is None:
            raise authorization(f"{member} is not a member of {rec['urn']}")
        return [{"PROJECT_MEMBER": self._spelled(m), "PROJECT_ROLE": role}
                for m, role in sorted(chapi.members_of(rec).items())]

    def _modify_project_membership(self, caller: x509.Certificate, urn: Any, credentials: Any,
                                   options: Any) -> bool:
        member = self._member(caller)
        rec = self._project(urn)
        chapi.require_role(rec, member, (chapi.LEAD, chapi.ADMIN), "change the members of")
        rec["members"] = chapi.membership_changes(rec, chapi.options_of(options), "PROJECT", self.authority, member)
        self.store.put(PROJECTS, rec["urn"].lower(), rec)
        return True

    # ---- slices ------------------------------------------------------------------------------------------------
    def _slice(self, urn_text: Any, member: str, allow_expired: bool = False) -> dict[str, Any]:
        """A slice record the member may see, or ARGUMENT "Unknown slice urn" / AUTHORIZATION."""
        try:
            urn = parse_urn(urn_text, "slice")
        except GeniError as exc:
            raise argument(f"Unknown slice urn {urn_text!r}: {exc.message}") from None
        rec = self.store.get(SLICES, str(urn).lower())
        if rec is None or (not allow_expired and parse_time(rec["expires"]) <= self.clock.now()):
            raise argument(f"Unknown slice urn {urn_text} (no such slice at this slice authority, or it expired)")
        if rec.get("deleted") and not allow_expired:
            raise argument(f"Unknown slice urn {urn_text}: its owner deleted it at {rec['deleted']} (the name stays "
                           f"reserved until {rec['expires']})")
        if not chapi.may_see_slice(rec, self._project_of(rec), member):
            raise authorization(f"slice {rec['urn']} is not yours: {member} is not a member of it or its project")
        return rec

    def _project_of(self, rec: dict[str, Any]) -> dict[str, Any] | None:
        return self.store.get(PROJECTS, rec["project"].lower()) if rec.get("project") else None

    def _create_slice(self, caller: x509.Certificate, credentials: Any, options: Any) -> dict[str, Any]:
        owner = self._member(caller)
        options = chapi.options_of(options)
        self._refuse_speaks_for(options)
        fields = chapi.fields_of(options, ("SLICE_NAME",))
        project = None
        if fields.get("SLICE_PROJECT_URN"):
            project = require_slice_maker(self.store, self.authority, fields["SLICE_PROJECT_URN"], owner,
                                          self.clock.now())
        urn = chapi.slice_urn_for(self.authority, fields["SLICE_NAME"], project["name"] if project else None)
        now = self.clock.now()
        expires = chapi.slice_expiry(fields.get("SLICE_EXPIRATION"), now, self.policy, project)
        extra = {"expires": rfc3339(expires), "uid": str(uuid.uuid4()),
                 "description": str(fields.get("SLICE_DESCRIPTION") or ""), "members": {owner.lower(): chapi.LEAD}}
        if project:
            extra["project"] = project["urn"]
        rec, created = self.sa.claim_slice(urn, owner, extra)
        if not created:
            raise ChError(chapi.DUPLICATE, f"slice {fields['SLICE_NAME']} already exists as {rec['urn']} "
                                           f"(until {rec['expires']}); choose another name")
        return chapi.slice_fields(rec, now)

    def _lookup_slices(self, caller: x509.Certificate, credentials: Any, options: Any = None) -> dict[str, Any]:
        """Slices the caller may see (its own and its projects'), keyed by URN."""
        member = self._member(caller)
        now = self.clock.now()
        projects = {r["urn"].lower(): r for r in self.store.scan(PROJECTS)}
        visible = {r["urn"]: chapi.slice_fields(r, now) for r in self.store.scan(SLICES)
                   if not r.get("deleted")
                   and chapi.may_see_slice(r, projects.get((r.get("project") or "").lower()), member)}
        return chapi.select(visible, chapi.options_of(options))

    def _update_slice(self, caller: x509.Certificate, urn: Any, credentials: Any, options: Any) -> bool:
        member = self._member(caller)
        options = chapi.options_of(options)
        self._refuse_speaks_for(options)
        rec = self._slice(urn, member)
        chapi.require_role(rec, member, (chapi.LEAD, chapi.ADMIN), "update")
        fields = chapi.fields_of(options)
        now = self.clock.now()
        if "SLICE_EXPIRATION" in fields:
            end = chapi.slice_expiry(fields["SLICE_EXPIRATION"], now, self.policy, self._project_of(rec),
                                     current=parse_time(rec["expires"]))
            rec["expires"] = rfc3339(end)
            self._cover(rec, end)
        if "SLICE_DESCRIPTION" in fields:
            rec["description"] = str(fields["SLICE_DESCRIPTION"])
        self.store.put(SLICES, rec["urn"].lower(), rec)
        return True

    def _cover(self, rec: dict[str, Any], end: datetime) -> None:
        """Reissue the slice's certificate when the slice would outlive it (credentials name it as target)."""
        cert = pki.load_cert(rec["cert"])
        if cert.not_valid_after_utc < end + timedelta(days=1):
            urn = parse_urn(rec["urn"], "slice")
            days = (end - self.clock.now()).days + 2
            pem, _key = pki.issue_certificate(self.sa.ca_cert_pem, self.sa.ca_key_pem, rec["urn"], urn.name, days=days,
                                              subject_uuid=chapi.slice_uid(rec))  # the same slice, the same UUID
            rec["cert"] = pem.decode()

    def _lookup_slices_for_member(self, caller: x509.Certificate, member_urn: Any, credentials: Any,
                                  options: Any = None) -> list[dict[str, Any]]:
        member = self._self_only(caller, member_urn)
        now = self.clock.now()
        rows = [chapi.for_member(chapi.slice_fields(r, now), "SLICE", chapi.role_of(r, member) or "")
                for r in self.store.scan(SLICES) if chapi.role_of(r, member) and not r.get("deleted")]
        match = chapi.options_of(options).get("match")
        return [r for r in rows if chapi.matches(r, match)]

    def _lookup_slice_members(self, caller: x509.Certificate, urn: Any, credentials: Any,
                              options: Any = None) -> list[dict[str, Any]]:
        rec = self._slice(urn, self._member(caller))
        return [{"SLICE_MEMBER": self._spelled(m), "SLICE_ROLE": role}
                for m, role in sorted(chapi.members_of(rec).items())]

    def _modify_slice_membership(self, caller: x509.Certificate, urn: Any, credentials: Any, options: Any) -> bool:
        member = self._member(caller)
        rec = self._slice(urn, member)
        chapi.require_role(rec, member, (chapi.LEAD, chapi.ADMIN), "change the members of")
        rec["members"] = chapi.membership_changes(rec, chapi.options_of(options), "SLICE", self.authority, member)
        self.store.put(SLICES, rec["urn"].lower(), rec)
        return True

    def _spelled(self, lowered: str) -> str:
        """A member URN as the member's certificate spells it (records keep them lower-cased)."""
        for m in self.directory():
            if m.urn.lower() == lowered:
                return m.urn
        return lowered

    def _self_only(self, caller: x509.Certificate, member_urn: Any) -> str:
        member = self._member(caller)
        if not isinstance(member_urn, str) or member_urn.lower() != member.lower():
            raise authorization(f"you are {member}; this authority answers for your own memberships only, "
                                f"not {member_urn!r}")
        return member

    # ---- credentials -------------------------------------------------------------------------------------------
    def _sa_get_credentials(self, caller: x509.Certificate, urn: Any, credentials: Any = None,
                            options: Any = None) -> list[dict[str, str]]:
        """A slice credential for a member of the slice (not for project members who are not in it)."""
        member = self._member(caller)
        self._refuse_speaks_for(chapi.options_of(options))
        rec = self._slice(urn, member)
        if chapi.role_of(rec, member) is None:
            raise authorization(f"{member} is not a member of slice {rec['urn']}; ask its lead to add you")
        return [_cred(self.sa._slice_credential(caller, rec))]

    def _ma_get_credentials(self, caller: x509.Certificate, urn: Any, credentials: Any = None,
                            options: Any = None) -> list[dict[str, str]]:
        self._self_only(caller, urn)
        self._refuse_speaks_for(chapi.options_of(options))
        return [_cred(self.sa.CreateUserCredential(caller))]

    # ---- sliver info -------------------------------------------------------------------------------------------
    def _create_sliver_info(self, caller: x509.Certificate, credentials: Any, options: Any) -> bool:
        member = self._member(caller)
        rec = chapi.new_sliver_info(chapi.fields_of(chapi.options_of(options)), member, self.clock.now())
        chapi.require_sliver_info_writer(self._slice(rec["SLIVER_INFO_SLICE_URN"], member), member)
        key = rec["SLIVER_INFO_URN"].lower()
        if self.store.get(SLIVER_INFO, key) is not None:
            raise ChError(chapi.DUPLICATE, f"sliver info for {rec['SLIVER_INFO_URN']} already exists; update it")
        self.store.put(SLIVER_INFO, key, rec)
        return True

    def _sliver_info(self, urn: Any, member: str) -> dict[str, Any]:
        """A sliver info record the member may change or delete (a member of its slice, not of its project
        only); project members who may see it get AUTHORIZATION, others "Unknown"."""
        rec = self.store.get(SLIVER_INFO, urn.lower()) if isinstance(urn, str) else None
        if rec is None:
            raise argument(f"Unknown sliver urn {urn!r}: no sliver info recorded for it")
        chapi.require_sliver_info_writer(self._slice(rec["SLIVER_INFO_SLICE_URN"], member, allow_expired=True),
                                         member)
        return rec

    def _update_sliver_info(self, caller: x509.Certificate, urn: Any, credentials: Any, options: Any) -> bool:
        member = self._member(caller)
        rec = self._sliver_info(urn, member)
        fields = chapi.fields_of(chapi.options_of(options))
        if fields.get("SLIVER_INFO_EXPIRATION"):
            rec["SLIVER_INFO_EXPIRATION"] = rfc3339(chapi.when(fields["SLIVER_INFO_EXPIRATION"],
                                                               "SLIVER_INFO_EXPIRATION"))
        self.store.put(SLIVER_INFO, rec["SLIVER_INFO_URN"].lower(), rec)
        return True

    def _delete_sliver_info(self, caller: x509.Certificate, urn: Any, credentials: Any = None,
                            options: Any = None) -> bool:
        rec = self._sliver_info(urn, self._member(caller))
        return self.store.delete(SLIVER_INFO, rec["SLIVER_INFO_URN"].lower())

    def _lookup_sliver_info(self, caller: x509.Certificate, credentials: Any, options: Any = None) -> dict[str, Any]:
        member = self._member(caller)
        options = chapi.options_of(options)
        slices: dict[str, bool] = {}

        def visible(rec: dict[str, Any]) -> bool:
            key = rec["SLIVER_INFO_SLICE_URN"].lower()
            if key not in slices:
                try:
                    self._slice(rec["SLIVER_INFO_SLICE_URN"], member, allow_expired=True)
                    slices[key] = True
                except ChError:
                    slices[key] = False
            return slices[key]

        candidates = {r["SLIVER_INFO_URN"]: r for r in self.store.scan(SLIVER_INFO)
                      if chapi.matches(r, options.get("match"))}
        return chapi.select({k: r for k, r in candidates.items() if visible(r)}, options)

    # ---- members and keys --------------------------------------------------------------------------------------
    PUBLIC = ("MEMBER_URN", "MEMBER_UID", "MEMBER_USERNAME")

    def _members(self) -> dict[str, Member]:
        return {m.urn.lower(): m for m in self.directory()}

    def _shares(self, a: str, b: str) -> bool:
        """Whether two members share a slice or a project (identifying details are shown to those only)."""
        a, b = a.lower(), b.lower()
        if a == b:
            return True
        for table in (SLICES, PROJECTS):
            for rec in self.store.scan(table):
                members = chapi.members_of(rec)
                if a in members and b in members:
                    return True
        return False

    def _member_info(self, caller: x509.Certificate, options: Any, identifying: bool) -> dict[str, Any]:
        me = self._member(caller)
        options = chapi.options_of(options)
        out = {}
        for m in self._members().values():
            rec = {"MEMBER_URN": m.urn, "MEMBER_UID": str(uuid.uuid5(uuid.NAMESPACE_URL, m.urn.lower())),
                   "MEMBER_USERNAME": m.username}
            if identifying and self._shares(me, m.urn):
                rec["MEMBER_EMAIL"] = m.email
            if chapi.matches(rec, options.get("match")):
                out[m.urn] = chapi.project(rec, options.get("filter"))
        return out

    def _lookup_public_member_info(self, caller: x509.Certificate, credentials: Any,
                                   options: Any = None) -> dict[str, Any]:
        return self._member_info(caller, options, identifying=False)

    def _lookup_identifying_member_info(self, caller: x509.Certificate, credentials: Any,
                                        options: Any = None) -> dict[str, Any]:
        return self._member_info(caller, options, identifying=True)

    _lookup_member_info = _lookup_identifying_member_info
    _lookup_private_member_info = _lookup_identifying_member_info  # nothing private is kept (no private keys)

    def _keys(self) -> list[dict[str, Any]]:
        """Every member's public ssh keys: the deployment's (from `slicex user add`) and those added here."""
        out = []
        for m in self._members().values():
            for pub in m.ssh_keys:
                out.append({"KEY_ID": "home-" + hashlib.sha256(pub.encode()).hexdigest()[:16], "KEY_MEMBER": m.urn,
                            "KEY_PUBLIC": pub, "KEY_DESCRIPTION": "slicex user key"})
        out += self.store.scan(KEYS)
        return out

    def _lookup_keys(self, caller: x509.Certificate, credentials: Any, options: Any = None) -> dict[str, Any]:
        """v1 shape: member URN → [key], KEY_PRIVATE never (none is kept)."""
        self._member(caller)
        options = chapi.options_of(options)
        out: dict[str, list[dict[str, Any]]] = {}
        for key in self._keys():
            if chapi.matches(key, options.get("match")):
                out.setdefault(key["KEY_MEMBER"], []).append(chapi.project(key, options.get("filter")))
        return out

    def _lookup_keys_by_id(self, caller: x509.Certificate, credentials: Any, options: Any = None) -> dict[str, Any]:
        """v2 shape: KEY_ID → key (with KEY_MEMBER, which omni reads to flip it back)."""
        self._member(caller)
        options = chapi.options_of(options)
        filt = options.get("filter")
        if filt is not None and "KEY_MEMBER" not in filt:
            filt = [*filt, "KEY_MEMBER"]
        return {k["KEY_ID"]: chapi.project(k, filt) for k in self._keys() if chapi.matches(k, options.get("match"))}

    def _create_key(self, caller: x509.Certificate, *args: Any) -> dict[str, Any]:
        """v1 `create_key(member_urn, credentials, options)` or v2 `create('KEY', credentials, options)`."""
        me = self._member(caller)
        if len(args) not in (2, 3):
            raise argument("create_key takes (member_urn, credentials, options) or ('KEY', credentials, options)")
        fields = chapi.fields_of(chapi.options_of(args[-1]), ("KEY_PUBLIC",))
        owner = args[0] if len(args) == 3 else fields.get("KEY_MEMBER", me)
        if not isinstance(owner, str) or owner.lower() != me.lower():
            raise authorization(f"you are {me}; you may add keys to your own account only")
        pub = chapi.one_public_key(fields["KEY_PUBLIC"])
        key = {"KEY_ID": uuid.uuid4().hex, "KEY_MEMBER": me, "KEY_PUBLIC": pub,
               "KEY_DESCRIPTION": str(fields.get("KEY_DESCRIPTION") or "")}
        self.store.put(KEYS, key["KEY_ID"], key)
        return key

    def _delete_key(self, caller: x509.Certificate, *args: Any) -> bool:
        me = self._member(caller)
        key_id = args[1] if len(args) == 4 else (args[0] if args else None)  # v1 (member, id, creds, opts)
        key = self.store.get(KEYS, key_id) if isinstance(key_id, str) else None
        if key is None or key["KEY_MEMBER"].lower() != me.lower():
            raise argument(f"Unknown key {key_id!r} among your keys (keys from `slicex user add` are managed there)")
        return self.store.delete(KEYS, key_id)

