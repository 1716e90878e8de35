"""Dry-run placement on both deployments: Allocate with `slicex_dry_run` and `slicex plan` answer whether a
request fits, where it would go and what is short, and hold nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cli.main import main
from tests.factories import request_rspec, three_node_lan, vm
from tests.integration.conftest import Running, make_home
from tests.integration.test_am_api import ok

DRY = {"slicex_dry_run": True}
TABLES = ("broker-tickets", "broker-relinquished", "delegations", "sm-reservations",
          "sm-requests", "authority-leases", "authority-delegations")


def held(r: Running) -> dict[str, Any]:
    """Everything an allocation could change: claims, the broker's and slice manager's tables, and what the
    broker answers is in use now (its availability query)."""
    d = r.deployment
    now = r.clock.now()
    return {"claims": d.store.all_claims(),
            **{t: sorted(map(repr, d.store.scan(t))) for t in TABLES},
            "broker": d.broker.availability("", now)}


def test_dry_run_of_a_fitting_request_places_it_as_allocate_then_does_and_holds_nothing(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("plan")
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("other")]), {}))  # something else already held
    before = held(running)
    reply = alice.am.Allocate(urn, creds, three_node_lan(), DRY)
    assert reply["code"]["geni_code"] == 0 and "nothing was allocated" in reply["output"]
    plan = reply["value"]
    assert held(running) == before
    assert plan["fits"] and plan["short"] == [] and plan["summary"].startswith("fits: 3 nodes")
    assert {n["client_id"] for n in plan["nodes"]} == {"n1", "n2", "n3"}
    assert all(n["site"] == "rack1" and n["host"].startswith("pc") for n in plan["nodes"])
    (lan,) = plan["links"]
    assert lan["client_id"] == "lan0" and lan["switch"] == "sw1" and isinstance(lan["vlan_tag"], int)
    assert sorted(lan["endpoints"]) == ["n1", "n2", "n3"]
    # Allocate now does what the plan said
    slivers = ok(alice.am.Allocate(urn, creds, three_node_lan(), {}))["geni_slivers"]
    got = {s["geni_client_id"]: running.deployment.sm.sliver(s["geni_sliver_urn"], running.clock.now())
           for s in slivers}
    for n in plan["nodes"]:
        assert got[n["client_id"]].component_id == n["component_id"]
    assert got["lan0"].details["vlan_tag"] == lan["vlan_tag"]


def test_dry_run_of_a_request_that_does_not_fit_names_what_is_short(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("short")
    before = held(running)
    reply = alice.am.Allocate(urn, creds, request_rspec(
        [vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0"])]
        + [{"client_id": f"b{i}", "sliver_type": "raw-pc", "ifaces": [f"b{i}:if0"]} for i in range(3)],
        [{"client_id": "tagged", "ifaces": ["n1:if0", "n2:if0"], "vlantag": "3000"},
         {"client_id": "to-b2", "ifaces": ["n1:if0", "b2:if0"]}]), DRY)
    assert reply["code"]["geni_code"] == 0
    plan = reply["value"]
    assert held(running) == before
    assert not plan["fits"] and plan["summary"].startswith("does not fit")
    short = {s["client_id"]: s for s in plan["short"]}
    assert set(short) == {"b2", "tagged", "to-b2"}
    assert short["b2"]["error"] == "InsufficientNodes"
    assert short["b2"]["needs"] == [{"resource": "bare-metal nodes", "site": "rack1", "asked": 1, "available": 0}]
    assert short["tagged"]["error"] == "VlanUnavailable" and "3000" in short["tagged"]["reason"]
    assert short["tagged"]["needs"] == [{"resource": "vlan tags", "site": "rack1", "switch": "sw1", "asked": 3000,
                                         "available": 0}]
    assert short["to-b2"]["needs"] == [] and "b2" in short["to-b2"]["reason"]
    assert {n["client_id"] for n in plan["nodes"]} == {"n1", "n2", "b0", "b1"}


def test_slicex_plan_reads_the_deployment_and_names_what_is_short(running, tmp_path: Path, capsys):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("cli")
    ok(alice.am.Allocate(urn, creds, request_rspec([{"client_id": "b0", "sliver_type": "raw-pc"}]), {}))
    home = str(running.home.root)
    from slicex import procs

    # the pid record `slicex actor broker` writes (distributed), or `slicex up`'s naming the broker it serves
    broker_url = running.actors[0].url if running.actors else running.deployment.actor_urls["broker_url"]
    record = running.home.pid_file.with_name("broker.pid") if running.actors else running.home.pid_file
    procs.write(record, procs.this_process({"role": "broker", "url": broker_url} if running.actors else
                                           {"role": "slicex", "broker_url": broker_url}))
    before = held(running)
    fits = tmp_path / "fits.xml"
    fits.write_text(three_node_lan())
    assert main(["--home", home, "plan", str(fits)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fits: 3 nodes") and "link lan0" in out and "VLAN 10" in out
    # the running broker actor answers itself in either deployment, as the AM's slice manager would ask it
    assert f"(answered by the broker actor at {broker_url})" in out
    short = tmp_path / "short.xml"
    short.write_text(request_rspec([{"client_id": f"b{i}", "sliver_type": "raw-pc"} for i in range(2)]))
    assert main(["--home", home, "plan", str(short)]) == 1
    out = capsys.readouterr().out
    assert "does not fit" in out and "short node b1: InsufficientNodes" in out
    assert "bare-metal nodes at site rack1: asked 1, available 0" in out
    assert held(running) == before
    record.unlink()


def test_slicex_plan_on_a_deployment_never_started_places_over_the_whole_substrate(tmp_path: Path, capsys):
    """No broker has been delegated anything yet: the plan is over the authority's whole export."""
    home = make_home(tmp_path / "fresh")
    req = tmp_path / "req.xml"
    req.write_text(three_node_lan())
    assert main(["--home", str(home.root), "plan", str(req)]) == 0
    assert capsys.readouterr().out.startswith("fits: 3 nodes")
