"""Validation of RSpecs against the schemas slicex ships (rspec/schemas/): GENI v3 core plus the
extensions slicex reads (opstate, shared VLAN, stitching v2, slicex Q-in-Q and capacity). Foreign
extensions are allowed and checked lax. Kind-specific rules the schema cannot say (a request node needs a
client_id, an advertised node a component_id) are checked here."""

from __future__ import annotations

import functools
from pathlib import Path

from lxml import etree

from rspec.namespaces import RSPEC3, q
from slicex.xmlsafe import parse_xml

SCHEMA_DIR = Path(__file__).with_name("schemas")


@functools.lru_cache(maxsize=1)
def rspec_schema() -> etree.XMLSchema:
    parser = etree.XMLParser(no_network=True, resolve_entities=False)
    return etree.XMLSchema(etree.parse(str(SCHEMA_DIR / "rspec-3.xsd"), parser))


def validate_rspec(doc: str | bytes | etree._Element, kind: str | None = None) -> list[str]:
    """Problems with a GENI v3 RSpec (empty list: valid). `kind` additionally checks the rspec type."""
    root = doc if isinstance(doc, etree._Element) else parse_xml(doc, "RSpec")
    if root.tag != q(RSPEC3, "rspec"):
        return [f"root element is {root.tag}, expected {{{RSPEC3}}}rspec"]
    schema = rspec_schema()
    problems = []
    if not schema.validate(root):
        problems += [f"line {e.line}: {e.message}" for e in schema.error_log]
    actual = root.get("type")
    if kind is not None and actual != kind:
        problems.append(f"type is {actual!r}, expected {kind!r}")
    kind = kind or actual
    for node in root.iter(q(RSPEC3, "node")):
        if kind in ("request", "manifest") and not node.get("client_id"):
            problems.append(f"line {node.sourceline}: a {kind} <node> needs a client_id")
        if kind == "advertisement" and not node.get("component_id"):
            problems.append(f"line {node.sourceline}: an advertised <node> needs a component_id")
    for link in root.iter(q(RSPEC3, "link")):
        if kind in ("request", "manifest") and not link.get("client_id"):
            problems.append(f"line {link.sourceline}: a {kind} <link> needs a client_id")
    return problems
