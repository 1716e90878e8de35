"""Numeric attributes of request RSpecs are bounded: whatever text an attacker puts in one, the parser
answers with a GeniError (BADARGS saying the attribute and its range) or a number inside the range."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lxml import etree

from rspec.namespaces import RSPEC3
from rspec.request import MAX_CAPACITY_KBPS, MAX_LATENCY_MS, parse_request
from slicex.errors import BadArgs, GeniError
from tests.factories import request_rspec, vm

FPGA = "http://slicex.dev/rspec/ext/fpga/1"


def _linked(link_attrs: dict[str, str] | None = None, prop: dict[str, str] | None = None,
            fpga: dict[str, str] | None = None) -> str:
    """Two nodes on a link; the link, its property and a node's FPGA sliver carry the attributes given."""
    doc = etree.fromstring(request_rspec([vm("a", ifaces=["a:0"]), vm("b", ifaces=["b:0"])],
                                         [{"client_id": "l", "ifaces": ["a:0", "b:0"]}]).encode())
    link = doc.find(f"{{{RSPEC3}}}link")
    for k, v in (link_attrs or {}).items():
        link.set(k, v)
    if prop is not None:
        p = etree.SubElement(link, f"{{{RSPEC3}}}property", source_id="a:0", dest_id="b:0")
        for k, v in prop.items():
            p.set(k, v)
    if fpga is not None:
        el = etree.SubElement(doc.find(f"{{{RSPEC3}}}node"), f"{{{FPGA}}}sliver", type="virtual-router")
        for k, v in fpga.items():
            el.set(k, v)
    return etree.tostring(doc, encoding="unicode")


@pytest.mark.parametrize("attr", ["capacity", "latency", "packet_loss"])
@pytest.mark.parametrize("value", ["1e999", "-1e999", "nan", "NaN", "inf", "-inf", "-1", "1e300", "9" * 400,
                                   "12abc", "0x10"])
def test_out_of_range_link_properties_are_badargs_naming_the_attribute(attr, value):
    with pytest.raises(BadArgs) as err:
        parse_request(_linked(prop={attr: value}))
    assert f"link l {attr}" in err.value.message
    assert "range" in err.value.message or "not a number" in err.value.message


@pytest.mark.parametrize("value", ["0", "4095", "1e999", "nan", "100.5", "-3"])
def test_bad_vlan_tags_are_badargs(value):
    with pytest.raises(BadArgs, match="vlantag"):
        parse_request(_linked(link_attrs={"vlantag": value}))


def test_numbers_in_range_are_kept():
    req = parse_request(_linked(link_attrs={"vlantag": "100"},
                                prop={"capacity": "1e6", "latency": "20", "packet_loss": "0.01"}))
    lk = req.links[0]
    assert (lk.capacity_kbps, lk.latency_ms, lk.packet_loss, lk.vlan_tag) == (1_000_000, 20, 0.01, 100)


_NUMERIC = {("prop", "capacity"), ("prop", "latency"), ("prop", "packet_loss"), ("link", "vlantag"),
            ("fpga", "bandwidth_mbps"), ("fpga", "table_size")}
_xml_text = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=80)
_numberish = st.one_of(
    _xml_text,
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.sampled_from(["1e999", "-0", "+5", "1_000", " 7 ", "٣", "1e-400", "0.5e1", "infinity", "NAN"]),
)


@settings(max_examples=300, deadline=None)
@given(where=st.sampled_from(sorted(_NUMERIC)), value=_numberish)
def test_mutated_numeric_attributes_never_raise_anything_but_geni_errors(where, value):
    place, attr = where
    doc = _linked(link_attrs={attr: value} if place == "link" else None,
                  prop={attr: value} if place == "prop" else None,
                  fpga={attr: value} if place == "fpga" else None)
    try:
        req = parse_request(doc)
    except GeniError:
        return
    lk = req.links[0]
    for number, high in ((lk.capacity_kbps, MAX_CAPACITY_KBPS), (lk.latency_ms, MAX_LATENCY_MS),
                         (lk.packet_loss, 1), (lk.vlan_tag, 4094)):
        assert number is None or (math.isfinite(number) and 0 <= number <= high)
