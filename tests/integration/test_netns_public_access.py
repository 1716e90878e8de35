"""Public access through the AM API on the netns substrate: a node's port forwarded from the gateway's public
ports (the substrate's `public_ports`, handed out by the broker as `pport:` units), shown in the manifest as
host:public_port, reached from the host by a TCP client while a server in the node's container answers;
a port outside the operator's range is BADARGS, one another slice holds is UNAVAILABLE; the forward outlives
a SIGKILL of the aggregate and is adopted by the next start; after Delete the port is closed and free for
another slice."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from lxml import etree

from authority.substrate.container import NodeContainer
from authority.substrate.netns import NetnsDriver
from rspec.namespaces import PUBLIC
from slicex.tls_xmlrpc import client
from tests.factories import RSPEC3, request_rspec, vm
from tests.integration.conftest import make_home
from tests.integration.netns_support import new_prefix, require_host
from tests.integration.test_netns_am import namespaces_of, ok, slice_of, up_then_down
from tests.integration.test_public_ports_am import gateway_site

PORTS = (25100, 25102)  # the operator's public range in this test (this helper's port base)
SITE = gateway_site(f"{PORTS[0]}-{PORTS[1]}", cores=8, memory_mb=16384)
# a TCP server in the node's container: answers each connection with the node's name and the port
SERVER = ("use IO::Socket::INET; my $s = IO::Socket::INET->new(LocalPort => 8080, Listen => 5, ReuseAddr => 1) "
          "or die $!; while (my $c = $s->accept) { print $c 'hello from ' . `hostname`; close $c }")


def public(port: int, public_port: int | None = None) -> str:
    asked = f' public_port="{public_port}"' if public_port else ""
    return f'<public:port xmlns:public="{PUBLIC}" port="{port}"{asked}/>'


def ask(cid: str, *ports: tuple[int, int | None]) -> str:
    return request_rspec([vm(cid, extra="".join(public(p, q) for p, q in ports))])


def forwards(manifest: str) -> dict[str, list[tuple[str, int, int]]]:
    """client_id -> (host, public_port, node port) of each public:port of the manifest's nodes."""
    root = etree.fromstring(manifest.encode())
    return {n.get("client_id"): [(p.get("host"), int(p.get("public_port") or 0), int(p.get("port")))
                                 for p in n.iter(f"{{{PUBLIC}}}port")]
            for n in root.iter(f"{{{RSPEC3}}}node")}


def answer(host: str, port: int, timeout: float = 20.0) -> str:
    """What a TCP client on the host reads from host:port (retrying until the node's server listens)."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=3) as c:
                data = c.recv(200).decode()
            if data:
                return data
        except OSError as exc:
            last = str(exc)
        time.sleep(0.3)
    raise AssertionError(f"{host}:{port} did not answer: {last}")


@pytest.fixture
def gateway_home(tmp_path: Path):
    require_host()
    prefix = new_prefix()
    (tmp_path / "site.yaml").write_text(SITE)
    home = make_home(tmp_path / "home", substrate_driver="netns", netns={"prefix": prefix},
                     substrate=str(tmp_path / "site.yaml"), sa_port=0, am_port=0)
    with up_then_down(home, prefix) as up:
        yield home, up, prefix


def test_a_public_port_reaches_a_server_in_the_node_is_exclusive_and_gone_after_delete(gateway_home):
    home, up, prefix = gateway_home
    am_url = up.start()
    am_a, urn_a, cred_a = slice_of(home, am_url, "alice", "pub-a")
    am_b, urn_b, cred_b = slice_of(home, am_url, "bob", "pub-b")
    taken = PORTS[0] + 1
    allocated = ok(am_a.Allocate(urn_a, cred_a, ask("web", (8080, taken)), {}))["geni_rspec"]
    assert forwards(allocated)["web"] == [(None, taken, 8080)]  # the broker's choice, before any host exists

    outside = am_b.Allocate(urn_b, cred_b, ask("web", (8080, 30000)), {})
    assert outside["code"]["geni_code"] == 1, outside  # BADARGS, naming the range
    assert f"outside the operator's range ({PORTS[0]}-{PORTS[1]})" in outside["output"]
    held = am_b.Allocate(urn_b, cred_b, ask("web", (8080, taken)), {})
    assert held["code"]["geni_code"] == 11, held  # UNAVAILABLE: slice a holds it
    assert f"public port {taken} is held by another sliver" in held["output"]

    manifest = ok(am_a.Provision([urn_a], cred_a, {"geni_users": []}))["geni_rspec"]
    assert forwards(manifest)["web"] == [("127.0.0.1", taken, 8080)], manifest
    ok(am_a.PerformOperationalAction([urn_a], cred_a, "geni_start", {}))
    ns = namespaces_of(manifest, prefix)["web"]
    driver = NetnsDriver(prefix)
    container = NodeContainer(driver.lxcpath, ns)
    container.spawn(["perl", "-e", SERVER], driver.nodes_dir / ns / "server.pid", driver.nodes_dir / ns / "server.log")
    assert answer("127.0.0.1", taken).strip() == "hello from web"
    status = ok(am_a.Status([urn_a], cred_a, {}))
    assert {s["geni_operational_status"] for s in status["geni_slivers"]} == {"geni_ready"}, status

    # the aggregate killed and started again: the relay is a process of its own, adopted by reconcile
    up.kill9()
    assert answer("127.0.0.1", taken).strip() == "hello from web"
    am_url = up.start()
    am_a = client(am_url, str(home.user_cert("alice")), str(home.user_key("alice")))
    am_b = client(am_url, str(home.user_cert("bob")), str(home.user_key("bob")))
    status = ok(am_a.Status([urn_a], cred_a, {}))
    assert {s["geni_operational_status"] for s in status["geni_slivers"]} == {"geni_ready"}, status
    assert answer("127.0.0.1", taken).strip() == "hello from web"

    # any free port: bob's node gets the lowest the broker has not promised
    got = forwards(ok(am_b.Allocate(urn_b, cred_b, ask("web", (8080, None)), {}))["geni_rspec"])["web"]
    assert got == [(None, PORTS[0], 8080)], got
    ok(am_b.Delete([urn_b], cred_b, {}))

    ok(am_a.Delete([urn_a], cred_a, {}))
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", taken), timeout=3).close()
    assert NetnsDriver(prefix).leftovers() == []
    # released with the sliver: another slice may have it now
    again = forwards(ok(am_b.Allocate(urn_b, cred_b, ask("web", (8080, taken)), {}))["geni_rspec"])["web"]
    assert again == [(None, taken, 8080)]
    ok(am_b.Delete([urn_b], cred_b, {}))
