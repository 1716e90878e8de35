"""The overlay between lab hosts (lab/, docs/lab.md): one virtual router per host, listening on the host's
address, claiming addresses on the operator's Redis through the lab's relay, tunnelling over UDP across the
fibres — directly between two hosts, and from a host behind a NAT host (the router advertising the NAT's
outside address; the inside sends first, which opens the NAT's mapping). A router behind the NAT that does not
advertise it is refused by the other side (its datagrams arrive from an endpoint its claims do not name).
Both data planes are exercised through the NAT: the fast one (taps passing TCP super-frames with their offload
header) and the portable one (a frame per system call), and a pair of routers with one of each.

Needs root, network namespaces, veth, tap, tbf, nft and socat; skipped, saying which, only where the machine
lacks them. Takes the lab chain's host-wide lock (tests/conftest.py)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from federation.overlay import tap
from federation.overlay.claims import RedisClaims
from federation.overlay.core import NamespaceConfig
from lab import Fibre, LabSpec, Nat, edge, running
from lab.overlay import RouterProcess, add_node, node_namespace, start_router
from tests.integration.netns_support import iperf3_mbps, root_qdisc

# switches, servers and routers only inside lab hosts: tests/conftest.py's lab chain, beside the root namespace's
USES_HOST_NETWORK = "lab"

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
            for name in ("sd", "sn", "sx", "fo", "fp", "fm"):
                claims.undefine(name)
            claims.close()


def ping(lab, host: str, node: str, address: str) -> bool:
    return lab.hosts[host].run(["ip", "netns", "exec", node_namespace(lab.hosts[host], node), "ping", "-c", "3",
                                "-i", "0.2", "-W", "1", address], timeout=15).returncode == 0


@contextmanager
def routers(lab, prefix: str, claims: RedisClaims, namespace: str, network: str,
            *ends: tuple[str, str, str, str, dict[str, Any]]) -> Iterator[list[RouterProcess]]:
    """The overlay `namespace` over `network` defined on the claims, and for each end (host, cluster, node,
    preferred address, router options) a node on that host and its cluster's router there serving it; on
    leaving, every router started is stopped (even when a later one failed to start)."""
    claims.define(NamespaceConfig.build(namespace, network, 30))
    for host, _cluster, node, _address, _options in ends:
        add_node(lab.hosts[host], node)
    started: list[RouterProcess] = []
    try:
        for host, cluster, node, address, options in ends:
            started.append(start_router(lab.hosts[host], prefix, namespace, cluster, {node: address}, **options))
        yield started
    finally:
        for router in started:
            router.stop()


def test_the_overlay_joins_nodes_on_two_hosts_over_their_fibre(lab):
    lab, prefix, claims = lab
    a, b = lab.hosts["a"], lab.hosts["b"]
    with routers(lab, prefix, claims, "sd", "10.61.0.0/24", ("a", "A", "x1", "10.61.0.11", {}),
                 ("b", "B", "y1", "10.61.0.21", {})) as (ra, rb):
        assert ra.endpoint.startswith(a.address + ":") and rb.endpoint.startswith(b.address + ":")
        assert {str(k): v.endpoint for k, v in claims.holders("sd").items()} == {
            "10.61.0.11": ra.endpoint, "10.61.0.21": rb.endpoint}
        assert ping(lab, "a", "x1", "10.61.0.21") and ping(lab, "b", "y1", "10.61.0.11")
        assert ra.stats()["stats"]["routed_out"] >= 3


def test_through_a_nat_the_inside_router_advertises_the_nats_address(lab):
    lab, prefix, claims = lab
    n = lab.hosts["n"]
    with routers(lab, prefix, claims, "sn", "10.62.0.0/24", ("c", "C", "p1", "10.62.0.11", {"advertise": n.address}),
                 ("b", "B", "q1", "10.62.0.21", {})) as (rc, rb):
        assert rc.endpoint.startswith(n.address + ":")
        assert ping(lab, "c", "p1", "10.62.0.21")  # the inside sends first: the NAT maps the router's port
        assert ping(lab, "b", "q1", "10.62.0.11")  # and the outside reaches in over that mapping
        assert rb.stats()["stats"].get("drop_spoofed", 0) == 0


def test_through_a_nat_a_router_claiming_its_inside_address_is_refused_as_spoofed(lab):
    lab, prefix, claims = lab
    with routers(lab, prefix, claims, "sx", "10.63.0.0/24", ("c", "C", "r1", "10.63.0.11", {}),
                 ("b", "B", "s1", "10.63.0.21", {})) as (rc, rb):
        assert not ping(lab, "c", "r1", "10.63.0.21")
        assert rb.stats()["stats"]["drop_spoofed"] >= 1  # the NAT's address is not the endpoint the claim names


CAPACITY_KBPS = 20_000


@pytest.mark.parametrize("dataplane,namespace,subnet", [("offload", "fo", 64), ("plain", "fp", 65)])
def test_through_the_nat_each_data_plane_carries_tcp_both_ways_held_to_the_links_capacity(lab, dataplane,
                                                                                          namespace, subnet):
    lab, prefix, claims = lab
    if dataplane == "offload" and tap.offload() != "ok":
        pytest.skip(f"taps here cannot pass super-frames: {tap.offload()}")
    b, c, n = lab.hosts["b"], lab.hosts["c"], lab.hosts["n"]
    shaped = {"dataplane": dataplane, "rate_kbps": CAPACITY_KBPS}
    with routers(lab, prefix, claims, namespace, f"10.{subnet}.0.0/24",
                 ("c", "C", f"{namespace}c", f"10.{subnet}.0.11", {"advertise": n.address, **shaped}),
                 ("b", "B", f"{namespace}b", f"10.{subnet}.0.21", shaped)) as (rc, rb):
        assert rc.dataplane == rb.dataplane == dataplane
        inside, outside = node_namespace(c, f"{namespace}c"), node_namespace(b, f"{namespace}b")
        assert ping(lab, "c", f"{namespace}c", f"10.{subnet}.0.21")  # the inside sends first
        assert ping(lab, "b", f"{namespace}b", f"10.{subnet}.0.11")
        for src, dst, address in ((inside, outside, f"10.{subnet}.0.21"), (outside, inside, f"10.{subnet}.0.11")):
            mbps = iperf3_mbps(dst, address, src, seconds=3, at_least=0.95 * CAPACITY_KBPS / 1000)
            print(f"lab overlay ({dataplane}) {src} -> {dst}: {mbps:.2f} Mbit/s on a "
                  f"{CAPACITY_KBPS / 1000:g} Mbit/s link")
            assert 0.95 * CAPACITY_KBPS / 1000 <= mbps <= 1.05 * CAPACITY_KBPS / 1000, f"{mbps:.2f} Mbit/s"
            assert root_qdisc(src, f"ov{src.rsplit('-', 1)[1]}")[0] == "tbf"
        counters = rb.stats()["stats"]
        assert counters.get("drop_spoofed", 0) == 0 and counters["routed_in"] > 1000


def test_a_fast_router_and_a_plain_one_carry_tcp_between_them_through_the_nat(lab):
    """The data plane is chosen per host: the plain router finishes the checksums and cuts the super-frames
    the fast one's tap left to the kernel, so its node's TCP accepts them (a bad checksum would stall iperf3)."""
    lab, prefix, claims = lab
    if tap.offload() != "ok":
        pytest.skip(f"taps here cannot pass super-frames: {tap.offload()}")
    b, c, n = lab.hosts["b"], lab.hosts["c"], lab.hosts["n"]
    with routers(lab, prefix, claims, "fm", "10.66.0.0/24",
                 ("c", "C", "fmc", "10.66.0.11", {"advertise": n.address, "dataplane": "offload"}),
                 ("b", "B", "fmb", "10.66.0.21", {"dataplane": "plain"})) as (_rc, rb):
        assert ping(lab, "c", "fmc", "10.66.0.21") and ping(lab, "b", "fmb", "10.66.0.11")
        fast, plain = node_namespace(c, "fmc"), node_namespace(b, "fmb")
        for src, dst, address in ((fast, plain, "10.66.0.21"), (plain, fast, "10.66.0.11")):
            mbps = iperf3_mbps(dst, address, src, seconds=3, at_least=20)
            print(f"lab overlay (offload/plain) {src} -> {dst}: {mbps:.2f} Mbit/s")
            assert mbps >= 20, f"{mbps:.2f} Mbit/s"
        assert rb.stats()["stats"].get("drop_offload_unsupported", 0) == 0
