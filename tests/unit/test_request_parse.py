import pytest

from rspec.request import parse_request
from slicex.errors import BadArgs, BadVersion, TooBig
from tests.factories import request_rspec, vm

BOMB = """<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">]>
<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request"><node client_id="&lol3;"/></rspec>"""
XXE = """<?xml version="1.0"?>
<!DOCTYPE r [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>
<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request"><node client_id="&xxe;"/></rspec>"""


def test_parses_nodes_links_and_interfaces():
    req = parse_request(request_rspec([vm("a", ifaces=["a:0"], image="urn:x+image+y"), vm("b", ifaces=["b:0"])],
                                      [{"client_id": "l", "ifaces": ["a:0", "b:0"], "capacity": 1000}]))
    assert [n.client_id for n in req.nodes] == ["a", "b"]
    assert req.nodes[0].disk_image == "urn:x+image+y"
    assert req.links[0].interface_refs == ("a:0", "b:0")
    assert req.links[0].capacity_kbps == 1000


@pytest.mark.parametrize("doc,err,reason", [
    ("<rspec", BadArgs, "not well-formed"),
    (BOMB, BadArgs, "DOCTYPE"),
    (XXE, BadArgs, "DOCTYPE"),
    (request_rspec([vm("a")], kind="advertisement"), BadArgs, "not a request"),
    (request_rspec([vm("a")], kind="manifest"), BadArgs, "not a request"),
    ('<rspec xmlns="http://www.protogeni.net/resources/rspec/2" type="request"/>', BadVersion, "ProtoGENI"),
    ('<rspec xmlns="urn:other" type="request"/>', BadVersion, "not GENI"),
    (request_rspec([vm("a"), vm("a")]), BadArgs, "used twice"),
    (request_rspec([vm("a")], [{"client_id": "l", "ifaces": ["zz"]}]), BadArgs, "no node declares"),
    ("", BadArgs, "empty"),
])
def test_bad_requests_are_refused_with_a_reason(doc, err, reason):
    with pytest.raises(err, match=reason):
        parse_request(doc)


def test_oversize_request_is_too_big():
    with pytest.raises(TooBig):
        parse_request(request_rspec([vm("a")], extra="<!--" + "x" * 3_000_000 + "-->"))


def test_for_aggregate_keeps_only_our_nodes():
    ours = "urn:publicid:IDN+here+authority+am"
    req = parse_request(request_rspec([{"client_id": "a", "component_manager_id": ours},
                                       {"client_id": "b", "component_manager_id": "urn:publicid:IDN+there+authority+am"},
                                       {"client_id": "c"}]))
    assert [n.client_id for n in req.for_aggregate(ours).nodes] == ["a", "c"]


def test_schema_invalid_request_names_the_line_and_problem():
    doc = ('<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">\n'
           '<node client_id="a"><sliver_type/></node></rspec>')
    with pytest.raises(BadArgs, match="line 2.*name"):
        parse_request(doc)
