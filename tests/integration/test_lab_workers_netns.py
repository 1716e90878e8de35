"""A distributed deployment whose AM workers run on two lab hosts against one Redis (docs/operator-guide.md
"AM workers on several hosts"): host A runs `slicex up --distributed` (broker, authority, an AM worker), host B
`slicex am-worker --join` from a copy of A's home (same CA, users, config, deployment id), reaching the actors
over the fibre at A's address (`broker_url`, `authority_url`) and the Redis through the lab's relay.

A slice allocated through either host's AM is seen, provisioned and deleted through the other's; B's worker
killed (SIGKILL) mid-Allocate and started again leaves nothing allocated: no broker promise, no authority
lease, no lock or sliver claim in Redis.

Needs what the lab needs; skipped, saying which is missing, only where the machine lacks it. Takes the lab
chain's host-wide lock (tests/conftest.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lab import edge, line, running
from slicex.home import Home
from slicex.store.redis_store import RedisStore
from slicex.tls_xmlrpc import client
from tests.factories import request_rspec, vm

# switches, servers and routers only inside lab hosts: tests/conftest.py's lab chain, beside the root namespace's
USES_HOST_NETWORK = "lab"
REDIS_URL = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/14")
AUTHORITY = "xw.lab"
WORKER_ROLE = "am-worker-joined"


def _pid_record(home: Path, role: str) -> dict | None:
    try:
        return json.loads((home / "run" / f"{role}.pid").read_text())
    except (OSError, ValueError):
        return None


def _join(host, home: Path) -> subprocess.Popen:
    """`slicex am-worker --join` on `host`, waiting until it serves (its pid record names its AM)."""
    (home / "run" / f"{WORKER_ROLE}.pid").unlink(missing_ok=True)
    log = open(home / "joined.log", "ab")
    proc = host.popen([sys.executable, "-m", "cli", "--home", str(home), "am-worker", "--join"], home=home,
                      stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 90
    while _pid_record(home, WORKER_ROLE) is None:
        assert proc.poll() is None, (home / "joined.log").read_text()[-3000:]
        assert time.monotonic() < deadline, (home / "joined.log").read_text()[-3000:]
        time.sleep(0.2)
    return proc


@pytest.fixture(scope="module")
def deployment():
    missing = edge.missing_capabilities()
    if missing:
        pytest.skip("the lab needs: " + "; ".join(missing))
    RedisStore(REDIS_URL).flush()
    with running(line("xw", hosts=2, rate_mbit=1000), REDIS_URL) as lab:
        a, b = lab.hosts["h1"], lab.hosts["h2"]
        home_a = a.make_home(AUTHORITY, tick_seconds=0.2, dashboard_port=None, store=a.redis_url)
        a.slicex(home_a, "up", "--distributed", "--detach", timeout=180)
        # host B: a copy of A's home (its CA, users, keys, deployment id), serving on B's own address and
        # calling the actors over the fibre on A's
        home_b = b.joined_home(home_a, a)
        (home_b / "run").mkdir(exist_ok=True)
        state = [lab, {"h1": home_a, "h2": home_b}, _join(b, home_b)]  # a test may start the worker again
        try:
            yield state
        finally:
            record = _pid_record(home_b, WORKER_ROLE)
            if record:
                try:
                    os.kill(record["pid"], signal.SIGTERM)
                except ProcessLookupError:
                    pass
            state[2].wait(timeout=30)
    RedisStore(REDIS_URL).flush()


def _am(lab, homes, name: str):
    h = Home(homes["h1"])
    return client(lab.hosts[name].am_url(homes[name]), str(h.user_cert("alice")), str(h.user_key("alice")),
                  timeout=120)


def _credential(lab, homes, slice_name: str) -> tuple[str, list]:
    h = Home(homes["h1"])
    sa = client(f"https://{lab.hosts['h1'].address}:8000/", str(h.user_cert("alice")), str(h.user_key("alice")))
    urn = f"urn:publicid:IDN+{AUTHORITY}+slice+{slice_name}"
    return urn, [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": sa.CreateSlice(urn)}]


def _ok(reply: dict) -> dict:
    assert reply["code"]["geni_code"] == 0, reply.get("output")
    return reply


def _held() -> dict:
    """What Redis holds for slivers and locks (the slice authority's own records aside)."""
    return {k: v for k, v in RedisStore(REDIS_URL).all_claims().items() if not k.startswith("sa_slice:")}


def _actors_hold() -> dict:
    """What the broker and the authority still hold in their own records: tickets whose units are claimed,
    leases that are active."""
    from authority.actor import LEASES
    from broker.broker import TICKETS
    from slicex.store import open_store

    store = open_store(REDIS_URL)
    try:
        tickets = [d["ticket"] for d in store.scan(TICKETS) if d.get("claimed", True) and
                   d.get("state") not in ("closed", "relinquished", "failed")]
        leases = [d["lease"] for d in store.scan(LEASES) if d.get("state") == "active"]
    finally:
        store.close()
    return {k: v for k, v in (("tickets", tickets), ("leases", leases)) if v}


@pytest.mark.parametrize("first,second", [("h2", "h1"), ("h1", "h2")])
def test_a_slice_allocated_through_one_hosts_worker_is_provisioned_and_deleted_through_the_others(
        deployment, first, second):
    lab, homes, _ = deployment
    urn, cred = _credential(lab, homes, f"x{first}")
    one, other = _am(lab, homes, first), _am(lab, homes, second)
    got = _ok(one.Allocate(urn, cred, request_rspec([vm("n1")]), {}))
    slivers = {s["geni_sliver_urn"] for s in got["value"]["geni_slivers"]}
    seen = _ok(other.Describe([urn], cred, {"geni_rspec_version": {"type": "GENI", "version": "3"}}))
    assert {s["geni_sliver_urn"] for s in seen["value"]["geni_slivers"]} == slivers
    assert all(s["geni_allocation_status"] == "geni_allocated" for s in seen["value"]["geni_slivers"])
    provisioned = _ok(other.Provision([urn], cred, {}))
    assert all(s["geni_allocation_status"] == "geni_provisioned" for s in provisioned["value"]["geni_slivers"])
    status = _ok(one.Status([urn], cred, {}))
    assert {s["geni_sliver_urn"] for s in status["value"]["geni_slivers"]} == slivers
    _ok(other.Delete([urn], cred, {}))
    gone = one.Status([urn], cred, {})
    assert gone["code"]["geni_code"] == 12 or all(
        s["geni_allocation_status"] == "geni_unallocated" for s in gone["value"]["geni_slivers"]), gone
    assert _held() == {} and _actors_hold() == {}


def _settled(lab, homes, urn: str, cred: list) -> dict:
    """Status at h1's AM once no slice manager works on the slice (no reservation lock in Redis)."""
    deadline = time.monotonic() + 60
    while any(k.startswith("sm-lock:") for k in _held()):
        assert time.monotonic() < deadline, _held()
        time.sleep(0.25)
    return _am(lab, homes, "h1").Status([urn], cred, {})


def test_kill_9_of_the_other_hosts_worker_mid_allocate_converges_and_delete_leaves_nothing(deployment):
    """The broker on h1 is stopped (SIGSTOP) while h2's worker waits on it in Allocate; h2's worker dies
    (SIGKILL); the broker goes on, and h2's worker, started again under the same slice manager name, settles
    its own unfinished work as recovery does on one host (the unanswered ticket message is delivered again:
    slice_manager/recovery.py): both AMs then tell the same story, the broker holds exactly the tickets of
    the slivers they show, the authority no lease, and a Delete at h1 leaves nothing in either actor's records
    or in Redis."""
    lab, homes, worker = deployment
    urn, cred = _credential(lab, homes, "xkill")
    broker = _pid_record(homes["h1"], "broker")
    joined = _pid_record(homes["h2"], WORKER_ROLE)
    answer: dict = {}

    def allocate() -> None:
        try:
            answer["reply"] = _am(lab, homes, "h2").Allocate(urn, cred, request_rspec([vm("n1")]), {})
        except Exception as exc:  # noqa: BLE001 - the worker dies under the call: asserted below
            answer["error"] = exc

    os.kill(broker["pid"], signal.SIGSTOP)
    try:
        t = threading.Thread(target=allocate)
        t.start()
        deadline = time.monotonic() + 20
        while not any(k.startswith("sm-lock:") for k in _held()):  # h2's slice manager works on it
            assert time.monotonic() < deadline and t.is_alive(), (answer, _held())
            time.sleep(0.05)
        os.kill(joined["pid"], signal.SIGKILL)
        t.join(30)
        assert "error" in answer, answer  # the client saw its connection drop, never an answer
    finally:
        os.kill(broker["pid"], signal.SIGCONT)
    worker.wait(10)
    deployment[2] = _join(lab.hosts["h2"], homes["h2"])
    at_h1 = _settled(lab, homes, urn, cred)
    at_h2 = _am(lab, homes, "h2").Status([urn], cred, {})
    assert at_h1["code"]["geni_code"] == at_h2["code"]["geni_code"], (at_h1, at_h2)
    slivers = at_h1["value"]["geni_slivers"] if at_h1["code"]["geni_code"] == 0 else []
    assert at_h1["code"]["geni_code"] == 12 or slivers, at_h1
    assert all(s["geni_allocation_status"] == "geni_allocated" for s in slivers), slivers
    if slivers:
        assert [s["geni_sliver_urn"] for s in at_h2["value"]["geni_slivers"]] == \
            [s["geni_sliver_urn"] for s in slivers]
    held = _actors_hold()
    assert "leases" not in held and len(held.get("tickets", [])) == len(slivers), held
    if slivers:
        _ok(_am(lab, homes, "h1").Delete([urn], cred, {}))
    deadline = time.monotonic() + 30
    while (held := {**_held(), **_actors_hold()}) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert held == {}
    for name in ("h1", "h2"):
        assert _am(lab, homes, name).Status([urn], cred, {})["code"]["geni_code"] == 12, name
