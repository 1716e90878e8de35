"""The one codec of the actors' messages: a value of a declared type to its wire form (what XML-RPC carries:
str, int, float, bool, None, lists and string-keyed structs) and back.

Decoding checks the wire form against the declared type on arrival, so a malformed message is refused at the
edge with BADARGS naming the field, never a KeyError three calls deep inside an actor. Types it knows:
scalars, datetime (RFC 3339), Any (carried as is), unions and optionals, lists, tuples, mappings, classes with
`to_doc`/`from_doc` (tickets, leases, delegations, demands) and other dataclasses field by field."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cache
from typing import Any, Union

from slicex.clock import parse_time, rfc3339
from slicex.errors import BadArgs

_SCALARS = (str, int, float, bool)
_SEQUENCES = (list, tuple, Sequence, typing.Sequence)
_MAPPINGS = (dict, Mapping, typing.Mapping)


class MalformedMessage(BadArgs):
    """A message whose wire form does not match its declared type (GENI BADARGS)."""


def encode(value: Any, hint: Any) -> Any:
    """`value`, declared as `hint`, in its wire form."""
    if value is None or hint is Any:
        return value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return encode(value, next((a for a in args if a is not type(None) and _is_instance(value, a)), Any))
    if hint is datetime:
        return rfc3339(value)
    if origin in _SEQUENCES:
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return [encode(v, a) for v, a in zip(value, args, strict=True)]
        return [encode(v, args[0] if args else Any) for v in value]
    if origin in _MAPPINGS:
        return {str(k): encode(v, args[1] if args else Any) for k, v in value.items()}
    if isinstance(hint, type) and hasattr(hint, "to_doc"):
        return value.to_doc()
    if dataclasses.is_dataclass(hint):
        hints = _field_hints(hint)
        return {f.name: encode(getattr(value, f.name), hints[f.name]) for f in dataclasses.fields(hint)}
    return value


def decode(wire: Any, hint: Any, where: str) -> Any:
    """The value of type `hint` that `wire` carries; MalformedMessage (BADARGS) naming `where` if none does."""
    if hint is Any:
        return wire
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return _decode_union(wire, args, where)
    if wire is None:
        if hint is type(None):
            return None
        raise MalformedMessage(f"{where}: missing (expected {_name(hint)})")
    if hint is datetime:
        if not isinstance(wire, str):
            raise MalformedMessage(f"{where}: expected an RFC 3339 time, got {type(wire).__name__}")
        try:
            return parse_time(wire)
        except (BadArgs, ValueError):
            raise MalformedMessage(f"{where}: not an RFC 3339 time: {wire!r}") from None
    if hint in _SCALARS:
        if hint is float and isinstance(wire, int) and not isinstance(wire, bool):
            return float(wire)
        if not isinstance(wire, hint) or (hint is int and isinstance(wire, bool)):
            raise MalformedMessage(f"{where}: expected {hint.__name__}, got {type(wire).__name__}")
        return wire
    if origin in _SEQUENCES:
        if not isinstance(wire, (list, tuple)):
            raise MalformedMessage(f"{where}: expected a list, got {type(wire).__name__}")
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            if len(wire) != len(args):
                raise MalformedMessage(f"{where}: expected {len(args)} items, got {len(wire)}")
            return tuple(decode(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(wire, args, strict=True)))
        items = [decode(v, args[0] if args else Any, f"{where}[{i}]") for i, v in enumerate(wire)]
        return items if origin is list else tuple(items)
    if origin in _MAPPINGS or hint in (dict, Mapping):
        if not isinstance(wire, dict):
            raise MalformedMessage(f"{where}: expected a struct, got {type(wire).__name__}")
        value_hint = args[1] if args else Any
        return {k: decode(v, value_hint, f"{where}.{k}") for k, v in wire.items()}
    if not isinstance(wire, dict):
        raise MalformedMessage(f"{where}: expected a {_name(hint)} struct, got {type(wire).__name__}")
    if isinstance(hint, type) and hasattr(hint, "from_doc"):
        try:  # `from_wire` where a type checks more of what another process sends than of its own records
            return getattr(hint, "from_wire", hint.from_doc)(wire)
        except MalformedMessage:
            raise
        except (BadArgs, KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise MalformedMessage(f"{where}: not a {_name(hint)}: {type(exc).__name__}: {exc}") from None
    if dataclasses.is_dataclass(hint):
        return _decode_fields(wire, hint, where)
    raise TypeError(f"the protocol codec cannot carry {_name(hint)} ({where})")


def _decode_union(wire: Any, args: tuple[Any, ...], where: str) -> Any:
    if wire is None and type(None) in args:
        return None
    reasons = []
    for a in (a for a in args if a is not type(None)):
        try:
            return decode(wire, a, where)
        except MalformedMessage as exc:
            reasons.append(exc.message)
    raise MalformedMessage(" / ".join(reasons) or f"{where}: missing")


def _decode_fields(wire: Mapping[str, Any], cls: type, where: str) -> Any:
    hints = _field_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(wire) - set(fields)
    if unknown:
        raise MalformedMessage(f"{where}: unknown field(s) {', '.join(sorted(unknown))} of {cls.__name__}")
    values = {}
    for name, f in fields.items():
        if name in wire:
            values[name] = decode(wire[name], hints[name], f"{where}.{name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise MalformedMessage(f"{where}: {cls.__name__} has no {name}")
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise MalformedMessage(f"{where}: not a {cls.__name__}: {exc}") from None


@cache
def _field_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_instance(value: Any, hint: Any) -> bool:
    if hint is Any:
        return True
    origin = typing.get_origin(hint) or hint
    if origin in (Sequence, typing.Sequence):
        origin = (list, tuple)
    elif origin in (Mapping, typing.Mapping):
        origin = dict
    return isinstance(value, origin)


def _name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint)
