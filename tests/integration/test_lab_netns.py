"""The multi-host lab (lab/, docs/lab.md) on this machine: two hosts with their own `slicex up`, each serving on
its own address, one behind a NAT host; the operator reaches both AMs over their addresses, a host behind the
NAT reaches the other's AM through it, and nothing outside reaches in. Fibres are shaped with tc tbf.

Needs root, network namespaces, veth pairs, tbf, nft and socat; skipped, saying which is missing, only where
the machine lacks them. Takes the lab chain's host-wide lock (tests/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from lab import edge, line, running
from slicex.errors import ServerError
from slicex.home import Home
from slicex.tls_xmlrpc import client
from tests.integration.netns_support import goodput_mbps

# switches, servers and routers only inside lab hosts: tests/conftest.py's lab chain, beside the root namespace's
USES_HOST_NETWORK = "lab"

REDIS_URL = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/6")


def require_lab() -> None:
    missing = edge.missing_capabilities()
    if missing:
        pytest.skip("the lab needs: " + "; ".join(missing))


@pytest.fixture(scope="module")
def lab():
    require_lab()
    with running(line("tl", hosts=2, rate_mbit=100, nat=True), REDIS_URL) as lab:
        homes = {}
        for name in ("h1", "h2"):
            h = lab.hosts[name]
            homes[name] = h.make_home(f"{name}.lab", tick_seconds=0.2, dashboard_port=None)
            h.slicex(homes[name], "up", "--detach", timeout=120)
        yield lab, homes


def am(lab, homes, name: str):
    home = homes[name]
    return client(lab.hosts[name].am_url(home), str(Home(home).user_cert("alice")),
                  str(Home(home).user_key("alice")))


def test_each_host_serves_its_own_am_on_its_own_address(lab):
    lab, homes = lab
    seen = {}
    for name in ("h1", "h2"):
        version = am(lab, homes, name).GetVersion({})
        assert version["code"]["geni_code"] == 0, version
        urls = version["value"]["geni_api_versions"].values()
        assert all(lab.hosts[name].address in u for u in urls), urls
        seen[name] = version["value"]["urn"]
    assert seen == {"h1": "urn:publicid:IDN+h1.lab+authority+am", "h2": "urn:publicid:IDN+h2.lab+authority+am"}
    # each listens on its host's address only, not on another's or on every address
    for name in ("h1", "h2"):
        listening = lab.hosts[name].run(["ss", "-ltnH"]).stdout
        assert f"{lab.hosts[name].address}:8001" in listening and "0.0.0.0:8001" not in listening


def test_a_slice_reserves_at_the_host_behind_the_nat_over_its_own_address(lab):
    lab, homes = lab
    h1 = lab.hosts["h1"]
    home = homes["h1"]
    cert, key = str(Home(home).user_cert("alice")), str(Home(home).user_key("alice"))
    sa = client(f"https://{h1.address}:8000/", cert, key)
    urn = "urn:publicid:IDN+h1.lab+slice+labone"
    cred = [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": sa.CreateSlice(urn)}]
    rspec = ('<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">'
             '<node client_id="n1" exclusive="false"/></rspec>')
    agg = am(lab, homes, "h1")
    got = agg.Allocate(urn, cred, rspec, {})
    assert got["code"]["geni_code"] == 0, got["output"]
    assert got["value"]["geni_slivers"][0]["geni_allocation_status"] == "geni_allocated"
    assert agg.Delete([urn], cred, {})["code"]["geni_code"] == 0


def _get_version_from(lab, homes, source: str, target: str) -> subprocess.CompletedProcess:
    """GetVersion at `target`'s AM, called by a client running inside host `source`."""
    home = homes[target]
    code = ("import json, sys; from slicex.tls_xmlrpc import client; "
            "print(json.dumps(client(sys.argv[1], sys.argv[2], sys.argv[3], timeout=5).GetVersion({})['code']))")
    return lab.hosts[source].run([sys.executable, "-c", code, lab.hosts[target].am_url(home),
                                  str(Home(home).user_cert("alice")), str(Home(home).user_key("alice"))], timeout=30)


def test_a_host_behind_the_nat_reaches_out_and_nothing_reaches_in(lab):
    lab, homes = lab
    out = _get_version_from(lab, homes, "h1", "h2")
    assert out.returncode == 0 and json.loads(out.stdout)["geni_code"] == 0, out.stderr
    # h2 sees the call coming from the NAT host's address, not from h1's
    conns = lab.hosts["h2"].run(["ss", "-tnH", "state", "time-wait"]).stdout
    assert lab.hosts["h1"].address not in conns
    back = _get_version_from(lab, homes, "h2", "h1")
    assert back.returncode != 0  # no route from outside to inside
    assert lab.hosts["h2"].run(["ping", "-c1", "-W1", lab.hosts["h1"].address]).returncode != 0
    assert lab.hosts["h2"].run(["ping", "-c1", "-W1", lab.hosts["nat"].address]).returncode == 0


def test_a_second_lab_on_the_same_addresses_is_refused_naming_the_one_routed(lab):
    lab, _ = lab
    with pytest.raises(ServerError, match=f"already routes {lab.operator_address}"):
        edge.up(line("tx", hosts=2, network=lab.plan.spec.network))
    assert not [ns for ns in edge.hostnet.namespaces() if ns.startswith("sxlab-tx-")]


def test_hosts_reach_the_operators_redis_through_the_relay(lab):
    lab, _ = lab
    h2 = lab.hosts["h2"]
    assert h2.run(["redis-cli", "-u", h2.redis_url, "ping"]).stdout.strip() == "PONG"


def test_fibres_are_shaped_to_their_rate(lab):
    lab, _ = lab
    h1, h2 = lab.hosts["h1"], lab.hosts["h2"]
    server = h2.popen(["iperf3", "-s", "-1", "-B", h2.address], stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):
            if f"{h2.address}:5201" in h2.run(["ss", "-ltnH"]).stdout:
                break
            time.sleep(0.1)
        out = h1.run(["iperf3", "-c", h2.address, "-t", "3", "-O", "1", "-J"], timeout=30)
        mbps = goodput_mbps(out.stdout)
    finally:
        server.kill()
        server.wait(5)
    assert 90 <= mbps <= 105, f"{mbps:.1f} Mbit/s over a fibre shaped to 100"


def test_status_reports_and_down_removes_everything():
    require_lab()
    spec = line("tm", hosts=2)
    edge.up(spec)
    p, hosts = edge.status("tm")
    assert p is not None and all(h.exists and set(h.links.values()) == {"UP"} for h in hosts)
    assert sorted(edge.down("tm")) == ["sxlab-tm-h1", "sxlab-tm-h2"]
    assert edge.status("tm") == (None, [])
    assert not [n for n in edge.hostnet.links() if n.startswith("sxltm-")]


def test_the_command_makes_reports_and_removes_a_lab():
    require_lab()

    def lab_cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cli", "lab", *args], capture_output=True, text=True,
                              timeout=120, env=edge.tree_env())

    try:
        up = lab_cli("up", "--name", "tc", "--hosts", "2", "--rate", "50", "--no-redis")
        assert up.returncode == 0, up.stderr
        assert "nsenter --net=/run/netns/sxlab-tc-h1" in up.stdout
        st = lab_cli("status", "tc", "--json")
        assert st.returncode == 0, st.stdout
        hosts = json.loads(st.stdout)["hosts"]
        assert [(h["name"], h["links"]) for h in hosts] == [("h1", {"mgmt": "UP", "f-h2": "UP tbf"}),
                                                            ("h2", {"mgmt": "UP", "f-h1": "UP tbf"})]
        edge.hostnet.shape("sxlab-tc-h1", "f-h2", None)  # a fibre that lost its shaping is reported
        st = lab_cli("status", "tc")
        assert st.returncode == 3 and "f-h2 UP UNSHAPED" in st.stdout
        bad = lab_cli("up", "--name", "toolong")
        assert bad.returncode == 2 and "lab name 'toolong'" in bad.stderr
    finally:
        down = lab_cli("down", "tc")
    assert down.returncode == 0 and "sxlab-tc-h1" in down.stdout
    assert lab_cli("status", "tc").returncode == 3
