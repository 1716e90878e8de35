"""FPGA slivers through the AM API: a whole FPGA with the user's bitstream and a virtual router."""

from __future__ import annotations

from datetime import timedelta

import pytest
import yaml

from fpga_aggregate.bitstreams import build_bitfile
from tests.integration.conftest import start
from tests.integration.test_am_api import code, ok

FPGA_NS = "http://slicex.dev/rspec/ext/fpga/1"


def fpga_request(sliver: str) -> str:
    return (f'<rspec xmlns="http://www.geni.net/resources/rspec/3" xmlns:fpga="{FPGA_NS}" type="request">'
            f'<node client_id="f1">{sliver}</node></rspec>')


@pytest.fixture
def fpga_running(pki_home, tmp_path):
    substrate = tmp_path / "site.yaml"
    substrate.write_text(yaml.safe_dump({
        "authority": "slicex.test", "hosts": [{"name": "pc1", "cores": 4, "memory_mb": 8192}],
        "fpga_boards": [{"name": "nf1", "model": "NetFPGA"}, {"name": "bee1", "model": "BEE2"}]}))
    cfg = yaml.safe_load((pki_home.root / "slicex.yaml").read_text())
    cfg.update({"store": f"sqlite:///{tmp_path / 'state.db'}", "substrate": str(substrate)})
    (pki_home.root / "slicex.yaml").write_text(yaml.safe_dump(cfg))
    r = start(pki_home)
    yield r
    r.deployment.stop()
    cfg.pop("substrate")
    (pki_home.root / "slicex.yaml").write_text(yaml.safe_dump(cfg))


def test_whole_fpga_with_user_bitstream(fpga_running):
    r = fpga_running
    alice = r.user("alice")
    bit = r.deployment.bitstreams.upload(alice.urn, "design.bit", build_bitfile("design", "xc2vp70ff1704", b"\1" * 4096))
    urn, creds = alice.slice_credential("fpga1")
    value = ok(alice.am.Allocate(urn, creds, fpga_request(f'<fpga:sliver type="fpga-bitstream" bitstream="{bit.ref}"/>'),
                                 {}))
    assert "bee1" in value["geni_rspec"] and 'fpga="bee1/fpga0"' in value["geni_rspec"]
    ok(alice.am.Provision([urn], creds, {}))
    assert r.deployment.fpga_backend.loaded["bee1/fpga0"] == bit.path  # programmed through the backend
    ok(alice.am.PerformOperationalAction([urn], creds, "geni_start", {}))
    r.clock.advance(timedelta(seconds=10))
    assert ok(alice.am.Status([urn], creds, {}))["geni_slivers"][0]["geni_operational_status"] == "geni_configuring"
    r.clock.advance(timedelta(seconds=2))  # 11 s to program one FPGA
    assert ok(alice.am.Status([urn], creds, {}))["geni_slivers"][0]["geni_operational_status"] == "geni_ready"
    ok(alice.am.Delete([urn], creds, {}))
    assert r.deployment.sm.usage_keys() == set()
    assert "bee1/fpga0" not in r.deployment.fpga_backend.loaded


def test_unknown_bitstream_and_virtual_routers(fpga_running):
    r = fpga_running
    alice = r.user("alice")
    urn, creds = alice.slice_credential("fpga2")
    unknown = "sha256:" + "0" * 64  # well formed (the schema's pattern), in nobody's catalogue
    reply = alice.am.Allocate(urn, creds, fpga_request(f'<fpga:sliver type="fpga-bitstream" bitstream="{unknown}"/>'),
                              {})
    assert code(reply) == 1 and "catalogue" in reply["output"], reply["output"]
    fast = ok(alice.am.Allocate(urn, creds, fpga_request(
        '<fpga:sliver type="virtual-router" bandwidth_mbps="300" table_size="5000"/>'), {}))
    assert "router:" not in fast["geni_rspec"]
    keys = r.deployment.sm.usage_keys()
    assert any(k.startswith("router:") for k in keys)
    urn2, creds2 = alice.slice_credential("fpga3")
    ok(alice.am.Allocate(urn2, creds2, fpga_request('<fpga:sliver type="virtual-router" bandwidth_mbps="2"/>'), {}))
    assert sum(k.startswith("router:") for k in r.deployment.sm.usage_keys()) == 2
    ad = ok(alice.am.ListResources(alice.user_credential(), {"geni_rspec_version": {"type": "GENI", "version": "3"}}))
    assert 'hardware_type name="NetFPGA"' in ad and "virtual-router" in ad


def two_fpga_request(ref: str) -> str:
    sliver = f'<fpga:sliver type="fpga-bitstream" bitstream="{ref}"/>'
    return (f'<rspec xmlns="http://www.geni.net/resources/rspec/3" xmlns:fpga="{FPGA_NS}" type="request">'
            f'<node client_id="f1">{sliver}</node><node client_id="f2">{sliver}</node></rspec>')


def op_states(alice, urn, creds) -> list[str]:
    return [s["geni_operational_status"] for s in ok(alice.am.Status([urn], creds, {}))["geni_slivers"]]


def test_fpgas_provisioned_together_take_the_concurrent_programming_time(fpga_running):
    r = fpga_running
    alice = r.user("alice")
    bit = r.deployment.bitstreams.upload(alice.urn, "d.bit", build_bitfile("d", "xc2vp70ff1704", b"\2" * 4096))
    urn, creds = alice.slice_credential("fpga4")
    ok(alice.am.Allocate(urn, creds, two_fpga_request(bit.ref), {}))
    ok(alice.am.Provision([urn], creds, {}))
    assert {"bee1/fpga0", "bee1/fpga1"} <= set(r.deployment.fpga_backend.loaded)
    ok(alice.am.PerformOperationalAction([urn], creds, "geni_start", {}))
    r.clock.advance(timedelta(seconds=12))  # one FPGA alone would be ready after 11 s; two together take 17
    assert op_states(alice, urn, creds) == ["geni_configuring"] * 2
    r.clock.advance(timedelta(seconds=6))
    assert op_states(alice, urn, creds) == ["geni_ready"] * 2


def test_stop_returns_the_fpga_to_idle_and_start_programs_it_again(fpga_running):
    r = fpga_running
    alice = r.user("alice")
    backend = r.deployment.fpga_backend
    bit = r.deployment.bitstreams.upload(alice.urn, "e.bit", build_bitfile("e", "xc2vp70ff1704", b"\3" * 4096))
    urn, creds = alice.slice_credential("fpga5")
    ok(alice.am.Allocate(urn, creds, fpga_request(f'<fpga:sliver type="fpga-bitstream" bitstream="{bit.ref}"/>'), {}))
    ok(alice.am.Provision([urn], creds, {}))
    ok(alice.am.PerformOperationalAction([urn], creds, "geni_start", {}))
    r.clock.advance(timedelta(seconds=12))
    ok(alice.am.PerformOperationalAction([urn], creds, "geni_stop", {}))
    assert "bee1/fpga0" not in backend.loaded
    r.clock.advance(timedelta(seconds=10))
    ok(alice.am.PerformOperationalAction([urn], creds, "geni_start", {}))
    assert backend.loaded["bee1/fpga0"] == bit.path and backend.counters["bee1/fpga0"]["programmings"] == 2


def test_an_fpga_whose_lease_expires_is_returned_to_idle_by_the_authority(fpga_running):
    r = fpga_running
    alice = r.user("alice")
    bit = r.deployment.bitstreams.upload(alice.urn, "f.bit", build_bitfile("f", "xc2vp70ff1704", b"\4" * 4096))
    urn, creds = alice.slice_credential("fpga6")
    ok(alice.am.Allocate(urn, creds, fpga_request(f'<fpga:sliver type="fpga-bitstream" bitstream="{bit.ref}"/>'), {}))
    ok(alice.am.Provision([urn], creds, {"geni_end_time": (r.clock.now() + timedelta(hours=1)).isoformat()}))
    assert "bee1/fpga0" in r.deployment.fpga_backend.loaded
    r.deployment.authority_actor.reap(r.clock.now() + timedelta(hours=2))  # the authority's clock, no SM call
    assert "bee1/fpga0" not in r.deployment.fpga_backend.loaded
