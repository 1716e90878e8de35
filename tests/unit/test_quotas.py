"""Service levels (operations/quotas.py) and the ledger (operations/ledger.py) over a real in-process slice manager on SQLite:
the config is checked with errors naming the key, refusals name the limit and take nothing, usage records
open at Allocate and end at Delete, Shutdown and expiry, and concurrent Allocates cannot both pass a limit."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from authority.substrate.emulated import EmulatedDriver
from deployment.actors import ActorKeys, embedded_slice_manager
from operations.ledger import OPEN, Ledger
from operations.quotas import Limits, check_amounts, lease_end, policy_from_config, request_amounts
from resources.kind import Amounts
from rspec.request import parse_request
from rspec.substrate import default_substrate
from slicex.clock import ManualClock
from slicex.errors import BadArgs, Forbidden, OutOfRange
from slicex.store.sqlite_store import SqliteStore
from slicex.urn import canonical_urn
from tests.factories import request_rspec, three_node_lan, vm

SUB = default_substrate("t.org")
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
ALICE = "urn:publicid:IDN+t.org+user+alice"
BOB = "urn:publicid:IDN+t.org+user+bob"
PROJ = "urn:publicid:IDN+t.org+project+proj1"
SLICE = "urn:publicid:IDN+t.org:proj1+slice+s1"
MIN = timedelta(minutes=1)


def two_vms(size: str = "default-vm") -> str:
    return request_rspec([vm("a", sliver_type=size), vm("b", sliver_type=size)])


# ---- config -----------------------------------------------------------------------------------------------------
def test_entries_override_the_default_limit_by_limit_and_null_lifts_one():
    policy = policy_from_config({"users": {"default": {"cores": 8, "lease_hours": 24},
                                           "urn:publicid:IDN+T.ORG+user+alice": {"cores": 16, "lease_hours": None}},
                                 "projects": {PROJ: {"vlans": 2}}})
    assert policy.for_user(ALICE) == Limits(cores=16)
    assert policy.for_user(BOB) == Limits(cores=8, lease=timedelta(hours=24))
    assert policy.for_project("urn:publicid:IDN+T.org+project+proj1") == Limits(vlans=2)
    assert policy.for_project("urn:publicid:IDN+t.org+project+other") == Limits()
    assert policy.for_project(None) == Limits()
    assert policy_from_config(None).empty


@pytest.mark.parametrize("section, says", [
    ({"users": {"default": {"cpus": 4}}}, "quotas.users.default: unknown limit 'cpus'"),
    ({"users": {ALICE: {"cores": "four"}}}, f"quotas.users.{ALICE}.cores: expected a whole number"),
    ({"users": {ALICE: {"cores": -1}}}, "expected a whole number >= 0"),
    ({"users": {ALICE: {"cores": 1.5}}}, "expected a whole number"),
    ({"users": {ALICE: {"lease_hours": True}}}, "expected a number of hours"),
    ({"projects": {ALICE: {"cores": 1}}}, "quotas.projects: " + repr(ALICE) + " is a user URN; a project URN"),
    ({"users": {"alice": {"cores": 1}}}, "quotas.users: 'alice' is not a GENI URN"),
    ({"user": {}}, "quotas: unknown key(s) user"),
    ({"users": [1]}, "quotas.users: expected a mapping"),
])
def test_a_wrong_config_names_the_key(section, says):
    with pytest.raises(BadArgs) as err:
        policy_from_config(section)
    assert says in err.value.message


# ---- pure checks --------------------------------------------------------------------------------------------------
def test_a_request_counts_vm_sizes_bare_metal_links_and_capacity():
    assert request_amounts(SUB, parse_request(three_node_lan())) == Amounts(cores=3, memory_mb=3072, nodes=3, vlans=1, disk_gb=30)
    medium = parse_request(request_rspec([vm("a", sliver_type="m1.medium", ifaces=["a:0"]),
                                          vm("b", ifaces=["b:0"])],
                                         [{"client_id": "l", "ifaces": ["a:0", "b:0"], "capacity": 20000}]))
    assert request_amounts(SUB, medium) == Amounts(cores=3, memory_mb=5120, nodes=2, vlans=1, bandwidth_kbps=20000,
                                                  disk_gb=50)


def test_the_refusal_names_each_limit_passed_with_what_is_held_and_asked():
    policy = policy_from_config({"users": {ALICE: {"cores": 10, "nodes": 2}}, "projects": {PROJ: {"cores": 4}}})
    with pytest.raises(Forbidden) as err:
        check_amounts(ALICE, PROJ, policy, Amounts(cores=1, nodes=1), Amounts(cores=3), Amounts(cores=2, nodes=2))
    assert err.value.code == 3
    assert err.value.message.startswith(f"quota exceeded: user {ALICE} may hold 2 nodes (holds 1, asked 2); "
                                        f"project {PROJ} may hold 4 cores (holds 3, asked 2)")
    check_amounts(ALICE, PROJ, policy, Amounts(cores=1), Amounts(cores=2), Amounts(cores=2, nodes=1))  # at the limit


def test_a_lease_past_the_limit_is_cut_when_defaulted_and_out_of_range_when_asked():
    policy = policy_from_config({"projects": {PROJ: {"lease_hours": 2}}})
    t0 = ManualClock().now()
    end, note = lease_end(ALICE, PROJ, policy, t0, t0 + timedelta(hours=24), t0, cut=True)
    assert end == t0 + timedelta(hours=2) and f"project {PROJ} may hold a sliver for 2 hours" in note
    with pytest.raises(OutOfRange) as err:
        lease_end(ALICE, PROJ, policy, t0, t0 + timedelta(hours=3), t0, cut=False)
    assert err.value.code == 19 and "may hold a sliver for 2 hours" in err.value.message
    with pytest.raises(OutOfRange):  # already at its limit: nothing left to extend to
        lease_end(ALICE, PROJ, policy, t0, t0 + timedelta(hours=3), t0 + timedelta(hours=2), cut=True)
    assert lease_end(ALICE, None, policy, t0, t0 + timedelta(hours=3), t0, cut=False)[0] == t0 + timedelta(hours=3)


# ---- the ledger over a slice manager ------------------------------------------------------------------------------
@pytest.fixture
def world(tmp_path):
    store = SqliteStore(str(tmp_path / "s.db"))
    clock = ManualClock()
    asm = embedded_slice_manager(store, SUB, EmulatedDriver(SUB), keys=ActorKeys.given(KEY))
    return store, clock, asm


def allocate(ledger: Ledger, asm, user: str, slice_urn: str, rspec: str, now, minutes: int = 10):
    request = parse_request(rspec)
    return ledger.allocate(user, slice_urn, request, now, now + minutes * MIN, False,
                           lambda e: asm.allocate(slice_urn, user, request, e, now))


def test_allocate_past_a_project_limit_is_forbidden_and_takes_nothing(world):
    store, clock, asm = world
    ledger = Ledger(store, SUB, policy_from_config({"projects": {PROJ: {"cores": 3}}}))
    now = clock.now()
    slivers = allocate(ledger, asm, ALICE, SLICE, two_vms(), now)
    claims = dict(store.all_claims())
    with pytest.raises(Forbidden) as err:
        allocate(ledger, asm, BOB, "urn:publicid:IDN+t.org:proj1+slice+s2", two_vms(), now)
    assert f"quota exceeded: project {PROJ} may hold 3 cores (holds 2, asked 2)" in err.value.message
    assert store.all_claims() == claims and len(ledger.open_records()) == 2
    # another project, and a slice outside any project, are not held to proj1's limit
    allocate(ledger, asm, BOB, "urn:publicid:IDN+t.org+slice+s3", two_vms(), now)
    assert {r.project for r in ledger.open_records()} == {PROJ, None}
    asm.delete([s.urn for s in slivers], now)
    ledger.ended([s.urn for s in slivers], now + 5 * MIN, "deleted")
    allocate(ledger, asm, BOB, "urn:publicid:IDN+t.org:proj1+slice+s2", two_vms(), now + 5 * MIN)  # room again


def test_records_open_at_allocate_and_end_at_delete_shutdown_and_expiry(world):
    store, clock, asm = world
    ledger = Ledger(store, SUB)
    now = clock.now()
    lan = allocate(ledger, asm, ALICE, SLICE, three_node_lan(), now)
    by_kind = {r.client_id: r for r in ledger.open_records()}
    assert by_kind["n1"].amounts == Amounts(cores=1, memory_mb=1024, nodes=1, disk_gb=10)
    assert by_kind["lan0"].amounts == Amounts(vlans=1) and by_kind["n1"].user == ALICE
    assert by_kind["n1"].project == PROJ and by_kind["n1"].expires == now + 10 * MIN

    provisioned = asm.provision([s.urn for s in lan], now + 60 * MIN, [], now)
    ledger.extended(provisioned)
    assert {r.expires for r in ledger.open_records()} == {now + 60 * MIN}
    clock.advance(30 * MIN)
    n1 = next(s for s in lan if s.client_id == "n1")
    ended = ledger.ended([n1.urn], clock.now(), "deleted")
    assert ended[0].end == now + 30 * MIN and ended[0].end_reason == "deleted"

    other = allocate(ledger, asm, BOB, "urn:publicid:IDN+t.org+slice+s2", two_vms(), clock.now())
    shut = ledger.shut_down("urn:publicid:IDN+t.org+slice+S2", clock.now())
    assert {r.sliver_urn for r in shut} == {s.urn for s in other} and {r.end_reason for r in shut} == {"shut down"}
    assert not {s.urn for s in other} & {r.sliver_urn for r in ledger.open_records()}

    # the rest of the LAN expires: the reaper's reconcile ends it at its expiry, not when it noticed
    clock.advance(45 * MIN)
    asm.reap(clock.now())
    assert ledger.sweep(lambda urn: False, clock.now()) and ledger.swept  # nothing live: all the open ones end
    assert ledger.open_records() == [] and store.scan(OPEN) == []
    ends = {r.client_id: (r.end, r.end_reason) for r in ledger.records() if r.slice_urn == canonical_urn(SLICE)}
    assert ends["n2"] == (now + 60 * MIN, "expired") and ends["n1"] == (now + 30 * MIN, "deleted")


def test_the_sweep_keeps_what_the_slice_manager_still_holds(world):
    store, clock, asm = world
    ledger = Ledger(store, SUB)
    allocate(ledger, asm, ALICE, SLICE, two_vms(), clock.now())
    assert ledger.sweep(asm.holds, clock.now()) == [] and len(ledger.open_records()) == 2
    clock.advance(11 * MIN)  # allocation expired
    asm.reap(clock.now())
    gone = ledger.sweep(asm.holds, clock.now())
    assert {r.end for r in gone} == {clock.now() - MIN} and {r.end_reason for r in gone} == {"expired"}


def test_concurrent_allocates_of_one_user_cannot_both_pass_the_limit(world):
    store, clock, asm = world
    ledger = Ledger(store, SUB, policy_from_config({"users": {ALICE: {"nodes": 2}}}))
    now = clock.now()
    outcomes: list[str] = []
    start = threading.Barrier(4)

    def one(i: int) -> None:
        start.wait()
        try:
            allocate(ledger, asm, ALICE, f"urn:publicid:IDN+t.org+slice+c{i}", two_vms(), now)
            outcomes.append("ok")
        except Forbidden:
            outcomes.append("forbidden")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["forbidden"] * 3 + ["ok"]
    assert len(ledger.open_records()) == 2 and not [k for k in store.all_claims() if k.startswith("quota-lock:")]


def test_an_update_is_charged_for_new_nodes_and_links_and_a_replaced_links_larger_capacity():
    from operations.quotas import update_amounts

    desired = parse_request(request_rspec([vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0", "n2:if1"]),
                                           vm("n3", ifaces=["n3:if0"])],
                                          [{"client_id": "l1", "ifaces": ["n1:if0", "n2:if0"], "capacity": 900000},
                                           {"client_id": "l2", "ifaces": ["n2:if1", "n3:if0"], "capacity": 500}]))
    named = {"n1": Amounts(cores=1, memory_mb=1024, nodes=1), "n2": Amounts(cores=1, memory_mb=1024, nodes=1),
             "l1": Amounts(vlans=1, bandwidth_kbps=1000)}
    n3 = request_amounts(SUB, parse_request(request_rspec([vm("n3", ifaces=["n3:if0"])])))
    assert update_amounts(SUB, desired, named) == n3 + Amounts(vlans=1, bandwidth_kbps=899000 + 500)
    # a link going down and nodes kept: nothing more
    smaller = parse_request(request_rspec([vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0"])],
                                          [{"client_id": "l1", "ifaces": ["n1:if0", "n2:if0"], "capacity": 10}]))
    assert update_amounts(SUB, smaller, named) == Amounts()
    with pytest.raises(Forbidden, match="may hold 10000 kbps of bandwidth .holds 1000, asked 899500"):
        check_amounts(ALICE, None, policy_from_config({"users": {"default": {"bandwidth_kbps": 10000}}}),
                      Amounts(vlans=1, bandwidth_kbps=1000), Amounts(), update_amounts(SUB, desired, named))


class CountingStore:
    """A store that counts reads per (method, table) and forwards everything."""

    def __init__(self, store):
        self._store, self.reads = store, {}

    def _count(self, method, table):
        self.reads[(method, table)] = self.reads.get((method, table), 0) + 1

    def get(self, table, key):
        self._count("get", table)
        return self._store.get(table, key)

    def scan(self, table, prefix=""):
        self._count("scan", table)
        return self._store.scan(table, prefix)

    def __getattr__(self, name):
        return getattr(self._store, name)


def test_settle_reads_only_the_usage_of_slivers_ended_or_expired(world):
    """The reaper's per-tick `settle` reads the usage of the slivers it ended and of those the time index says
    expired, never every open record: one Delete among eight slices reads one open record."""
    store, clock, asm = world
    ledger = Ledger(store, SUB)
    now = clock.now()
    slices = [allocate(ledger, asm, ALICE, f"urn:publicid:IDN+t.org:proj1+slice+s{i}", request_rspec([vm("a")]),
                       now, minutes=10 + i) for i in range(8)]
    counting = CountingStore(store)
    ledger.store = counting
    gone = asm.delete([slices[0][0].urn], now)
    assert ledger.settle([s.urn for s in gone], asm.holds, now)[0].sliver_urn == slices[0][0].urn
    assert counting.reads == {("get", OPEN): 1}
    assert ledger.settle([], asm.holds, now) == [] and counting.reads == {("get", OPEN): 1}  # nothing due: no read

    clock.advance(12 * MIN + timedelta(seconds=30))  # s1 and s2 expired; nobody told the ledger
    asm.reap(clock.now())
    counting.reads.clear()
    ended = ledger.settle([], asm.holds, clock.now())
    assert sorted((r.slice_urn[-2:], r.end, r.end_reason) for r in ended) == [
        ("s1", now + 11 * MIN, "expired"), ("s2", now + 12 * MIN, "expired")]
    assert counting.reads == {("get", OPEN): 2}
    assert len(ledger.open_records()) == 5


def test_settle_keeps_a_sliver_still_held_and_agrees_with_reconcile(world):
    store, clock, asm = world
    ledger = Ledger(store, SUB)
    now = clock.now()
    kept = allocate(ledger, asm, ALICE, SLICE, request_rspec([vm("a")]), now)
    other = allocate(ledger, asm, BOB, "urn:publicid:IDN+t.org+slice+s2", request_rspec([vm("b")]), now)
    asm.provision([s.urn for s in kept], now + 60 * MIN, [], now)  # held past its usage record's expiry
    clock.advance(11 * MIN)
    gone = asm.reap(clock.now())
    assert {s.urn for s in other} <= set(gone) | {r.sliver_urn for r in ledger.open_records()}
    ended = ledger.settle(gone, asm.holds, clock.now())
    assert {r.sliver_urn for r in ended} == {s.urn for s in other}
    assert ledger.sweep(asm.holds, clock.now()) == []  # the rotating check finds nothing more
    assert {r.sliver_urn for r in ledger.open_records()} == {s.urn for s in kept}


def test_the_time_index_step_files_open_records_of_an_older_layout(world):
    """Open usage records written before the time index (no `due`) are filed by the migration step `time
    index` (deployment/migrations.py), so `settle` finds them when they expire."""
    from deployment.migrations import time_index

    store, clock, asm = world
    ledger = Ledger(store, SUB)
    now = clock.now()
    slivers = allocate(ledger, asm, ALICE, SLICE, request_rspec([vm("a")]), now)
    doc = store.get(OPEN, slivers[0].urn)
    store.put(OPEN, slivers[0].urn, doc)  # as an older version wrote it: not in the time index
    assert store.due(OPEN, (now + 20 * MIN).timestamp()) == []
    assert time_index(store) > 0
    assert [k for k, _ in store.due(OPEN, (now + 20 * MIN).timestamp())] == [slivers[0].urn]
    clock.advance(11 * MIN)
    asm.reap(clock.now())
    assert [r.end_reason for r in ledger.settle([], asm.holds, clock.now())] == ["expired"]
