"""Three slicex aggregates (sx1 -- sx2 -- sx3, separate authorities and CAs that trust each other) and the path
service, driven over real TLS the way omni's stitcher drives them (../shared/STITCHING.md §1.3, §1.5): ComputePath,
then Allocate at each aggregate in the workflow's dependency order with importing hops taking the upstream
manifest's tag, then Provision. Tags agree end to end (also across the transit sx2); a tag taken at an importing
aggregate is VLAN_UNAVAILABLE (24), and ComputePath again with the hop exclusion moves the whole path to
another tag. The AM API v2 endpoint (what the stitcher uses without -V3) is served and listed under "2"."""

from __future__ import annotations

import threading
import xmlrpc.client
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from lxml import etree

from slicex.clock import ManualClock
from slicex.devpki import add_user, init_ca
from slicex.home import Home
from slicex.tls_xmlrpc import client
from stitching.server import make_server
from stitching.topology import load_topology
from tests.integration.conftest import start, stop

SX = ("sx1", "sx2", "sx3")
CABLES = (("sx1", "sx2"), ("sx2", "sx3"))
STITCH = "http://www.geni.net/resources/rspec/ext/stitch/2/"


def urn(name: str, rest: str = "authority+am") -> str:
    return f"urn:publicid:IDN+{name}.test+{rest}"


def port(name: str, peer: str) -> str:
    return urn(name, f"interface+sw1:to-{peer}")


def substrate(name: str) -> dict:
    peers = [b if a == name else a for a, b in CABLES if name in (a, b)]
    return {"authority": f"{name}.test",
            "switches": [{"name": "sw1", "vlan_range": ["100-199"],
                          "ports": [{"name": "h1"}, {"name": "h2"}] + [{"name": f"to-{p}"} for p in peers]}],
            "hosts": [{"name": "pc", "count": 2, "cores": 8, "memory_mb": 16384,
                       "interfaces": [{"name": "eth0", "switch_port": "sw1:h{n}"}]}],
            "external_links": [{"name": f"to-{p}", "switch": "sw1", "port": f"to-{p}", "remote_aggregate": urn(p),
                                "remote_port": port(p, name), "vlan_range": "100-103"} for p in peers]}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The three aggregates (alice is sx1's user; sx2 and sx3 trust sx1's root) and the path service."""
    root: Path = tmp_path_factory.mktemp("stitch3")
    homes = {}
    for name in SX:
        (root / f"{name}.yaml").write_text(yaml.safe_dump(substrate(name)))
        home = Home(root / name)
        home.root.mkdir()
        home.config_file.write_text(yaml.safe_dump(
            {"authority": f"{name}.test", "sa_port": 0, "am_port": 0, "tick_seconds": 0.05, "dashboard_port": None,
             "substrate": str(root / f"{name}.yaml")}))
        init_ca(home, f"{name}.test")
        homes[name] = home
    add_user(homes["sx1"], "sx1.test", "alice")
    for name, home in homes.items():
        for other, peer in homes.items():
            if other != name:
                (home.trusted_roots / f"{other}.pem").write_bytes(peer.ca_cert.read_bytes())
    clock = ManualClock(datetime.now(UTC).replace(microsecond=0))
    running = {name: start(home, clock) for name, home in homes.items()}
    urls = {name: r.deployment.endpoints for name, r in running.items()}
    (root / "topology.yaml").write_text(yaml.safe_dump({"aggregates": [
        {"substrate": f"{name}.yaml", "url": urls[name].am_url} for name in SX]}))
    topo = load_topology(root / "topology.yaml")
    scs = make_server(lambda: topo, "127.0.0.1", 0)
    threading.Thread(target=scs.serve_forever, daemon=True).start()
    alice = homes["sx1"]
    cert, key = str(alice.user_cert("alice")), str(alice.user_key("alice"))
    yield {"scs": xmlrpc.client.ServerProxy(f"http://127.0.0.1:{scs.server_address[1]}/geni/xmlrpc"),
           "am": {urls[n].am_url: client(urls[n].am_url, cert, key) for n in SX},
           "v2": {n: client(urls[n].am_v2_url, cert, key) for n in SX}, "urls": urls,
           "sa": client(urls["sx1"].sa_url, cert, key)}
    scs.shutdown()
    for r in running.values():
        stop(r)


def request(a: str, b: str) -> str:
    return f"""<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">
  <node client_id="a" component_manager_id="{urn(a, 'authority+cm')}" exclusive="false">
    <sliver_type name="default-vm"/><interface client_id="a:if0"/></node>
  <node client_id="b" component_manager_id="{urn(b)}" exclusive="false">
    <sliver_type name="default-vm"/><interface client_id="b:if0"/></node>
  <link client_id="stitched0"><component_manager name="{urn(a, 'authority+cm')}"/>
    <component_manager name="{urn(b)}"/><interface_ref client_id="a:if0"/><interface_ref client_id="b:if0"/>
  </link></rspec>"""


def slice_cred(site, name: str) -> tuple[str, list[dict]]:
    s = urn("sx1", f"slice+{name}")
    return s, [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": site["sa"].CreateSlice(s)}]


def flatten(deps: list[dict], parent: str | None = None, out: dict | None = None) -> dict[str, dict]:
    """hop urn -> {url, imports, upstream}: the first mention wins, as in the stitcher's WorkflowParser."""
    out = {} if out is None else out
    for d in deps:
        out.setdefault(d["hop_urn"], {"url": d["aggregate_url"], "imports": d["import_vlans"],
                                      "upstream": [x["hop_urn"] for x in d.get("dependencies", [])]})
        flatten(d.get("dependencies", []), d["hop_urn"], out)
    return out


def l2(root: etree._Element, hop_urn: str) -> etree._Element:
    link = root.find(f".//{{{STITCH}}}link[@id='{hop_urn}']")
    return link.find(f".//{{{STITCH}}}switchingCapabilitySpecificInfo_L2sc")


def stitch(site, slice_name: str, a: str, b: str, max_rounds: int = 3) -> tuple[dict[str, int], list[int]]:
    """What the stitcher does: ComputePath, Allocate in dependency order importing tags, on 24 at an importing
    hop delete everything and ask again excluding the tag. Returns the tags per hop and the codes seen."""
    slice_urn, creds = slice_cred(site, slice_name)
    codes: list[int] = []
    excluded: list[str] = []
    for _ in range(max_rounds):
        opts = {"geni_workflow_paths_merged": True}
        if excluded:
            opts["geni_routing_profile"] = {"stitched0": {"hop_exclusion_list": excluded}}
        res = site["scs"].ComputePath({"slice_urn": slice_urn, "request_rspec": request(a, b), "request_options": opts})
        assert res["code"]["geni_code"] == 0, res["output"]
        hops = flatten(res["value"]["workflow_data"]["stitched0"]["dependencies"])
        order: list[str] = []  # aggregate URLs, each after those it imports from
        while len(order) < len({h["url"] for h in hops.values()}):
            for h in hops.values():
                ups = {hops[u]["url"] for u in h["upstream"]} - {h["url"]}
                if h["url"] not in order and ups <= set(order):
                    order.append(h["url"])
        tags: dict[str, int] = {}
        done: list[str] = []
        failed = None
        for url in order:
            doc = etree.fromstring(res["value"]["service_rspec"].encode())
            for hop_urn, h in hops.items():
                if h["url"] == url and h["imports"]:
                    src = next(u for u in h["upstream"] if hops[u]["url"] != url)
                    for name in ("suggestedVLANRange", "vlanRangeAvailability"):
                        l2(doc, hop_urn).find(f"{{{STITCH}}}{name}").text = str(tags[src])
            out = site["am"][url].Allocate(slice_urn, creds, etree.tostring(doc, encoding="unicode"), {})
            codes.append(out["code"]["geni_code"])
            if out["code"]["geni_code"] != 0:
                failed = (url, out)
                break
            done.append(url)
            manifest = etree.fromstring(out["value"]["geni_rspec"].encode())
            for hop_urn, h in hops.items():
                if h["url"] == url:
                    got = l2(manifest, hop_urn)
                    assert all((el.text or "").strip() for el in got), "no empty element under _L2sc"
                    tags[hop_urn] = int(got.find(f"{{{STITCH}}}suggestedVLANRange").text)
        if failed is None:
            for url in order:
                prov = site["am"][url].Provision([slice_urn], creds, {})
                assert prov["code"]["geni_code"] == 0, prov["output"]
            return tags, codes
        url, out = failed
        assert out["code"]["geni_code"] == 24, out["output"]
        for prior in done:  # all or nothing, as the stitcher does before asking the path service again
            gone = site["am"][prior].Delete([slice_urn], creds, {})
            assert gone["code"]["am_code"] == 0
            assert {s["geni_allocation_status"] for s in gone["value"]} == {"geni_unallocated"}
        for hop_urn, h in hops.items():
            if h["url"] == url and h["imports"]:
                src = next(u for u in h["upstream"] if hops[u]["url"] != url)
                excluded += [f"{hop_urn}={tags[src]}", f"{src}={tags[src]}"]
    raise AssertionError(f"no success in {max_rounds} rounds: {codes}")


def release(site, slice_name: str) -> None:
    """Delete the slice everywhere it has slivers (Delete answers am_code and unallocated slivers)."""
    slice_urn, creds = slice_cred(site, slice_name)
    for am in site["am"].values():
        out = am.Delete([slice_urn], creds, {})
        assert out["code"]["geni_code"] in (0, 12), out["output"]
        assert out["code"]["am_code"] == out["code"]["geni_code"]


def lan(at: str, tag: int | None = None) -> str:
    """Two VMs at one aggregate on a LAN (holding `tag` on its switch when given)."""
    vlan = f' vlantag="{tag}"' if tag else ""
    nodes = "".join(f"""<node client_id="{n}" component_manager_id="{urn(at)}"><sliver_type name="default-vm"/>
        <interface client_id="{n}:if0"/></node>""" for n in ("h1", "h2"))
    return f"""<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">{nodes}
      <link client_id="lan"{vlan}><interface_ref client_id="h1:if0"/><interface_ref client_id="h2:if0"/></link>
    </rspec>"""


def test_two_aggregates_agree_on_the_tag(site):
    tags, codes = stitch(site, "two", "sx1", "sx2")
    release(site, "two")
    assert codes == [0, 0]
    assert set(tags) == {port("sx1", "sx2"), port("sx2", "sx1")} and len(set(tags.values())) == 1


def test_transit_aggregate_carries_the_same_tag_end_to_end(site):
    tags, codes = stitch(site, "three", "sx1", "sx3")
    release(site, "three")
    assert codes == [0, 0, 0]
    assert set(tags) == {port("sx1", "sx2"), port("sx2", "sx1"), port("sx2", "sx3"), port("sx3", "sx2")}
    assert len(set(tags.values())) == 1


def test_tag_taken_at_the_importing_aggregate_is_24_and_the_exclusion_retry_succeeds(site):
    # another slice holds tag 100 on sx2's switch; the path service (advertised ranges only, like the GENI
    # SCS) still suggests it, sx1 takes it, sx2 answers 24, the retry excludes it
    s, creds = slice_cred(site, "hold")
    out = site["am"][site["urls"]["sx2"].am_url].Allocate(s, creds, lan("sx2", 100), {})
    assert out["code"]["geni_code"] == 0, out["output"]
    tags, codes = stitch(site, "conflict", "sx1", "sx2")
    release(site, "conflict")
    release(site, "hold")
    assert codes == [0, 24, 0, 0]
    assert len(set(tags.values())) == 1 and 100 not in tags.values()


def test_v2_endpoint_is_listed_served_and_maps_onto_the_same_slivers(site):
    urls = site["urls"]["sx3"]
    v3 = site["am"][urls.am_url].GetVersion()
    v2 = site["v2"]["sx3"].GetVersion()
    assert v3["value"]["geni_api_versions"] == {"3": urls.am_url, "2": urls.am_v2_url}
    assert v2["geni_api"] == 2 and v2["value"]["geni_api"] == 2
    assert v2["value"]["geni_api_versions"] == v3["value"]["geni_api_versions"]
    s, creds = slice_cred(site, "v2")
    plain = [c["geni_value"] for c in creds]  # v2 credentials are plain XML strings
    users = [{"urn": urn("sx1", "user+alice"), "keys": []}]
    manifest = site["v2"]["sx3"].CreateSliver(s, plain, lan("sx3"), users, {})
    assert manifest["code"]["geni_code"] == 0, manifest["output"]
    assert 'type="manifest"' in manifest["value"]
    again = site["v2"]["sx3"].CreateSliver(s, plain, lan("sx3"), users, {})
    assert again["code"]["geni_code"] == 17, again["output"]  # v2: one sliver per slice
    status = site["v2"]["sx3"].SliverStatus(s, plain, {})["value"]
    assert status["geni_urn"] == s and status["geni_status"] in ("configuring", "ready")
    assert len(status["geni_resources"]) == 3 and all(r["geni_error"] == "" for r in status["geni_resources"])
    # the same slivers through v3: provisioned (CreateSliver = Allocate + Provision + geni_start)
    v3_status = site["am"][urls.am_url].Status([s], creds, {})["value"]["geni_slivers"]
    assert {x["geni_allocation_status"] for x in v3_status} == {"geni_provisioned"}
    listed = site["v2"]["sx3"].ListResources(plain, {"geni_slice_urn": s,
                                                     "geni_rspec_version": {"type": "GENI", "version": "3"}})
    assert listed["code"]["geni_code"] == 0 and 'type="manifest"' in listed["value"]
    assert site["v2"]["sx3"].DeleteSliver(s, plain, {}) == {"code": {"geni_code": 0, "am_type": "slicex",
                                                                     "am_code": 0}, "value": True, "output": ""}
    assert site["v2"]["sx3"].SliverStatus(s, plain, {})["code"]["geni_code"] == 12
    unknown = site["v2"]["sx3"].Allocate(s, plain, lan("sx3"), {})
    assert unknown["code"]["geni_code"] == 13, unknown["output"]
