"""The operator's substrate file: the worked example, mistakes reported with file, line and fix, warnings,
and the `slicex substrate check|ad|ndl` commands."""

from __future__ import annotations

import argparse
import base64
import zlib
from dataclasses import replace
from pathlib import Path

import pytest

from broker.placement import dry_run, plan
from cli.substrate import add_substrate_commands
from rspec.request import parse_request
from rspec.substrate import (
    SubstrateError,
    check_substrate,
    default_substrate,
    load_substrate,
    substrate_from_dict,
)
from slicex.errors import VlanUnavailable
from tests.factories import request_rspec

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "two-rack-site.yaml"
HOST = "hosts:\n  - name: a\n"


def test_worked_example_loads_as_the_guide_describes_it():
    sub = load_substrate(EXAMPLE)
    assert [h.name for h in sub.hosts] == ["host-a1", "host-a2", "bm-a1", "host-b1", "host-b2"]
    assert [s.name for s in sub.sites] == ["rack-a", "rack-b"]
    assert sub.host("host-b2").site == "rack-b" and sub.host("bm-a1").exclusive
    assert sub.host("host-a2").interfaces[0].switch_port == "urn:publicid:IDN+example.edu+interface+tor-a:host-a2"
    assert sub.trunks[0].port_b == "urn:publicid:IDN+example.edu+interface+tor-b:trunk-a"
    ext = sub.external_links[0]
    assert (ext.qinq, ext.vlan_translation, ext.vlan_range, ext.switch_id) == (
        True, False, ((3100, 3199),), "urn:publicid:IDN+example.edu+node+tor-a")
    assert ext.remote_aggregate_url == "https://am.transit.example.net:12346/"
    assert [v.name for v in sub.shared_vlans] == ["campus-research"]
    assert check_substrate(sub) == []


@pytest.mark.parametrize("text,where,fix", [
    ("authority: x\nhosts:\n  - name: a\n    corez: 4\n", ":3:", "did you mean 'cores'"),
    ("authority: x\nhosts:\n  - name: a\n    cores: -1\n", ":3:", "whole number"),
    ("authority: x\nhosts: []\n", ":1:", "at least one"),
    ("authority: x\nhosts: pc1\n", ":1:", "line starting with '- '"),
    ("authority: x\nhosts:\n  - pc1\n", ":1:", "key: value pairs"),
    ("authority: x\nhosts:\n  - name: a\n    exclusive: maybe\n", ":3:", "true or false"),
    ("authority: x\nhosts:\n  - name: a b\n", ":3:", "letters, digits"),
    ("authority: urn:publicid:IDN+x+authority+am\n" + HOST, ":1:", "bare name"),
    ("authority: x\nswitches:\n  - name: s\n    vlan_range: [5000-6000]\n" + HOST, ":3:", "1-4094"),
    ("authority: x\nswitches:\n  - name: s\n    vlan_range: [10-20, 15-30]\n" + HOST, ":3:", "each tag once"),
    ("authority: x\nswitches:\n  - name: s\n  - name: s\n" + HOST, ":4:", "own name"),
    ("authority: x\nhosts:\n  - name: a\n    interfaces:\n      - {name: e, switch_port: 'sw:p'}\n", ":5:",
     "SWITCH:PORT"),
    ("authority: x\nswitches:\n  - {name: s, ports: [{name: p}]}\nhosts:\n  - name: a\n    interfaces:\n"
     "      - {name: e, switch_port: 's:p'}\n  - name: b\n    interfaces:\n      - {name: e, switch_port: 's:p'}\n",
     ":10:", "one interface"),
    ("authority: x\nhosts:\n  - name: a\n  - name: a\n", ":4:", "own name"),
    ("authority: x\nsites:\n  - {name: r1}\nhosts:\n  - {name: a, site: r2}\n", ":5:", "use one of r1"),
    ("authority: x\nsites:\n  - {name: r1, latitude: 10, longitude: 20}\n" + HOST, ":3:", "country"),
    ("authority: x\nswitches:\n  - {name: s, ports: [{name: p}, {name: q}]}\ntrunks:\n"
     "  - {name: t, between: ['s:p', 's:q']}\n" + HOST, ":5:", "joins two switches"),
    ("authority: x\nswitches:\n  - {name: s, vlan_range: [100-200]}\nstatic_vlans:\n"
     "  - {name: v, tag: 150, switch: s}\n" + HOST, ":5:", "outside the range"),
    ("authority: x\nswitches:\n  - {name: s, ports: [{name: up}]}\nexternal_links:\n"
     "  - {name: e, switch: s, port: up, remote_aggregate: 'peer', remote_port: 'urn:publicid:IDN+p+interface+x'}\n"
     + HOST, ":5:", "urn:publicid:IDN+<authority>"),
    ("authority: x\nswitches:\n  - {name: s, ports: [{name: up}]}\nexternal_links:\n"
     "  - {name: e, switch: s, port: up, remote_aggregate: 'urn:publicid:IDN+x+authority+am',"
     " remote_port: 'urn:publicid:IDN+p+interface+x'}\n" + HOST, ":5:", "other end"),
    ("authority: x\nhosts: [\n", ":", "syntax"),
    ("authority: x\nvm_sizes:\n  - {name: big, machine: xen}\n" + HOST, ":3:", "machine: qemu"),
])
def test_substrate_mistakes_name_file_line_and_fix(tmp_path, text, where, fix):
    f = tmp_path / "site.yaml"
    f.write_text(text)
    with pytest.raises(SubstrateError) as err:
        load_substrate(f)
    assert str(f) + where in str(err.value) and "fix: " in str(err.value) and fix in str(err.value)


def test_a_missing_file_says_so(tmp_path):
    with pytest.raises(SubstrateError, match="cannot read substrate file.*fix: check the path"):
        load_substrate(tmp_path / "nope.yaml")


def test_warnings_point_at_what_will_surprise_the_operator():
    sub = substrate_from_dict({
        "authority": "w.org",
        "switches": [{"name": "s1", "ports": [{"name": "p1"}, {"name": "spare"}]}, {"name": "s2"}],
        "hosts": [{"name": "a", "cores": 4, "interfaces": [{"name": "e", "switch_port": "s1:p1"}]},
                  {"name": "b", "interfaces": [{"name": "e", "role": "control"}]}],
        "vm_sizes": [{"name": "huge", "cores": 64}]})
    warnings = "\n".join(check_substrate(sub))
    assert "VM size huge (64 cores, 1024 MB) fits on no VM host" in warnings
    assert "host b has no experimental interface" in warnings
    assert "switch s1: port spare cabled to nothing" in warnings
    assert "2 switches and no trunks" in warnings


def test_a_trunk_between_switches_sharing_no_tag_and_unable_to_translate_is_warned_about():
    sub = load_substrate(EXAMPLE)
    assert not [w for w in check_substrate(sub) if w.startswith("trunk ")]
    bare = replace(sub, trunks=tuple(replace(t, translation=(), qinq=()) for t in sub.trunks))
    (warning,) = [w for w in check_substrate(bare) if w.startswith("trunk ")]
    assert "tor-a and tor-b share no tag" in warning and "vlan_translation" in warning


def test_trunk_capabilities_name_its_own_ends():
    base = {"authority": "t.org", "switches": [{"name": "a", "ports": [{"name": "t"}]},
                                                {"name": "b", "ports": [{"name": "t"}]}],
            "hosts": [{"name": "h"}]}
    sub = substrate_from_dict({**base, "trunks": [{"name": "ab", "between": ["a:t", "b:t"], "qinq": ["b:t"],
                                                   "vlan_translation": True, "s_vlan_range": ["3000-3009"]}]})
    (t,) = sub.trunks
    assert t.translation == (t.port_a, t.port_b) and t.qinq == (t.port_b,) and t.s_vlan_range == ((3000, 3009),)
    with pytest.raises(SubstrateError, match="vlan_translation .* is not true, false or a list of its ends"):
        substrate_from_dict({**base, "trunks": [{"name": "ab", "between": ["a:t", "b:t"],
                                                 "vlan_translation": ["c:t"]}]})
    with pytest.raises(SubstrateError, match="s_vlan_range is given but no end does Q-in-Q"):
        substrate_from_dict({**base, "trunks": [{"name": "ab", "between": ["a:t", "b:t"],
                                                 "s_vlan_range": ["3000-3009"]}]})


def test_fpga_boards_pass_through_as_plain_data():
    sub = substrate_from_dict({"authority": "f.org", "hosts": [{"name": "a"}],
                               "fpga_boards": [{"name": "b1", "model": "NetFPGA", "extra": {"k": [1, {"x": 2}]}}]})
    assert sub.fpga_boards == ({"name": "b1", "model": "NetFPGA", "extra": {"k": [1, {"x": 2}]}},)


def test_sites_named_by_hosts_but_not_declared_are_declared_for_them():
    sub = substrate_from_dict({"authority": "s.org", "hosts": [{"name": "a", "site": "room1"}]})
    assert [s.name for s in sub.sites] == ["room1"]
    assert [s.name for s in default_substrate().all_sites] == ["rack1"]


def _cross_rack_request(sub):
    a = {"client_id": "a", "component_id": sub.hosts[0].component_id, "sliver_type": "small", "ifaces": ["a:0"]}
    b = {"client_id": "b", "component_id": sub.hosts[3].component_id, "sliver_type": "small", "ifaces": ["b:0"]}
    return parse_request(request_rspec([a, b], [{"client_id": "l", "ifaces": ["a:0", "b:0"]}]))


def test_cross_rack_link_of_the_example_is_translated_at_rack_a_trunk_port():
    sub = load_substrate(EXAMPLE)
    link = [p for p in plan(sub, _cross_rack_request(sub), set()) if p.kind == "link"][0]
    assert link.details["rack_path"] == "translated"
    tags = {urn.rsplit("+", 1)[1]: t for urn, t in link.details["switch_tags"].items()}
    assert 1000 <= tags["tor-a"] <= 1499 and 1500 <= tags["tor-b"] <= 1999
    # two tags: the ticket's label is rack A's (the link's key), rack B's tag and the trunk's are units
    assert link.labels == {f"vlan:{sub.switches[0].component_id}": tags["tor-a"]}
    assert f"vlan:{sub.switches[1].component_id}:{tags['tor-b']}" in link.keys


def test_cross_rack_link_without_translation_or_qinq_is_vlan_unavailable_naming_racks_ranges_and_ports():
    sub = load_substrate(EXAMPLE)
    sub = replace(sub, trunks=tuple(replace(t, translation=(), qinq=()) for t in sub.trunks))
    with pytest.raises(VlanUnavailable, match=r"rack rack-a \(switch tor-a, VLANs 1000-1499\) and rack rack-b "
                                              r"\(switch tor-b, VLANs 1500-1999\).*without VLAN translation: "
                                              r"tor-a:trunk-b, tor-b:trunk-a; without Q-in-Q: tor-a:trunk-b"):
        plan(sub, _cross_rack_request(sub), set())
    report = dry_run(sub, _cross_rack_request(sub), set())  # a dry run says the same, with what is short
    (short,) = report["short"]
    assert not report["fits"] and short["geni_code"] == 24 and "rack rack-a" in short["reason"]
    assert {(n["switch"], n["available"]) for n in short["needs"]} == {("tor-a", 0), ("tor-b", 0)}


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    add_substrate_commands(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_check_accepts_the_example_and_summarises_it(capsys):
    assert _cli(["substrate", "check", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "OK — authority example.edu" in out and "bare metal   1" in out
    assert "shared: campus-research (tag 2001)" in out and "to-transit → urn:publicid:IDN+transit" in out


def test_cli_check_reports_a_mistake_and_fails(tmp_path, capsys):
    f = tmp_path / "bad.yaml"
    f.write_text("authority: x\nhosts:\n  - name: a\n    corez: 4\n")
    assert _cli(["substrate", "check", str(f)]) == 1
    assert f"error: {f}:3: unknown key 'corez' in host; fix: did you mean 'cores'?" in capsys.readouterr().err


def test_cli_ad_prints_the_advertisement_plain_or_compressed(capsys):
    assert _cli(["substrate", "ad", str(EXAMPLE), "--am-url", "https://am.example.edu/"]) == 0
    plain = capsys.readouterr().out
    assert 'type="advertisement"' in plain and 'url="https://am.example.edu/"' in plain
    assert _cli(["substrate", "ad", str(EXAMPLE), "--compressed"]) == 0
    text = zlib.decompress(base64.b64decode(capsys.readouterr().out)).decode()
    assert 'type="advertisement"' in text and "stitching" in text


def test_cli_ndl_output_loads_back_as_the_same_substrate(tmp_path, capsys):
    for fmt, suffix in (("turtle", ".ttl"), ("xml", ".rdf"), ("nt", ".nt")):
        assert _cli(["substrate", "ndl", str(EXAMPLE), "--format", fmt]) == 0
        f = tmp_path / f"site{suffix}"
        f.write_text(capsys.readouterr().out)
        again = load_substrate(f)
        original = load_substrate(EXAMPLE)
        assert again.hosts == original.hosts and again.external_links[0].vlan_range == ((3100, 3199),)
        assert _cli(["substrate", "check", str(f)]) == 0
        assert "OK — authority example.edu" in capsys.readouterr().out


def test_an_ndl_file_with_entities_or_bad_syntax_is_refused(tmp_path):
    f = tmp_path / "x.rdf"
    f.write_text('<!DOCTYPE r [<!ENTITY e SYSTEM "file:///etc/passwd">]><rdf:RDF/>')
    with pytest.raises(SubstrateError, match="DOCTYPE or ENTITY"):
        load_substrate(f)
    f = tmp_path / "x.ttl"
    f.write_text("this is not turtle")
    with pytest.raises(SubstrateError, match="not valid Turtle"):
        load_substrate(f)


def test_a_vm_size_may_be_a_qemu_machine(tmp_path):
    f = tmp_path / "site.yaml"
    f.write_text("authority: x\nvm_sizes:\n  - {name: small}\n  - {name: kvm-big, cores: 2, memory_mb: 2048, "
                 "machine: qemu}\n" + HOST)
    sizes = {s.name: s.machine for s in load_substrate(f).vm_sizes}
    assert sizes == {"small": "container", "kvm-big": "qemu"}


def test_a_host_is_found_by_component_id_in_any_case_or_by_name_the_first_in_order_winning():
    """Substrate.host answers from an index built once (issue 33), as the walk it replaced did: the first host
    whose component id (any case) or name matches."""
    from dataclasses import replace

    from rspec.substrate import Host, default_substrate

    base = default_substrate("t.org")
    hosts = (Host("a", "urn:publicid:IDN+t.org+node+x", 1, 1024), Host("x", "urn:publicid:IDN+t.org+node+a", 1, 1024),
             Host("a", "urn:publicid:IDN+t.org+node+y", 1, 1024))
    sub = replace(base, hosts=hosts)
    assert sub.host("a") is hosts[0] and sub.host("x") is hosts[1]  # by name: the first "a"
    assert sub.host("URN:publicid:IDN+t.org+node+A") is hosts[1] and sub.host("urn:publicid:IDN+t.org+node+y") is hosts[2]
    assert sub.host("b") is None and sub.host("") is None
    assert all(base.host(h.component_id) is h and base.host(h.name) is h for h in base.hosts)
