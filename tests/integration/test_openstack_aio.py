"""The OpenStack substrate against a live cloud: the all-in-one OpenStack Zed of scripts/openstack-aio.sh
(Keystone, Glance, Placement, Nova with the libvirt driver, Neutron ML2 with the Open vSwitch agent on
userspace bridges). The driver (authority/substrate/openstack.py) on its own, and `slicex up --substrate openstack`
driven over mutual TLS as omni drives it.

Runs only with SLICEX_OPENSTACK_AIO=1: `make test-openstack` installs and starts the cloud, runs this file
and stops the cloud. The clouds.yaml is the script's (`scripts/openstack-aio.sh clouds`) unless
OS_CLIENT_CONFIG_FILE names one with a `slicex-aio` entry."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from lxml import etree

pytestmark = [
    pytest.mark.skipif(os.environ.get("SLICEX_OPENSTACK_AIO") != "1",
                       reason="needs the all-in-one OpenStack cloud: `make test-openstack` (SLICEX_OPENSTACK_AIO=1)"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::PendingDeprecationWarning"),
    pytest.mark.timeout(600),  # servers are real QEMU guests (TCG on the development machines)
]

openstack = pytest.importorskip("openstack")

from authority.substrate.openstack import OpenStackDriver  # noqa: E402
from authority.substrate.openstack_plan import OpenStackSettings  # noqa: E402
from protocol.messages import SliverSpec  # noqa: E402
from slicex import procs  # noqa: E402
from slicex.errors import ServerError  # noqa: E402
from slicex.tls_xmlrpc import client  # noqa: E402
from tests.factories import RSPEC3, request_rspec, vm  # noqa: E402
from tests.integration.conftest import AUTHORITY, make_home  # noqa: E402
from tests.integration.test_netns_am import Up  # noqa: E402

CLOUD = "slicex-aio"
PHYSNET = "physnet1"
IMAGE = "slicex-aio-image"  # scripts/openstack-aio/bootstrap.py makes it, and the flavors
VM_IMAGE = "slicex-aio-vm"  # a slicex VM image that boots: scripts/openstack-aio/guest_image.py puts it in Glance
FLAVORS = {"default-vm": "m1.tiny", "XOSmall": "m1.tiny", "XOHuge": "slicex-aio-huge",
           "XOQuota": "slicex-aio-overquota"}
TEST_FLAVORS = {  # name: (RAM MiB, vCPUs, disk GiB)
    "slicex-aio-huge": (512, 1, 1_000_000),  # more disk than the compute host has; no quota on disk
    "slicex-aio-overquota": (4_000_000, 1, 1),  # more RAM than the project's default quota (51 200 MiB)
}
NOW = datetime.now(UTC)
REPO = Path(__file__).resolve().parents[2]


def wait_until(what: str, probe: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    """Poll `probe` until it answers something true; fail naming `what` and its last answer."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout_s:.0f}s (last: {last!r})")


@pytest.fixture(scope="module")
def conn() -> Iterator[Any]:
    if "OS_CLIENT_CONFIG_FILE" not in os.environ:
        path = subprocess.run([str(REPO / "scripts" / "openstack-aio.sh"), "clouds"], capture_output=True,
                              text=True, check=True).stdout.strip()
        os.environ["OS_CLIENT_CONFIG_FILE"] = path  # `slicex up` below inherits it
    c = openstack.connect(cloud=CLOUD)
    clean_earlier_runs(c)
    for name, (ram, vcpus, disk) in TEST_FLAVORS.items():
        have = c.compute.find_flavor(name)
        if have is not None and (have.ram, have.vcpus, have.disk) != (ram, vcpus, disk):
            c.compute.delete_flavor(have)
            have = None
        if have is None:
            c.compute.create_flavor(name=name, ram=ram, vcpus=vcpus, disk=disk)
    yield c
    c.close()


def clean_earlier_runs(c) -> None:
    """Remove what an interrupted earlier run of these tests left in the cloud (its VLANs would stay taken)."""
    tags = [t for r in [*c.network.networks(), *c.network.ports()] for t in (r.tags or ())]
    tags += [(s.metadata or {}).get("slicex", "") for s in c.compute.servers()]
    for prefix in {m.group(1) for t in tags if (m := re.fullmatch(r"slicex-(t[0-9a-f]{6})", t))}:
        d = OpenStackDriver(settings(prefix))
        d.start()
        d.reconcile([])
        d.shutdown()


def new_prefix() -> str:
    return "t" + uuid.uuid4().hex[:6]


def settings(prefix: str) -> OpenStackSettings:
    return OpenStackSettings(CLOUD, PHYSNET, FLAVORS, {}, default_image=IMAGE, prefix=prefix)


@pytest.fixture
def driver(conn) -> Iterator[OpenStackDriver]:
    d = OpenStackDriver(settings(new_prefix()))
    d.start()
    try:
        yield d
    finally:
        d.reconcile([])  # whatever a failed test left
        d.shutdown()


# ---- the driver against the cloud ----------------------------------------------------------------------------------
def link(vlan: int, capacity_kbps: int = 0) -> SliverSpec:
    return SliverSpec(f"urn:lan0-{vlan}", "link", "lan0", (f"vlan:sw:{vlan}",), (("vlan", vlan),),
                      {"subnet": "10.10.0", "interface_refs": ["n1:if0", "n2:if0"], "capacity_kbps": capacity_kbps})


def ssh_key() -> str:
    """A real public key: Nova checks a keypair's key (400 "failed to generate fingerprint" otherwise)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    public = ed25519.Ed25519PrivateKey.generate().public_key()
    return public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


def node(name: str, vlan: int, sliver_type: str = "XOSmall") -> SliverSpec:
    return SliverSpec(f"urn:{name}-{vlan}", "node", name, (), (("vlan", vlan),),
                      {"sliver_type": sliver_type, "vm_size": sliver_type, "hostname": f"{name}.aio.slicex.test",
                       "logins": [{"username": "alice", "keys": [ssh_key() + " alice@aio"]}],
                       "interfaces": {f"{name}:if0": {"ip": "", "netmask": ""}}})


def free_vlan(conn) -> int:
    used = {n.provider_segmentation_id for n in conn.network.networks() if n.provider_network_type == "vlan"}
    return next(v for v in range(3000, 4000) if v not in used)


def started_pair(d: OpenStackDriver, conn, capacity_kbps: int = 0):
    """A link and two nodes on it, created and started, both servers ACTIVE."""
    vlan = free_vlan(conn)
    specs = {"lan0": link(vlan, capacity_kbps), "n1": node("n1", vlan), "n2": node("n2", vlan)}
    recs = {k: d.create(s, NOW) for k, s in specs.items()}
    for k, s in specs.items():
        recs[k] = d.modify(s, recs[k], "geni_start", NOW)
    for k in ("n1", "n2"):
        wait_until(f"{k} ready", lambda k=k: d.status(specs[k], recs[k], NOW)[0] == "geni_ready")
    return specs, recs


def test_leftovers_waits_for_the_servers_nova_is_still_deleting(driver, conn):
    specs, recs = started_pair(driver, conn)
    for k in ("n1", "n2", "lan0"):
        driver.destroy(specs[k], recs[k], NOW)
    assert driver.leftovers() == []
    assert not [s for s in conn.compute.servers() if s.name.startswith(driver.prefix + "-")]


def test_deleting_a_link_whose_network_has_ports_names_neutrons_409_and_succeeds_after_its_nodes(driver, conn):
    specs, recs = started_pair(driver, conn)
    with pytest.raises(ServerError, match=r"Neutron refuses to delete network .* ports are on it \("
                                          rf"{driver.prefix}-\w+-\w+, {driver.prefix}-\w+-\w+: "
                                          r".*ports still in use on the network.*delete its nodes first"):
        driver.destroy(specs["lan0"], recs["lan0"], NOW)
    assert driver.status(specs["lan0"], recs["lan0"], NOW)[0] == "geni_ready"  # nothing of it went
    for k in ("n1", "n2", "lan0"):
        driver.destroy(specs[k], recs[k], NOW)
    assert driver.leftovers() == []


def test_a_node_no_host_can_take_is_failed_with_novas_reason(driver, conn):
    vlan = free_vlan(conn)
    lan, big = link(vlan), node("n1", vlan, sliver_type="XOHuge")
    recs = {"lan0": driver.create(lan, NOW), "n1": driver.create(big, NOW)}
    recs["n1"] = driver.modify(big, recs["n1"], "geni_start", NOW)
    state, error = wait_until("n1 failed", lambda: (s := driver.status(big, recs["n1"], NOW))[0] == "geni_failed"
                              and s)
    assert "No valid host was found" in error and "ERROR" in error, error
    driver.destroy(big, recs["n1"], NOW)
    driver.destroy(lan, recs["lan0"], NOW)
    assert driver.leftovers() == []


def test_a_node_over_the_projects_quota_fails_geni_start_with_novas_reason(driver, conn):
    vlan = free_vlan(conn)
    lan, big = link(vlan), node("n1", vlan, sliver_type="XOQuota")
    recs = {"lan0": driver.create(lan, NOW), "n1": driver.create(big, NOW)}
    with pytest.raises(ServerError, match=r"node n1: Nova refused to create its server \(403\): "
                                          r"Quota exceeded for ram"):
        driver.modify(big, recs["n1"], "geni_start", NOW)
    driver.destroy(big, recs["n1"], NOW)
    driver.destroy(lan, recs["lan0"], NOW)
    assert driver.leftovers() == []


def test_a_node_whose_image_is_gone_fails_geni_start_with_novas_reason(driver, conn):
    gone = f"slicex-aio-gone-{driver.prefix}"
    image = conn.image.create_image(name=gone, data=b"\0" * 1024, disk_format="raw", container_format="bare")
    d = OpenStackDriver(OpenStackSettings(CLOUD, PHYSNET, FLAVORS, {}, default_image=gone, prefix=driver.prefix))
    d.start()
    vlan = free_vlan(conn)
    lan, n1 = link(vlan), node("n1", vlan)
    recs = {"lan0": d.create(lan, NOW), "n1": d.create(n1, NOW)}
    conn.image.delete_image(image)
    with pytest.raises(ServerError, match=r"node n1: Nova refused to create its server \(400\): "
                                          r"Can not find requested image"):
        d.modify(n1, recs["n1"], "geni_start", NOW)
    d.destroy(n1, recs["n1"], NOW)
    d.destroy(lan, recs["lan0"], NOW)
    assert d.leftovers() == []


# ---- `slicex up --substrate openstack` through the AM API ----------------------------------------------------------
@pytest.fixture
def aggregate(conn, tmp_path: Path, request):
    """A running `slicex up --substrate openstack` on the cloud, an AM client and a slice credential of
    alice's; afterwards nothing of the deployment may stay in the cloud. Nodes boot `default_image` (IMAGE, a
    blank disk, unless the test is marked `@pytest.mark.image(name)`)."""
    prefix = new_prefix()
    marker = request.node.get_closest_marker("image")
    image = marker.args[0] if marker else IMAGE
    home = make_home(tmp_path / "home", substrate_driver="openstack", sa_port=0, am_port=0,
                     openstack={"cloud": CLOUD, "physical_network": PHYSNET, "flavors": FLAVORS,
                                "images": {"ubuntu-22.04": image}, "default_image": image, "prefix": prefix})
    up = Up(home, "openstack", cwd=REPO)
    checker = OpenStackDriver(settings(prefix))
    checker.start()
    try:
        am_url = up.start()
        sa_url = procs.read(home.pid_file).info["sa_url"]
        cert, key = str(home.user_cert("alice")), str(home.user_key("alice"))
        am, sa = client(am_url, cert, key), client(sa_url, cert, key)
        urn = f"urn:publicid:IDN+{AUTHORITY}+slice+os{prefix}"
        cred = [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": sa.CreateSlice(urn)}]
        yield am, urn, cred, checker
    finally:
        up.stop()
        subprocess.run([sys.executable, "-m", "cli", "--home", str(home.root), "down"], capture_output=True,
                       timeout=60, cwd=REPO)
        checker.reconcile([])
        checker.shutdown()


def ok(reply: dict) -> Any:
    assert reply["code"]["geni_code"] == 0, reply.get("output")
    return reply["value"]


def sliver_urns(manifest: str) -> dict[str, str]:
    root = etree.fromstring(manifest.encode())
    return {e.get("client_id"): e.get("sliver_id") for tag in ("node", "link")
            for e in root.iter(f"{{{RSPEC3}}}{tag}")}


def states(am, urn: str, cred) -> dict[str, str]:
    return {s["geni_sliver_urn"]: s["geni_operational_status"] for s in ok(am.Status([urn], cred, {}))["geni_slivers"]}


def all_in(am, urn: str, cred, state: str, timeout_s: float = 60.0) -> dict[str, str]:
    return wait_until(f"every sliver {state}",
                      lambda: (st := states(am, urn, cred)) and all(v == state for v in st.values()) and st, timeout_s)


def two_nodes_on_a_vlan(capacity_kbps: int = 0) -> str:
    link = {"client_id": "lan0", "ifaces": ["n1:if0", "n2:if0"]}
    if capacity_kbps:
        link["capacity"] = capacity_kbps
    return request_rspec([vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0"])], [link])


def servers_of(conn, prefix: str) -> dict[str, Any]:
    return {s.name: s for s in conn.compute.servers() if s.name.startswith(prefix + "-")}


def test_a_two_node_vlan_slice_with_qos_lives_its_whole_life_through_the_am_api(aggregate, conn):
    am, urn, cred, checker = aggregate
    ok(am.Allocate(urn, cred, two_nodes_on_a_vlan(capacity_kbps=20_000), {}))
    manifest = ok(am.Provision([urn], cred, {"geni_users": []}))["geni_rspec"]
    urns = sliver_urns(manifest)
    assert set(urns) == {"n1", "n2", "lan0"}
    ok(am.PerformOperationalAction([urn], cred, "geni_start", {}))
    all_in(am, urn, cred, "geni_ready")

    servers = servers_of(conn, checker.prefix)
    assert len(servers) == 2 and {s.status for s in servers.values()} == {"ACTIVE"}
    net = next(iter(conn.network.networks(tags=f"slicex-{checker.prefix}")))
    assert net.provider_network_type == "vlan" and net.provider_physical_network == PHYSNET
    vlan = int(net.provider_segmentation_id)
    assert f'vlantag="{vlan}"' in manifest or str(vlan) in manifest
    rules = list(conn.network.qos_bandwidth_limit_rules(net.qos_policy_id))
    assert [(r.max_kbps, r.direction) for r in rules] == [(20_000, "egress")]
    ports = list(conn.network.ports(network_id=net.id))
    assert len(ports) == 2 and {p.binding_vif_type for p in ports} == {"ovs"}  # bound by the OVS agent's host

    ok(am.PerformOperationalAction([urns["n1"], urns["n2"]], cred, "geni_stop", {}))
    wait_until("servers SHUTOFF", lambda: {s.status for s in servers_of(conn, checker.prefix).values()} == {"SHUTOFF"})
    assert {states(am, urn, cred)[urns[n]] for n in ("n1", "n2")} == {"geni_notready"}
    ok(am.PerformOperationalAction([urns["n1"], urns["n2"]], cred, "geni_start", {}))
    all_in(am, urn, cred, "geni_ready")
    ok(am.PerformOperationalAction([urns["n1"], urns["n2"]], cred, "geni_restart", {}))
    all_in(am, urn, cred, "geni_ready")

    end = (datetime.now(UTC) + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    renewed = ok(am.Renew([urn], cred, end, {}))
    assert {s["geni_expires"][:16] for s in renewed} == {end[:16]}

    ok(am.Delete([urn], cred, {}))
    assert checker.leftovers() == []


def test_deleting_the_link_before_its_nodes_in_one_call_leaves_nothing(aggregate, conn):
    am, urn, cred, checker = aggregate
    ok(am.Allocate(urn, cred, two_nodes_on_a_vlan(), {}))
    urns = sliver_urns(ok(am.Provision([urn], cred, {"geni_users": []}))["geni_rspec"])
    ok(am.PerformOperationalAction([urn], cred, "geni_start", {}))
    all_in(am, urn, cred, "geni_ready")
    # the link first: Neutron refuses to delete a network while the nodes' ports are on it (409)
    ok(am.Delete([urns["lan0"], urns["n1"], urns["n2"]], cred, {}))
    assert not list(conn.network.networks(tags=f"slicex-{checker.prefix}")), "the link's close failed (409)"
    assert checker.leftovers() == []


def console(conn, server) -> str:
    return conn.compute.get_server_console_output(server).get("output") or ""


@pytest.mark.image(VM_IMAGE)
def test_two_servers_boot_the_slicex_vm_image_on_a_vlan_and_one_pings_the_other(aggregate, conn):
    """Nova's libvirt driver boots the VM form of a slicex image on both nodes; the guests take their addresses
    from the config drive and ping each other over the VLAN, which their console logs show."""
    am, urn, cred, checker = aggregate
    ok(am.Allocate(urn, cred, two_nodes_on_a_vlan(), {}))
    ok(am.Provision([urn], cred, {"geni_users": []}))
    t0 = time.monotonic()
    ok(am.PerformOperationalAction([urn], cred, "geni_start", {}))
    all_in(am, urn, cred, "geni_ready", timeout_s=300)
    active_s = time.monotonic() - t0
    servers = servers_of(conn, checker.prefix)
    assert len(servers) == 2 and {s.status for s in servers.values()} == {"ACTIVE"}
    net = next(iter(conn.network.networks(tags=f"slicex-{checker.prefix}")))
    assert net.provider_network_type == "vlan"
    ports = wait_until("both ports ACTIVE", lambda: (ps := list(conn.network.ports(network_id=net.id)))
                       and len(ps) == 2 and all(p.status == "ACTIVE" for p in ps) and ps, 120)
    address = {p.device_id: p.fixed_ips[0]["ip_address"] for p in ports}
    by_id = {s.id: s for s in servers.values()}
    assert set(address) == set(by_id)

    def a_ping() -> str:
        for sid, server in by_id.items():
            peer = next(a for other, a in address.items() if other != sid)
            log = console(conn, server)
            m = re.search(rf"slicex: ping {re.escape(peer)}: 3 packets transmitted, 3 received.*", log)
            if m:
                return f"{address[sid]} -> {m.group(0)}"
        return ""
    seen = wait_until("a guest's console showing it pinged the other", a_ping, 400)
    print(f"\nservers ACTIVE {active_s:.0f} s after geni_start; ping seen {time.monotonic() - t0:.0f} s after: "
          f"{seen}")
    ok(am.Delete([urn], cred, {}))
    assert checker.leftovers() == []
