"""Accounting and service levels over real TLS on both deployments: a request past a project's limit is
FORBIDDEN naming the limit and changes nothing; a lease past its length is OUTOFRANGE; an allocate, provision,
delete workflow (and an allocation left to expire) is what `slicex usage` then reports, to the core-hour."""

from __future__ import annotations

import csv
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from cli.main import main
from slicex.clock import rfc3339
from slicex.errors import BadArgs
from tests.factories import request_rspec, three_node_lan, vm
from tests.integration.conftest import AUTHORITY, Running, User, deployment
from tests.integration.test_am_api import RSPEC_V3, code, ok

PROJECT = f"urn:publicid:IDN+{AUTHORITY}+project+proj1"
QUOTAS = {"projects": {PROJECT: {"cores": 4, "lease_hours": 48}},
          "users": {"default": {"nodes": 10}}}


@pytest.fixture(params=["embedded", "distributed"])
def limited(request, pki_home, tmp_path: Path) -> Iterator[Running]:
    from tests.integration.test_chapi import chapi_user
    from tests.integration.test_chapi import ok as ch_ok

    for running in deployment(request.param, pki_home, tmp_path, quotas=QUOTAS):
        alice = chapi_user(running, "alice")  # proj1, alice its lead, bob a member: they make its slices
        ch_ok(alice.sa.create_project([], {"fields": {"PROJECT_NAME": "proj1"}}))
        ch_ok(alice.sa.modify_project_membership(PROJECT, [], {"members_to_add": [
            {"PROJECT_MEMBER": f"urn:publicid:IDN+{AUTHORITY}+user+bob", "PROJECT_ROLE": "MEMBER"}]}))
        yield running


def project_slice(user: User, name: str) -> tuple[str, list[dict]]:
    """A slice of project proj1 (the CH API form `<authority>:<project>`, which the slice authority makes for
    the project's members only) and its credential."""
    urn = f"urn:publicid:IDN+{AUTHORITY}:proj1+slice+{name}"
    return urn, [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": user.sa.CreateSlice(urn)}]


def state(r: Running) -> dict:
    d = r.deployment
    return {"claims": d.store.all_claims(), "reservations": sorted(map(repr, d.store.scan("sm-reservations"))),
            "usage": sorted(map(repr, d.store.scan("usage")))}


def test_a_request_past_the_project_limit_is_forbidden_naming_it_and_changes_nothing(limited):
    alice, bob = limited.user("alice"), limited.user("bob")
    mine, creds = project_slice(alice, "held")
    ok(alice.am.Allocate(mine, creds, three_node_lan(), {}))  # 3 of the project's 4 cores
    theirs, bob_creds = project_slice(bob, "more")
    before = state(limited)
    reply = bob.am.Allocate(theirs, bob_creds, request_rspec([vm("a"), vm("b")]), {})
    assert code(reply) == 3
    assert reply["output"].startswith(f"quota exceeded: project {PROJECT} may hold 4 cores (holds 3, asked 2)")
    assert state(limited) == before
    assert code(bob.am.Status([theirs], bob_creds, {})) == 12
    # one more core fits; a slice outside the project is not held to its limit
    ok(bob.am.Allocate(theirs, bob_creds, request_rspec([vm("a")]), {}))
    outside, outside_creds = bob.slice_credential("outside")
    ok(bob.am.Allocate(outside, outside_creds, request_rspec([vm("a"), vm("b")]), {}))


def test_a_lease_past_the_project_length_is_out_of_range_and_alap_cuts_it(limited):
    alice = limited.user("alice")
    urn, creds = project_slice(alice, "lease")
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {}))
    start = limited.clock.now()
    ok(alice.am.Provision([urn], creds, {}))  # the default day fits in 48 hours
    too_long = rfc3339(start + timedelta(hours=50))
    reply = alice.am.Renew([urn], creds, too_long, {})
    assert code(reply) == 19 and f"quota exceeded: project {PROJECT} may hold a sliver for 48 hours" in reply["output"]
    (sliver,) = ok(alice.am.Renew([urn], creds, too_long, {"geni_extend_alap": True}))
    assert sliver["geni_expires"] == rfc3339(start + timedelta(hours=48))


def run_usage(home: Path, capsys, *args: str) -> str:
    capsys.readouterr()
    assert main(["--home", str(home), "usage", *args]) == 0
    return capsys.readouterr().out


def test_slicex_usage_reports_a_workflow_and_an_expired_allocation(limited, tmp_path: Path, capsys):
    alice, bob = limited.user("alice"), limited.user("bob")
    t0 = limited.clock.now()
    urn, creds = project_slice(alice, "work")
    ok(alice.am.Allocate(urn, creds, three_node_lan(), {}))
    ok(alice.am.Provision([urn], creds, {}))
    limited.clock.advance(timedelta(hours=2))
    ok(alice.am.Delete([urn], creds, {}))
    # bob's allocation (2 VMs, not in a project) is never provisioned: it ends when it expires, 10 minutes on
    other, other_creds = bob.slice_credential("lapse")
    ok(bob.am.Allocate(other, other_creds, request_rspec([vm("a"), vm("b")]), {}))
    limited.clock.advance(timedelta(minutes=30))
    deadline = time.monotonic() + 10
    while limited.deployment.store.scan("usage-open") and time.monotonic() < deadline:
        time.sleep(0.05)  # the reaper's next tick ends it
    assert limited.deployment.store.scan("usage-open") == []
    assert code(bob.am.Status([other], other_creds, {})) == 12

    period = ("--from", rfc3339(t0 - timedelta(hours=1)), "--to", rfc3339(t0 + timedelta(hours=5)))
    out = run_usage(limited.home.root, capsys, *period, "--csv", str(tmp_path / "u.csv"), "--plot",
                    str(tmp_path / "u.png"))
    assert alice.urn in out and bob.urn in out
    rows = {r["who"]: r for r in csv.DictReader((tmp_path / "u.csv").open())}
    a, b = rows[alice.urn], rows[bob.urn]
    # 3 one-core 1 GB VMs and a LAN for 2 hours
    assert (a["slivers"], float(a["core_hours"]), float(a["memory_gb_hours"]), float(a["node_hours"]),
            float(a["vlan_hours"])) == ("4", 6.0, 6.0, 6.0, 2.0)
    # 2 VMs for the 10 minutes of their allocation
    assert (b["slivers"], float(b["core_hours"]), float(b["node_hours"])) == ("2", pytest.approx(1 / 3),
                                                                              pytest.approx(1 / 3))
    assert (tmp_path / "u.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    by_project = run_usage(limited.home.root, capsys, *period, "--by", "project")
    line = next(x for x in by_project.splitlines() if x.startswith(PROJECT)).split()
    assert line[1:4] == ["4", "6.00", "6.00"]
    assert any(x.startswith("(no project)") for x in by_project.splitlines())
    # a period after both ended reports nothing
    late = run_usage(limited.home.root, capsys, "--from", rfc3339(t0 + timedelta(hours=3)), "--to",
                     rfc3339(t0 + timedelta(hours=4)))
    assert "(no slivers lived in this period)" in late
    described = ok(alice.am.Describe([urn], creds, {"geni_rspec_version": RSPEC_V3}))
    assert described["geni_slivers"] == []


def test_a_wrong_quotas_section_stops_the_deployment_before_it_serves(pki_home, tmp_path: Path):
    """The configuration model refuses it naming the key (slicex/config.py), before anything starts."""
    with pytest.raises(BadArgs) as err:
        next(deployment("embedded", pki_home, tmp_path, quotas={"users": {"default": {"cpus": 4}}}))
    assert "unknown key 'quotas.users.default.cpus'" in err.value.message


def test_what_an_update_adds_counts_against_the_project_limit(limited):
    """Update cannot be a way around a service level: n3..n5 would make the project's 5 cores of 4."""
    alice = limited.user("alice")
    mine, creds = project_slice(alice, "grow")
    pair = request_rspec([vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0"])],
                         [{"client_id": "l1", "ifaces": ["n1:if0", "n2:if0"]}])
    ok(alice.am.Allocate(mine, creds, pair, {}))
    ok(alice.am.Provision([mine], creds, {"geni_rspec_version": RSPEC_V3}))
    three = request_rspec([vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0"]), vm("n3"), vm("n4"), vm("n5")],
                          [{"client_id": "l1", "ifaces": ["n1:if0", "n2:if0"]}])
    before = state(limited)
    reply = alice.am.Update([mine], creds, three, {})
    assert code(reply) == 3
    assert reply["output"].startswith(f"quota exceeded: project {PROJECT} may hold 4 cores (holds 2, asked 3)")
    assert state(limited) == before
    one = request_rspec([vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0"]), vm("n3")],
                        [{"client_id": "l1", "ifaces": ["n1:if0", "n2:if0"]}])
    ok(alice.am.Update([mine], creds, one, {}))  # the 3rd core fits
