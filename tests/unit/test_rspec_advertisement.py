"""Advertisements: layout, live availability, stitching with free VLANs, and the cache."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from lxml import etree

from protocol.slice_manager import ALLOWED_ACTIONS
from rspec.advertisement import AdvertisementCache, Usage, build_advertisement, format_ranges, host_available
from rspec.namespaces import CAPACITY, OPSTATE, QINQ, RSPEC3, SHARED_VLAN_GENI, STITCH2
from rspec.substrate import default_substrate, load_substrate, parse_range
from rspec.validate import validate_rspec
from slicex.clock import parse_time
from tests.unit.test_ndl import substrates

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "two-rack-site.yaml"
NOW = datetime(2030, 1, 1, tzinfo=UTC)


def _root(ad: str) -> etree._Element:
    return etree.fromstring(ad.encode())


def _node(root: etree._Element, name: str) -> etree._Element:
    return next(n for n in root.iter(f"{{{RSPEC3}}}node") if n.get("component_name") == name)


def _l2sc(root: etree._Element, tag: str) -> str:
    return root.find(f".//{{{STITCH2}}}switchingCapabilitySpecificInfo_L2sc/{{{STITCH2}}}{tag}").text


def test_ad_is_valid_and_dated():
    ad = build_advertisement(load_substrate(EXAMPLE), Usage(), NOW)
    assert validate_rspec(ad, "advertisement") == []
    root = _root(ad)
    assert parse_time(root.get("generated")) == NOW and parse_time(root.get("expires")) == NOW + timedelta(hours=1)


def test_hosts_carry_sliver_types_images_and_interfaces():
    sub = load_substrate(EXAMPLE)
    root = _root(build_advertisement(sub, Usage(), NOW))
    vm_host, bare = _node(root, "host-a1"), _node(root, "bm-a1")
    assert vm_host.get("exclusive") == "false" and bare.get("exclusive") == "true"
    assert [s.get("name") for s in vm_host.findall(f"{{{RSPEC3}}}sliver_type")] == ["small", "medium", "large"]
    assert [s.get("name") for s in bare.findall(f"{{{RSPEC3}}}sliver_type")] == ["raw-pc"]
    images = bare.findall(f"{{{RSPEC3}}}sliver_type/{{{RSPEC3}}}disk_image")
    assert [(i.get("name"), i.get("default")) for i in images] == [
        ("urn:publicid:IDN+example.edu+image+ubuntu-22.04", "true"),
        ("urn:publicid:IDN+example.edu+image+rocky-9", "false")]
    iface = vm_host.find(f"{{{RSPEC3}}}interface")
    assert (iface.get("component_id"), iface.get("role")) == (sub.hosts[0].interfaces[0].component_id, "experimental")
    loc = vm_host.find(f"{{{RSPEC3}}}location")
    assert (loc.get("country"), loc.get("latitude")) == ("US", "35.9049")


def test_opstate_describes_the_state_machine_the_aggregate_implements():
    root = _root(build_advertisement(default_substrate(), Usage(), NOW))
    op = root.find(f"{{{OPSTATE}}}rspec_opstate")
    assert op.get("start") == "geni_notready"
    assert op.get("aggregate_manager_id") == default_substrate().component_manager_id
    advertised = {(a.get("name"), s.get("name")) for s in op.iter(f"{{{OPSTATE}}}state")
                  for a in s.findall(f"{{{OPSTATE}}}action")}
    implemented = {(action, state) for action, states in ALLOWED_ACTIONS.items() for state in states}
    assert advertised == implemented
    waits = {(s.get("name"), w.get("type"), w.get("next")) for s in op.iter(f"{{{OPSTATE}}}state")
             for w in s.findall(f"{{{OPSTATE}}}wait")}
    assert ("geni_configuring", "geni_success", "geni_ready") in waits
    assert ("geni_configuring", "geni_failure", "geni_failed") in waits
    assert {t.get("name") for t in op.findall(f"{{{OPSTATE}}}sliver_type")} == {
        "raw-pc", "default-vm", "m1.small", "m1.medium", "m1.large"}


def test_availability_follows_usage():
    sub = default_substrate("t.org")
    pc1, bm1 = sub.host("pc1"), sub.host("bm1")
    full = Usage(cores={pc1.component_id: pc1.cores}, taken=frozenset({bm1.component_id}))
    nearly = Usage(cores={pc1.component_id: pc1.cores - 1}, memory_mb={pc1.component_id: pc1.memory_mb - 1024})
    for usage, expected in ((Usage(), "true"), (full, "false"), (nearly, "true")):
        root = _root(build_advertisement(sub, usage, NOW))
        assert _node(root, "pc1").find(f"{{{RSPEC3}}}available").get("now") == expected
    root = _root(build_advertisement(sub, full, NOW))
    assert _node(root, "bm1").find(f"{{{RSPEC3}}}available").get("now") == "false"
    assert _node(root, "pc2").find(f"{{{RSPEC3}}}available").get("now") == "true"


def test_available_only_leaves_out_used_nodes_and_their_links():
    sub = default_substrate("t.org")
    bm1 = sub.host("bm1")
    ad = build_advertisement(sub, Usage(taken=frozenset({bm1.component_id})), NOW, available_only=True)
    assert validate_rspec(ad, "advertisement") == []
    assert bm1.component_id not in ad and bm1.interfaces[0].component_id not in ad
    assert sub.host("bm2").component_id in ad


def test_stitching_offers_the_external_vlans_not_in_use():
    sub = load_substrate(EXAMPLE)
    ext = sub.external_links[0]
    usage = Usage(vlans={ext.component_id: frozenset({3100, 3101}), ext.switch_id: frozenset({3150}),
                         ext.local_port: frozenset({3199})}, bandwidth_kbps={ext.component_id: 4_000_000})
    ad = build_advertisement(sub, usage, NOW, am_url="https://am.example.edu:8001/")
    assert validate_rspec(ad, "advertisement") == []
    root = _root(ad)
    assert _l2sc(root, "vlanRangeAvailability") == "3102-3149,3151-3198"
    assert _l2sc(root, "vlanTranslation") == "false" and _l2sc(root, "interfaceMTU") == "9000"
    tunneling = root.find(f".//{{{QINQ}}}tunneling")
    assert (tunneling.get("tpid"), tunneling.get("sTagRange")) == ("0x88a8", "3100-3199")
    agg = root.find(f"{{{STITCH2}}}stitching/{{{STITCH2}}}aggregate")
    assert (agg.get("id"), agg.get("url")) == (sub.component_manager_id, "https://am.example.edu:8001/")
    node = agg.find(f"{{{STITCH2}}}node")
    port = node.find(f"{{{STITCH2}}}port")
    link = port.find(f"{{{STITCH2}}}link")
    assert node.get("id") == "urn:publicid:IDN+example.edu+node+tor-a"
    assert port.get("id") == "urn:publicid:IDN+example.edu+stitchport+tor-a:uplink"
    assert link.get("id") == ext.local_port
    assert link.findtext(f"{{{STITCH2}}}remoteLinkId") == ext.remote_port
    assert link.findtext(f"{{{STITCH2}}}maximumReservableCapacity") == "6000000"
    ref = root.find(f"{{{RSPEC3}}}external_ref")
    assert (ref.get("component_id"), ref.get("component_manager_id")) == (ext.remote_port, ext.remote_aggregate)
    core = next(lk for lk in root.findall(f"{{{RSPEC3}}}link") if lk.get("component_id") == ext.component_id)
    assert [c.get("name") for c in core.findall(f"{{{RSPEC3}}}component_manager")] == [
        sub.component_manager_id, ext.remote_aggregate]


def test_without_qinq_or_external_links_there_is_no_tunneling_or_stitching():
    sub = load_substrate(EXAMPLE)
    no_qinq = replace(sub, external_links=(replace(sub.external_links[0], qinq=False),))
    assert f"{{{QINQ}}}" not in etree.tostring(_root(build_advertisement(no_qinq, Usage(), NOW))).decode()
    assert "stitching" not in build_advertisement(default_substrate(), Usage(), NOW)


def test_shared_and_static_vlans_are_listed():
    root = _root(build_advertisement(load_substrate(EXAMPLE), Usage(), NOW))
    shared = root.find(f"{{{SHARED_VLAN_GENI}}}rspec_shared_vlan")
    assert [a.get("name") for a in shared.findall(f"{{{SHARED_VLAN_GENI}}}available")] == ["campus-research"]
    statics = _node(root, "tor-a").findall(f"{{{CAPACITY}}}static_vlan")
    assert [(s.get("name"), s.get("tag"), s.get("shared")) for s in statics] == [
        ("mgmt-a", "10", "false"), ("campus-research", "2001", "true")]


def test_switch_vlans_show_the_range_and_what_is_free():
    sub = default_substrate("t.org")
    sw = sub.switches[0]
    vlans = _node(_root(build_advertisement(sub, Usage(vlans={sw.component_id: frozenset({1000, 1050})}), NOW)),
                  "sw1").find(f"{{{CAPACITY}}}vlans")
    assert (vlans.get("ranges"), vlans.get("available")) == ("1000-1099", "1001-1049,1051-1099")


@given(st.lists(st.tuples(st.integers(1, 4094), st.integers(0, 40)), min_size=1, max_size=4),
       st.frozensets(st.integers(1, 4094), max_size=60))
def test_format_ranges_lists_exactly_the_free_tags(spans, used):
    ranges, covered = [], set()
    for lo, width in spans:
        hi = min(4094, lo + width)
        if covered.isdisjoint(range(lo, hi + 1)):
            ranges.append((lo, hi))
            covered |= set(range(lo, hi + 1))
    text = format_ranges(ranges, used)
    listed = set()
    for part in filter(None, text.split(",")):
        lo, hi = parse_range(part)
        assert lo <= hi and listed.isdisjoint(range(lo, hi + 1))
        listed |= set(range(lo, hi + 1))
    assert listed == covered - used


def test_cache_reuses_documents_until_usage_or_substrate_changes():
    sub = default_substrate("t.org")
    cache = AdvertisementCache()
    first = cache.get(sub, Usage(), NOW)
    assert cache.get(sub, Usage(cores={}), NOW + timedelta(seconds=1)) is first  # equal usage: same document
    available = cache.get(sub, Usage(), NOW, available_only=True)
    assert available is not first and cache.get(sub, Usage(), NOW) is first  # both variants kept
    bm = sub.host("bm1").component_id
    changed = cache.get(sub, Usage(taken=frozenset({bm})), NOW)
    assert changed is not first and 'now="false"' in changed
    assert cache.get(sub, Usage(), NOW) is not first  # the old usage was dropped
    other = default_substrate("t.org")  # equal, but a new object: a reload
    assert cache.get(other, Usage(), NOW) is not cache.get(sub, Usage(), NOW)
    kept = cache.get(sub, Usage(), NOW)
    cache.invalidate()
    assert cache.get(sub, Usage(), NOW) is not kept
    assert cache.get(sub, Usage(), NOW + cache.ttl) is not cache.get(sub, Usage(), NOW)  # too old
    assert cache.hits >= 3 and cache.misses >= 6


def test_the_same_usage_object_again_is_not_keyed_again():
    """The deployment passes the one Usage it counted per broker answer: its key (every host sorted) is computed
    once, and an equal usage in a new object still finds the same document."""
    keyed: list[int] = []

    class Counted(Usage):
        def key(self) -> tuple:
            keyed.append(1)
            return super().key()

    sub = default_substrate("t.org")
    cache = AdvertisementCache()
    usage = Counted(cores={sub.hosts[0].component_id: 1})
    first = cache.get(sub, usage, NOW)
    for k in range(1, 5):
        assert cache.get(sub, usage, NOW + timedelta(seconds=k)) is first
    assert len(keyed) == 1
    again = Counted(cores={sub.hosts[0].component_id: 1})
    assert cache.get(sub, again, NOW) is first and len(keyed) == 2


def test_an_empty_vlan_usage_entry_does_not_change_the_key():
    assert Usage(vlans={"x": frozenset()}).key() == Usage().key()


@settings(max_examples=25, deadline=None)
@given(substrates(), st.data())
def test_any_usage_gives_a_valid_ad_with_consistent_flags(sub, data):
    """Random usage over generated substrates: the ad stays valid, each node's flag is what host_available says,
    and each external port offers exactly its range minus the tags in use."""
    hosts = {h.component_id: h for h in sub.hosts}
    used = data.draw(st.lists(st.sampled_from(sorted(hosts)), unique=True))
    vlans = {e.component_id: frozenset(data.draw(st.lists(st.integers(3000, 3020), max_size=5)))
             for e in sub.external_links}
    usage = Usage(cores={c: data.draw(st.integers(0, hosts[c].cores)) for c in used},
                  memory_mb={c: data.draw(st.integers(0, hosts[c].memory_mb)) for c in used},
                  taken=frozenset(c for c in used if hosts[c].exclusive), vlans=vlans)
    ad = build_advertisement(sub, usage, NOW)
    assert validate_rspec(ad, "advertisement") == []
    root = _root(ad)
    for h in sub.hosts:
        flag = _node(root, h.name).find(f"{{{RSPEC3}}}available").get("now")
        assert flag == ("true" if host_available(h, sub, usage) else "false")
    for e in sub.external_links:
        offered = set()
        for part in filter(None, _l2sc(root, "vlanRangeAvailability").split(",")):
            lo, hi = parse_range(part)
            offered |= set(range(lo, hi + 1))
        assert offered == {t for lo, hi in e.vlan_range for t in range(lo, hi + 1)} - vlans[e.component_id]
