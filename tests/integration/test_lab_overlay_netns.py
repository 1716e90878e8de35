"""The overlay between lab hosts (lab/, docs/lab.md): one virtual router per host, listening on the host's
address, claiming addresses on the operator's Redis through the lab's relay, tunnelling over UDP across the
fibres — directly between two hosts, and from a host behind a NAT host (the router advertising the NAT's
outside address; the inside sends first, which opens the NAT's mapping). A router behind the NAT that does not
advertise it is refused by the other side (its datagrams arrive from an endpoint its claims do not name).

Needs root, network namespaces, veth, tap, tbf, nft and socat; skipped, saying which, only where the machine
lacks them. Takes the host-network lock like every netns test."""

from __future__ import annotations

import os
import uuid

import pytest

from federation.overlay import tap
from federation.overlay.claims import RedisClaims
from federation.overlay.core import NamespaceConfig
from lab import Fibre, LabSpec, Nat, edge, running
from lab.overlay import add_node, node_namespace, start_router

REDIS_URL = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/6")


@pytest.fixture(scope="module")
def lab():
    missing = edge.missing_capabilities() + tap.missing()
    if missing:
        pytest.skip("the lab overlay needs: " + "; ".join(missing))
    # a—b joined directly; c behind the NAT host n, which is joined to b
    spec = LabSpec("to", ("a", "b", "c", "n"), (Fibre("a", "b", 200), Fibre("c", "n", 200), Fibre("n", "b", 200)),
                   (Nat("n", ("c",)),))
    prefix = "ov" + uuid.uuid4().hex[:4]
    claims = RedisClaims(REDIS_URL, prefix)
    with running(spec, REDIS_URL) as lab:
        try:
            yield lab, prefix, claims
        finally:
            for name in ("sd", "sn", "sx"):
                claims.undefine(name)
            claims.close()


def ping(lab, host: str, node: str, address: str) -> bool:
    return lab.hosts[host].run(["ip", "netns", "exec", node_namespace(lab.hosts[host], node), "ping", "-c", "3",
                                "-i", "0.2", "-W", "1", address], timeout=15).returncode == 0


def test_the_overlay_joins_nodes_on_two_hosts_over_their_fibre(lab):
    lab, prefix, claims = lab
    claims.define(NamespaceConfig.build("sd", "10.61.0.0/24", 30))
    a, b = lab.hosts["a"], lab.hosts["b"]
    add_node(a, "x1")
    add_node(b, "y1")
    ra = start_router(a, prefix, "sd", "A", {"x1": "10.61.0.11"})
    rb = start_router(b, prefix, "sd", "B", {"y1": "10.61.0.21"})
    try:
        assert ra.endpoint.startswith(a.address + ":") and rb.endpoint.startswith(b.address + ":")
        assert {str(k): v.endpoint for k, v in claims.holders("sd").items()} == {
            "10.61.0.11": ra.endpoint, "10.61.0.21": rb.endpoint}
        assert ping(lab, "a", "x1", "10.61.0.21") and ping(lab, "b", "y1", "10.61.0.11")
        assert ra.stats()["stats"]["routed_out"] >= 3
    finally:
        ra.stop()
        rb.stop()


def test_through_a_nat_the_inside_router_advertises_the_nats_address(lab):
    lab, prefix, claims = lab
    claims.define(NamespaceConfig.build("sn", "10.62.0.0/24", 30))
    b, c, n = lab.hosts["b"], lab.hosts["c"], lab.hosts["n"]
    add_node(c, "p1")
    add_node(b, "q1")
    rc = start_router(c, prefix, "sn", "C", {"p1": "10.62.0.11"}, advertise=n.address)
    rb = start_router(b, prefix, "sn", "B", {"q1": "10.62.0.21"})
    try:
        assert rc.endpoint.startswith(n.address + ":")
        assert ping(lab, "c", "p1", "10.62.0.21")  # the inside sends first: the NAT maps the router's port
        assert ping(lab, "b", "q1", "10.62.0.11")  # and the outside reaches in over that mapping
        assert rb.stats()["stats"].get("drop_spoofed", 0) == 0
    finally:
        rc.stop()
        rb.stop()


def test_through_a_nat_a_router_claiming_its_inside_address_is_refused_as_spoofed(lab):
    lab, prefix, claims = lab
    claims.define(NamespaceConfig.build("sx", "10.63.0.0/24", 30))
    b, c = lab.hosts["b"], lab.hosts["c"]
    add_node(c, "r1")
    add_node(b, "s1")
    rc = start_router(c, prefix, "sx", "C", {"r1": "10.63.0.11"})
    rb = start_router(b, prefix, "sx", "B", {"s1": "10.63.0.21"})
    try:
        assert not ping(lab, "c", "r1", "10.63.0.21")
        assert rb.stats()["stats"]["drop_spoofed"] >= 1  # the NAT's address is not the endpoint the claim names
    finally:
        rc.stop()
        rb.stop()
