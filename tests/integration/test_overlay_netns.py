"""The overlay's data plane on this host: three network namespaces in two clusters (a1, a2 in A; b1 in B),
each with a tap into the overlay, one virtual router process per cluster (`python -m federation.overlay
router`), addresses claimed in a real Redis (SLICEX_REDIS_URL, default db 6). Pings cross clusters through
the routers (proxy ARP answers with the router's MAC) and stay on the segment within a cluster.

Needs root, network namespaces and tap devices; skipped, saying which is missing, only where the host lacks
them. Like every netns test it takes the host-network lock (tests/conftest.py)."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import uuid
from ipaddress import IPv4Address
from pathlib import Path

import pytest

from authority.substrate import hostnet
from federation.overlay import frames, tap
from federation.overlay.claims import RedisClaims
from federation.overlay.core import NamespaceConfig
from lab.overlay import stop_router
from slicex.errors import Unavailable
from tests.integration.netns_support import iperf3_mbps

REDIS_URL = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/6")
ROOT = Path(__file__).resolve().parents[2]
NETWORK = "10.77.0.0/24"


def mac(node: str) -> str:
    return f"02:00:00:00:{ord(node[0]):02x}:{int(node[1:]):02x}"


class Router:
    """One cluster's virtual router process: its ready line, and its counters on demand."""

    def __init__(self, prefix: str, cluster: str, nodes: list[str], preferred: dict[str, str]):
        argv = [sys.executable, "-m", "federation.overlay", "--redis", REDIS_URL, "--prefix", prefix,
                "router", "s1", "--cluster", cluster]
        for n in nodes:
            spec = f"id={n},netns={prefix}-{n},tap={prefix}{n},mac={mac(n)}"
            argv += ["--node", spec + (f",address={preferred[n]}" if n in preferred else "")]
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready = self._line(20)
        self.endpoint: str = ready["endpoint"]
        self.dataplane: str = ready["dataplane"]
        self.nodes: dict[str, str] = ready["nodes"]

    def _line(self, timeout: float) -> dict:
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not r:
            self.proc.kill()
            raise AssertionError(f"router gave no line in {timeout} s: {self.proc.stderr.read()}")
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"router exited {self.proc.wait()}: {self.proc.stderr.read()}")
        return json.loads(line)

    def stats(self) -> dict:
        self.proc.send_signal(signal.SIGUSR1)
        return self._line(5)

    def stop(self) -> int:
        return stop_router(self.proc)


@pytest.fixture(scope="module")
def overlay():
    missing = tap.missing()
    if missing:
        pytest.skip("the overlay data plane needs: " + "; ".join(missing))
    prefix = "ov" + uuid.uuid4().hex[:4]
    claims = RedisClaims(REDIS_URL, prefix=prefix)
    try:
        claims.ping()
    except Unavailable as exc:
        pytest.fail(f"Redis is required and is not answering ({exc}); run `make redis`")
    routers: list[Router] = []
    try:
        for n in ("a1", "a2", "b1"):
            hostnet.add_namespace(f"{prefix}-{n}", n)
        claims.define(NamespaceConfig.build("s1", NETWORK, 2.0))
        routers.append(Router(prefix, "A", ["a1", "a2"], {}))
        routers.append(Router(prefix, "B", ["b1"], {"b1": "10.77.0.50"}))
        yield prefix, claims, routers[0], routers[1]
    finally:
        for r in routers:
            r.stop()
        hostnet.remove_prefixed(prefix)
        claims.undefine("s1")
        claims.close()


def ping(ns: str, address: str, count: int = 3) -> bool:
    return hostnet.exec_in(ns, ["ping", "-c", str(count), "-i", "0.2", "-W", "1", address],
                           timeout=count + 5).returncode == 0


def neighbour_mac(ns: str, address: str) -> str:
    out = hostnet.run(["ip", "-n", ns, "-j", "neigh", "show", address]).stdout
    entries = json.loads(out or "[]")
    return entries[0].get("lladdr", "") if entries else ""


def test_addresses_are_claimed_in_redis_with_each_router_as_endpoint(overlay):
    prefix, claims, ra, rb = overlay
    held = claims.holders("s1")
    assert rb.nodes == {"b1": "10.77.0.50"}
    want = {IPv4Address(a): (n, ra.endpoint) for n, a in ra.nodes.items()}
    want[IPv4Address("10.77.0.50")] = ("b1", rb.endpoint)
    assert {a: (h.node, h.endpoint) for a, h in held.items()} == want
    for n, a in {**ra.nodes, **rb.nodes}.items():
        shown = hostnet.run(["ip", "-n", f"{prefix}-{n}", "-j", "addr", "show", f"{prefix}{n}"]).stdout
        assert a in shown


def test_ping_crosses_clusters_through_the_virtual_routers(overlay):
    prefix, _, ra, rb = overlay
    before_a, before_b = ra.stats()["stats"], rb.stats()["stats"]
    assert ping(f"{prefix}-a1", "10.77.0.50")
    assert ping(f"{prefix}-b1", ra.nodes["a2"])
    # a1 reached b1 at the router's MAC (proxy ARP), b1 reached a2 the same way on its side
    assert neighbour_mac(f"{prefix}-a1", "10.77.0.50") == frames.mac_text(frames.ROUTER_MAC)
    assert neighbour_mac(f"{prefix}-b1", ra.nodes["a2"]) == frames.mac_text(frames.ROUTER_MAC)
    after_a, after_b = ra.stats(), rb.stats()
    sa, sb = after_a["stats"], after_b["stats"]
    assert sa["routed_out"] - before_a.get("routed_out", 0) >= 3 + 3  # a1's requests, a2's replies
    assert sb["routed_in"] - before_b.get("routed_in", 0) >= 6
    assert sa.get("arp_proxied", 0) >= 1 and sb.get("arp_proxied", 0) >= 1
    assert set(after_a["leases"].values()) == {"bound"}  # renewed all along (lease 2 s)


def test_where_taps_pass_super_frames_the_router_takes_the_fast_data_plane_and_tcp_uses_it(overlay):
    prefix, _, ra, rb = overlay
    fast = tap.offload() == "ok"
    assert ra.dataplane == rb.dataplane == ("offload" if fast else "plain"), tap.offload()
    if not fast:
        pytest.skip(f"taps here cannot pass super-frames: {tap.offload()}")
    before = ra.stats()["stats"].get("super_frames", 0)
    mbps = iperf3_mbps(f"{prefix}-b1", rb.nodes["b1"], f"{prefix}-a1", seconds=2, tries=1)
    assert mbps > 0
    # a1's kernel handed its router TCP segments many at a time (each super-frame one datagram to B)
    assert ra.stats()["stats"].get("super_frames", 0) > before


def test_ping_within_a_cluster_stays_on_the_segment(overlay):
    prefix, _, ra, _ = overlay
    before = ra.stats()["stats"]
    assert ping(f"{prefix}-a1", ra.nodes["a2"])
    after = ra.stats()["stats"]
    assert neighbour_mac(f"{prefix}-a1", ra.nodes["a2"]) == mac("a2")  # a2's own MAC: no proxy ARP
    assert after["switched"] - before.get("switched", 0) >= 6
    assert after.get("routed_out", 0) == before.get("routed_out", 0)
    assert after.get("routed_local", 0) == before.get("routed_local", 0)


def test_an_unclaimed_address_gets_no_arp_answer_and_no_route(overlay):
    prefix, _, ra, _ = overlay
    before = ra.stats()["stats"]
    assert not ping(f"{prefix}-a1", "10.77.0.200", count=1)
    after = ra.stats()["stats"]
    assert after.get("arp_proxied", 0) == before.get("arp_proxied", 0)
    assert neighbour_mac(f"{prefix}-a1", "10.77.0.200") in ("", None)


def test_a_datagram_from_a_router_that_does_not_hold_its_source_is_dropped(overlay):
    _, _, ra, rb = overlay
    before = rb.stats()["stats"]
    src = IPv4Address(ra.nodes["a1"])  # held by router A, but sent from another socket
    ip = bytes([0x45, 0, 0, 28, 0, 0, 0, 0, 64, 1, 0, 0]) + src.packed + IPv4Address("10.77.0.50").packed
    frame = frames.ROUTER_MAC + bytes.fromhex(mac("a1").replace(":", "")) + b"\x08\x00" + ip + bytes(8)
    host, port = rb.endpoint.rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(frames.encapsulate(b"s1", frame), (host, int(port)))
        s.sendto(frames.encapsulate(b"other-slice", frame), (host, int(port)))
    after = rb.stats()["stats"]
    assert after.get("drop_spoofed", 0) == before.get("drop_spoofed", 0) + 1
    assert after.get("drop_not_ours", 0) == before.get("drop_not_ours", 0) + 1
    assert after.get("routed_in", 0) == before.get("routed_in", 0)


def test_a_node_whose_namespace_is_deleted_is_forgotten_and_its_claim_released(overlay):
    prefix, claims, ra, _ = overlay
    hostnet.del_namespace(f"{prefix}-a2")  # its tap goes with it
    deadline = time.monotonic() + 5
    while IPv4Address(ra.nodes["a2"]) in claims.holders("s1") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert IPv4Address(ra.nodes["a2"]) not in claims.holders("s1")
    after = ra.stats()
    assert after["stats"]["tap_ebadfd"] == 1 and after["leases"] == {"a1": "bound", "a2": "released"}
    assert ping(f"{prefix}-a1", "10.77.0.50", count=1)  # the rest of the cluster carries on


def test_stopping_a_router_releases_its_claims(overlay):
    _, claims, ra, rb = overlay
    assert rb.stop() == 0
    assert {h.node for h in claims.holders("s1").values()} == {"a1"}
    assert ra.stop() == 0
    assert claims.holders("s1") == {}

