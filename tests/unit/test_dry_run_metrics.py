"""The pure parts of dry-run placement (deployment/plan.py over the planner's collecting mode) and of the metrics
read from state (operations/metrics.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from broker.placement import dry_run, plan
from operations.metrics import Sites, sample_of, state_families, unit_bin
from rspec.request import parse_request
from rspec.substrate import default_substrate
from slice_manager import reservation as rs
from slicex.errors import InsufficientNodes
from tests.factories import request_rspec, three_node_lan, vm

SUB = default_substrate("slicex.test")
PC = [h for h in SUB.hosts if not h.exclusive]
NOW = datetime(2030, 1, 1, tzinfo=UTC)


def all_cores_of(host, keep: int = 0) -> set[str]:
    return {f"core:{host.component_id}:{i}" for i in range(host.cores - keep)}


def test_a_fitting_plan_is_the_planners_placement():
    req = parse_request(three_node_lan())
    answer = dry_run(SUB, req, set())
    placed = plan(SUB, req, set())
    assert answer["fits"]
    assert [n["component_id"] for n in answer["nodes"]] == [p.component_id for p in placed if p.kind == "node"]
    assert answer["links"][0]["vlan_tag"] == next(p for p in placed if p.kind == "link").details["vlan_tag"]


def test_without_collecting_the_planner_still_raises_the_first_shortage():
    with pytest.raises(InsufficientNodes):
        plan(SUB, parse_request(request_rspec([{"client_id": f"b{i}", "sliver_type": "raw-pc"} for i in range(3)])),
             set())


def test_a_vm_that_fits_no_host_reports_the_most_one_host_offers():
    used = all_cores_of(PC[0]) | all_cores_of(PC[1]) | all_cores_of(PC[2], keep=3)  # 3 cores free on pc3
    answer = dry_run(SUB, parse_request(request_rspec([vm("big", sliver_type="m1.large")])), used)
    (short,) = answer["short"]
    assert short["error"] == "InsufficientNodes" and short["client_id"] == "big"
    assert {"resource": "cores", "site": "rack1", "asked": 4, "available": 3} in short["needs"]
    assert {"resource": "memory_mb", "site": "rack1", "asked": 8192, "available": 65536} in short["needs"]


def test_every_element_short_is_named_not_only_the_first():
    req = request_rspec([{"client_id": f"b{i}", "sliver_type": "raw-pc"} for i in range(4)])
    answer = dry_run(SUB, parse_request(req), set())
    assert [s["client_id"] for s in answer["short"]] == ["b2", "b3"]
    assert [n["client_id"] for n in answer["nodes"]] == ["b0", "b1"]


def record(state: str, pending: str = rs.NONE, since: datetime | None = None) -> SimpleNamespace:
    return SimpleNamespace(r=rs.Reservation("r", state=state, pending=pending, pending_since=since))


def test_state_families_count_reservations_pending_age_tickets_leases_and_units_per_site():
    sample = sample_of([record(rs.TICKETED), record(rs.ACTIVE), record(rs.NASCENT, rs.TICKETING,
                                                                        NOW - timedelta(seconds=42))],
                       {f"core:{PC[0].component_id}:0", f"vlan:{SUB.switches[0].component_id}:1000",
                        f"leased:core:{PC[0].component_id}:0"}, NOW)
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for fam in state_families(Sites.of(SUB), sample) for s in fam.samples}
    assert got[("slicex_reservations", (("state", "Ticketed"),))] == 1
    assert got[("slicex_reservations_pending", (("operation", rs.TICKETING),))] == 1
    assert got[("slicex_reservation_pending_oldest_seconds", (("operation", rs.TICKETING),))] == 42
    assert got[("slicex_tickets_outstanding", ())] == 2 and got[("slicex_leases_outstanding", ())] == 1
    assert got[("slicex_units_in_use", (("kind", "core"), ("site", "rack1")))] == 1
    assert got[("slicex_units_in_use", (("kind", "node"), ("site", "rack1")))] == 0
    assert got[("slicex_vlan_tags_in_use", (("site", "rack1"), ("switch", "sw1")))] == 1


def test_unit_bins():
    assert unit_bin("core:urn:x+node+pc1:3") == ("core", "urn:x+node+pc1")
    assert unit_bin("router:board1:2") == ("router", "board1")
    assert unit_bin("node:urn:x+node+bm1") == ("node", "urn:x+node+bm1")
