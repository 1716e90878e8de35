"""Service levels (VANI): operator-set limits per user and per project, checked before anything is taken. Pure:
the policy read from slicex.yaml's `quotas:` section, what a request will hold, and the refusals. The ledger
(operations/ledger.py) counts what is held now and calls these.

Codes: a limit on what may be *held* (cores, memory, nodes, VLANs, bandwidth, FPGAs) is FORBIDDEN (3): the
caller's service level does not permit it, whatever the aggregate has free; INSUFFICIENT_* (24-26) would tell
clients (omni's stitcher) the aggregate is short of capacity and to retry or route elsewhere, which cannot
help. A limit on *lease length* is OUTOFRANGE (19), the code the aggregate's own maximum lease already gives
(DESIGN §3), and like it yields to `geni_extend_alap` on Renew (the lease is cut to the limit)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from operations.accounting import beyond, user_key
from resources import STANDARD
from resources.kind import RESOURCES, Amounts
from rspec.request import Request
from rspec.substrate import Substrate
from slicex.clock import rfc3339
from slicex.errors import BadArgs, Forbidden, OutOfRange
from slicex.urn import parse_urn

LIMITS = (*RESOURCES, "lease_hours")
NOUNS = {"cores": "cores", "memory_mb": "MB of memory", "nodes": "nodes", "vlans": "VLANs",
         "bandwidth_kbps": "kbps of bandwidth", "fpgas": "FPGA slivers", "public_ports": "public ports",
         "disk_gb": "GB of node disk"}
DEFAULT = "default"


@dataclass(frozen=True)
class Limits:
    """At most this much held at once (None: no limit), and no sliver living longer than `lease`."""

    cores: int | None = None
    memory_mb: int | None = None
    nodes: int | None = None
    vlans: int | None = None
    bandwidth_kbps: int | None = None
    fpgas: int | None = None
    public_ports: int | None = None
    disk_gb: int | None = None
    lease: timedelta | None = None

    @property
    def limits_amounts(self) -> bool:
        return any(getattr(self, r) is not None for r in RESOURCES)


NONE = Limits()


@dataclass(frozen=True)
class QuotaPolicy:
    """Limits by canonical user URN and project URN; `default_user` / `default_project` for those without an
    entry (an entry overrides the default's limits one by one; `null` lifts one)."""

    users: Mapping[str, Limits] = field(default_factory=dict)
    projects: Mapping[str, Limits] = field(default_factory=dict)
    default_user: Limits = NONE
    default_project: Limits = NONE

    @property
    def empty(self) -> bool:
        return not self.users and not self.projects and self.default_user == NONE and self.default_project == NONE

    def for_user(self, user: str) -> Limits:
        return self.users.get(user_key(user), self.default_user)

    def for_project(self, project: str | None) -> Limits:
        if project is None:
            return NONE
        return self.projects.get(project_key(project), self.default_project)


def project_key(urn: str) -> str:
    """Projects compare with their authority case-folded, as URNs do."""
    return user_key(urn)


# ---- slicex.yaml ------------------------------------------------------------------------------------------------
def _limits(where: str, doc: Any, base: Limits) -> Limits:
    if doc is None:
        doc = {}
    if not isinstance(doc, Mapping):
        raise BadArgs(f"{where}: expected a mapping of limits ({', '.join(LIMITS)}), got {type(doc).__name__}")
    values: dict[str, Any] = {r: getattr(base, r) for r in RESOURCES}
    lease = base.lease
    for key, value in doc.items():
        if key not in LIMITS:
            raise BadArgs(f"{where}: unknown limit {key!r}; limits are {', '.join(LIMITS)}")
        if value is None:
            number = None
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 \
                or (key != "lease_hours" and not float(value).is_integer()):
            kind = "a number of hours" if key == "lease_hours" else "a whole number"
            raise BadArgs(f"{where}.{key}: expected {kind} >= 0 (or null for no limit), got {value!r}")
        else:
            number = value
        if key == "lease_hours":
            lease = None if number is None else timedelta(hours=float(number))
        else:
            values[key] = None if number is None else int(number)
    return Limits(**values, lease=lease)


def _entries(where: str, doc: Any, expect: str) -> tuple[Limits, dict[str, Limits]]:
    if doc is None:
        return NONE, {}
    if not isinstance(doc, Mapping):
        raise BadArgs(f"{where}: expected a mapping of {expect} URNs (or `default`) to limits")
    default = _limits(f"{where}.default", doc.get(DEFAULT), NONE)
    out: dict[str, Limits] = {}
    for key, limits in doc.items():
        if key == DEFAULT:
            continue
        try:
            urn = parse_urn(key, expect)
        except BadArgs as exc:
            raise BadArgs(f"{where}: {exc.message}") from None
        out[urn.canonical] = _limits(f"{where}.{key}", limits, default)
    return default, out


def policy_from_config(section: Any) -> QuotaPolicy:
    """Read and check slicex.yaml's `quotas:` section; BADARGS naming the key that is wrong:

        quotas:
          users:
            default: {cores: 8, lease_hours: 168}
            urn:publicid:IDN+example.org+user+alice: {cores: 16}
          projects:
            urn:publicid:IDN+example.org+project+proj1: {cores: 4, vlans: 2}
    """
    if section is None:
        return QuotaPolicy()
    if not isinstance(section, Mapping):
        raise BadArgs(f"quotas: expected a mapping with `users` and/or `projects`, got {type(section).__name__}")
    unknown = set(section) - {"users", "projects"}
    if unknown:
        raise BadArgs(f"quotas: unknown key(s) {', '.join(sorted(map(str, unknown)))}; expected users, projects")
    default_user, users = _entries("quotas.users", section.get("users"), "user")
    default_project, projects = _entries("quotas.projects", section.get("projects"), "project")
    return QuotaPolicy(users, projects, default_user, default_project)


# ---- what a request will hold -----------------------------------------------------------------------------------
def request_amounts(substrate: Substrate, request: Request) -> Amounts:
    """What a request will hold once placed, counted before anything is taken, as each resource kind sizes it
    (resources/: VMs by their size, bare metal by the host named or else the smallest bare-metal host, as the
    federation peer gate counts it; FPGA nodes as one node and one FPGA sliver; one VLAN per link, each link's
    capacity as asked)."""
    return STANDARD.asked(substrate, request)


def update_amounts(substrate: Substrate, desired: Request, named: Mapping[str, Amounts]) -> Amounts:
    """What an Update to the `desired` RSpec adds to the slivers it names (`named`: client_id -> what each
    holds): every new node (with its public ports) and new link whole, and for a link it keeps or replaces
    what the desired one asks beyond what the old one holds (a larger capacity). A kept node cannot change
    in place (slice_manager/update.py), so it adds nothing."""
    out = Amounts()
    for node in desired.nodes:
        if node.client_id not in named:
            out = out + request_amounts(substrate, Request((node,), ()))
    for link in desired.links:
        asked = request_amounts(substrate, Request((), (link,)))
        out = out + (beyond(asked, named[link.client_id]) if link.client_id in named else asked)
    return out


# ---- the checks ---------------------------------------------------------------------------------------------------
def excess(who: str, limits: Limits, held: Amounts, asked: Amounts) -> list[str]:
    """Each limit `who` would pass by holding `asked` on top of `held`, said as the refusal says it."""
    out = []
    for r in RESOURCES:
        limit = getattr(limits, r)
        if limit is not None and getattr(asked, r) > 0 and getattr(held, r) + getattr(asked, r) > limit:
            out.append(f"{who} may hold {limit} {NOUNS[r]} (holds {getattr(held, r)}, asked {getattr(asked, r)})")
    return out


def check_amounts(user: str, project: str | None, policy: QuotaPolicy, held_user: Amounts, held_project: Amounts,
                  asked: Amounts) -> None:
    """FORBIDDEN naming every limit the request would pass, for the user and for the slice's project."""
    over = excess(f"user {user}", policy.for_user(user), held_user, asked)
    if project is not None:
        over += excess(f"project {project}", policy.for_project(project), held_project, asked)
    if over:
        raise Forbidden("quota exceeded: " + "; ".join(over) + ". Delete slivers you no longer need, or ask the "
                        "operator for a larger service level")


def _hours(d: timedelta) -> str:
    h = d / timedelta(hours=1)
    return f"{h:g} hours" if h != 1 else "1 hour"


def lease_end(user: str, project: str | None, policy: QuotaPolicy, start: datetime, end: datetime, now: datetime,
              cut: bool) -> tuple[datetime, str]:
    """The end a sliver that began at `start` may have under the user's and project's lease lengths: `end`
    when within them; cut to the shorter limit when `cut` (a default end, or Renew with geni_extend_alap),
    with a note saying so; else OUTOFRANGE naming the limit. A sliver already at its limit cannot be extended."""
    note = ""
    for who, limits in ((f"user {user}", policy.for_user(user)), (f"project {project}", policy.for_project(project))):
        if limits.lease is None or end <= start + limits.lease:
            continue
        latest = start + limits.lease
        if not cut or latest <= now:
            raise OutOfRange(f"quota exceeded: {who} may hold a sliver for {_hours(limits.lease)}; this one began "
                             f"{rfc3339(start)}, so it may last until {rfc3339(latest)}, not {rfc3339(end)}")
        end = latest
        note = f"lease cut to {rfc3339(end)}: {who} may hold a sliver for {_hours(limits.lease)}"
    return end, note
