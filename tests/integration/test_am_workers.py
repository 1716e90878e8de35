"""`slicex up --distributed --workers N`: N AM worker processes on one AM port (SO_REUSEPORT) over one Redis,
as users run it (separate processes, real ports, mutual TLS on 127.0.0.1)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
import time
from pathlib import Path

from slicex.home import Home
from slicex.tls_xmlrpc import client
from tests.factories import request_rspec, vm
from tests.integration.test_cli_processes import configure, slicex

REDIS = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/11")
CLIENTS = 4
CYCLES = 5


def _record(home: Path, role: str) -> dict:
    return json.loads((home / "run" / f"{role}.pid").read_text())


def _gone(pid: int) -> bool:
    from slicex.procs import _stat

    stat = _stat(pid)
    return stat is None or stat[0] in ("Z", "X")


def _served(log: Path, method: str) -> int:
    """How many calls of `method` one worker's log says it answered with success (slicex.endpoint logs one
    line per call: `Allocate -> 0 in 41.2 ms from urn:...`)."""
    return len(re.findall(rf"\b{method} -> 0 in ", log.read_text())) if log.exists() else 0


def _lifecycles(home: Path, am: int, sa: int, client_index: int, errors: list[str]) -> None:
    """CYCLES Allocate → Provision → Status → Delete of one slice, each call on a new TLS connection (as omni
    makes them), so the kernel chooses a worker for every call."""
    h = Home(home)
    cert, key = str(h.user_cert("alice")), str(h.user_key("alice"))
    urn = f"urn:publicid:IDN+workers.test+slice+c{client_index}"
    creds = [{"geni_type": "geni_sfa", "geni_version": "3",
              "geni_value": client(f"https://127.0.0.1:{sa}/", cert, key).CreateSlice(urn)}]
    for _ in range(CYCLES):
        for method, args in (("Allocate", (urn, creds, request_rspec([vm("n1")]), {})),
                             ("Provision", ([urn], creds, {})), ("Status", ([urn], creds, {})),
                             ("Delete", ([urn], creds, {}))):
            try:
                reply = getattr(client(f"https://127.0.0.1:{am}/", cert, key), method)(*args)
                if reply["code"]["geni_code"] != 0:
                    errors.append(f"{method}: {reply['code']} {reply.get('output')}")
            except Exception as exc:  # noqa: BLE001 - collected and asserted on in the test's thread
                errors.append(f"{method}: {type(exc).__name__}: {exc}")


def test_two_am_workers_on_one_port_serve_concurrent_lifecycles_and_both_answer_calls(tmp_path):
    from slicex.store.redis_store import RedisStore

    RedisStore(REDIS).flush()
    home = tmp_path / "home"
    ports = configure(home, "workers.test", store=REDIS)
    am, sa = ports["am_port"], ports["sa_port"]
    up = slicex(home, "up", "--distributed", "--workers", "2", "--detach")
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        first, second = _record(home, "slicex"), _record(home, "am-worker-1")
        assert first["workers"] == 2 and first["pid"] != second["pid"]
        assert second["am_url"] == first["am_url"] == f"https://127.0.0.1:{am}/"  # one port
        assert second["sm_name"].endswith("-w1")  # its own slice manager name: locks are held by name
        status = slicex(home, "status")
        assert status.returncode == 0, status.stdout + status.stderr
        assert f"AM worker 1: running, pid {second['pid']}" in status.stdout

        errors: list[str] = []
        threads = [threading.Thread(target=_lifecycles, args=(home, am, sa, i, errors)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert errors == []
        # each worker logs the calls it answered in a log of its own: between them, every call, and each
        # answered some (with 80 connections spread by the kernel, one worker taking all is ~1e-24)
        logs = home / "logs"
        for method in ("Allocate", "Provision", "Status", "Delete"):
            per_worker = [_served(logs / "slicex.log", method), _served(logs / "am-worker-1.log", method)]
            assert sum(per_worker) == CLIENTS * CYCLES, (method, per_worker)
        assert _served(logs / "slicex.log", "Allocate") > 0 and _served(logs / "am-worker-1.log", "Allocate") > 0
        held = {k: v for k, v in RedisStore(REDIS).all_claims().items() if not k.startswith("sa_slice:")}
        assert held == {}  # every sliver deleted, no lock left behind

        # a worker that dies is restarted under the same slice manager name, on the same port
        os.kill(second["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 30
        again = second
        while again["pid"] == second["pid"] and time.monotonic() < deadline:
            time.sleep(0.2)
            try:
                again = _record(home, "am-worker-1")
            except (OSError, ValueError):
                pass
        assert again["pid"] != second["pid"] and again["sm_name"] == second["sm_name"]
    finally:
        down = slicex(home, "down")
        RedisStore(REDIS).flush()
    assert down.returncode == 0, down.stdout + down.stderr
    for role, pid in (("slicex", first["pid"]), ("am-worker-1", again["pid"])):
        assert not (home / "run" / f"{role}.pid").exists() and _gone(pid)
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", am)) != 0  # nothing listens on the AM port any more


def test_the_embedded_deployment_refuses_several_workers_saying_why(tmp_path):
    home = tmp_path / "home"
    configure(home, "embedded.test")
    up = slicex(home, "up", "--workers", "2", "--detach")
    assert up.returncode == 2
    assert "--workers 2 needs --distributed" in up.stderr
    assert not (home / "run" / "slicex.pid").exists()  # nothing started
