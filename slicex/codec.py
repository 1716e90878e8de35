"""The one codec of the actors' messages and the records they keep: a value of a declared type to its wire or
stored form (what XML-RPC and the store carry: str, int, float, bool, None, lists and string-keyed structs;
datetimes as RFC 3339) and back, by msgspec (bench/codec.py: 2-4x faster than pydantic's TypeAdapter).

Decoding checks the form against the declared type on arrival, so a malformed message is refused at the edge
with BADARGS naming the field path, never a KeyError three calls deep inside an actor. Messages and records
are msgspec Structs (or plain dataclasses, TypedDicts, unions, lists, tuples, mappings of them), declared
once; a Struct declared `omit_defaults` leaves its defaults out of what is stored."""

from __future__ import annotations

import re
import types
import typing
from functools import cache
from typing import Any, Union

import msgspec

from slicex.errors import BadArgs

_TO_JSON = msgspec.json.Encoder()
_FROM_JSON = msgspec.json.Decoder()


class MalformedMessage(BadArgs):
    """A message whose wire form does not match its declared type (GENI BADARGS)."""


def encode(value: Any, hint: Any = Any) -> Any:
    """`value` (declared as `hint`) in its wire or stored form: exactly what the store's JSON reads back (lists,
    string keys), so a document compares equal to its stored copy (through msgspec's JSON: about 4 us for a
    ticket, against 1 us for `msgspec.to_builtins`, which keeps tuples). A type not yet declared as a Struct (protocol/delegation.py
    Delegation, whose pools travel as counts) writes its own `to_doc`."""
    if hasattr(value, "to_doc"):
        return value.to_doc()
    return _FROM_JSON.decode(_TO_JSON.encode(value))


def decode(wire: Any, hint: Any, where: str) -> Any:
    """The value of type `hint` that `wire` carries; MalformedMessage (BADARGS) naming `where` and the path
    inside it if none does."""
    if hint is Any:
        return wire
    members = _split_union(hint)
    if members is not None:  # a union msgspec cannot tell apart by shape: the first member that fits
        if wire is None and type(None) in members:
            return None
        reasons = []
        for member in (m for m in members if m is not type(None)):
            try:
                return decode(wire, member, where)
            except MalformedMessage as exc:
                reasons.append(exc.message)
        raise MalformedMessage(" / ".join(reasons) or f"{where}: missing")
    if isinstance(hint, type) and hasattr(hint, "from_doc"):  # as `encode`: a type that reads its own form
        try:
            return hint.from_doc(wire)
        except (BadArgs, KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise MalformedMessage(f"{where}: not a {_name(hint)}: {type(exc).__name__}: {exc}") from None
    try:
        return msgspec.convert(wire, hint)
    except msgspec.ValidationError as exc:
        raise MalformedMessage(_reason(str(exc), where, hint)) from None


_AT = re.compile(r"^(?P<why>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)


def _reason(text: str, where: str, hint: Any) -> str:
    """msgspec's "Expected `str`, got `int` - at `$.nodes[0].client_id`" as "<where>.nodes[0].client_id:
    expected str, got int (a <type>)"."""
    m = _AT.match(text)
    why, path = (m["why"], m["path"] or "") if m else (text, "")
    why = why.replace("`", "")
    return f"{where}{path}: {why[:1].lower()}{why[1:]} (not a {_name(hint)})"


@cache
def _split_union(hint: Any) -> tuple[Any, ...] | None:
    """The members of a union of several struct-like types (msgspec decodes a union of at most one), else
    None."""
    if typing.get_origin(hint) not in (Union, types.UnionType):
        return None
    members = typing.get_args(hint)
    try:
        msgspec.convert(None, hint)
    except TypeError:
        return members
    except msgspec.ValidationError:
        pass
    return None


def _name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint)
