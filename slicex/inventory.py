"""The inventory model every actor shares: how a substrate is cut into units, and how units are named.

Units are named by claim keys, so what the broker's policy chooses, the calendar books, the store claims, the
ticket names and the authority leases are the same strings:
  core:<host>:<i>   one CPU core of a shared VM host        mem:<host>:<i>   one MEM_CHUNK_MB of its memory
  node:<host>       a whole exclusive (bare-metal) node     bw:<iface>:<i>   BW_CHUNK_KBPS of a host interface
  vlan:<switch>:<t> VLAN tag t on a switch                  wire:<port>:<t>  outer tag t on a stitching port
  fpga:<id>         a whole FPGA                            vplane:<id>:<k>  hardware plane k of an FPGA
  swplane:<board>:<k>  software plane k of a board

This module sits in the kernel (it imports no other project package), so the authority, the broker and the
slice manager all read unit sizes from here instead of from one another. It also holds the plain-data codec
with which an authority's substrate description travels inside its delegation (broker/delegation.py)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import types
import typing
from collections.abc import Iterable, Set
from typing import Any

MEM_CHUNK_MB = 512
BW_CHUNK_KBPS = 100_000
SOFTWARE_PLANES_PER_BOARD = 16
UNIT_KINDS = ("core", "mem", "node", "bw", "vlan", "wire", "fpga", "vplane", "swplane")
"""The first segment of every unit key; other claims in a store (locks, lease markers, slice names) are not
inventory."""


def core(host: str, i: int) -> str:
    return f"core:{host}:{i}"


def mem(host: str, i: int) -> str:
    return f"mem:{host}:{i}"


def node(host: str) -> str:
    return f"node:{host}"


def bw(iface: str, i: int) -> str:
    return f"bw:{iface}:{i}"


def vlan(switch: str, tag: int) -> str:
    return f"vlan:{switch}:{tag}"


def wire(port: str, tag: int) -> str:
    return f"wire:{port}:{tag}"


def is_unit(key: str) -> bool:
    """Whether a claim key names a unit of inventory (not a lock, a lease marker or a slice-name claim)."""
    kind, sep, _rest = key.partition(":")
    return bool(sep) and kind in UNIT_KINDS


def units(keys: Iterable[str]) -> set[str]:
    return {k for k in keys if is_unit(k)}


def usage_counts(keys: Set[str]) -> tuple[dict[str, int], dict[str, int], frozenset[str], dict[str, frozenset[int]]]:
    """(cores per host, MB per host, exclusive nodes taken, VLAN tags per switch) from unit keys in use."""
    cores: dict[str, int] = {}
    mb: dict[str, int] = {}
    taken: set[str] = set()
    vlans: dict[str, set[int]] = {}
    for key in keys:
        kind, _, rest = key.partition(":")
        if kind == "core":
            host = rest.rsplit(":", 1)[0]
            cores[host] = cores.get(host, 0) + 1
        elif kind == "mem":
            host = rest.rsplit(":", 1)[0]
            mb[host] = mb.get(host, 0) + MEM_CHUNK_MB
        elif kind == "node":
            taken.add(rest)
        elif kind == "vlan":
            switch, _, tag = rest.rpartition(":")
            vlans.setdefault(switch, set()).add(int(tag))
    return cores, mb, frozenset(taken), {k: frozenset(v) for k, v in vlans.items()}


def keys_under(substrate: Any, prefixes: Set[str]) -> set[str]:
    """Every unit key of `substrate`'s hosts under the given pool names (reclaimed inventory: unavailable)."""
    out: set[str] = set()
    for h in substrate.hosts:
        cid = h.component_id
        if node(cid) in prefixes:
            out.add(node(cid))
        if f"core:{cid}" in prefixes:
            out |= {core(cid, i) for i in range(h.cores)}
        if f"mem:{cid}" in prefixes:
            out |= {mem(cid, i) for i in range(h.memory_mb // MEM_CHUNK_MB)}
        for i in h.interfaces:
            if f"bw:{i.component_id}" in prefixes:
                out |= {bw(i.component_id, k) for k in range(i.bandwidth_kbps // BW_CHUNK_KBPS)}
    return out


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
