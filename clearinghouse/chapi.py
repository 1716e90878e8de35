"""The Common Federation API v2 (CHAPI) in plain functions: result shapes, error codes, match/filter options,
the records a slice authority and member authority answer with, and who may see or change what.

Everything here is pure: records in, records or errors out, the time passed in. The stateful authorities
(clearinghouse/chapi_authority.py) read and write the store and call these; the XML-RPC edge
(clearinghouse/chapi_edge.py) only routes. Field names and value shapes follow what the clients read, where
they differ from the spec text (../shared/FEDERATION.md §1.4-1.5): SERVICE lookups are lists, SLICE lookups
dicts keyed by URN, times RFC 3339 strings with `Z`, `EXPIRED` beside `SLICE_EXPIRED` for omni."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from slicex import pki
from slicex.clock import parse_time, rfc3339
from slicex.errors import (
    AlreadyExists,
    BadArgs,
    Busy,
    CredentialExpired,
    CredentialInvalid,
    CredentialMismatch,
    CredentialSignerUntrusted,
    Forbidden,
    GeniError,
    MissingArgs,
    TimedOut,
    Unavailable,
    Unsupported,
)
from slicex.urn import Urn, parse_urn

# ---- results -------------------------------------------------------------------------------------------------
NONE, AUTHENTICATION, AUTHORIZATION, ARGUMENT, DATABASE, DUPLICATE = 0, 1, 2, 3, 4, 5
NOT_IMPLEMENTED, SERVER, CONFIGURATION = 100, 101, 102
CODE_NAMES = {AUTHENTICATION: "AUTHENTICATION", AUTHORIZATION: "AUTHORIZATION", ARGUMENT: "ARGUMENT",
              DATABASE: "DATABASE", DUPLICATE: "DUPLICATE", NOT_IMPLEMENTED: "NOT_IMPLEMENTED", SERVER: "SERVER",
              CONFIGURATION: "CONFIGURATION"}


class ChError(Exception):
    """An error that reaches the client as a CH API result: `code` from the spec, `message` saying what to do."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def argument(message: str) -> ChError:
    return ChError(ARGUMENT, message)


def authorization(message: str) -> ChError:
    return ChError(AUTHORIZATION, message)


# slicex's GENI error types → CH API codes (the one table; nothing else in the CH API knows these numbers)
_FROM_GENI: tuple[tuple[type[GeniError], int], ...] = (
    (CredentialSignerUntrusted, AUTHENTICATION), (CredentialExpired, AUTHENTICATION),
    (CredentialInvalid, AUTHENTICATION), (CredentialMismatch, AUTHORIZATION), (Forbidden, AUTHORIZATION),
    (AlreadyExists, DUPLICATE), (Unavailable, DATABASE), (TimedOut, DATABASE), (Busy, DATABASE),
    (Unsupported, NOT_IMPLEMENTED), (BadArgs, ARGUMENT), (MissingArgs, ARGUMENT),
)


def from_geni(exc: GeniError) -> ChError:
    for kind, code in _FROM_GENI:
        if isinstance(exc, kind):
            return ChError(code, exc.message)
    return ChError(SERVER, exc.message)


def ok(value: Any) -> dict[str, Any]:
    return {"code": NONE, "value": value, "output": ""}


def error(err: ChError) -> dict[str, Any]:
    """geni-ch's shape, `[NAME] NAME_ERROR (message)`: omni matches on these strings (DUPLICATE_ERROR means
    "slice exists", `ARGUMENT_ERROR (Unknown sli` means "no such slice/sliver")."""
    name = CODE_NAMES.get(err.code, "SERVER")
    return {"code": err.code, "value": None, "output": f"[{name}] {name}_ERROR ({err.message})"}


# ---- options ---------------------------------------------------------------------------------------------------
def options_of(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise argument(f"options must be a struct, got {type(value).__name__}")
    for key, kind in (("match", dict), ("filter", list), ("fields", dict)):
        if key in value and value[key] is not None and not isinstance(value[key], kind):
            raise argument(f"options {key!r} must be a {'struct' if kind is dict else 'list'}")
    return value


def _same(have: Any, want: Any) -> bool:
    if isinstance(have, str) and isinstance(want, str):
        if have.startswith("urn:publicid:IDN+") or want.startswith("urn:publicid:IDN+"):
            return have.lower() == want.lower()  # URNs compare case-insensitively (slices and authorities)
        return have == want
    return have == want


def matches(record: dict[str, Any], match: dict[str, Any] | None) -> bool:
    """AND over the match keys; a list value means any of them (spec §options)."""
    for key, want in (match or {}).items():
        have = record.get(key)
        wants = want if isinstance(want, list) else [want]
        if not any(_same(have, w) for w in wants):
            return False
    return True


def project(record: dict[str, Any], fields: list[str] | None) -> dict[str, Any]:
    """The fields asked for (all without a filter; none with an empty one)."""
    return dict(record) if fields is None else {k: record[k] for k in fields if k in record}


def select(records: dict[str, dict[str, Any]], options: dict[str, Any]) -> dict[str, dict[str, Any]]:
    match, fields = options.get("match"), options.get("filter")
    return {k: project(r, fields) for k, r in records.items() if matches(r, match)}


def fields_of(options: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    fields = options.get("fields") or {}
    missing = [f for f in required if f not in fields]
    if missing:
        raise argument(f"missing field(s) {', '.join(missing)} in options['fields']")
    return fields


def when(value: Any, what: str) -> datetime:
    """A time as clients send it: RFC 3339, or omni's naive isoformat (UTC), with fractions dropped."""
    try:
        return parse_time(str(value) if not isinstance(value, (str, datetime)) else value)
    except GeniError:
        raise argument(f"{what} {value!r} is not a time (e.g. 2030-01-01T12:00:00Z)") from None


# ---- roles and who may do what --------------------------------------------------------------------------------
LEAD, ADMIN, MEMBER, AUDITOR = "LEAD", "ADMIN", "MEMBER", "AUDITOR"
ROLES = (LEAD, ADMIN, MEMBER, AUDITOR)
RANK = {AUDITOR: 0, MEMBER: 1, ADMIN: 2, LEAD: 3}
"""Roles from least to most power: nobody raises their own role (the Common Federation API's roles)."""


def members_of(record: dict[str, Any]) -> dict[str, str]:
    """URN (lower-cased) → role. A record without a members table (a slice made through the gcf interface,
    its membership never changed) has its creator as its only member, as LEAD; otherwise the table is the
    whole truth, so a creator the new LEAD removed stays removed."""
    members = {k.lower(): v for k, v in (record.get("members") or {}).items()}
    owner = record.get("owner") or record.get("lead")
    if owner and not members:
        members[owner.lower()] = LEAD
    return members


def role_of(record: dict[str, Any], member: str) -> str | None:
    return members_of(record).get(member.lower())


def require_role(record: dict[str, Any], member: str, allowed: tuple[str, ...], doing: str) -> None:
    role = role_of(record, member)
    if role not in allowed:
        what = f"you are {role} there" if role else "you are not a member"
        raise authorization(f"{member} may not {doing} {record['urn']}: {what}; this needs "
                            f"{' or '.join(allowed)}")


def require_sliver_info_writer(slice_rec: dict[str, Any], member: str) -> None:
    """Sliver info is the business of the slice's members (not of members of its project outside it, who may
    look): who records, changes or deletes it must hold LEAD, ADMIN or MEMBER in the slice."""
    role = role_of(slice_rec, member)
    if role not in (LEAD, ADMIN, MEMBER):
        what = f"is {role} of slice {slice_rec['urn']}" if role else f"is not a member of slice {slice_rec['urn']}"
        raise authorization(f"{member} {what}; only its LEAD, ADMINs and MEMBERs record, change or delete its "
                            f"sliver info")


def one_public_key(text: Any) -> str:
    """The one OpenSSH public key line `create_key` takes (a key file's final newline dropped): text holding
    several lines is refused, since it would be stored and handed to aggregates as one key."""
    if not isinstance(text, str):
        raise argument("KEY_PUBLIC must be an OpenSSH public key line (ssh-rsa AAAA... comment)")
    key = text.strip()
    if "\n" in key or "\r" in key:
        raise argument("KEY_PUBLIC holds more than one line; one key per call (call create_key once per key)")
    if not key.startswith(("ssh-", "ecdsa-")) or len(key) > 16384:
        raise argument("KEY_PUBLIC must be an OpenSSH public key line (ssh-rsa AAAA... comment)")
    return key


def may_see_slice(slice_rec: dict[str, Any], project_rec: dict[str, Any] | None, member: str) -> bool:
    """Slice members see their slices; project members see the slices of their project."""
    return role_of(slice_rec, member) is not None or (project_rec is not None
                                                       and role_of(project_rec, member) is not None)


def membership_changes(record: dict[str, Any], options: dict[str, Any], prefix: str,
                       our_authority: str, caller: str) -> dict[str, str]:
    """The members after `caller` (a LEAD or ADMIN there) applies `members_to_add/remove/change`
    ({SLICE|PROJECT}_MEMBER, _ROLE). Nobody raises their own role; only a LEAD makes a LEAD or changes or
    removes one (so an ADMIN cannot depose the lead, alone or by crowning an accomplice); a LEAD always
    remains. Members must be users of this authority: the MA serves no one else."""
    members = members_of(record)
    mine = members.get(caller.lower())
    for entry in (options.get("members_to_add") or []) + (options.get("members_to_change") or []):
        if not isinstance(entry, dict) or f"{prefix}_MEMBER" not in entry:
            raise argument(f"members_to_add/change entries are structs with {prefix}_MEMBER and {prefix}_ROLE")
        urn = parse_urn(entry[f"{prefix}_MEMBER"], "user")
        if urn.top_authority != our_authority.lower():
            raise argument(f"{urn} is not a member of {our_authority}; this authority serves its own users only")
        role = str(entry.get(f"{prefix}_ROLE", MEMBER)).upper()
        if role not in ROLES:
            raise argument(f"role {role!r} is not one of {', '.join(ROLES)}")
        key = str(urn).lower()
        if key == caller.lower() and RANK[role] > RANK.get(mine or "", -1):
            raise authorization(f"{caller} may not promote themselves from {mine} to {role} in {record['urn']}; "
                                f"a LEAD of it gives roles")
        if mine != LEAD and LEAD in (role, members.get(key)):
            raise authorization(f"{caller} may not make {urn} {role} in {record['urn']}: only a LEAD makes a LEAD or "
                                f"changes a LEAD's role, and you are {mine}")
        members[key] = role
    for text in options.get("members_to_remove") or []:
        key = str(text).lower()
        if mine != LEAD and members.get(key) == LEAD:
            raise authorization(f"{caller} may not remove {text} from {record['urn']}: only a LEAD removes a LEAD, "
                                f"and you are {mine}")
        members.pop(key, None)
    if LEAD not in members.values():
        raise argument(f"{record['urn']} would have no LEAD; change the lead by adding another LEAD first")
    return members


# ---- projects --------------------------------------------------------------------------------------------------
PROJECT_NAME = re.compile(r"^[a-zA-Z0-9][-a-zA-Z0-9_]{0,31}$")


def project_urn(authority: str, name: str) -> str:
    if not isinstance(name, str) or not PROJECT_NAME.match(name):
        raise argument(f"project name {name!r} must match {PROJECT_NAME.pattern}")
    return f"urn:publicid:IDN+{authority}+project+{name}"


def new_project(authority: str, fields: dict[str, Any], lead: str, now: datetime) -> dict[str, Any]:
    urn = project_urn(authority, fields.get("PROJECT_NAME"))
    expires = fields.get("PROJECT_EXPIRATION")
    if expires not in (None, ""):
        end = when(expires, "PROJECT_EXPIRATION")
        if end <= now:
            raise argument(f"PROJECT_EXPIRATION {rfc3339(end)} is not in the future")
        expires = rfc3339(end)
    return {"urn": urn, "name": fields["PROJECT_NAME"], "uid": str(uuid.uuid4()), "lead": lead,
            "created": rfc3339(now), "expires": expires or None,
            "description": str(fields.get("PROJECT_DESCRIPTION") or ""), "members": {lead.lower(): LEAD}}


def project_expired(rec: dict[str, Any], now: datetime) -> bool:
    return bool(rec.get("expires")) and parse_time(rec["expires"]) <= now


def project_fields(rec: dict[str, Any], now: datetime) -> dict[str, Any]:
    expired = project_expired(rec, now)
    return {"PROJECT_URN": rec["urn"], "PROJECT_UID": rec["uid"], "PROJECT_NAME": rec["name"],
            "PROJECT_DESCRIPTION": rec.get("description", ""), "PROJECT_EXPIRATION": rec.get("expires") or "",
            "PROJECT_EXPIRED": expired, "PROJECT_CREATION": rec["created"], "PROJECT_LEAD": rec["lead"]}


def project_name_of(project_urn_text: str) -> tuple[str, str]:
    """(authority, name) of a project URN, or ARGUMENT saying what is wrong."""
    try:
        urn = parse_urn(project_urn_text, "project")
    except GeniError as exc:
        raise argument(f"Unknown project {project_urn_text!r}: {exc.message}") from None
    return urn.authority, urn.name


# ---- slices ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SlicePolicy:
    lifetime: timedelta = timedelta(days=7)
    max_lifetime: timedelta = timedelta(days=60)


def slice_urn_for(authority: str, name: Any, project_name: str | None) -> Urn:
    """The URN omni builds locally (`<authority>:<project>+slice+<name>`, or `<authority>+slice+<name>`
    without projects), so the one we mint is the one it will use."""
    if not isinstance(name, str):
        raise argument(f"SLICE_NAME must be a string, got {type(name).__name__}")
    where = f"{authority}:{project_name}" if project_name else authority
    try:
        return parse_urn(f"urn:publicid:IDN+{where}+slice+{name}", "slice")
    except GeniError as exc:
        raise argument(exc.message) from None


def slice_expiry(requested: Any, now: datetime, policy: SlicePolicy, project_rec: dict[str, Any] | None,
                 current: datetime | None = None) -> datetime:
    """The expiration a create (current None) or renewal may set: in the future, within the policy's maximum
    and the project's expiration, and never earlier than the slice already has."""
    limit = now + policy.max_lifetime
    if project_rec is not None and project_rec.get("expires"):
        limit = min(limit, parse_time(project_rec["expires"]))
    if requested in (None, ""):
        if current is not None:
            raise argument("no SLICE_EXPIRATION in options['fields']")
        return min(now + policy.lifetime, limit)
    end = when(requested, "SLICE_EXPIRATION")
    if end <= now:
        raise argument(f"SLICE_EXPIRATION {rfc3339(end)} is not in the future")
    if current is not None and end < current:
        raise argument(f"SLICE_EXPIRATION {rfc3339(end)} is before the slice's current expiration "
                       f"{rfc3339(current)}; slices are never shortened")
    if end > limit:
        raise argument(f"SLICE_EXPIRATION {rfc3339(end)} is after {rfc3339(limit)}, the latest this slice may "
                       f"last (at most {policy.max_lifetime.days} days ahead"
                       f"{', and not past its project' if project_rec and project_rec.get('expires') else ''})")
    return end


def slice_uid(rec: dict[str, Any]) -> str:
    """The slice's UUID, the one its certificate carries (a record made before records kept it: read from its
    certificate, so reissued certificates and aggregates' records keep naming the same slice)."""
    if rec.get("uid"):
        return rec["uid"]
    cert = pki.load_certs(rec.get("cert") or "")
    return (pki.cert_uuid(cert[0]) if cert else "") or str(uuid.uuid5(uuid.NAMESPACE_URL, rec["urn"].lower()))


def slice_fields(rec: dict[str, Any], now: datetime) -> dict[str, Any]:
    urn = parse_urn(rec["urn"], "slice")
    expired = parse_time(rec["expires"]) <= now
    return {"SLICE_URN": rec["urn"], "SLICE_UID": slice_uid(rec), "SLICE_NAME": urn.name,
            "SLICE_PROJECT_URN": rec.get("project") or "", "SLICE_EXPIRATION": rec["expires"],
            "SLICE_EXPIRED": expired, "SLICE_CREATION": rec.get("created", ""),
            "SLICE_DESCRIPTION": rec.get("description", ""), "SLICE_LEAD": rec["owner"]}


def for_member(fields: dict[str, Any], prefix: str, role: str) -> dict[str, Any]:
    """A `lookup_*_for_member` row: URN, UID, ROLE, EXPIRED (the spec's) and `EXPIRED` (what omni reads)."""
    expired = fields[f"{prefix}_EXPIRED"]
    return {f"{prefix}_URN": fields[f"{prefix}_URN"], f"{prefix}_UID": fields[f"{prefix}_UID"],
            f"{prefix}_ROLE": role, f"{prefix}_EXPIRED": expired, "EXPIRED": expired}


# ---- sliver info -----------------------------------------------------------------------------------------------
SLIVER_INFO_FIELDS = ("SLIVER_INFO_URN", "SLIVER_INFO_SLICE_URN", "SLIVER_INFO_AGGREGATE_URN",
                      "SLIVER_INFO_CREATOR_URN", "SLIVER_INFO_CREATION", "SLIVER_INFO_EXPIRATION")


def new_sliver_info(fields: dict[str, Any], creator: str, now: datetime) -> dict[str, Any]:
    fields_required = ("SLIVER_INFO_URN", "SLIVER_INFO_SLICE_URN", "SLIVER_INFO_AGGREGATE_URN")
    missing = [f for f in fields_required if not fields.get(f)]
    if missing:
        raise argument(f"missing field(s) {', '.join(missing)}")
    try:
        sliver = parse_urn(fields["SLIVER_INFO_URN"], "sliver")
        slice_ = parse_urn(fields["SLIVER_INFO_SLICE_URN"], "slice")
        aggregate = parse_urn(fields["SLIVER_INFO_AGGREGATE_URN"])
    except GeniError as exc:
        raise argument(exc.message) from None
    created = when(fields["SLIVER_INFO_CREATION"], "SLIVER_INFO_CREATION") \
        if fields.get("SLIVER_INFO_CREATION") else now
    expires = when(fields["SLIVER_INFO_EXPIRATION"], "SLIVER_INFO_EXPIRATION") \
        if fields.get("SLIVER_INFO_EXPIRATION") else None
    return {"SLIVER_INFO_URN": str(sliver), "SLIVER_INFO_SLICE_URN": str(slice_),
            "SLIVER_INFO_AGGREGATE_URN": str(aggregate),
            "SLIVER_INFO_CREATOR_URN": str(fields.get("SLIVER_INFO_CREATOR_URN") or creator),
            "SLIVER_INFO_CREATION": rfc3339(created),
            "SLIVER_INFO_EXPIRATION": rfc3339(expires) if expires else ""}


# ---- services --------------------------------------------------------------------------------------------------
SERVICE_TYPES = {"AGGREGATE_MANAGER": 0, "SLICE_AUTHORITY": 1, "PROJECT_AUTHORITY": 2, "MEMBER_AUTHORITY": 3,
                 "AUTHORIZATION_SERVICE": 4, "LOGGING_SERVICE": 5, "CREDENTIAL_STORE": 6}


def service(kind: str, urn: str, url: str, name: str, description: str,
            am_type: str | None = None) -> dict[str, Any]:
    record = {"SERVICE_URN": urn, "SERVICE_URL": url, "SERVICE_TYPE": kind, "SERVICE_NAME": name,
              "SERVICE_DESCRIPTION": description, "_GENI_SERVICE_SHORT_NAME": name}
    if am_type:
        record["_GENI_SERVICE_ATTRIBUTES"] = {"UI_AM_TYPE": am_type}
    return record


def lookup_services(services: list[dict[str, Any]], options: dict[str, Any],
                    kind: str | None = None) -> list[dict[str, Any]]:
    """A list, as geni-ch and both clients use (not the spec's URN-keyed dict); SERVICE_TYPE matches by name
    or by geni-ch's integer code."""
    match = dict(options.get("match") or {})
    wanted = match.pop("SERVICE_TYPE", kind)
    if wanted is not None:
        names = {w if isinstance(w, str) else next((n for n, c in SERVICE_TYPES.items() if c == w), "")
                 for w in (wanted if isinstance(wanted, list) else [wanted])}
        services = [s for s in services if s["SERVICE_TYPE"] in names]
    return [project(s, options.get("filter")) for s in services if matches(s, match)]


# ---- the two vocabularies --------------------------------------------------------------------------------------
# v2 generic (method, TYPE) → the v1 name it means, as geni-ch dispatches them.
V2_TO_V1: dict[tuple[str, str], str] = {
    ("create", "SLICE"): "create_slice", ("lookup", "SLICE"): "lookup_slices", ("update", "SLICE"): "update_slice",
    ("lookup_for_member", "SLICE"): "lookup_slices_for_member", ("lookup_members", "SLICE"): "lookup_slice_members",
    ("modify_membership", "SLICE"): "modify_slice_membership",
    ("create", "PROJECT"): "create_project", ("lookup", "PROJECT"): "lookup_projects",
    ("update", "PROJECT"): "update_project", ("lookup_for_member", "PROJECT"): "lookup_projects_for_member",
    ("lookup_members", "PROJECT"): "lookup_project_members",
    ("modify_membership", "PROJECT"): "modify_project_membership",
    ("create", "SLIVER_INFO"): "create_sliver_info", ("lookup", "SLIVER_INFO"): "lookup_sliver_info",
    ("update", "SLIVER_INFO"): "update_sliver_info", ("delete", "SLIVER_INFO"): "delete_sliver_info",
    ("lookup", "MEMBER"): "lookup_member_info", ("lookup", "KEY"): "lookup_keys_by_id",
    ("create", "KEY"): "create_key", ("delete", "KEY"): "delete_key",
    ("lookup", "SERVICE"): "lookup_services",
}
GENERIC = ("create", "lookup", "update", "delete", "lookup_for_member", "lookup_members", "modify_membership")


def v1_name(method: str, params: tuple) -> tuple[str, tuple]:
    """The v1 method a call means, and its arguments without the TYPE (v1 calls pass through)."""
    if method not in GENERIC:
        return method, params
    if not params or not isinstance(params[0], str):
        raise argument(f"{method} needs an object type first (SLICE, PROJECT, SLIVER_INFO, MEMBER, KEY, SERVICE)")
    kind = params[0].upper()
    name = V2_TO_V1.get((method, kind))
    if name is None:
        raise ChError(NOT_IMPLEMENTED, f"{method}({kind!r}) is not offered here")
    return name, params[1:]
