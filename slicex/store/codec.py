"""The stored form of a document: compact JSON with sorted keys (written and read by msgspec: bench/codec.py),
deflated against a preset dictionary of what records look like (field names, URN shapes, an RSpec), behind one
version byte. Every store (SQLite, Redis) writes and reads documents through `encode` and `decode`, so a
document reads back the same whichever store holds it.

Why: a record's text repeats itself and its siblings (URNs, field names, a ticket's unit keys); deflate with the
dictionary stores a slice manager record, an authority lease or a broker ticket in about a fifth of its JSON
(issue 33: the store held about 21 KB per live sliver). It costs about 25 us per write and 6 us per read on
the development machine (the compressor primed with the dictionary once, copied per document).

`decode` reads every form ever written: JSON text (str, or bytes starting with "{" or "["; what stores held
before, and what they hold of a small document), and version 1 (b"\x01" + raw deflate against `_DICTIONARY_1`). The dictionary of a version never
changes (documents written with it must stay readable): a better one is a new version byte beside it."""

from __future__ import annotations

import json
import zlib
from typing import Any

import msgspec

_ENCODER = msgspec.json.Encoder(order="sorted")
_DECODER = msgspec.json.Decoder()
_VERSION_1 = b"\x01"
_DICTIONARY_1 = (
    b'{"cert":"-----BEGIN CERTIFICATE-----\\n-----END CERTIFICATE-----'
    b'\\n\\n","claim":"urn:publicid:IDN+example.org+user+bench||","created":"2030-01-'
    b'01T00:00:00Z","expires":"2030-01-'
    b'01T00:00:00Z","owner":"urn:publicid:IDN+example.org+user+bench","uid":"","urn":"urn:publicid:IDN+exa'
    b'mple.org+slice+s1"}{"id":"urn:publicid:IDN+example.org+sliver+","slice_urn":"urn:publicid:IDN+exampl'
    b'e.org+slice+s1"}{"client_ids":["n1","n2","n3"],"key":"urn:publicid:IDN+example.org+slice+s1#","slice'
    b'_urn":"urn:publicid:IDN+example.org+slice+s1","xml":"<rspec '
    b'xmlns=\\"http://www.geni.net/resources/rspec/3\\" type=\\"request\\"><node client_id=\\"n1\\"><sliver_type'
    b' name=\\"small\\"/></node><node client_id=\\"n2\\"><sliver_type name=\\"small\\"/></node><node '
    b'client_id=\\"n3\\"><sliver_type name=\\"small\\"/></node></rspec>"}{"amounts":{"cores":1,"disk_gb":20,"m'
    b'emory_mb":2048,"nodes":1},"client_id":"n2","expires":"2030-01-'
    b'01T00:00:00Z","kind":"node","slice_urn":"urn:publicid:IDN+example.org+slice+s1","sliver_urn":"urn:pu'
    b'blicid:IDN+example.org+sliver+","start":"2030-01-'
    b'01T00:00:00Z","user":"urn:publicid:IDN+example.org+user+bench"}{"broker":"broker","placement":{"comp'
    b'onent_id":"urn:publicid:IDN+example.org+node+h1","details":{"cores":1,"disk_gb":20,"disk_image":"urn'
    b':publicid:IDN+example.org+image+ubuntu-'
    b'22.04","exclusive":false,"host":"h1","interfaces":{},"memory_mb":2048,"sliver_type":"small","vm_size'
    b'":"small"},"kind":"node"},"state":"active","ticket":{"authority":"urn:publicid:IDN+example.org+autho'
    b'rity+am","broker":"broker","end":"2030-01-'
    b'01T00:00:00Z","holder":"sm","id":"ticket:urn:publicid:IDN+example.org+sliver+","reservation":"urn:pu'
    b'blicid:IDN+example.org+sliver+","sequence":2,"signature":"","start":"2030-01-'
    b'01T00:00:00Z","units":["core:urn:publicid:IDN+example.org+node+h1:24","mem:urn:publicid:IDN+example.'
    b'org+node+h1:96","mem:urn:publicid:IDN+example.org+node+h1:97","mem:urn:publicid:IDN+example.org+node'
    b'+h1:98","mem:urn:publicid:IDN+example.org+node+h1:99"]}}{"lease":{"authority":"urn:publicid:IDN+exam'
    b'ple.org+authority+am","from_ticket":true,"id":"ticket:urn:publicid:IDN+example.org+sliver+","signatu'
    b're":""},"spec":{"client_id":"n2","details":{"cores":1,"disk_gb":20,"disk_image":"urn:publicid:IDN+ex'
    b'ample.org+image+ubuntu-'
    b'22.04","exclusive":false,"host":"h1","hostname":"n2.s1.example.org","interfaces":{},"logins":[],"mem'
    b'ory_mb":2048,"owner":"urn:publicid:IDN+example.org+user+bench","slice_urn":"urn:publicid:IDN+example'
    b'.org+slice+s1","sliver_type":"small","vm_size":"small"},"kind":"node","packed":true},"state":"active'
    b'","status":{"since":"2030-01-'
    b'01T00:00:00Z","state":"geni_notready","then":null,"until":null},"ticket":{"authority":"urn:publicid:'
    b'IDN+example.org+authority+am","broker":"broker","end":"2030-01-'
    b'01T00:00:00Z","holder":"sm","id":"ticket:urn:publicid:IDN+example.org+sliver+","reservation":"urn:pu'
    b'blicid:IDN+example.org+sliver+","sequence":2,"signature":"","start":"2030-01-'
    b'01T00:00:00Z","units":["core:urn:publicid:IDN+example.org+node+h1:24","mem:urn:publicid:IDN+example.'
    b'org+node+h1:96","mem:urn:publicid:IDN+example.org+node+h1:97","mem:urn:publicid:IDN+example.org+node'
    b'+h1:98","mem:urn:publicid:IDN+example.org+node+h1:99"]}}{"client_id":"n2","component_id":"urn:public'
    b'id:IDN+example.org+node+r01h6","demand":{"element":{"client_id":"n2","sliver_type":"small"},"image_p'
    b'olicy":"reject","order":1},"details":{"cores":1,"disk_gb":20,"disk_image":"urn:publicid:IDN+example.'
    b'org+image+ubuntu-'
    b'22.04","exclusive":false,"host":"r01h6","hostname":"n2.s1.example.org","interfaces":{},"logins":[],"'
    b'memory_mb":2048,"sliver_type":"small","vm_size":"small"},"group":"ticket:","id":"urn:publicid:IDN+ex'
    b'ample.org+sliver+","kind":"node","lease":{"authority":"urn:publicid:IDN+example.org+authority+am","f'
    b'rom_ticket":true,"id":"ticket:urn:publicid:IDN+example.org+sliver+","signature":""},"owner_urn":"urn'
    b':publicid:IDN+example.org+user+bench","provisioned":true,"r":{"end":"2030-01-'
    b'01T00:00:00Z","gate":"redeem","request":3,"resource":"node n2 (small)","sequence":2,"state":"Active"'
    b'},"slice_urn":"urn:publicid:IDN+example.org+slice+s1","slice_uuid":"","ticket":{"authority":"urn:pub'
    b'licid:IDN+example.org+authority+am","broker":"broker","end":"2030-01-'
    b'01T00:00:00Z","holder":"sm","sequence":2,"signature":"","start":"2030-01-'
    b'01T00:00:00Z","units":["core:urn:publicid:IDN+example.org+node+r01h6:6","mem:urn:publicid:IDN+exampl'
    b'e.org+node+r01h6:24","mem:urn:publicid:IDN+example.org+node+r01h6:25","mem:urn:publicid:IDN+example.'
    b'org+node+r01h6:26","mem:urn:publicid:IDN+example.org+node+r01h6:27"]}}'
)
_DEFLATE_1 = zlib.compressobj(6, zlib.DEFLATED, -15, zlib.DEF_MEM_LEVEL, zlib.Z_DEFAULT_STRATEGY, _DICTIONARY_1)
"""Primed once with the dictionary; each document is compressed by a copy (zlib copies under its own lock).
zlib's default memory level (8), not its largest (9): a copy of the larger state cost 75-400 us against 15-35 us
for a record on the development machine (about a third of every record write's CPU), for the same bytes out
(what a reader inflates does not depend on it)."""


def _json(doc: Any) -> bytes:
    """Compact JSON, keys sorted. A mapping with keys other than strings (msgspec sorts only string keys) is
    written as the standard library writes it, also compact."""
    try:
        return _ENCODER.encode(doc)
    except TypeError:
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


_SMALL = 128
"""Below this many bytes of JSON a document is stored as its JSON (version tokens, heartbeats, index entries:
written often, deflating saves little of them)."""


def encode(doc: Any) -> bytes:
    """`doc` as stored: version 1, or its JSON when small."""
    text = _json(doc)
    if len(text) < _SMALL:
        return text
    deflate = _DEFLATE_1.copy()
    return _VERSION_1 + deflate.compress(text) + deflate.flush()


def decode(stored: str | bytes) -> Any:
    """A stored document, in any form ever written."""
    if isinstance(stored, bytes) and stored[:1] == _VERSION_1:
        inflate = zlib.decompressobj(-15, _DICTIONARY_1)
        return _DECODER.decode(inflate.decompress(stored[1:]) + inflate.flush())
    return _DECODER.decode(stored)
