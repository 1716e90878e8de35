"""GENI URNs: `urn:publicid:IDN+<authority[:sub]>+<type>+<name>` (DESIGN §4)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from slicex.errors import BadArgs

_PREFIX = "urn:publicid:IDN+"
_SLICE_NAME = re.compile(r"^[a-zA-Z0-9][-a-zA-Z0-9]{0,18}$")
_AUTHORITY = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.:]*$")
_NAME = re.compile(r"^[^\s+]+$")
KNOWN_TYPES = {"authority", "user", "slice", "sliver", "node", "interface", "link", "image", "vlan", "tool",
               "stitching", "service", "member", "project"}
CASE_FOLDED_NAMES = {"slice"}


@dataclass(frozen=True)
class Urn:
    authority: str
    type: str
    name: str

    def __str__(self) -> str:
        return f"{_PREFIX}{self.authority}+{self.type}+{self.name}"

    @property
    def top_authority(self) -> str:
        """The authority without its sub-authority part, lower-cased (authorities compare case-insensitively)."""
        return self.authority.split(":")[0].lower()

    @property
    def canonical(self) -> str:
        """The one spelling used as a key and in comparisons: authority case-folded (authorities compare
        case-insensitively) and, for slices, the name too (the slice authority keys slices by the lower-cased
        URN, so `Exp1` and `exp1` are one slice). Without this, a shut-down slice comes back under another
        spelling."""
        name = self.name.lower() if self.type in CASE_FOLDED_NAMES else self.name
        return f"{_PREFIX}{self.authority.lower()}+{self.type}+{name}"

    def same_as(self, other: Urn) -> bool:
        return self.canonical == other.canonical


def parse_urn(text: object, expect_type: str | None = None) -> Urn:
    """Parse a URN or raise BadArgs saying exactly what is wrong with it."""
    if not isinstance(text, str):
        raise BadArgs(f"expected a URN string, got {type(text).__name__}")
    if len(text) > 512:
        raise BadArgs(f"URN is {len(text)} characters long; at most 512 are allowed")
    if not text.startswith(_PREFIX):
        raise BadArgs(f"{text!r} is not a GENI URN: it must start with {_PREFIX!r}")
    parts = text[len(_PREFIX):].split("+", 2)
    if len(parts) != 3:
        raise BadArgs(f"{text!r} is not a GENI URN: expected {_PREFIX}<authority>+<type>+<name>")
    authority, kind, name = parts
    if not _AUTHORITY.match(authority):
        raise BadArgs(f"{text!r}: authority {authority!r} is not valid")
    if kind not in KNOWN_TYPES:
        raise BadArgs(f"{text!r}: unknown URN type {kind!r}")
    if not name or not _NAME.match(name):
        raise BadArgs(f"{text!r}: name {name!r} is empty or contains spaces or '+'")
    if expect_type is not None and kind != expect_type:
        raise BadArgs(f"{text!r} is a {kind} URN; a {expect_type} URN is required here")
    if kind == "slice" and not _SLICE_NAME.match(name):
        raise BadArgs(f"{text!r}: slice name {name!r} must match {_SLICE_NAME.pattern}")
    return Urn(authority, kind, name)


def canonical_urn(text: object, expect_type: str | None = None) -> str:
    """Parse a URN received at an edge and return its canonical spelling (see `Urn.canonical`)."""
    return parse_urn(text, expect_type).canonical


def as_spelled(canonical: str, candidates: Iterable[object], expect_type: str | None = None) -> str:
    """The first of `candidates` (the URNs a caller named, then its credential's) that is `canonical` up to
    case, as the caller spelled it; else `canonical`. URNs compare case-insensitively but keep their case
    (Fed4FIRE Federation AM API), and jFed's tester checks that Status and Describe answer geni_urn exactly
    as it named its slice (`S<millis>`)."""
    for text in candidates:
        try:
            if isinstance(text, str) and canonical_urn(text, expect_type) == canonical:
                return text
        except BadArgs:
            continue
    return canonical


def slice_urn(authority: str, name: str) -> Urn:
    """Build a slice URN, validating the name."""
    return parse_urn(f"{_PREFIX}{authority}+slice+{name}", "slice")


def is_valid_slice_name(name: str) -> bool:
    return bool(_SLICE_NAME.match(name))
