"""The `slicex` command as users run it: separate processes, real ports, real TLS."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import yaml

from slicex.home import Home
from slicex.tls_xmlrpc import client
from tests.factories import request_rspec, vm

REDIS = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/11")


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def slicex(home: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slicex.cli", "--home", str(home), *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


def configure(home: Path, authority: str, **extra) -> dict[str, int]:
    """A fresh home (CA, user alice) whose processes listen on free ports; returns the ports by config key."""
    assert slicex(home, "ca", "init", "--authority", authority).returncode == 0
    ports = dict(zip(("sa_port", "am_port", "broker_port", "authority_port"), free_ports(4), strict=True))
    cfg = yaml.safe_load((home / "slicex.yaml").read_text())
    cfg.update({**ports, "dashboard_port": 0, **extra})
    (home / "slicex.yaml").write_text(yaml.safe_dump(cfg))
    assert slicex(home, "user", "add", "alice").returncode == 0
    return ports


def test_up_distributed_detach_runs_actor_processes_and_down_stops_them(tmp_path):
    from slicex.store.redis_store import RedisStore

    RedisStore(REDIS).flush()
    home = tmp_path / "home"
    sa, am, broker, authority = free_ports(4)
    assert slicex(home, "ca", "init", "--authority", "proc.test").returncode == 0
    cfg = yaml.safe_load((home / "slicex.yaml").read_text())
    cfg.update({"sa_port": sa, "am_port": am, "broker_port": broker, "authority_port": authority, "dashboard_port": 0})
    (home / "slicex.yaml").write_text(yaml.safe_dump(cfg))
    assert slicex(home, "user", "add", "alice").returncode == 0
    up = slicex(home, "up", "--distributed", "--detach", env={"SLICEX_REDIS_URL": REDIS})
    assert up.returncode == 0, up.stderr + up.stdout
    try:
        h = Home(home)
        am_proxy = client(f"https://127.0.0.1:{am}/", str(h.user_cert("alice")), str(h.user_key("alice")))
        sa_proxy = client(f"https://127.0.0.1:{sa}/", str(h.user_cert("alice")), str(h.user_key("alice")))
        urn = "urn:publicid:IDN+proc.test+slice+p1"
        creds = [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": sa_proxy.CreateSlice(urn)}]
        for reply in (am_proxy.Allocate(urn, creds, request_rspec([vm("a")]), {}), am_proxy.Provision([urn], creds, {}),
                      am_proxy.Status([urn], creds, {})):
            assert reply["code"]["geni_code"] == 0, reply["output"]
        # the state lives in Redis, written through the separate broker process
        claims = RedisStore(REDIS).all_claims()
        assert claims and all(owner.startswith("ticket:") for owner in claims.values())
        assert am_proxy.Delete([urn], creds, {})["code"]["geni_code"] == 0
        assert RedisStore(REDIS).all_claims() == {}
        assert "broker actor" in (home / "logs" / "slicex.log").read_text()
    finally:
        down = slicex(home, "down")
        assert down.returncode == 0
        RedisStore(REDIS).flush()
    for port in (am, broker, authority):
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0  # nothing listens any more


def test_maintenance_takes_a_host_out_of_the_running_aggregates_inventory(tmp_path):
    home = tmp_path / "home"
    sa, am = free_ports(2)
    assert slicex(home, "ca", "init", "--authority", "mnt.test").returncode == 0
    cfg = yaml.safe_load((home / "slicex.yaml").read_text())
    cfg.update({"sa_port": sa, "am_port": am, "dashboard_port": 0})
    (home / "slicex.yaml").write_text(yaml.safe_dump(cfg))
    assert slicex(home, "user", "add", "alice").returncode == 0
    assert slicex(home, "up", "--detach").returncode == 0
    try:
        out = slicex(home, "maintenance", "bm1")
        assert out.returncode == 0, out.stdout + out.stderr
        h = Home(home)
        am_proxy = client(f"https://127.0.0.1:{am}/", str(h.user_cert("alice")), str(h.user_key("alice")))
        sa_proxy = client(f"https://127.0.0.1:{sa}/", str(h.user_cert("alice")), str(h.user_key("alice")))
        urn = "urn:publicid:IDN+mnt.test+slice+m1"
        creds = [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": sa_proxy.CreateSlice(urn)}]
        bm1 = {"client_id": "b", "component_id": "urn:publicid:IDN+mnt.test+node+bm1", "sliver_type": "raw-pc"}
        reply = am_proxy.Allocate(urn, creds, request_rspec([bm1]), {})
        assert reply["code"]["geni_code"] == 26 and "bm1" in reply["output"]  # bound to a host in maintenance
        unbound = am_proxy.Allocate(urn, creds, request_rspec([{"client_id": "u", "sliver_type": "raw-pc"}]), {})
        assert unbound["code"]["geni_code"] == 0 and "bm2" in unbound["value"]["geni_rspec"]  # planned around it
        assert slicex(home, "maintenance", "bm1", "--end").returncode == 0
        assert am_proxy.Allocate(urn, creds, request_rspec([bm1]), {})["code"]["geni_code"] == 0
    finally:
        slicex(home, "down")
