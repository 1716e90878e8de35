"""An experimenter cannot pass his quota through Update, on both deployments (embedded SQLite, distributed
Redis), over mutual TLS as omni calls it.

Before, under `bandwidth_kbps: 10000` a link allocated at 1,000 kbps and updated to 900,000 kbps was
provisioned and the ledger then held 901,000 (the replaced link's capacity was never charged, the old one never
released); under `nodes: 2` an Update adding a third node was staged and committed. Now an Update is charged for
what it adds (new nodes and links, a replaced link's larger capacity) under the same count locks as Allocate,
a commit ends the records of what it removed, and Cancel or an expiry ends the records of what it added."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from operations.accounting import held_now
from slicex.home import Home
from tests.factories import request_rspec, vm
from tests.integration.conftest import AUTHORITY, Running, deployment
from tests.integration.test_am_api import code, ok
from tests.security.test_quota_atomicity import peer_home, peered  # noqa: F401 - pytest fixtures

RSPEC_V3 = {"type": "GENI", "version": "3"}
ALICE = f"urn:publicid:IDN+{AUTHORITY}+user+alice"


def pair(capacity: int) -> str:
    return request_rspec([vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0"])],
                         [{"client_id": "l1", "ifaces": ["n1:if0", "n2:if0"], "capacity": capacity}])


def triple(capacity: int, capacity2: int) -> str:
    """pair plus n3, linked to n2 by l2."""
    return request_rspec([vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0", "n2:if1"]),
                          vm("n3", ifaces=["n3:if0"])],
                         [{"client_id": "l1", "ifaces": ["n1:if0", "n2:if0"], "capacity": capacity},
                          {"client_id": "l2", "ifaces": ["n2:if1", "n3:if0"], "capacity": capacity2}])


@pytest.fixture(params=["embedded", "distributed"])
def limited(request, pki_home: Home, tmp_path: Path) -> Iterator[Running]:
    yield from deployment(request.param, pki_home, tmp_path,
                          quotas={"users": {"default": {"bandwidth_kbps": 10000, "nodes": 4}}})


def held(running: Running):
    """What alice holds now, as the quota check counts it."""
    return held_now(running.deployment.ledger.open_records(), ALICE, None)[0]


def capacities(running: Running, urn: str) -> list[int]:
    return sorted(int(s.details.get("capacity_kbps") or 0)
                  for s in running.deployment.sm.slivers(urn, running.clock.now()) if s.kind == "link")


def test_update_cannot_pass_a_bandwidth_or_node_quota(limited: Running):
    alice = limited.user("alice")
    urn, creds = alice.slice_credential("updq")
    ok(alice.am.Allocate(urn, creds, pair(1000), {}))
    ok(alice.am.Provision([urn], creds, {"geni_rspec_version": RSPEC_V3}))
    assert held(limited).bandwidth_kbps == 1000
    # the reported attack: the link replaced by one of 900,000 kbps
    reply = alice.am.Update([urn], creds, pair(900000), {})
    assert code(reply) == 3 and "10000 kbps of bandwidth" in reply["output"] and "asked 899000" in reply["output"]
    assert capacities(limited, urn) == [1000] and held(limited).bandwidth_kbps == 1000
    # three more nodes: 2 + 3 passes `nodes: 4`
    five = request_rspec([vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0"]), vm("n3"), vm("n4"), vm("n5")],
                         [{"client_id": "l1", "ifaces": ["n1:if0", "n2:if0"], "capacity": 1000}])
    reply = alice.am.Update([urn], creds, five, {})
    assert code(reply) == 3 and "4 nodes" in reply["output"] and "asked 3" in reply["output"]
    # a new link whose capacity together with what is held passes the limit
    reply = alice.am.Update([urn], creds, triple(1000, 9500), {})
    assert code(reply) == 3 and "asked 9500" in reply["output"]
    assert capacities(limited, urn) == [1000] and held(limited).nodes == 2
    assert limited.deployment.sm.pending_update(urn) is None


def test_update_charges_the_difference_and_the_ledger_follows_commit_cancel_and_expiry(limited: Running):
    alice = limited.user("alice")
    urn, creds = alice.slice_credential("updl")
    ok(alice.am.Allocate(urn, creds, pair(1000), {}))
    ok(alice.am.Provision([urn], creds, {"geni_rspec_version": RSPEC_V3}))
    # 1,000 -> 8,000: 7,000 more, within 10,000; while staged both links exist, the new one counts its difference
    ok(alice.am.Update([urn], creds, pair(8000), {}))
    assert capacities(limited, urn) == [1000, 8000] and held(limited).bandwidth_kbps == 8000
    ok(alice.am.Provision([urn], creds, {"geni_rspec_version": RSPEC_V3}))  # the commit ends the old link's record
    assert capacities(limited, urn) == [8000] and held(limited).bandwidth_kbps == 8000
    assert held(limited).vlans == 1
    # Cancel: the added link's record ends, what was held is as before
    ok(alice.am.Update([urn], creds, pair(9000), {}))
    assert held(limited).bandwidth_kbps == 9000
    ok(alice.am.Cancel([urn], creds, {}))
    assert capacities(limited, urn) == [8000] and held(limited).bandwidth_kbps == 8000
    # a smaller link, staged then reverted at its expiry: charged nothing more meanwhile, nothing after
    ok(alice.am.Update([urn], creds, pair(2000), {}))
    assert held(limited).bandwidth_kbps == 8000
    limited.clock.advance(timedelta(minutes=11))
    limited.deployment.sm.reap(limited.clock.now())
    assert capacities(limited, urn) == [8000]
    assert held(limited).bandwidth_kbps == 8000 and held(limited).vlans == 1
    # and a smaller one committed: the quota now has room again
    ok(alice.am.Update([urn], creds, pair(2000), {}))
    ok(alice.am.Provision([urn], creds, {"geni_rspec_version": RSPEC_V3}))
    assert capacities(limited, urn) == [2000] and held(limited).bandwidth_kbps == 2000
    ok(alice.am.Update([urn], creds, triple(2000, 8000), {}))  # 2,000 + 8,000 = the limit
    ok(alice.am.Provision([urn], creds, {"geni_rspec_version": RSPEC_V3}))
    assert held(limited).bandwidth_kbps == 10000 and held(limited).nodes == 3
    live = {s.urn for s in limited.deployment.sm.slivers(urn, limited.clock.now())}
    assert {r.sliver_urn for r in limited.deployment.ledger.open_records()} == live


def test_an_update_and_an_allocate_at_once_cannot_together_pass_a_limit(limited: Running):
    """alice's provisioned link of 1,000 kbps raised to 9,000 by Update while she Allocates a 5,000 kbps link
    in another slice, at once (each on its own connection): under 10,000 only one is admitted (before, the
    Update was charged nothing for the capacity, and both were)."""
    from tests.security.test_quota_atomicity import _codes, _together

    alice = limited.user("alice")
    urn, creds = alice.slice_credential("updrace")
    ok(alice.am.Allocate(urn, creds, pair(1000), {}))
    ok(alice.am.Provision([urn], creds, {"geni_rspec_version": RSPEC_V3}))
    other, other_creds = alice.slice_credential("updrace2")
    link = request_rspec([vm("m1", ifaces=["m1:if0"]), vm("m2", ifaces=["m2:if0"])],
                         [{"client_id": "k", "ifaces": ["m1:if0", "m2:if0"], "capacity": 5000}])
    first, second = limited.user("alice"), limited.user("alice")
    replies = _together([lambda: first.am.Update([urn], creds, pair(9000), {}),
                         lambda: second.am.Allocate(other, other_creds, link, {})])
    assert sorted(_codes(replies)) == [0, 3], replies
    assert held(limited).bandwidth_kbps in (9000, 6000)


def test_an_update_of_allocated_slivers_is_charged_and_released_at_once(limited: Running):
    alice = limited.user("alice")
    urn, creds = alice.slice_credential("updnow")
    ok(alice.am.Allocate(urn, creds, pair(1000), {}))
    reply = alice.am.Update([urn], creds, pair(20000), {})
    assert code(reply) == 3 and "asked 19000" in reply["output"]
    ok(alice.am.Update([urn], creds, pair(6000), {}))  # applied at once: the old link is given back now
    assert capacities(limited, urn) == [6000] and held(limited).bandwidth_kbps == 6000
    live = {s.urn for s in limited.deployment.sm.slivers(urn, limited.clock.now())}
    assert {r.sliver_urn for r in limited.deployment.ledger.open_records()} == live


def test_a_peers_user_cannot_pass_the_peers_quota_through_update(peered: Running, peer_home: Home):  # noqa: F811
    """A federation peer's user holds the peer's `max_nodes: 2`; an Update adding a third node is REFUSED (7)
    naming the rule, one replacing a link (no node, no sliver more at the commit) is admitted."""
    from slicex.tls_xmlrpc import client
    from tests.security.test_quota_atomicity import PEER, _slice_credential

    cert, key = peer_home.user_cert("pat"), peer_home.user_key("pat")
    urn, creds = _slice_credential(peer_home, PEER, cert, "pupd", peered.clock.now() + timedelta(days=1))
    am = client(peered.deployment.endpoints.am_url, str(cert), str(key))
    ok(am.Allocate(urn, creds, pair(1000), {}))
    ok(am.Provision([urn], creds, {"geni_rspec_version": RSPEC_V3}))
    reply = am.Update([urn], creds, triple(1000, 1000), {})
    assert code(reply) == 7 and "policy.max_nodes" in reply["output"]
    ok(am.Update([urn], creds, pair(2000), {}))
    ok(am.Provision([urn], creds, {"geni_rspec_version": RSPEC_V3}))
    assert capacities(peered, urn) == [2000]


@pytest.fixture(params=["embedded", "distributed"])
def peered_slivers(request, pki_home: Home, tmp_path: Path, peer_home: Home) -> Iterator[Running]:  # noqa: F811
    root = tmp_path / "testbed-a.pem"
    root.write_bytes(peer_home.ca_cert.read_bytes())
    yield from deployment(request.param, pki_home, tmp_path,
                          peers={"testbed-a": {"root": str(root), "namespaces": ["a.test"],
                                               "policy": {"max_slivers": 4}}})


def test_a_staged_replacing_link_is_not_one_more_sliver_for_the_peer(peered_slivers: Running,
                                                                     peer_home: Home):  # noqa: F811
    """Under `max_slivers: 4` a peer's user holds a pair (3 slivers) and stages a capacity change of its link:
    the peer still holds 3 (the commit or the revert drops one of the two l1), so a 1-node Allocate fits; a
    second one does not."""
    from slicex.tls_xmlrpc import client
    from tests.security.test_quota_atomicity import PEER, _slice_credential

    cert, key = peer_home.user_cert("pat"), peer_home.user_key("pat")
    expires = peered_slivers.clock.now() + timedelta(days=1)
    urn, creds = _slice_credential(peer_home, PEER, cert, "pslv", expires)
    am = client(peered_slivers.deployment.endpoints.am_url, str(cert), str(key))
    ok(am.Allocate(urn, creds, pair(1000), {}))
    ok(am.Provision([urn], creds, {"geni_rspec_version": RSPEC_V3}))
    ok(am.Update([urn], creds, pair(2000), {}))
    assert capacities(peered_slivers, urn) == [1000, 2000]
    one, one_creds = _slice_credential(peer_home, PEER, cert, "pslv2", expires)
    ok(am.Allocate(one, one_creds, request_rspec([vm("x")]), {}))
    two, two_creds = _slice_credential(peer_home, PEER, cert, "pslv3", expires)
    reply = am.Allocate(two, two_creds, request_rspec([vm("y")]), {})
    assert code(reply) == 7 and "policy.max_slivers" in reply["output"]
    ok(am.Provision([urn], creds, {"geni_rspec_version": RSPEC_V3}))
    assert capacities(peered_slivers, urn) == [2000]
