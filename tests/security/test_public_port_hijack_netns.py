"""Public ports asked at ports the host listens on. A node's public port is a relay bound on the gateway's
address (authority/substrate/login.py); bound where a host service listens, it would answer that service's
clients (sshd's, the AM's, Redis's) from inside an experimenter's node.

- The aggregate's own ports and the privileged ones are never in the offer: `slicex up` refuses a
  `public_ports` range holding port 22 (or any below 1024), the AM's, the slice authority's, the actors', the
  dashboard's, the path service's or the Redis store's, naming each. Before, such a range was accepted, and
  a relay bound while the service was down (restarting, or the aggregate starting after its nodes' relays
  were adopted) took its port.
- A port in the range that another program of the host listens on is refused when the node's relay binds it
  (the kernel's EADDRINUSE: the relay never sets SO_REUSEPORT), and the program keeps its port and its
  clients. (Already so before: kept as a regression guard.)"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from deployment.service import deployment_substrate
from rspec.substrate import SubstrateError
from slicex.config import SlicexConfig
from tests.integration.conftest import AUTHORITY
from tests.integration.test_netns_am import namespaces_of, ok, slice_of
from tests.integration.test_netns_public_access import PORTS, ask, gateway_home  # noqa: F401 - a fixture
from tests.integration.test_public_ports_am import gateway_site

USES_HOST_NETWORK = True


def config(tmp_path: Path, ports: str, **settings) -> SlicexConfig:
    (tmp_path / "site.yaml").write_text(gateway_site(ports, cores=8, memory_mb=16384))
    return SlicexConfig(authority=AUTHORITY, substrate=str(tmp_path / "site.yaml"), **settings)


@pytest.mark.parametrize("ports, settings, named", [
    ("20-30", {}, "ports below 1024"),
    ("1-65535", {}, "sshd's 22"),
    ("6000-6500", {"store": "redis://127.0.0.1:6379/3"}, "6379 (the Redis store)"),
    ("7000-7100", {"store": "redis://127.0.0.1:7007/0"}, "7007 (the Redis store)"),
    ("8000-8010", {}, "8001 (am_port)"),
    ("8000-8010", {}, "8000 (sa_port)"),
    ("8000-8010", {}, "8002 (broker_port)"),
    ("8000-8010", {}, "8003 (authority_port)"),
    ("8000-8010", {}, "8004 (dashboard_port)"),
    ("8000-8010", {}, "8006 (am_v2_port)"),
    ("8000-8010", {}, "8007 (chapi_port)"),
    ("25000-26000", {"am_port": 25500}, "25500 (am_port)"),
])
def test_a_public_range_holding_the_hosts_or_the_aggregates_ports_is_refused_naming_them(tmp_path, ports, settings,
                                                                                       named):
    with pytest.raises(SubstrateError, match="public_ports would hand nodes ports of this host") as refused:
        deployment_substrate(config(tmp_path, ports, **settings))
    assert named in str(refused.value)


def test_a_range_of_its_own_is_accepted(tmp_path):
    substrate = deployment_substrate(config(tmp_path, "25100-25199", store="redis://127.0.0.1:6379/3"))
    assert substrate.public_ports == ((25100, 25199),)


class HostService:
    """A host program on 127.0.0.1:`port` answering each client with `banner` (as sshd or Redis would)."""

    def __init__(self, port: int, banner: bytes):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(16)
        self.banner = banner
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with c:
                c.sendall(self.banner)

    def read(self, port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            return c.recv(100)

    def close(self) -> None:
        self.sock.close()


def test_a_public_port_a_host_program_listens_on_is_never_bound_over_it(gateway_home):  # noqa: F811 - the fixture
    home, up, prefix = gateway_home
    am_url = up.start()
    port = PORTS[1]
    service = HostService(port, b"SSH-2.0-host-service\r\n")
    try:
        am, urn, cred = slice_of(home, am_url, "bob", "hijack")
        ok(am.Allocate(urn, cred, ask("web", (8080, port)), {}))  # the broker knows only its range
        provisioned = am.Provision([urn], cred, {"geni_users": []})
        if provisioned["code"]["geni_code"] == 0:  # a relay that failed to bind must leave the node failed
            ns = namespaces_of(provisioned["value"]["geni_rspec"], prefix)["web"]
            am.PerformOperationalAction([urn], cred, "geni_start", {})
            status = ok(am.Status([urn], cred, {}))
            node = [s for s in status["geni_slivers"] if ns.rsplit("-", 1)[-1] in s["geni_sliver_urn"]
                    or s["geni_operational_status"] != "geni_ready"]
            assert node and all(s["geni_operational_status"] == "geni_failed" for s in node), status
        else:
            assert f"{port} is taken by another program" in provisioned["output"], provisioned
        for _ in range(5):  # every client still reaches the host's program, none the node
            assert service.read(port) == b"SSH-2.0-host-service\r\n"
        am.Delete([urn], cred, {})
        assert service.read(port) == b"SSH-2.0-host-service\r\n"
    finally:
        service.close()
