"""What every actor shares about inventory: the claim namespaces of unit keys, the plain-data codec with
which an authority's substrate description travels inside its delegation (protocol/delegation.py), and the
MAC of a sliver's interface.

Units are named by claim keys (`<kind>:<where>[:<i>]`), so what the broker's policy chooses, the calendar
books, the store claims, the ticket names and the authority leases are the same strings; each resource kind
(resources/: compute, VLAN links, stitching ports, FPGAs) names its own. This module sits in the kernel (it
imports no other project package)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import types
import typing
from typing import Any

UNIT_KINDS = ("core", "mem", "disk", "node", "bw", "vlan", "wire", "fpga", "router", "pport")
"""The first segment of every unit key: the broker's claim namespaces in the store. Each resource kind
(resources/) names the units of its own segments; other claims in a store (locks, lease markers, slice
names) are not inventory. tests/unit/test_resource_kinds.py keeps this list equal to the kinds' own."""


# ---- plain data: a substrate description (frozen dataclasses) as a document and back ---------------------------
def to_doc(value: Any) -> Any:
    """A dataclass tree as JSON/XML-RPC-friendly data (dicts, lists, str, numbers, bools, None)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_doc(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [to_doc(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_doc(v) for k, v in value.items()}
    return value


def from_doc(cls: Any, doc: Any) -> Any:
    """The inverse of `to_doc` for dataclass `cls`, led by its type hints (tuples come back as tuples)."""
    return _build(cls, doc)


@functools.cache
def _hints(tp: Any) -> dict[str, Any]:
    """A dataclass's resolved type hints: resolving them parses annotation strings, so once per class."""
    return typing.get_type_hints(tp)


def _build(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        hints = _hints(tp)
        kw = {f.name: _build(hints[f.name], value[f.name]) for f in dataclasses.fields(tp)
              if f.init and f.name in value}
        return tp(**kw)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _build(args[0], value) if len(args) == 1 else value
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_build(args[0], v) for v in value)
        return tuple(_build(a, v) for a, v in zip(args, value, strict=True)) if args else tuple(value)
    if origin is list:
        (arg,) = typing.get_args(tp) or (Any,)
        return [_build(arg, v) for v in value]
    if origin is dict:
        return dict(value)
    if origin in (frozenset, set):
        (arg,) = typing.get_args(tp) or (Any,)
        return origin(_build(arg, v) for v in value)
    if tp is float and isinstance(value, int):
        return float(value)
    return value


def mac_for(sliver_urn: str, iface: str) -> str:
    """A stable locally administered MAC for an interface of a sliver (manifest and drivers agree on it)."""
    digest = hashlib.sha256(f"{sliver_urn}/{iface}".encode()).digest()
    return "02:" + ":".join(f"{b:02x}" for b in digest[:5])
