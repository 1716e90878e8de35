"""Per-slice measurement through the AM API on the netns substrate: a link that asks for a mirror
(measure:mirror) has its packets copied to its slice's capture node, where a raw socket sees the pings
across the link; the slice's member reads the counters of its links and nodes (Describe with
slicex_measurement) and they count those pings."""

from __future__ import annotations

import subprocess
import time

from authority.substrate import hostnet
from rspec.namespaces import MEASURE
from slicex import procs
from slicex.tls_xmlrpc import client
from tests.factories import request_rspec, vm
from tests.integration import test_netns_am
from tests.integration.conftest import AUTHORITY
from tests.integration.netns_support import ping
from tests.integration.test_netns_am import namespaces_of, ok

netns_home = test_netns_am.netns_home  # the fixture: `slicex up --substrate netns` in a process of its own

PINGS = 5
# counts ICMP echo requests from 10.10.0.1 to 10.10.0.2 seen on one device for some seconds (VLAN-tagged
# or not), then prints the count
CAPTURE = """
import socket, sys, time
dev, seconds = sys.argv[1], float(sys.argv[2])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
s.bind((dev, 0))
s.settimeout(0.2)
seen, end = 0, time.time() + seconds
while time.time() < end:
    try:
        f = s.recv(4096)
    except socket.timeout:
        continue
    off = 12
    if f[off:off + 2] == b"\\x81\\x00":
        off += 4
    if f[off:off + 2] != b"\\x08\\x00":
        continue
    ip = f[off + 2:]
    if ip[9] == 1 and ip[12:16] == bytes([10, 10, 0, 1]) and ip[16:20] == bytes([10, 10, 0, 2]) \\
            and ip[(ip[0] & 15) * 4] == 8:
        seen += 1
print(seen)
"""


def mirrored_lan() -> str:
    mirror = f'<measure:mirror xmlns:measure="{MEASURE}" to="cap:if0"/>'
    return request_rspec([vm("a", ifaces=["a:if0"]), vm("b", ifaces=["b:if0"]), vm("cap", ifaces=["cap:if0"])],
                         [{"client_id": "lan0", "ifaces": ["a:if0", "b:if0"]}]).replace("</link>", mirror + "</link>")


def test_a_mirrored_link_is_seen_by_the_capture_node_and_its_member_reads_the_counters(netns_home):
    home, up, prefix = netns_home
    am_url = up.start()
    sa_url = procs.read(home.pid_file).info["sa_url"]
    cert, key = str(home.user_cert("alice")), str(home.user_key("alice"))
    am, sa = client(am_url, cert, key), client(sa_url, cert, key)
    urn = f"urn:publicid:IDN+{AUTHORITY}+slice+mirror"
    cred = [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": sa.CreateSlice(urn)}]
    ok(am.Allocate(urn, cred, mirrored_lan(), {}))
    ns = namespaces_of(ok(am.Provision([urn], cred, {"geni_users": []}))["geni_rspec"], prefix)
    ok(am.PerformOperationalAction([urn], cred, "geni_start", {}))
    devices = [d for d in hostnet.links(ns["cap"]) if d != "lo"]
    assert len(devices) == 1, devices
    capture = subprocess.Popen(["ip", "netns", "exec", ns["cap"], "python3", "-c", CAPTURE, devices[0], "6"],
                               stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)
    assert ping(ns["a"], "10.10.0.2", count=PINGS)[0]
    seen = int(capture.communicate(timeout=30)[0].strip())
    assert seen >= PINGS, f"the capture node saw {seen} of {PINGS} echo requests"
    assert not ping(ns["cap"], "10.10.0.1", count=1)[0]  # the capture port is in no segment: it only listens

    reply = ok(am.Describe([urn], cred, {"geni_rspec_version": {"type": "GENI", "version": "3"},
                                         "slicex_measurement": True}))
    counters = reply["slicex_measurement"]
    lan = counters["links"]["lan0"]
    assert set(lan["interfaces"]) == {"a:if0", "b:if0"}
    assert lan["interfaces"]["a:if0"]["rx_packets"] >= PINGS  # the switch received a's requests
    assert lan["interfaces"]["b:if0"]["rx_packets"] >= PINGS  # and b's replies
    assert counters["nodes"]["a"]["cpu_ns"] > 0 and counters["nodes"]["a"]["memory_bytes"] > 0
    ok(am.Delete([urn], cred, {}))
