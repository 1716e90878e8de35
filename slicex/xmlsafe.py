"""Hardened XML parsing for everything that arrives from outside (RSpecs, credentials).

No DTDs, no entities, no network, bounded size: entity bombs and external entities are refused with a
clear BadArgs/TooBig instead of being expanded."""

from __future__ import annotations

import re

from lxml import etree

from slicex.errors import BadArgs, TooBig

MAX_XML_BYTES = 4 * 1024 * 1024
_DOCTYPE = re.compile(rb"<!DOCTYPE|<!ENTITY", re.IGNORECASE)


def _parser() -> etree.XMLParser:
    return etree.XMLParser(resolve_entities=False, no_network=True, dtd_validation=False, load_dtd=False,
                           huge_tree=False, remove_comments=False, remove_pis=True, collect_ids=True)


def parse_xml(data: str | bytes, what: str = "document", max_bytes: int = MAX_XML_BYTES) -> etree._Element:
    """Parse untrusted XML into an element tree, or raise BadArgs/TooBig naming `what` and the problem."""
    if isinstance(data, str):
        raw = data.encode("utf-8")
    elif isinstance(data, bytes):
        raw = data
    else:
        raise BadArgs(f"{what} must be an XML string, got {type(data).__name__}")
    if len(raw) > max_bytes:
        raise TooBig(f"{what} is {len(raw)} bytes; this aggregate accepts at most {max_bytes}")
    if not raw.strip():
        raise BadArgs(f"{what} is empty")
    if _DOCTYPE.search(raw):
        raise BadArgs(f"{what} contains a DOCTYPE or ENTITY declaration; DTDs and entities are refused")
    if raw.lstrip().startswith(b"<?xml") and isinstance(data, str):
        # lxml refuses str input with an encoding declaration; the bytes are UTF-8 already.
        raw = re.sub(rb"^\s*<\?xml[^>]*\?>", b"", raw, count=1)
    try:
        root = etree.fromstring(raw, _parser())
    except etree.XMLSyntaxError as exc:
        raise BadArgs(f"{what} is not well-formed XML: {exc}") from None
    if root is None:
        raise BadArgs(f"{what} has no root element")
    return root
