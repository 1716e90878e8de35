"""The answer to "find a slot" as an RSpec (ListResources with slicex_find_slot): an advertisement whose one
element, `<slot:slot>` in the slicex slot namespace, names the earliest start and end at which the request
fits and where each node and link would go then. An RSpec, because that is what a ListResources answer is to
its clients (omni prints and saves it only when it is one); `read_slot` turns it back into plain data."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from lxml import etree

from rspec.namespaces import AD_XSD, RSPEC3, SLOT, XSI, q
from slicex.clock import parse_time, rfc3339
from slicex.errors import BadArgs

NODE_FIELDS = ("client_id", "host", "site", "sliver_type", "vm_size")
LINK_FIELDS = ("client_id", "switch", "vlan_tag")


def slot_rspec(start: datetime, end: datetime, tried: int, summary: str, nodes: Iterable[Mapping[str, Any]],
               links: Iterable[Mapping[str, Any]], now: datetime) -> str:
    """The slot as an advertisement RSpec: `<slot:slot start end duration_seconds tried>` with a
    `<slot:node>` per node (host, site) and a `<slot:link>` per link (switch, VLAN) as placed over it."""
    root = etree.Element(q(RSPEC3, "rspec"), nsmap={None: RSPEC3, "xsi": XSI, "slot": SLOT})
    root.set("type", "advertisement")
    root.set(q(XSI, "schemaLocation"), f"{RSPEC3} {AD_XSD}")
    root.set("generated", rfc3339(now))
    root.set("expires", rfc3339(start))
    slot = etree.SubElement(root, q(SLOT, "slot"), start=rfc3339(start), end=rfc3339(end),
                            duration_seconds=str(int((end - start).total_seconds())), tried=str(tried))
    slot.set("summary", summary)
    for tag, fields, items in (("node", NODE_FIELDS, nodes), ("link", LINK_FIELDS, links)):
        for item in items:
            etree.SubElement(slot, q(SLOT, tag), {k: str(item[k]) for k in fields if item.get(k) not in (None, "")})
    return etree.tostring(root, encoding="unicode", pretty_print=True)


def read_slot(text: str) -> dict[str, Any]:
    """The slot an answer RSpec names: start and end (datetimes), duration_seconds, tried, summary, nodes and
    links (their attributes); BADARGS when it names none."""
    try:
        root = etree.fromstring(text.encode("utf-8"))
    except etree.XMLSyntaxError as exc:
        raise BadArgs(f"the answer is not XML: {exc}") from None
    slot = root.find(q(SLOT, "slot"))
    if slot is None:
        raise BadArgs("the answer names no slot (no <slot:slot> element)")
    return {"start": parse_time(slot.get("start")), "end": parse_time(slot.get("end")),
            "duration_seconds": int(slot.get("duration_seconds", "0")), "tried": int(slot.get("tried", "0")),
            "summary": slot.get("summary", ""),
            "nodes": [dict(n.attrib) for n in slot.findall(q(SLOT, "node"))],
            "links": [dict(lk.attrib) for lk in slot.findall(q(SLOT, "link"))]}
