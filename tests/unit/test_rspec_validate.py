"""slicex's own GENI v3 schemas and the checks around them: what they accept, what they refuse and how they
say so."""

from __future__ import annotations

import threading

import pytest

from rspec.validate import KINDS, schema_for, validate_rspec
from slicex.errors import BadArgs
from tests.factories import RSPEC3, request_rspec, three_node_lan, vm

QINQ = "http://slicex.dev/rspec/ext/qinq/1"
SHARED = "http://www.protogeni.net/resources/rspec/ext/shared-vlan/1"


def _ad(body: str) -> str:
    return f'<rspec xmlns="{RSPEC3}" type="advertisement">{body}</rspec>'


NODE_AD = ('<node component_id="urn:publicid:IDN+x+node+a" component_manager_id="urn:publicid:IDN+x+authority+am" '
           'exclusive="false"><interface component_id="urn:publicid:IDN+x+interface+a:eth0"/></node>')


def test_a_plain_request_is_valid():
    assert validate_rspec(three_node_lan(), "request") == []


def test_schemas_compile_once_per_kind_and_unknown_kinds_are_refused():
    assert all(schema_for(k) is schema_for(k) for k in KINDS)
    with pytest.raises(ValueError, match="kinds are request, advertisement, manifest"):
        schema_for("ticket")


def test_request_node_without_client_id_names_the_line_and_attribute():
    doc = f'<rspec xmlns="{RSPEC3}" type="request">\n<node component_id="urn:publicid:IDN+x+node+a"/>\n</rspec>'
    assert validate_rspec(doc, "request") == ["line 2: Element 'node': The attribute 'client_id' is required but "
                                              "missing."]


def test_a_document_of_another_kind_is_reported():
    problems = validate_rspec(request_rspec([vm("a")], kind="manifest"), "request")
    assert problems == ["line 1: type is 'manifest', expected 'request'"]


def test_an_unknown_type_or_root_is_reported():
    assert "type is 'ticket'" in validate_rspec(f'<rspec xmlns="{RSPEC3}" type="ticket"/>')[0]
    assert "expected {http://www.geni.net/resources/rspec/3}rspec" in validate_rspec("<rspec type='request'/>")[0]


def test_ad_only_elements_are_not_allowed_in_a_request():
    doc = request_rspec([vm("a", extra='<available now="true"/>')])
    assert any("'available': This element is not expected" in p for p in validate_rspec(doc))


def test_client_ids_must_be_unique_in_a_request():
    doc = request_rspec([vm("a", ifaces=["a"])])
    assert any("client_id 'a' is used twice" in p for p in validate_rspec(doc))


def test_a_link_to_an_undeclared_interface_is_reported():
    doc = request_rspec([vm("a", ifaces=["a:0"])], [{"client_id": "l", "ifaces": ["a:0", "ghost:0"]}])
    assert any("refers to interface 'ghost:0', which no node declares" in p for p in validate_rspec(doc))


def test_unknown_extensions_are_allowed_and_known_ones_are_checked():
    foreign = '<x:anything xmlns:x="urn:example:ext" x:attr="1"><x:deep/></x:anything>'
    assert validate_rspec(request_rspec([vm("a", extra=foreign)]), "request") == []
    good = f'<q:qinq xmlns:q="{QINQ}" c_tag="100" s_tag="3100"><q:edge port="p" action="push-pop"/></q:qinq>'
    bad = f'<q:qinq xmlns:q="{QINQ}" c_tag="5000"/>'
    links = [{"client_id": "l", "ifaces": ["a:0", "b:0"]}]
    nodes = [vm("a", ifaces=["a:0"]), vm("b", ifaces=["b:0"])]
    assert validate_rspec(request_rspec(nodes, links).replace("</link>", good + "</link>")) == []
    problems = validate_rspec(request_rspec(nodes, links).replace("</link>", bad + "</link>"))
    assert any("c_tag" in p and "5000" in p for p in problems)
    unnamed = f'<s:link_shared_vlan xmlns:s="{SHARED}"/>'
    problems = validate_rspec(request_rspec(nodes, links).replace("</link>", unnamed + "</link>"))
    assert any("'name' is required" in p for p in problems)


def test_advertised_nodes_need_a_manager_and_exclusivity():
    node = '<node component_id="urn:publicid:IDN+x+node+a"/>'
    problems = " ".join(validate_rspec(_ad(node), "advertisement"))
    assert "component_manager_id" in problems and "exclusive" in problems
    assert validate_rspec(_ad(NODE_AD), "advertisement") == []


def test_an_advertised_link_to_an_unadvertised_local_interface_is_reported():
    link = ('<link component_id="urn:publicid:IDN+x+link+l">'
            '<interface_ref component_id="urn:publicid:IDN+x+interface+a:eth0"/>'
            '<interface_ref component_id="urn:publicid:IDN+x+interface+b:eth0"/></link>')
    problems = validate_rspec(_ad(NODE_AD + link), "advertisement")
    assert problems == ["line 1: link 'urn:publicid:IDN+x+link+l' refers to interface "
                        "'urn:publicid:IDN+x+interface+b:eth0', which no node advertises"]


def test_a_manifest_link_may_name_interfaces_of_other_aggregates():
    doc = request_rspec([vm("a", ifaces=["a:0"])], [{"client_id": "l", "ifaces": ["a:0", "elsewhere:0"]}],
                        kind="manifest")
    assert validate_rspec(doc, "manifest") == []


def test_dtds_are_refused_before_validation():
    with pytest.raises(BadArgs, match="DOCTYPE"):
        validate_rspec('<!DOCTYPE r [<!ENTITY e "x">]><rspec/>')


def test_validation_is_safe_from_several_threads():
    docs = [three_node_lan(), request_rspec([vm("a", ifaces=["a"])])]  # valid, invalid
    results: list[tuple[int, list[str]]] = []

    def work(k: int) -> None:
        for _ in range(20):
            results.append((k % 2, validate_rspec(docs[k % 2])))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all((problems == []) == (k == 0) for k, problems in results) and len(results) == 80
