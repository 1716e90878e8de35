"""slicex's own multi-aggregate allocation (stitching/client.py) against three `slicex up` aggregates (child
processes, emulated substrate, separate authorities and CAs that trust each other), over mutual TLS: a link
whose ends share no VLAN succeeds through a translating transit, or through Q-in-Q where the transit carries
neither edge's tags, Allocate and Provision at each aggregate, and every manifest says which (the hops'
tags, vlanTranslation, the S-tag and C-tag). A tag another slice holds is refused with 24, everything
allocated is released, and the path service is asked again without that tag; with no retry left the
failure is raised and nothing stays allocated anywhere."""

from __future__ import annotations

import subprocess
import sys
import xmlrpc.client

import pytest
import yaml
from lxml import etree

from slicex.tls_xmlrpc import client
from stitching.client import StitchClient, StitchFailure
from stitching.topology import load_topology
from tests.integration.stitching_support import MODES, Up, make_homes, port, request, slice_credential, urn

STITCH = "{http://www.geni.net/resources/rspec/ext/stitch/2/}"
QINQ = "{http://slicex.dev/rspec/ext/qinq/1}"


@pytest.fixture(scope="module", params=["translated", "qinq"])
def racks(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"sdk-{request.param}")
    # sa's `slicex up` also serves the path service (slicex.yaml scs:) over the topology file below
    homes = make_homes(root, MODES[request.param],
                       scs=lambda name: {"topology": "../topology.yaml", "port": 0} if name == "sa" else None)
    topology = root / "topology.yaml"
    topology.write_text(yaml.safe_dump({"aggregates": [{"substrate": f"{name}.yaml"} for name in homes]}))
    ups = {name: Up(home) for name, home in homes.items()}
    try:
        procs = {name: up.start() for name, up in ups.items()}
        # the AMs' URLs are known now: the path service re-reads the file when it changes
        topology.write_text(yaml.safe_dump({"aggregates": [
            {"substrate": f"{name}.yaml", "url": procs[name]["am_url"]} for name in homes]}))
        alice = homes["sa"]
        cert, key = str(alice.user_cert("alice")), str(alice.user_key("alice"))
        ams = {p["am_url"]: client(p["am_url"], cert, key) for p in procs.values()}
        yield {"mode": request.param, "homes": homes, "procs": procs, "ams": ams,
               "topology": load_topology(topology), "sa": client(procs["sa"]["sa_url"], cert, key),
               "scs": xmlrpc.client.ServerProxy(procs["sa"]["scs_url"])}
    finally:
        for up in ups.values():
            up.stop()


def hop_l2(manifest: str, hop: str):
    link = etree.fromstring(manifest.encode()).find(f".//{STITCH}link[@id='{hop}']")
    return link, link.find(f".//{STITCH}switchingCapabilitySpecificInfo_L2sc")


def test_no_common_vlan_succeeds_through_translation_or_qinq_and_the_manifests_say_which(racks):
    sdk = StitchClient(racks["ams"], racks["topology"])
    s, creds = slice_credential(racks["sa"], "sa.test", "nocommon")
    got = sdk.allocate(s, creds, request("sa", "sc"))
    url = {name: p["am_url"] for name, p in racks["procs"].items()}
    assert [u for u, _ in got.codes] == [url["sa"], url["sb"], url["sc"]] and {c for _, c in got.codes} == {0}
    link = got.links["st0"]
    hops = {h.urn: h for h in link.hops}
    assert [h.aggregate_url for h in link.hops] == [url["sa"], url["sb"], url["sb"], url["sc"]]
    if racks["mode"] == "translated":
        assert link.mode == "translated"
        assert [h.tag for h in link.hops] == [100, 100, 200, 200]
        _, l2 = hop_l2(got.manifests[url["sb"]], port("sb", "sc"))  # the transit's manifest: its own two tags
        assert l2.findtext(f"{STITCH}suggestedVLANRange") == "200" and l2.findtext(f"{STITCH}vlanTranslation") == "true"
        _, l2 = hop_l2(got.manifests[url["sb"]], port("sb", "sa"))
        assert l2.findtext(f"{STITCH}suggestedVLANRange") == "100"
    else:
        assert link.mode == "qinq"
        assert [h.tag for h in link.hops] == [3005, 3005, 3005, 3005]  # the S-tag on every wire
        edge = hops[port("sa", "sb")]
        assert (edge.qinq_action, edge.c_tag, edge.s_tag, edge.translation) == ("push", 100, 3005, True)
        assert (hops[port("sc", "sb")].qinq_action, hops[port("sc", "sb")].c_tag) == ("pop", 100)
        qlink, l2 = hop_l2(got.manifests[url["sa"]], port("sa", "sb"))
        q = qlink.find(f"{QINQ}qinq")
        assert (q.get("c_tag"), q.get("s_tag"), l2.findtext(f"{STITCH}suggestedVLANRange")) == ("100", "3005", "3005")
        # the edge's own segment uses the C-tag; the transit's the S-tag
        assert 'vlantag="100"' in got.manifests[url["sa"]] and 'vlantag="3005"' in got.manifests[url["sb"]]
    provisioned = sdk.provision(s, creds, got)
    assert set(provisioned) == set(url.values())
    for u, am in racks["ams"].items():
        slivers = am.Status([s], creds, {})["value"]["geni_slivers"]
        assert {x["geni_allocation_status"] for x in slivers} == {"geni_provisioned"}, (u, slivers)
    assert sdk.release(s, creds, list(got.manifests)) == []


def test_a_tag_held_at_the_far_end_is_24_released_and_retried_without_it(racks):
    # another slice holds, on sc's switch, the tag the path service suggests for the sc end (the C-tag in
    # Q-in-Q, the translated tag otherwise)
    held = 100 if racks["mode"] == "qinq" else 200
    url = {name: p["am_url"] for name, p in racks["procs"].items()}
    hs, hcreds = slice_credential(racks["sa"], "sa.test", "hold" + racks["mode"])
    lan = f"""<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">
      <node client_id="h1" component_manager_id="{urn('sc')}"><sliver_type name="default-vm"/>
        <interface client_id="h1:if0"/></node>
      <node client_id="h2" component_manager_id="{urn('sc')}"><sliver_type name="default-vm"/>
        <interface client_id="h2:if0"/></node>
      <link client_id="lan" vlantag="{held}"><interface_ref client_id="h1:if0"/><interface_ref client_id="h2:if0"/>
      </link></rspec>"""
    out = racks["ams"][url["sc"]].Allocate(hs, hcreds, lan, {})
    assert out["code"]["geni_code"] == 0, out["output"]
    s, creds = slice_credential(racks["sa"], "sa.test", "retry")
    once = StitchClient(racks["ams"], racks["topology"], max_rounds=1)
    with pytest.raises(StitchFailure) as failed:
        once.allocate(s, creds, request("sa", "sc"))
    assert failed.value.code == 24 and failed.value.aggregate == url["sc"], failed.value.message
    assert str(held) in failed.value.message
    for u in (url["sa"], url["sb"]):  # all or nothing: what sa and sb had allocated is gone
        assert racks["ams"][u].Status([s], creds, {})["code"]["geni_code"] == 12
    # the same through the path service `slicex up` runs at sa (ComputePath over HTTP, exclusions included)
    got = StitchClient(racks["ams"], racks["scs"]).allocate(s, creds, request("sa", "sc"))
    assert got.rounds == 2 and [c for _, c in got.codes] == [0, 0, 24, 0, 0, 0]
    sc_hop = next(h for h in got.links["st0"].hops if h.urn == port("sc", "sb"))
    assert (sc_hop.c_tag if racks["mode"] == "qinq" else sc_hop.tag) == held + 1
    assert once.release(s, creds, list(url.values())) == [] and once.release(hs, hcreds, [url["sc"]]) == []


def test_slicex_up_runs_the_path_service_and_status_shows_it(racks):
    sa = racks["homes"]["sa"]
    url = racks["procs"]["sa"]["scs_url"]
    assert url.startswith("http://127.0.0.1:") and url.endswith("/geni/xmlrpc")
    out = subprocess.run([sys.executable, "-m", "cli", "--home", str(sa.root), "status"], capture_output=True,
                         text=True, timeout=60)
    assert f"path svc:   {url} (answering)" in out.stdout, out.stdout + out.stderr
    listed = racks["scs"].ListAggregates()["value"]["geni_aggregate_list"]
    assert sorted(a["url"] for a in listed.values()) == sorted(p["am_url"] for p in racks["procs"].values())
    sb = racks["homes"]["sb"]
    plain = subprocess.run([sys.executable, "-m", "cli", "--home", str(sb.root), "status"], capture_output=True,
                           text=True, timeout=60)
    assert "path svc" not in plain.stdout  # no scs: section, no path service


def test_slicex_up_refuses_a_path_service_whose_topology_is_missing(tmp_path):
    homes = make_homes(tmp_path, {"solo": {}}, scs={"topology": "nowhere.yaml", "port": 0})
    out = subprocess.run([sys.executable, "-m", "cli", "--home", str(homes["solo"].root), "up"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 1 and "path service" in out.stderr and "nowhere.yaml" in out.stderr, out.stderr
