"""Validation of RSpecs against the schemas slicex ships (rspec/schemas/): GENI v3 request, advertisement
and manifest, plus the extensions slicex reads and writes (opstate, shared VLAN, stitching v2, slicex
Q-in-Q, capacity and FPGA). Foreign extensions are allowed and checked lax. What a schema cannot say
(client_ids unique, links naming interfaces that exist) is checked here too, so every problem comes back
as one list of sentences with line numbers."""

from __future__ import annotations

import threading
from pathlib import Path

from lxml import etree

from rspec.namespaces import RSPEC3, q
from slicex.errors import ServerError
from slicex.xmlsafe import parse_xml

SCHEMA_DIR = Path(__file__).with_name("schemas")
SCHEMA_FILES = {"request": "request.xsd", "advertisement": "ad.xsd", "manifest": "manifest.xsd"}
KINDS = tuple(SCHEMA_FILES)
MAX_PROBLEMS = 50

_validate_lock = threading.Lock()  # an lxml XMLSchema object is not safe to share between threads
# libxml2 sets up its schema machinery (the built-in types) on the first compile and does not guard that:
# two first compiles at once corrupt it for the life of the process (XMLSchemaParseError on every later
# compile, or a crash). Every compile here happens under this lock, and processes compile before serving.
compile_lock = threading.Lock()
_schemas: dict[str, etree.XMLSchema] = {}


def schema_for(kind: str) -> etree.XMLSchema:
    """The compiled schema for one RSpec kind (request, advertisement, manifest); compiled once, offline."""
    schema = _schemas.get(kind)
    if schema is not None:
        return schema
    if kind not in SCHEMA_FILES:
        raise ValueError(f"no schema for RSpec kind {kind!r}; kinds are {', '.join(KINDS)}")
    with compile_lock:
        if kind not in _schemas:
            parser = etree.XMLParser(no_network=True, resolve_entities=False, load_dtd=False)
            _schemas[kind] = etree.XMLSchema(etree.parse(str(SCHEMA_DIR / SCHEMA_FILES[kind]), parser))
        return _schemas[kind]


CANARY_REQUEST = (f'<rspec xmlns="{RSPEC3}" type="request"><node client_id="canary" exclusive="false">'
                  '<sliver_type name="default-vm"/></node></rspec>')


def warm() -> None:
    """Compile every schema now, one after another, so a process does it before it serves (not in the
    first requests' threads); raises ServerError if validation does not work in this process."""
    for kind in KINDS:
        try:
            schema_for(kind)
        except etree.XMLSchemaParseError as exc:
            raise ServerError(f"the shipped {kind} schema ({SCHEMA_FILES[kind]}) does not compile: {exc}") from exc
    check()


def check() -> None:
    """Validate a known-good request: ServerError when this process can no longer validate requests
    (what a health check asks)."""
    try:
        problems = validate_rspec(CANARY_REQUEST, "request")
    except etree.LxmlError as exc:
        raise ServerError(f"request validation is broken in this process: {type(exc).__name__}: {exc}") from exc
    if problems:
        raise ServerError(f"request validation is broken in this process: a valid request was refused: "
                          f"{problems[0]}")


def validate_rspec(doc: str | bytes | etree._Element, kind: str | None = None) -> list[str]:
    """Problems with a GENI v3 RSpec, each naming its line (empty list: valid). `kind` is the type the caller
    needs; without it the document's own type attribute picks the schema."""
    root = doc if isinstance(doc, etree._Element) else parse_xml(doc, "RSpec", 64 * 1024 * 1024)
    if root.tag != q(RSPEC3, "rspec"):
        return [f"root element is {root.tag}, expected {{{RSPEC3}}}rspec"]
    actual = root.get("type")
    problems: list[str] = []
    if kind is not None and kind not in SCHEMA_FILES:
        raise ValueError(f"no schema for RSpec kind {kind!r}; kinds are {', '.join(KINDS)}")
    if actual not in SCHEMA_FILES:
        return [f"line {root.sourceline}: type is {actual!r}; a GENI v3 RSpec is one of {', '.join(KINDS)}"]
    if kind is not None and actual != kind:
        problems.append(f"line {root.sourceline}: type is {actual!r}, expected {kind!r}")
    schema = schema_for(actual)
    with _validate_lock:
        ok = schema.validate(root)
        if not ok:
            problems += [f"line {e.line}: {_short(e.message)}" for e in list(schema.error_log)[:MAX_PROBLEMS]]
    problems += _references(root, actual)
    return problems


def _short(message: str) -> str:
    """libxml2's messages name elements in Clark notation; keep them readable."""
    return message.replace("{" + RSPEC3 + "}", "")


def _references(root: etree._Element, kind: str) -> list[str]:
    """Identity rules: ids unique, and links name interfaces that the document declares."""
    out: list[str] = []
    attr = "component_id" if kind == "advertisement" else "client_id"
    seen: dict[str, int] = {}
    interfaces: set[str] = set()
    for el in root.iter(q(RSPEC3, "node"), q(RSPEC3, "link"), q(RSPEC3, "interface")):
        if el.getparent() is not root and etree.QName(el).localname != "interface":
            continue
        if etree.QName(el).localname == "interface" and el.getparent().tag != q(RSPEC3, "node"):
            continue
        value = el.get(attr)
        if not value:
            continue
        if etree.QName(el).localname == "interface":
            interfaces.add(value)
        if value in seen and kind != "advertisement":
            out.append(f"line {el.sourceline}: {attr} {value!r} is used twice (first on line {seen[value]}); "
                       f"{attr}s must be unique in a {kind}")
        seen.setdefault(value, el.sourceline or 0)
    external = {e.get("component_id") for e in root.findall(q(RSPEC3, "external_ref"))}
    for link in root.findall(q(RSPEC3, "link")):
        for ref in link.findall(q(RSPEC3, "interface_ref")):
            value = ref.get(attr)
            if kind == "advertisement":
                # ads may name the far end of a link to another aggregate (InstaGENI racks do)
                if value and value not in interfaces and value not in external and _authority(value) == \
                        _authority(link.get("component_id", "")):
                    out.append(f"line {ref.sourceline}: link {link.get('component_id')!r} refers to interface "
                               f"{value!r}, which no node advertises")
            elif kind == "request" and value and value not in interfaces:
                # (a manifest covers one aggregate's part, so its links may name interfaces elsewhere)
                out.append(f"line {ref.sourceline}: link {link.get('client_id')!r} refers to interface {value!r}, "
                           f"which no node declares")
    return out[:MAX_PROBLEMS]


def _authority(urn: str) -> str:
    parts = urn.split("+")
    return parts[1] if len(parts) > 2 else ""
