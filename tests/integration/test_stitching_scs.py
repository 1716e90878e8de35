"""`slicex scs` in its own process on 127.0.0.1, called over plain-HTTP XML-RPC the way omni's stitcher calls
it (ComputePath with one struct; ../shared/STITCHING.md §2), on aggregates described by substrate files."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import xmlrpc.client
from pathlib import Path

import pytest
import yaml
from lxml import etree

from tests.ports import free_ports

ROOT = Path(__file__).resolve().parents[2]
STITCH = "{http://www.geni.net/resources/rspec/ext/stitch/2/}"
QINQ = "{http://slicex.dev/rspec/ext/qinq/1}"


def am(name: str) -> str:
    return f"urn:publicid:IDN+{name}.test+authority+am"


def iface(name: str, peer: str) -> str:
    return f"urn:publicid:IDN+{name}.test+interface+sw1:to-{peer}"


def substrate(name: str, peers: dict[str, dict]) -> dict:
    """One rack: a host on switch sw1, and a port toward each peer aggregate (options per peer)."""
    return {"authority": f"{name}.test", "am_url": f"https://127.0.0.1/{name}/",
            "switches": [{"name": "sw1", "vlan_range": ["100-199"],
                          "ports": [{"name": "h1"}] + [{"name": f"to-{p}"} for p in peers]}],
            "hosts": [{"name": "pc1", "interfaces": [{"name": "eth0", "switch_port": "sw1:h1"}]}],
            "external_links": [{"name": f"to-{p}", "switch": "sw1", "port": f"to-{p}", "remote_aggregate": am(p),
                                "remote_port": iface(p, name), **opts} for p, opts in peers.items()]}


def request(a: str, b: str, link: str = "stitched0") -> str:
    return f"""<?xml version="1.0"?>
<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
  xsi:schemaLocation="http://www.geni.net/resources/rspec/3 http://www.geni.net/resources/rspec/3/request.xsd">
  <node client_id="n1" component_manager_id="{am(a).replace('+am', '+cm')}" exclusive="false">
    <sliver_type name="default-vm"/><interface client_id="n1:if0"/></node>
  <node client_id="n2" component_manager_id="{am(b)}" exclusive="false">
    <sliver_type name="default-vm"/><interface client_id="n2:if0"/></node>
  <link client_id="{link}">
    <component_manager name="{am(a).replace('+am', '+cm')}"/><component_manager name="{am(b)}"/>
    <interface_ref client_id="n1:if0"/><interface_ref client_id="n2:if0"/>
    <property source_id="n1:if0" dest_id="n2:if0" capacity="20000"/>
    <property source_id="n2:if0" dest_id="n1:if0" capacity="20000"/>
  </link>
</rspec>"""


@pytest.fixture
def scs(tmp_path):
    """Start `slicex scs` on a topology written by the test; yields (write_topology, proxy)."""
    procs = []

    def start(racks: dict[str, dict], extra: list[dict] | None = None) -> xmlrpc.client.ServerProxy:
        entries = []
        for name, peers in racks.items():
            (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(substrate(name, peers)))
            entries.append({"substrate": f"{name}.yaml", "url": f"https://127.0.0.1:1844{len(entries) + 1}/"})
        topo = tmp_path / "topology.yaml"
        topo.write_text(yaml.safe_dump({"aggregates": entries + (extra or [])}))
        (port,) = free_ports(1)
        p = subprocess.Popen([sys.executable, "-m", "cli", "scs", "--topology", str(topo), "--port",
                              str(port)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        procs.append(p)
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if p.poll() is not None:
                    raise AssertionError(p.stdout.read()) from None
                time.sleep(0.05)
        return xmlrpc.client.ServerProxy(f"http://127.0.0.1:{port}/geni/xmlrpc")

    yield start
    for p in procs:
        p.terminate()
        p.wait(10)


def hops(service_rspec: str, path: str = "stitched0") -> list[dict]:
    root = etree.fromstring(service_rspec.encode())
    p = root.find(f"{STITCH}stitching/{STITCH}path[@id='{path}']")
    out = []
    for h in p.findall(f"{STITCH}hop"):
        l2 = h.find(f".//{STITCH}switchingCapabilitySpecificInfo_L2sc")
        out.append({"id": h.get("id"), "urn": h.find(f"{STITCH}link").get("id"),
                    "avail": l2.findtext(f"{STITCH}vlanRangeAvailability"),
                    "tag": l2.findtext(f"{STITCH}suggestedVLANRange"),
                    "translation": l2.findtext(f"{STITCH}vlanTranslation"),
                    "qinq": h.find(f"{STITCH}link/{QINQ}qinq"), "next": h.findtext(f"{STITCH}nextHop")})
    return out


def test_two_aggregates_downstream_hop_imports_from_upstream(scs):
    proxy = scs({"sx1": {"sx2": {"vlan_range": "100-110"}}, "sx2": {"sx1": {"vlan_range": "105-120"}}})
    res = proxy.ComputePath({"slice_urn": "urn:publicid:IDN+sx1.test+slice+s", "request_rspec": request("sx1", "sx2"),
                             "request_options": {"geni_workflow_paths_merged": True}})
    assert res["code"]["geni_code"] == 0, res["output"]
    h = hops(res["value"]["service_rspec"])
    assert [(x["urn"], x["tag"], x["avail"], x["next"]) for x in h] == [
        (iface("sx1", "sx2"), "105", "105-110", "2"), (iface("sx2", "sx1"), "105", "105-110", "null")]
    wf = res["value"]["workflow_data"]["stitched0"]["dependencies"]
    assert wf == [{"hop_urn": iface("sx2", "sx1"), "aggregate_urn": am("sx2"), "aggregate_url": "https://127.0.0.1:18442/",
                   "import_vlans": True,
                   "dependencies": [{"hop_urn": iface("sx1", "sx2"), "aggregate_urn": am("sx1").replace("+am", "+cm"),
                                     "aggregate_url": "https://127.0.0.1:18441/", "import_vlans": False}]}]


def test_transit_aggregate_is_added_and_the_chain_orders_the_aggregates(scs):
    proxy = scs({"sx1": {"sx2": {}}, "sx2": {"sx1": {}, "sx3": {}}, "sx3": {"sx2": {}}})
    res = proxy.ComputePath({"slice_urn": "urn:publicid:IDN+sx1.test+slice+s", "request_rspec": request("sx1", "sx3"),
                             "request_options": {}})
    assert res["code"]["geni_code"] == 0, res["output"]
    h = hops(res["value"]["service_rspec"])
    assert [x["urn"] for x in h] == [iface("sx1", "sx2"), iface("sx2", "sx1"), iface("sx2", "sx3"), iface("sx3", "sx2")]
    assert {x["tag"] for x in h} == {"3000"}
    root = etree.fromstring(res["value"]["service_rspec"].encode())
    cms = [c.get("name") for c in root.find("{http://www.geni.net/resources/rspec/3}link")
           if c.tag.endswith("component_manager")]
    assert am("sx2") in cms
    wf = res["value"]["workflow_data"]["stitched0"]["dependencies"]
    b = next(d for d in wf if d["hop_urn"] == iface("sx3", "sx2"))
    assert b["import_vlans"] and b["dependencies"][0]["hop_urn"] == iface("sx2", "sx3")
    assert b["dependencies"][0]["dependencies"][0]["hop_urn"] == iface("sx1", "sx2")
    mentioned = set()

    def walk(ds):
        for d in ds:
            mentioned.add(d["hop_urn"])
            walk(d.get("dependencies", []))

    walk(wf)
    assert mentioned == {x["urn"] for x in h}


def test_hop_exclusion_moves_the_tag_and_narrows_the_range(scs):
    proxy = scs({"sx1": {"sx2": {"vlan_range": "100-102"}}, "sx2": {"sx1": {"vlan_range": "100-102"}}})
    res = proxy.ComputePath({"slice_urn": "urn:publicid:IDN+sx1.test+slice+s", "request_rspec": request("sx1", "sx2"),
                             "request_options": {"geni_routing_profile": {"stitched0": {"hop_exclusion_list": [
                                 f"{iface('sx2', 'sx1')}=100", f"{iface('sx1', 'sx2')}=101"]}}}})
    assert res["code"]["geni_code"] == 0, res["output"]
    assert [(x["tag"], x["avail"]) for x in hops(res["value"]["service_rspec"])] == [("102", "102")] * 2


def test_translating_transit_lets_each_side_pick(scs):
    proxy = scs({"sx1": {"sx2": {"vlan_range": "100"}},
                 "sx2": {"sx1": {"vlan_range": "100"}, "sx3": {"vlan_range": "200", "vlan_translation": True}},
                 "sx3": {"sx2": {"vlan_range": "200"}}})
    res = proxy.ComputePath({"slice_urn": "urn:publicid:IDN+sx1.test+slice+s", "request_rspec": request("sx1", "sx3")})
    assert res["code"]["geni_code"] == 0, res["output"]
    h = hops(res["value"]["service_rspec"])
    assert [(x["tag"], x["translation"]) for x in h] == [("100", "false"), ("100", "false"), ("200", "true"),
                                                        ("200", "false")]
    wf = res["value"]["workflow_data"]["stitched0"]["dependencies"]
    b = next(d for d in wf if d["hop_urn"] == iface("sx3", "sx2"))
    assert b["dependencies"][0] == {"hop_urn": iface("sx2", "sx3"), "aggregate_urn": am("sx2"),
                                    "aggregate_url": "https://127.0.0.1:18442/", "import_vlans": False}


def test_no_common_tag_falls_back_to_qinq_and_the_service_rspec_says_so(scs):
    edge = {"vlan_range": "100-110", "qinq": True, "s_vlan_range": "3000-3009"}
    proxy = scs({"sx1": {"sx2": edge}, "sx2": {"sx1": {"vlan_range": "3005-3010"}, "sx3": {"vlan_range": "3000-3010"}},
                 "sx3": {"sx2": edge}})
    res = proxy.ComputePath({"slice_urn": "urn:publicid:IDN+sx1.test+slice+s", "request_rspec": request("sx1", "sx3")})
    assert res["code"]["geni_code"] == 0, res["output"]
    h = hops(res["value"]["service_rspec"])
    assert [x["tag"] for x in h] == ["3005"] * 4
    assert [(x["qinq"].get("c_tag"), x["qinq"].get("s_tag"), x["qinq"][0].get("action")) for x in (h[0], h[3])] == [
        ("100", "3005", "push"), ("100", "3005", "pop")]
    assert h[1]["qinq"] is None and h[0]["translation"] == "true"


def test_errors_are_results_with_a_code_and_the_reason(scs):
    proxy = scs({"sx1": {"sx2": {"vlan_range": "100"}}, "sx2": {"sx1": {"vlan_range": "200"}}})
    res = proxy.ComputePath({"slice_urn": "s", "request_rspec": request("sx1", "sx2")})
    assert res["code"]["geni_code"] == 24 and "100" in res["output"] and "200" in res["output"]
    res = proxy.ComputePath({"slice_urn": "s", "request_rspec": request("sx1", "nowhere")})
    assert res["code"]["geni_code"] == 12 and "nowhere" in res["output"]
    res = proxy.ComputePath({"slice_urn": "s", "request_rspec": "<rspec"})
    assert res["code"]["geni_code"] == 1 and "well-formed" in res["output"]
    res = proxy.ComputePath({"slice_urn": "s", "request_rspec": request("sx1", "sx2"), "request_options": {
        "geni_routing_profile": {"stitched0": {"hop_inclusion_list": ["x"]}}}})
    assert res["code"]["geni_code"] == 13 and "hop_inclusion_list" in res["output"]
