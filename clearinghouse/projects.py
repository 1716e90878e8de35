"""Projects as both slice authority interfaces see them: the one lookup of a live project and the one check of
who may make slices in it, so the gcf SA (`<authority>:<project>+slice+<name>` through CreateSlice) and the CH
API (`create_slice` with SLICE_PROJECT_URN) cannot disagree. Quotas and accounting take the project from the
slice URN (operations/quotas.py), so whoever may name a slice into a project spends that project's allowance.

Errors are GENI types (the gcf interface turns them into faults, the CH API into its codes: BadArgs is
ARGUMENT "Unknown project", Forbidden is AUTHORIZATION)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from clearinghouse import chapi
from slicex.errors import BadArgs, Forbidden
from slicex.store import Store
from slicex.urn import Urn

PROJECTS = "ch_projects"
SLICE_MAKERS = (chapi.LEAD, chapi.ADMIN, chapi.MEMBER)
"""Project roles that may create slices in it (an AUDITOR looks, and makes nothing)."""


def live_project(store: Store, authority: str, project_urn: Any, now: datetime) -> dict[str, Any]:
    """The record of a project of `authority` that exists and has not expired; BadArgs "Unknown project"
    (the phrase omni recognises) otherwise."""
    if not isinstance(project_urn, str):
        raise BadArgs(f"Unknown project {project_urn!r}: a project URN is a string")
    try:
        project_authority, name = chapi.project_name_of(project_urn)
    except chapi.ChError as exc:
        raise BadArgs(exc.message) from None
    rec = store.get(PROJECTS, project_urn.lower())
    if rec is None or project_authority.lower() != authority.lower():
        raise BadArgs(f"Unknown project {project_urn}: this slice authority has no such project (create it "
                      f"with create_project or `slicex project create {name}`)")
    if chapi.project_expired(rec, now):
        raise BadArgs(f"Unknown project {project_urn}: it expired at {rec['expires']}")
    return rec


def project_of_slice(authority: str, slice_urn: Urn) -> str | None:
    """The project URN a slice URN names (`<authority>:<project>+slice+<name>`), None for `<authority>+slice+…`."""
    _top, _colon, project = slice_urn.authority.partition(":")
    return f"urn:publicid:IDN+{authority}+project+{project}" if project else None


def require_slice_maker(store: Store, authority: str, project_urn: str, member: str,
                        now: datetime) -> dict[str, Any]:
    """The project's record if `member` may create slices in it; Forbidden naming their role otherwise."""
    rec = live_project(store, authority, project_urn, now)
    role = chapi.role_of(rec, member)
    if role not in SLICE_MAKERS:
        what = f"you are {role} there" if role else "you are not a member of it"
        raise Forbidden(f"{member} may not create slices in project {rec['urn']}: {what}; its lead or an admin "
                        f"adds members ({' or '.join(SLICE_MAKERS)} may create slices)")
    return rec
