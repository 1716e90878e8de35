"""Virtual routers through the AM API, on both deployments, served by the one FPGA model: the authority's
scheduler places each (hardware plane or software plane), its routes are compiled into the FPGA's shared
table and looked up in the SRAM/CAM images the board holds, the manifest says where it landed and what the
table's Conflict CAM allocated, and a Delete re-runs the scheduler so a router in software migrates to the
hardware plane that freed up."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import yaml
from lxml import etree

from fpga_aggregate.fib import L2_SETS_PER_BANK, SharedFib
from fpga_aggregate.tables import virtual_router_tables
from rspec.fpga_ext import FPGA_NS, FpgaRequest, route_element, sliver_element
from tests.fpga_oracle import ReferenceLpm, probe_addresses
from tests.integration.conftest import deployment
from tests.integration.test_am_api import code, ok

RSPEC3 = "http://www.geni.net/resources/rspec/3"
# one NetFPGA: one FPGA, 1000 Mbps line rate, the external-SRAM table (3 hardware planes)
SITE = {"authority": "slicex.test", "hosts": [{"name": "pc1", "cores": 4, "memory_mb": 8192}],
        "fpga_boards": [{"name": "nf1", "model": "NetFPGA"}]}
V3 = {"geni_rspec_version": {"type": "GENI", "version": "3"}}
TABLES = virtual_router_tables(30, routers=3, overlap=0.3, seed=3)  # a third of each table shared: CAM entries


@pytest.fixture(params=["embedded", "distributed"])
def site(request, pki_home, tmp_path):
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(SITE))
    yield from deployment(request.param, pki_home, tmp_path, substrate=str(path))


def router_request(mbps: int, routes) -> str:
    el = sliver_element(FpgaRequest("virtual-router", bandwidth_mbps=mbps, table_size=100))
    for r in routes:
        route_element(el, r)
    node = (f'<rspec xmlns="{RSPEC3}" xmlns:fpga="{FPGA_NS}" type="request"><node client_id="r1">'
            f'{etree.tostring(el).decode()}</node></rspec>')
    return node


def fpga_sliver(manifest: str) -> dict[str, str]:
    el = etree.fromstring(manifest.encode()).find(f".//{{{FPGA_NS}}}sliver")
    return dict(el.attrib)


def model(r):
    """The authority's FPGA model (the authority actor's own process in the distributed deployment)."""
    driver = r.actors[1].actor.substrate if r.actors else r.deployment.driver
    return driver.aggregate


def check_lookups(r, urn: str, routes) -> None:
    """Every prefix's first and last address and random ones, through the engine forwarding for the router
    now (the board's exported table, or the software plane's copy), against a reference longest match."""
    addresses = probe_addresses(routes, extra=100, seed=7)
    want_port, want_hop = ReferenceLpm(routes).lookup_many(addresses)
    agg, now = model(r), r.clock.now()
    for a, port, hop in zip(addresses.tolist(), want_port.tolist(), want_hop.tolist(), strict=True):
        got = agg.forward(urn, int(a), now)
        assert got == (None if port == 7 else (port, hop)), (hex(a), got, port, hop)


def test_virtual_routers_placed_compiled_and_migrated_by_the_fpga_model(site):
    r = site
    alice = r.user("alice")
    slivers = {}
    for name, mbps, routes in (("vra", 600, TABLES[0]), ("vrb", 400, TABLES[1]), ("vrc", 300, TABLES[2])):
        urn, creds = alice.slice_credential(name)
        ok(alice.am.Allocate(urn, creds, router_request(mbps, routes), {}))
        value = ok(alice.am.Provision([urn], creds, {}))
        slivers[name] = (urn, creds, value["geni_slivers"][0]["geni_sliver_urn"])
    r.clock.advance(timedelta(seconds=20))  # the router design programmed and tables loaded (11 + 3 s)

    def manifest(name: str) -> dict[str, str]:
        urn, creds, _ = slivers[name]
        return fpga_sliver(ok(alice.am.Describe([urn], creds, V3))["geni_rspec"])

    a, b, c = manifest("vra"), manifest("vrb"), manifest("vrc")
    # 600 + 400 Mbps fill the FPGA's 1000 Mbps line rate: the third goes to a software plane (11 Mbps)
    assert (a["placement"], a["fpga"], a["delivered_mbps"]) == ("hardware", "nf1/fpga0", "600")
    assert (b["placement"], b["fpga"], b["delivered_mbps"]) == ("hardware", "nf1/fpga0", "400")
    assert (c["placement"], c["fpga"], c["delivered_mbps"]) == ("software", "nf1/software", "11")
    assert "cam_entries" not in c
    # the CAM the shared table allocated for these two tables, loaded in this order, as the board holds it
    fib = SharedFib(routers=3, l2_sets=L2_SETS_PER_BANK)
    fib.load(0, TABLES[0])
    fib.load(1, TABLES[1])
    assert len(fib.cam) > 0 and int(a["cam_entries"]) == int(b["cam_entries"]) == len(fib.cam)
    assert int(a["cam_bits"]) == len(fib.cam) * fib.cam_entry_bits()
    assert int(a["router_cam_entries"]) == 0 and int(b["router_cam_entries"]) == len(fib.cam)  # A came first
    for name, routes in (("vra", TABLES[0]), ("vrb", TABLES[1]), ("vrc", TABLES[2])):
        check_lookups(r, slivers[name][2], routes)
    backend = model(r).backend
    assert backend.counters["nf1/fpga0"]["lookups"] > 0  # hardware lookups went through the board's image

    urn, creds, _ = slivers["vra"]
    ok(alice.am.Delete([urn], creds, {}))
    deadline = time.monotonic() + 10
    while manifest("vrc")["placement"] != "hardware":  # the lease closes, the scheduler re-runs
        assert time.monotonic() < deadline, manifest("vrc")
        time.sleep(0.05)
    c = manifest("vrc")
    assert (c["fpga"], c["delivered_mbps"]) == ("nf1/fpga0", "300")
    assert manifest("vrb")["placement"] == "hardware"
    check_lookups(r, slivers["vrc"][2], TABLES[2])  # software keeps forwarding while the move (3 s) runs
    r.clock.advance(timedelta(seconds=4))
    check_lookups(r, slivers["vrc"][2], TABLES[2])  # now from the FPGA's table
    check_lookups(r, slivers["vrb"][2], TABLES[1])
    agg = model(r)
    c = manifest("vrc")
    exported = json.loads((Path(agg.workdir) / "tables" / "nf1_fpga0" / "fib.json").read_text())
    assert int(c["cam_entries"]) == len(agg.fibs["nf1/fpga0"].cam) == exported["conflict_cam.bin"]["entries"]
    assert np.fromfile(Path(agg.workdir) / "tables" / "nf1_fpga0" / "conflict_cam.bin", dtype="<u8").size == \
        int(c["cam_entries"])


def test_bad_routes_are_badargs(site):
    r = site
    alice = r.user("alice")
    urn, creds = alice.slice_credential("vrbad")
    bad = (f'<rspec xmlns="{RSPEC3}" xmlns:fpga="{FPGA_NS}" type="request"><node client_id="r1">'
           f'<fpga:sliver type="virtual-router" bandwidth_mbps="50"><fpga:route prefix="10.0.0.1/8" port="1" '
           f'next_hop="192.0.2.1"/></fpga:sliver></node></rspec>')
    reply = alice.am.Allocate(urn, creds, bad, {})
    assert code(reply) == 1 and "host bits" in reply["output"], reply["output"]
    assert r.deployment.sm.usage_keys() == set()
