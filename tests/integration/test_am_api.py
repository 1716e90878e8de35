"""The AM API v3 over real TLS on 127.0.0.1: every method, every option, the whole lifecycle."""

from __future__ import annotations

import base64
import time
import zlib
from datetime import timedelta

import yaml
from lxml import etree

from slicex.clock import parse_time, rfc3339
from tests.factories import RSPEC3, request_rspec, three_node_lan, vm
from tests.integration.conftest import AUTHORITY

RSPEC_V3 = {"type": "GENI", "version": "3"}


def ok(reply: dict) -> object:
    assert reply["code"]["geni_code"] == 0, reply.get("output")
    return reply["value"]


def code(reply: dict) -> int:
    return reply["code"]["geni_code"]


def client_ids(manifest: str) -> set[str]:
    root = etree.fromstring(manifest.encode())
    return {el.get("client_id") for el in root if el.tag in (f"{{{RSPEC3}}}node", f"{{{RSPEC3}}}link")}


def test_get_version_advertises_api_3_and_rspec_and_credential_types(running):
    alice = running.user("alice")
    reply = alice.am.GetVersion()
    assert reply["geni_api"] == 3
    v = ok(reply)
    assert v["geni_api_versions"]["3"] == running.deployment.endpoints.am_url
    assert {"type": "GENI", "version": "3"}.items() <= v["geni_request_rspec_versions"][0].items()
    assert v["geni_ad_rspec_versions"][0]["namespace"] == RSPEC3
    types = {(c["geni_type"], c["geni_version"]) for c in v["geni_credential_types"]}
    assert ("geni_sfa", "3") in types and ("geni_abac", "1") in types
    assert v["geni_allocate"] == "geni_many"
    assert "emulated" in v["slicex_substrate"]


def test_list_resources_returns_an_advertisement_compressed_or_not(running):
    alice = running.user("alice")
    creds = alice.user_credential()
    ad = ok(alice.am.ListResources(creds, {"geni_rspec_version": RSPEC_V3}))
    root = etree.fromstring(ad.encode())
    assert root.get("type") == "advertisement"
    packed = ok(alice.am.ListResources(creds, {"geni_rspec_version": RSPEC_V3, "geni_compressed": True}))
    assert zlib.decompress(base64.b64decode(packed)).decode() == ad


def test_list_resources_geni_available_drops_taken_bare_metal(running):
    alice = running.user("alice")
    creds = alice.user_credential()
    urn, scred = alice.slice_credential("avail")
    bm = f"urn:publicid:IDN+{AUTHORITY}+node+bm1"
    ok(alice.am.Allocate(urn, scred, request_rspec([{"client_id": "b", "component_id": bm,
                                                      "sliver_type": "raw-pc"}]), {}))
    ad = ok(alice.am.ListResources(creds, {"geni_rspec_version": RSPEC_V3, "geni_available": True}))
    ids = {n.get("component_id") for n in etree.fromstring(ad.encode()).iter(f"{{{RSPEC3}}}node")}
    assert bm not in ids
    full = ok(alice.am.ListResources(creds, {"geni_rspec_version": RSPEC_V3}))
    assert bm in {n.get("component_id") for n in etree.fromstring(full.encode()).iter(f"{{{RSPEC3}}}node")}


def test_full_lifecycle_allocate_provision_start_status_describe_renew_delete(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("life")
    value = ok(alice.am.Allocate(urn, creds, three_node_lan(), {}))
    slivers = value["geni_slivers"]
    assert len(slivers) == 4
    assert {s["geni_allocation_status"] for s in slivers} == {"geni_allocated"}
    assert client_ids(value["geni_rspec"]) == {"n1", "n2", "n3", "lan0"}
    now = running.clock.now()
    assert all(parse_time(s["geni_expires"]) <= now + timedelta(minutes=10) for s in slivers)

    users = [{"urn": alice.urn, "keys": ["ssh-rsa AAAA alice@test"]}]
    value = ok(alice.am.Provision([urn], creds, {"geni_users": users}))
    assert {s["geni_allocation_status"] for s in value["geni_slivers"]} == {"geni_provisioned"}
    manifest = etree.fromstring(value["geni_rspec"].encode())
    logins = list(manifest.iter(f"{{{RSPEC3}}}login"))
    assert logins and logins[0].get("username") == "alice"
    lan = next(manifest.iter(f"{{{RSPEC3}}}link"))
    assert 1000 <= int(lan.get("vlantag")) <= 1099
    macs = [i.get("mac_address") for i in manifest.iter(f"{{{RSPEC3}}}interface")]
    assert len(macs) == 3 and all(macs)

    value = ok(alice.am.PerformOperationalAction([urn], creds, "geni_start", {}))
    assert {s["geni_operational_status"] for s in value} == {"geni_configuring", "geni_ready"}
    running.clock.advance(timedelta(seconds=10))
    status = ok(alice.am.Status([urn], creds, {}))
    assert status["geni_urn"] == urn
    assert {s["geni_operational_status"] for s in status["geni_slivers"]} == {"geni_ready"}

    described = ok(alice.am.Describe([urn], creds, {"geni_rspec_version": RSPEC_V3}))
    assert client_ids(described["geni_rspec"]) == {"n1", "n2", "n3", "lan0"}

    new_end = running.clock.now() + timedelta(days=2)
    renewed = ok(alice.am.Renew([urn], creds, rfc3339(new_end), {}))
    assert {s["geni_expires"] for s in renewed} == {rfc3339(new_end)}

    deleted = ok(alice.am.Delete([urn], creds, {}))
    assert {s["geni_allocation_status"] for s in deleted} == {"geni_unallocated"}
    assert code(alice.am.Status([urn], creds, {})) == 12
    assert running.deployment.sm.usage_keys() == set()


def test_describe_of_an_empty_slice_is_an_empty_manifest(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("empty")
    value = ok(alice.am.Describe([urn], creds, {"geni_rspec_version": RSPEC_V3}))
    assert value["geni_slivers"] == []
    assert etree.fromstring(value["geni_rspec"].encode()).get("type") == "manifest"


def test_operations_on_individual_sliver_urns(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("parts")
    slivers = ok(alice.am.Allocate(urn, creds, request_rspec([vm("a"), vm("b")]), {}))["geni_slivers"]
    first = slivers[0]["geni_sliver_urn"]
    value = ok(alice.am.Provision([first], creds, {}))
    assert [s["geni_sliver_urn"] for s in value["geni_slivers"]] == [first]
    status = ok(alice.am.Status([urn], creds, {}))["geni_slivers"]
    states = {s["geni_sliver_urn"]: s["geni_allocation_status"] for s in status}
    assert states[first] == "geni_provisioned"
    assert states[slivers[1]["geni_sliver_urn"]] == "geni_allocated"
    ok(alice.am.Delete([first], creds, {}))
    assert len(ok(alice.am.Status([urn], creds, {}))["geni_slivers"]) == 1


def test_allocate_twice_into_one_slice_geni_many(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("many")
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {}))
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("b")]), {}))
    described = ok(alice.am.Describe([urn], creds, {"geni_rspec_version": RSPEC_V3}))
    assert client_ids(described["geni_rspec"]) == {"a", "b"}


def test_geni_end_time_on_provision_and_beyond_credential_is_out_of_range(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("endtime")
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {}))
    end = running.clock.now() + timedelta(hours=5)
    value = ok(alice.am.Provision([urn], creds, {"geni_end_time": rfc3339(end)}))
    assert value["geni_slivers"][0]["geni_expires"] == rfc3339(end)
    too_late = running.clock.now() + timedelta(days=365)
    assert code(alice.am.Provision([urn], creds, {"geni_end_time": rfc3339(too_late)})) == 19


def test_renew_beyond_slice_credential_is_out_of_range_unless_alap(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("renewlimit")
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {}))
    ok(alice.am.Provision([urn], creds, {}))
    far = running.clock.now() + timedelta(days=20)
    reply = alice.am.Renew([urn], creds, rfc3339(far), {})
    assert code(reply) == 19 and "credential" in reply["output"]
    value = ok(alice.am.Renew([urn], creds, rfc3339(far), {"geni_extend_alap": True}))
    slice_expiry = running.deployment.sa.slice_expiry(urn)
    assert parse_time(value[0]["geni_expires"]) == slice_expiry


def test_renew_into_the_past_is_bad_args(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("past")
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {}))
    assert code(alice.am.Renew([urn], creds, rfc3339(running.clock.now() - timedelta(hours=1)), {})) == 1


def test_best_effort_start_reports_per_sliver_errors(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("besteffort")
    slivers = ok(alice.am.Allocate(urn, creds, request_rspec([vm("a"), vm("b")]), {}))["geni_slivers"]
    ok(alice.am.Provision([slivers[0]["geni_sliver_urn"]], creds, {}))
    assert code(alice.am.PerformOperationalAction([urn], creds, "geni_start", {})) == 1
    value = ok(alice.am.PerformOperationalAction([urn], creds, "geni_start", {"geni_best_effort": True}))
    errors = {s["geni_sliver_urn"]: s["geni_error"] for s in value}
    assert errors[slivers[0]["geni_sliver_urn"]] == ""
    assert "not provisioned" in errors[slivers[1]["geni_sliver_urn"]]


def test_stop_restart_update_users(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("ops")
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {}))
    ok(alice.am.Provision([urn], creds, {}))
    ok(alice.am.PerformOperationalAction([urn], creds, "geni_start", {}))
    running.clock.advance(timedelta(seconds=30))
    value = ok(alice.am.PerformOperationalAction([urn], creds, "geni_update_users",
                                                 {"geni_users": [{"urn": alice.urn, "keys": ["ssh-rsa B"]}]}))
    assert value[0]["geni_operational_status"] == "geni_ready_busy"
    running.clock.advance(timedelta(seconds=5))
    assert ok(alice.am.PerformOperationalAction([urn], creds, "geni_restart", {}))[0][
        "geni_operational_status"] == "geni_configuring"
    running.clock.advance(timedelta(seconds=30))
    assert ok(alice.am.PerformOperationalAction([urn], creds, "geni_stop", {}))[0][
        "geni_operational_status"] == "geni_stopping"
    running.clock.advance(timedelta(seconds=30))
    assert ok(alice.am.Status([urn], creds, {}))["geni_slivers"][0]["geni_operational_status"] == "geni_notready"


def test_injected_boot_failure_reaches_geni_error(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("failing")
    running.failures.fail_on_start["a"] = "emulated disk failure on pc1"
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {}))
    ok(alice.am.Provision([urn], creds, {}))
    ok(alice.am.PerformOperationalAction([urn], creds, "geni_start", {}))
    running.clock.advance(timedelta(seconds=30))
    sliver = ok(alice.am.Status([urn], creds, {}))["geni_slivers"][0]
    assert sliver["geni_operational_status"] == "geni_failed"
    assert "disk failure" in sliver["geni_error"]


def test_shutdown_refuses_further_changes(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("shut")
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {}))
    assert ok(alice.am.Shutdown(urn, creds, {})) is True
    assert code(alice.am.Allocate(urn, creds, request_rspec([vm("b")]), {})) == 7


def test_allocation_expires_and_reaper_releases_without_any_call(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("reaped")
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {}))
    assert running.deployment.sm.usage_keys()
    running.clock.advance(timedelta(minutes=11))
    deadline = time.monotonic() + 5
    while running.deployment.sm.usage_keys() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running.deployment.sm.usage_keys() == set()


def test_status_of_an_expired_allocation_says_it_expired(running):
    """Status after the allocation's term ended says so (it said "has no slivers here", as for a slice that
    never had any); after the owner's Delete it does not claim expiry."""
    alice = running.user("alice")
    urn, creds = alice.slice_credential("lapsed")
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {}))
    running.clock.advance(timedelta(minutes=11))
    deadline = time.monotonic() + 5
    while running.deployment.sm.usage_keys() and time.monotonic() < deadline:
        time.sleep(0.05)
    reply = alice.am.Status([urn], creds, {})
    assert code(reply) == 12 and "ended by themselves" in reply["output"] and "term ended" in reply["output"], reply
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("b")]), {}))
    ok(alice.am.Delete([urn], creds, {}))
    reply = alice.am.Status([urn], creds, {})
    assert code(reply) == 12 and "ended by themselves" not in reply["output"], reply


def test_insufficient_nodes_names_what_was_short(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("toomany")
    req = request_rspec([{"client_id": f"b{i}", "sliver_type": "raw-pc"} for i in range(3)])
    reply = alice.am.Allocate(urn, creds, req, {})
    assert code(reply) == 26
    assert "bare metal" in reply["output"] and "b2" in reply["output"]
    assert running.deployment.sm.usage_keys() == set()  # all-or-nothing


def test_requested_vlan_taken_is_vlan_unavailable(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("vlan1")
    lan = [{"client_id": "l", "ifaces": ["a:if0", "b:if0"], "vlantag": 1005}]
    req = request_rspec([vm("a", ifaces=["a:if0"]), vm("b", ifaces=["b:if0"])], lan)
    ok(alice.am.Allocate(urn, creds, req, {}))
    urn2, creds2 = alice.slice_credential("vlan2")
    reply = alice.am.Allocate(urn2, creds2, req, {})
    assert code(reply) == 24 and "1005" in reply["output"]


def test_bandwidth_beyond_interface_is_insufficient_bandwidth(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("bw")
    lan = [{"client_id": "l", "ifaces": ["a:if0", "b:if0"], "capacity": 50_000_000}]
    reply = alice.am.Allocate(urn, creds, request_rspec([vm("a", ifaces=["a:if0"]), vm("b", ifaces=["b:if0"])], lan), {})
    assert code(reply) == 25


def test_bound_request_manifest_keeps_component_ids(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("bound")
    pc2 = f"urn:publicid:IDN+{AUTHORITY}+node+pc2"
    value = ok(alice.am.Allocate(urn, creds, request_rspec([vm("x", component_id=pc2)]), {}))
    node = next(etree.fromstring(value["geni_rspec"].encode()).iter(f"{{{RSPEC3}}}node"))
    assert node.get("component_id") == pc2
    assert node.get("component_manager_id") == f"urn:publicid:IDN+{AUTHORITY}+authority+am"


def test_unknown_request_extensions_are_copied_into_the_manifest(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("ext")
    extra = '<foo:thing xmlns:foo="http://example.org/foo/1" level="3"><foo:inner/></foo:thing>'
    value = ok(alice.am.Allocate(urn, creds, request_rspec([vm("a", extra=extra)]), {}))
    assert 'level="3"' in value["geni_rspec"] and "foo:inner" in value["geni_rspec"]


def test_restart_keeps_slivers_and_enforces_expiry(running, pki_home):
    from tests.integration.conftest import start, stop

    alice = running.user("alice")
    urn, creds = alice.slice_credential("persist")
    ok(alice.am.Allocate(urn, creds, three_node_lan(), {}))
    urn2, creds2 = alice.slice_credential("persist2")
    ok(alice.am.Allocate(urn2, creds2, request_rspec([vm("later")]), {}))
    ok(alice.am.Provision([urn], creds, {}))
    before = ok(alice.am.Status([urn], creds, {}))["geni_slivers"]
    keys = running.deployment.sm.usage_keys()
    clock = running.clock
    distributed = bool(running.actors)
    stop(running)
    again = start(pki_home, clock=clock, distributed=distributed)
    try:
        alice2 = again.user("alice")
        after = ok(alice2.am.Status([urn], creds, {}))["geni_slivers"]
        assert sorted(before, key=str) == sorted(after, key=str)
        assert again.deployment.sm.usage_keys() == keys
        # a ticket issued before the restart still redeems: the broker's signing key persisted
        ok(alice2.am.Provision([urn2], creds2, {}))
        clock.advance(timedelta(days=2))
        assert code(alice2.am.Status([urn], creds, {})) == 12
        # the reaper closes what expired within its tick (0.05 s here; longer on a loaded host)
        deadline = time.monotonic() + 15
        while again.deployment.sm.usage_keys() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert again.deployment.sm.usage_keys() == set()
    finally:
        stop(again)
        running.deployment, running.actors = again.deployment, again.actors  # teardown stops them harmlessly


def test_speaks_for_lets_a_tool_act_for_a_user(running):
    from slicex.speaksfor import create_speaks_for

    alice, tool = running.user("alice"), running.user("bob")
    urn, creds = alice.slice_credential("spoken")
    statement = create_speaks_for(alice.cert.read_bytes(), alice.key.read_bytes(), tool.cert.read_bytes(),
                                  running.clock.now() + timedelta(hours=1))
    abac = [{"geni_type": "geni_abac", "geni_version": "1", "geni_value": statement}]
    options = {"geni_speaking_for": alice.urn}
    value = ok(tool.am.Allocate(urn, creds + abac, request_rspec([vm("a")]), options))
    assert len(value["geni_slivers"]) == 1
    assert code(tool.am.Status([urn], creds, {})) == 22  # without speaks-for the tool is not alice
    assert code(tool.am.Status([urn], creds, options)) == 20  # speaks-for named but no statement sent
    ok(tool.am.Delete([urn], creds + abac, options))


def test_describe_geni_compressed(running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("packed")
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("a")]), {}))
    plain = ok(alice.am.Describe([urn], creds, {"geni_rspec_version": RSPEC_V3}))["geni_rspec"]
    packed = ok(alice.am.Describe([urn], creds, {"geni_rspec_version": RSPEC_V3, "geni_compressed": True}))
    assert client_ids(zlib.decompress(base64.b64decode(packed["geni_rspec"])).decode()) == client_ids(plain) == {"a"}


def test_first_reaper_pass_runs_before_a_restarted_aggregate_answers(running, pki_home):
    """An allocation that expired while the aggregate was down is free in ListResources the moment the
    restarted aggregate answers (issue 22: it looked taken for 1-2 s after `up --detach` returned). The
    restarted deployment's clock ticks every 300 s, so only a pass made before it answered can free it."""
    from tests.integration.conftest import start, stop

    alice = running.user("alice")
    urn, scred = alice.slice_credential("expired-while-down")
    bm = f"urn:publicid:IDN+{AUTHORITY}+node+bm1"
    ok(alice.am.Allocate(urn, scred, request_rspec([{"client_id": "b", "component_id": bm,
                                                      "sliver_type": "raw-pc"}]), {}))
    clock, distributed = running.clock, bool(running.actors)
    stop(running)
    clock.advance(timedelta(minutes=11))  # past the allocation's 10 minutes
    config = pki_home.root / "slicex.yaml"
    cfg = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**cfg, "tick_seconds": 300}))
    again = start(pki_home, clock=clock, distributed=distributed)
    try:
        alice2 = again.user("alice")
        ad = ok(alice2.am.ListResources(alice2.user_credential(), {"geni_rspec_version": RSPEC_V3,
                                                                   "geni_available": True}))
        assert bm in {n.get("component_id") for n in etree.fromstring(ad.encode()).iter(f"{{{RSPEC3}}}node")}
    finally:
        stop(again)
        config.write_text(yaml.safe_dump(cfg))
        running.deployment, running.actors = again.deployment, again.actors  # teardown stops them harmlessly
