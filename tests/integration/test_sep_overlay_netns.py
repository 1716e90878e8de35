"""The SEP joins a cross-domain link through the overlay where no layer-2 path exists: two `slicex up
--substrate netns` testbeds (own CAs, one shared Open vSwitch as one host needs, but no cable between them:
their advertisements have no stitching ports). Through the SEP (SDK `span_slice`), the link is planned as an
overlay link; each testbed makes its node without it, and after both provisioned, the SEP's overlay
(federation/sep/overlay_netns.py over federation/overlay/: an overlay namespace for the link, a virtual router
per testbed with a tap in the node's namespace, addresses claimed in Redis) joins the two nodes. The node at A
pings the node at B's overlay address; Delete through the SEP stops the routers and frees the claims. Takes
the host-network lock (tests/conftest.py); Redis db from SLICEX_REDIS_URL."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
import yaml

from authority.substrate import hostnet
from authority.substrate.netns_plan import netns_name
from federation.overlay.claims import RedisClaims
from federation.sep.config import load_config
from federation.sep.sdk import span_slice
from federation.sep.server import SepServer
from slicex.tls_xmlrpc import client
from tests.integration.netns_support import iperf3_mbps, new_prefix, ping, require_host, root_qdisc
from tests.integration.stitching_support import CAPACITY_KBPS, Up, make_homes, request, urn
from tests.integration.test_stitching_netns_am import remove_everything

REDIS = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/8")
NETWORK = "10.78.0.0/24"


@pytest.fixture
def testbeds(tmp_path: Path):
    require_host()
    racks: dict[str, dict] = {"sa": {}, "sb": {}}  # no external links: no layer-2 path between them
    switch_dir = Path(f"/run/slicex-s{uuid.uuid4().hex[:6]}")
    prefixes = {name: new_prefix() for name in racks}
    homes = make_homes(tmp_path, racks, substrate_driver="netns",
                       netns=lambda name: {"prefix": prefixes[name], "switch_dir": str(switch_dir)})
    ups = {name: Up(home) for name, home in homes.items()}
    sep = None
    try:
        procs = {name: up.start() for name, up in ups.items()}
        sep_yaml = tmp_path / "sep" / "sep.yaml"
        init = subprocess.run([sys.executable, "-m", "cli", "--home", str(homes["sa"].root), "sep", "init",
                               "--config", str(sep_yaml), "--port", "0",
                               *(a for n in racks for a in ("--aggregate", f"{urn(n)}={procs[n]['am_url']}"))],
                              capture_output=True, text=True, timeout=60)
        assert init.returncode == 0, init.stderr
        cfg = yaml.safe_load(sep_yaml.read_text())
        cfg.update(overlay="federation.sep.overlay_netns:make_overlay",
                   overlay_options={"redis": REDIS, "network": NETWORK, "lease_seconds": 20,
                                    "netns_prefixes": {f"{n}.test": p for n, p in prefixes.items()}})
        sep_yaml.write_text(yaml.safe_dump(cfg))
        sep = SepServer(load_config(sep_yaml))
        sep.start()
        alice = homes["sa"]
        cert, key = str(alice.user_cert("alice")), str(alice.user_key("alice"))
        yield {"sep": sep, "prefixes": prefixes, "cert": cert, "key": key,
               "sa": client(procs["sa"]["sa_url"], cert, key)}
    finally:
        if sep is not None:
            for proc in list(sep.sep.overlay._procs.values()):  # routers a failed test left running
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
            sep.stop()
        for name, up in ups.items():
            up.stop()
            subprocess.run([sys.executable, "-m", "cli", "--home", str(homes[name].root), "down"], capture_output=True,
                           timeout=60)
        remove_everything(prefixes.values(), switch_dir, [])


def test_without_a_layer2_path_the_sep_joins_the_link_through_the_overlay_and_it_carries_ping(testbeds):
    s = urn("sa", "slice+sepov")
    got = span_slice(testbeds["sep"].url, testbeds["cert"], testbeds["key"], s, testbeds["sa"].CreateSlice(s),
                     request("sa", "sb"))
    record = testbeds["sep"].store.get("sep_slices", s)
    link = record["links"]["st0"]
    assert link["mode"] == "overlay" and "not in the stitching topology" in link["why"], link
    routers = link["joined"]["routers"]
    assert {r["cluster"] for r in routers.values()} == {"sa.test", "sb.test"}
    claims = RedisClaims(REDIS)
    try:
        held = {str(a): h.node for a, h in claims.holders(link["joined"]["namespace"]).items()}
    finally:
        claims.close()
    assert held == {routers["a"]["address"]: "a", routers["b"]["address"]: "b"}
    ns_a = netns_name(testbeds["prefixes"]["sa"], next(x["geni_sliver_urn"] for x in got["slivers"]
                                                        if x["geni_client_id"] == "a"))
    assert ns_a == routers["a"]["netns"] and ns_a in hostnet.namespaces()
    ok, rtt = ping(ns_a, routers["b"]["address"], count=5)
    assert ok, f"a cannot reach b's overlay address {routers['b']['address']}"
    print(f"SEP overlay: ping a@sa.test -> b@sb.test ({routers['b']['address']}) RTT {rtt} ms")
    # the link's capacity on both ends: each node's tap holds what that node sends (unshaped before)
    for r in routers.values():
        assert root_qdisc(r["netns"], r["tap"])[0] == "tbf", hostnet.qdisc(r["netns"], r["tap"])
    # measured both ways (an unshaped overlay link carried 177-491 Mbit/s here): at most 5 % over the capacity,
    # which load cannot break (it only lowers the rate); the floor is loose for the same reason
    ra, rb = routers["a"], routers["b"]
    for src, dst in ((ra, rb), (rb, ra)):
        mbps = iperf3_mbps(dst["netns"], dst["address"], src["netns"], seconds=4)
        print(f"SEP overlay iperf3 {src['cluster']} -> {dst['cluster']}: {mbps:.2f} Mbit/s on a "
              f"{CAPACITY_KBPS / 1000:g} Mbit/s link")
        assert 0.5 * CAPACITY_KBPS / 1000 < mbps <= 1.05 * CAPACITY_KBPS / 1000, f"{mbps:.2f} Mbit/s"
        assert root_qdisc(src["netns"], src["tap"])[1] > 0  # the sender's token bucket held TCP back
    # each router logs beside sep.yaml (it logged to the system temp dir, appending run after run, and kept
    # the file after Delete)
    sep_dir = testbeds["sep"].cfg.path.parent.resolve()
    for r in routers.values():
        assert Path(r["log"]).is_file() and Path(r["log"]).is_relative_to(sep_dir), r
    sep = client(testbeds["sep"].url, testbeds["cert"], testbeds["key"])
    gone = sep.Delete([s], got["credentials"], {})
    assert gone["code"]["geni_code"] == 0, gone["output"]
    for r in routers.values():  # and so is the file an earlier version left in the temp dir for this tap
        assert not Path(r["log"]).exists(), f"{r['log']} outlived the slice"
        assert not (Path(tempfile.gettempdir()) / f"slicex-sep-overlay-{r['tap']}.log").exists()
    for r in routers.values():
        assert not os.path.exists(f"/proc/{r['pid']}") or b"federation.overlay" not in Path(
            f"/proc/{r['pid']}/cmdline").read_bytes()
    claims = RedisClaims(REDIS)
    try:
        assert claims.holders(link["joined"]["namespace"]) == {}
    finally:
        claims.close()


def test_the_overlays_router_logs_live_beside_sep_yaml_and_go_with_the_link(tmp_path):
    """The netns overlay on its own (no testbed, no switch: two namespaces named as the netns driver names a
    node's): each router logs under `log_dir` (the SEP gives run/overlay beside sep.yaml) while the link
    lives, and `leave` removes the logs. They were in the system temp dir, appended to run after run, and
    left there after Delete."""
    from federation.overlay import tap
    from federation.sep.overlay import Endpoint
    from federation.sep.overlay_netns import make_overlay

    if tap.missing():
        pytest.skip("the overlay data plane needs: " + "; ".join(tap.missing()))
    prefixes = {"la.test": new_prefix(), "lb.test": new_prefix()}
    slivers = {d: f"urn:publicid:IDN+{d}+sliver+{uuid.uuid4().hex[:12]}" for d in prefixes}
    log_dir = tmp_path / "run" / "overlay"
    overlay = make_overlay({"redis": REDIS, "network": "10.79.0.0/24", "lease_seconds": 20,
                            "netns_prefixes": prefixes, "log_dir": str(log_dir)})
    slice_urn = f"urn:publicid:IDN+la.test+slice+logs{uuid.uuid4().hex[:6]}"
    a, b = (Endpoint(f"urn:publicid:IDN+{d}+authority+am", node, f"{node}:if0", slivers[d], "", ip, 10_000)
            for d, node, ip in (("la.test", "a", "10.79.0.10"), ("lb.test", "b", "10.79.0.20")))
    joined: dict = {}
    try:
        for d, p in prefixes.items():
            hostnet.add_namespace(netns_name(p, slivers[d]), d)
        joined = dict(overlay.join(slice_urn, "l0", a, b))
        routers = joined["routers"]
        for r in routers.values():
            assert Path(r["log"]).is_file() and Path(r["log"]).is_relative_to(log_dir), r
            assert not (Path(tempfile.gettempdir()) / f"slicex-sep-overlay-{r['tap']}.log").exists()  # a fresh tap
        assert ping(routers["a"]["netns"], routers["b"]["address"], count=2)[0]
    finally:
        if joined:
            overlay.leave(slice_urn, "l0", joined)
        for p in prefixes.values():
            hostnet.remove_prefixed(p)
    for r in joined["routers"].values():
        assert not Path(r["log"]).exists(), f"{r['log']} outlived the link"
