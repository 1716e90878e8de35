"""What each actor publishes for the dashboard (operations/snapshot.py), built from a real in-process slice manager,
broker and authority on SQLite: slices with links and tags, tickets, leases with their driver's state."""

from __future__ import annotations

from datetime import timedelta

from cryptography.hazmat.primitives.asymmetric import rsa

from authority.substrate.emulated import EmulatedDriver
from deployment.actors import ActorKeys, embedded_slice_manager
from operations.snapshot import (
    StatusCache,
    authority_state,
    broker_state,
    publishers_for,
    read_snapshots,
    slice_manager_state,
)
from rspec.request import parse_request
from rspec.substrate import default_substrate
from slicex.clock import ManualClock
from slicex.store.sqlite_store import SqliteStore
from tests.factories import three_node_lan

SLICE = "urn:publicid:IDN+t.org+slice+s1"
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
SUB = default_substrate("t.org")


def test_each_actor_publishes_its_own_state(tmp_path):
    store = SqliteStore(str(tmp_path / "s.db"))
    now = ManualClock().now()
    asm = embedded_slice_manager(store, SUB, EmulatedDriver(SUB), keys=ActorKeys.given(KEY))
    slivers = asm.allocate(SLICE, "urn:o", parse_request(three_node_lan()), now + timedelta(minutes=10), now)
    asm.provision([s.urn for s in slivers], now + timedelta(hours=2), [], now)

    sm = slice_manager_state(asm, now)
    mine = sm["slices"][SLICE]["slivers"]
    assert sorted(s["client_id"] for s in mine) == ["lan0", "n1", "n2", "n3"]
    lan = next(s for s in mine if s["kind"] == "link")
    assert isinstance(lan["details"]["vlan_tag"], int) and sorted(lan["details"]["endpoints"]) == ["n1", "n2", "n3"]
    assert {s["allocation_state"] for s in mine} == {"geni_provisioned"}
    assert all(s["ticket"] and s["lease"] for s in mine) and sm["leases_held"] == 4
    assert sm["point"]["units"]["vlan"] >= 1 and sm["use"]["vlans"]

    broker = broker_state(asm.broker, now)
    assert broker["ticket_states"] == {"active": 4} and {t["holder"] for t in broker["tickets"]} == {asm.name}

    calls: list[str] = []
    real = asm.authority.status

    def counted(lease_id, when):
        calls.append(lease_id)
        return real(lease_id, when)
    asm.authority.status = counted
    mono = [0.0]
    cache = StatusCache(asm.authority, 5.0, lambda: mono[0])
    auth = authority_state(asm.authority, now, cache)
    assert len(auth["leases"]) == 4 and {x["operational_state"] for x in auth["leases"]} <= {
        "geni_notready", "geni_configuring", "geni_ready"}
    authority_state(asm.authority, now, cache)
    assert len(calls) == 4  # the driver is asked once per lease per interval, not on every tick
    mono[0] = 5.0
    authority_state(asm.authority, now, cache)
    assert len(calls) == 8

    for p in publishers_for(store, asm, asm.broker, asm.authority):
        assert p.publish(now)
    assert {d["role"] for d in read_snapshots(store)} == {"slice-manager", "broker", "authority"}
    store.close()
