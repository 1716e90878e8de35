"""The operator's substrate file, its NDL-OWL graph, and the advertisement round trip."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rdflib.compare import isomorphic

from am.embed import plan
from rspec.advertisement import AdvertisementCache, Usage, build_advertisement
from rspec.ndl import REQ, advertisement_graph, request_graph, substrate_graph
from rspec.request import parse_request
from rspec.substrate import SubstrateError, default_substrate, load_substrate, substrate_from_dict
from rspec.validate import validate_rspec
from slicex.errors import VlanUnavailable
from tests.factories import request_rspec, three_node_lan, vm

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "two-rack-site.yaml"
NOW = datetime(2030, 1, 1, tzinfo=UTC)


def test_worked_example_loads_and_yields_a_valid_ad():
    sub = load_substrate(EXAMPLE)
    assert [h.name for h in sub.hosts] == ["host-a1", "host-a2", "bm-a1", "host-b1", "host-b2"]
    assert sub.external_links[0].qinq
    assert validate_rspec(build_advertisement(sub, Usage(), NOW), "advertisement") == []


@pytest.mark.parametrize("text,where,fix", [
    ("authority: x\nhosts:\n  - name: a\n    corez: 4\n", ":3:", "did you mean 'cores'"),
    ("authority: x\nhosts:\n  - name: a\n    cores: -1\n", ":3:", "whole number"),
    ("authority: x\nhosts: []\n", ":1:", "at least one"),
    ("authority: x\nswitches:\n  - name: s\n    vlan_range: [5000-6000]\nhosts:\n  - name: a\n", ":3:", "1-4094"),
    ("authority: x\nhosts:\n  - name: a\n    interfaces:\n      - {name: e, switch_port: 'sw:p'}\n", ":5:", "SWITCH:PORT"),
    ("authority: x\nhosts:\n  - name: a\n  - name: a\n", ":4:", "own name"),
    ("authority: x\nhosts: [\n", ":", "syntax"),
])
def test_substrate_mistakes_name_file_line_and_fix(tmp_path, text, where, fix):
    f = tmp_path / "site.yaml"
    f.write_text(text)
    with pytest.raises(SubstrateError) as err:
        load_substrate(f)
    assert str(f) + where in str(err.value) and fix in str(err.value)


def test_ndl_advertisement_round_trip_is_isomorphic_for_the_example():
    sub = load_substrate(EXAMPLE)
    assert isomorphic(substrate_graph(sub), advertisement_graph(build_advertisement(sub, Usage(), NOW)))


names = st.from_regex(r"\A[a-z][a-z0-9]{0,6}\Z")


@st.composite
def substrates(draw):
    nsw = draw(st.integers(1, 2))
    switches = []
    for s in range(nsw):
        lo = draw(st.integers(1, 4000))
        switches.append({"name": f"sw{s}", "vlan_range": [f"{lo}-{lo + draw(st.integers(0, 90))}"],
                         "ports": [{"name": f"p{i}"} for i in range(4)]})
    hosts = []
    for i, name in enumerate(draw(st.lists(names, min_size=1, max_size=4, unique=True))):
        hosts.append({"name": name, "cores": draw(st.integers(1, 64)), "memory_mb": draw(st.integers(512, 65536)),
                      "exclusive": draw(st.booleans()),
                      "interfaces": [{"name": "eth0", "bandwidth_kbps": draw(st.integers(1000, 10**7)),
                                      "switch_port": f"sw{i % nsw}:p{i}"}]})
    doc = {"authority": draw(names) + ".org", "switches": switches, "hosts": hosts}
    if draw(st.booleans()):
        doc["external_links"] = [{"name": "ext", "switch": "sw0", "port": "p3",
                                  "remote_aggregate": "urn:publicid:IDN+peer.org+authority+am",
                                  "remote_port": "urn:publicid:IDN+peer.org+interface+x:y",
                                  "vlan_range": ["3000-3010"], "vlan_translation": draw(st.booleans()),
                                  "qinq": draw(st.booleans())}]
    return substrate_from_dict(doc)


@settings(max_examples=30, deadline=None)
@given(substrates())
def test_ndl_to_ad_to_ndl_is_isomorphic(sub):
    ad = build_advertisement(sub, Usage(), NOW)
    assert validate_rspec(ad, "advertisement") == []
    assert isomorphic(substrate_graph(sub), advertisement_graph(ad))


def test_request_graph_links_depend_on_their_nodes():
    g = request_graph(parse_request(three_node_lan()), "urn:publicid:IDN+x+slice+s")
    deps = {str(o).rsplit("#", 1)[1] for o in g.objects(None, REQ.dependOn)}
    assert deps == {"n1", "n2", "n3"}


def test_cross_rack_link_without_a_common_tag_is_vlan_unavailable():
    sub = load_substrate(EXAMPLE)
    a = {"client_id": "a", "component_id": sub.hosts[0].component_id, "sliver_type": "small", "ifaces": ["a:0"]}
    b = {"client_id": "b", "component_id": sub.hosts[3].component_id, "sliver_type": "small", "ifaces": ["b:0"]}
    req = parse_request(request_rspec([a, b], [{"client_id": "l", "ifaces": ["a:0", "b:0"]}]))
    with pytest.raises(VlanUnavailable, match="tor-a .*tor-b.*no tag is in every range"):
        plan(sub, req, set())


def test_live_availability_and_cache_invalidation():
    sub = default_substrate("t.org")
    cache = AdvertisementCache()
    first = cache.get(sub, Usage(), NOW)
    assert cache.get(sub, Usage(), NOW) is first
    bm = next(h for h in sub.hosts if h.exclusive).component_id
    taken = cache.get(sub, Usage(taken=frozenset({bm})), NOW)
    assert taken is not first and 'now="false"' in taken
    only_free = build_advertisement(sub, Usage(taken=frozenset({bm})), NOW, available_only=True)
    assert bm not in only_free


def test_manifest_keeps_every_client_id():
    from rspec.manifest import SliverView, build_manifest

    req = parse_request(request_rspec([vm("a", ifaces=["a:0"]), vm("b", ifaces=["b:0"])],
                                      [{"client_id": "l", "ifaces": ["a:0", "b:0"]}]))
    sub = default_substrate("t.org")
    views = [SliverView(p.client_id, f"urn:publicid:IDN+t.org+sliver+{p.client_id}", p.kind, p.component_id,
                        p.details) for p in plan(sub, req, set())]
    manifest = build_manifest([req.xml], views, sub.component_manager_id, NOW)
    assert validate_rspec(manifest, "manifest") == []
    for cid in ("a", "b", "l", "a:0", "b:0"):
        assert f'client_id="{cid}"' in manifest
