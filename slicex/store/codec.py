"""The stored form of a document: compact JSON with sorted keys, written and read by msgspec (bench/codec.py:
several times faster than the standard library's json, and no spaces after separators, which were about 5 %
of a stored record). Every store (SQLite, Redis) writes and reads documents through these two functions, so a
document reads back the same whichever store holds it; a document written before (spaced JSON) reads the same."""

from __future__ import annotations

import json
from typing import Any

import msgspec

_ENCODER = msgspec.json.Encoder(order="sorted")
_DECODER = msgspec.json.Decoder()


def encode(doc: Any) -> str:
    """`doc` as stored. A mapping with keys other than strings (msgspec sorts only string keys) is written as
    the standard library writes it, also compact."""
    try:
        return _ENCODER.encode(doc).decode()
    except TypeError:
        return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def decode(text: str | bytes) -> Any:
    """A stored document."""
    return _DECODER.decode(text)
