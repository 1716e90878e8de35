"""The held index: each live sliver filed under its owner's and its slice's URN authority, so a federation
peer's usage limit (slicex/peers.py) reads the slivers of the peer's namespaces only, never every record.

Table `sm-held`, two entries per live sliver: `o#<owner authority>#<sliver>` and `s#<slice authority>#<sliver>`
(authorities in lower case, as namespaces compare), each `{"id", "owner_urn", "slice_urn"}` (`filed`; a store
made before also holds its kind and cores, which nothing reads: what is counted comes from the record, `entry`).
A sliver is live while its record is neither ended, failed nor being discarded, and is not a staged Update's
replacing link (its commit releases the one it replaces). `Records._save` keeps the entries with each change:
written before the record when it becomes live, removed after it when it stops being live, so a crash in
between counts a sliver once too often, never once too few; the next save of the record puts it right, and
`held_in` checks each entry against its record before counting it (what a peer holds is bounded by its
limits, so that read is small)."""

from __future__ import annotations

from typing import Any

from slice_manager import reservation as rs
from slicex.errors import BadArgs
from slicex.urn import parse_urn

HELD = "sm-held"
ENDED = (rs.CLOSE_WAIT, rs.CLOSED, rs.FAILED)


def live(rec: Any) -> bool:
    return not (rec.r.state in ENDED or rec.discard or rec.update == "replacing")


def filed(rec: Any) -> dict[str, Any] | None:
    """What the held index files for `rec` (None: not live, so not filed): what finds it, nothing that changes
    while it is live (its cores are known only once placed), so a sliver's entries are written once."""
    if not live(rec):
        return None
    return {"id": rec.id, "owner_urn": rec.owner_urn, "slice_urn": rec.slice_urn}


def entry(rec: Any) -> dict[str, Any] | None:
    """What a peer's usage counts of `rec`, from the record itself (None: not live)."""
    if not live(rec):
        return None
    return {"id": rec.id, "owner_urn": rec.owner_urn, "slice_urn": rec.slice_urn, "kind": rec.kind,
            "cores": int(rec.details.get("cores", 0) or 0)}


def _authority(urn: str) -> str:
    try:
        return parse_urn(urn).authority.lower()
    except BadArgs:
        return ""  # not a GENI URN: no peer's namespace covers it


def keys(held: dict[str, Any]) -> list[str]:
    """The two index keys of an entry: by owner authority and by slice authority."""
    return [f"o#{_authority(held['owner_urn'])}#{held['id']}", f"s#{_authority(held['slice_urn'])}#{held['id']}"]


def prefixes(namespace: str) -> list[str]:
    """Key prefixes under which the slivers of `namespace` (and of its sub-authorities `namespace:sub`) are
    filed; the prefix also matches other authorities that merely start with it, which the caller filters."""
    ns = namespace.lower()
    return [f"o#{ns}", f"s#{ns}"]
