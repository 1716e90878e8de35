"""The `slicex` command as users run it: separate processes, real ports, real TLS."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from slicex.home import Home
from slicex.tls_xmlrpc import client
from tests.factories import request_rspec, vm
from tests.ports import free_ports

REDIS = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/11")


def slicex(home: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", "--home", str(home), *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


def configure(home: Path, authority: str, **extra) -> dict[str, int]:
    """A fresh home (CA, user alice) whose processes listen on free ports; returns the ports by config key."""
    assert slicex(home, "ca", "init", "--authority", authority).returncode == 0
    ports = dict(zip(("sa_port", "am_port", "broker_port", "authority_port", "am_v2_port", "chapi_port"),
                     free_ports(6), strict=True))  # the derived ones too: am_port + 5 may be another's
    cfg = yaml.safe_load((home / "slicex.yaml").read_text())
    cfg.update({**ports, "dashboard_port": 0, **extra})
    (home / "slicex.yaml").write_text(yaml.safe_dump(cfg))
    assert slicex(home, "user", "add", "alice").returncode == 0
    return ports


def test_up_distributed_detach_runs_actor_processes_and_down_stops_them(tmp_path):
    from slicex.store.redis_store import RedisStore

    RedisStore(REDIS).flush()
    home = tmp_path / "home"
    sa, am, broker, authority, v2, chapi = free_ports(6)
    assert slicex(home, "ca", "init", "--authority", "proc.test").returncode == 0
    cfg = yaml.safe_load((home / "slicex.yaml").read_text())
    cfg.update({"sa_port": sa, "am_port": am, "broker_port": broker, "authority_port": authority, "am_v2_port": v2,
                "chapi_port": chapi, "dashboard_port": 0})
    (home / "slicex.yaml").write_text(yaml.safe_dump(cfg))
    assert slicex(home, "user", "add", "alice").returncode == 0
    up = slicex(home, "up", "--distributed", "--detach", env={"SLICEX_STORE": REDIS})
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
        def units() -> dict[str, str]:  # what slivers hold (the slice authority's slice records aside)
            return {k: v for k, v in RedisStore(REDIS).all_claims().items() if not k.startswith("sa_slice:")}

        claims = units()
        assert claims and all(owner.startswith(("ticket:", "lease-")) for owner in claims.values())  # broker groups, leases (authority lease_owner)
        assert am_proxy.Delete([urn], creds, {})["code"]["geni_code"] == 0
        assert units() == {}
        assert "broker actor" in (home / "logs" / "slicex.log").read_text()
    finally:
        down = slicex(home, "down")
        assert down.returncode == 0
        RedisStore(REDIS).flush()
    for port in (am, broker, authority):
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0  # nothing listens any more


@pytest.mark.parametrize("deployment", ["embedded", "distributed"])
def test_maintenance_takes_a_host_out_of_the_running_aggregates_inventory(tmp_path, deployment):
    """In both deployments the order is a message to the running authority actor (the embedded process serves
    its in-process authority as the distributed one's process does), which sends its signed reclaim to its
    broker."""
    from slicex.store.redis_store import RedisStore

    home = tmp_path / "home"
    ports = configure(home, "mnt.test")
    sa, am = ports["sa_port"], ports["am_port"]
    if deployment == "distributed":
        RedisStore(REDIS).flush()
    up = slicex(home, "up", "--detach", *(["--distributed"] if deployment == "distributed" else []),
                env={"SLICEX_STORE": REDIS} if deployment == "distributed" else None)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        out = slicex(home, "maintenance", "bm1")
        assert out.returncode == 0, out.stdout + out.stderr
        assert "(the authority actor at https://127.0.0.1:" in out.stdout, out.stdout
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


# ---- one configuration source, supervision, pid files by identity ---------------------------------------------------
def _env_without_store() -> dict:
    """The environment an operator's fresh shell has: no store override."""
    return {k: v for k, v in os.environ.items() if k not in ("SLICEX_STORE", "SLICEX_REDIS_URL")}


def _run(home: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", "--home", str(home), *args], capture_output=True,
                          text=True, timeout=120, env=env if env is not None else _env_without_store())


def _record(home: Path, role: str) -> dict:
    import json

    return json.loads((home / "run" / f"{role}.pid").read_text())


def _wait(predicate, timeout: float = 15.0) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def _gone(pid: int) -> bool:
    from slicex.procs import _stat

    stat = _stat(pid)
    return stat is None or stat[0] in ("Z", "X")


def test_an_actor_started_by_hand_uses_the_deployments_redis_and_refuses_another_store(tmp_path):
    import signal

    from slicex.store.redis_store import RedisStore

    RedisStore(REDIS).flush()
    home = tmp_path / "home"
    configure(home, "hand.test")
    up = _run(home, "up", "--distributed", "--detach", env={**_env_without_store(), "SLICEX_STORE": REDIS})
    assert up.returncode == 0, up.stdout + up.stderr
    assert yaml.safe_load((home / "slicex.yaml").read_text())["store"] == REDIS  # recorded for every process
    assert _run(home, "down").returncode == 0
    try:
        hand = subprocess.Popen([sys.executable, "-m", "cli", "--home", str(home), "actor", "broker"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env_without_store())
        try:
            assert _wait(lambda: (home / "run" / "broker.pid").exists() or hand.poll() is not None)
            assert hand.poll() is None and _record(home, "broker")["pid"] == hand.pid
            status = _run(home, "status")
            assert "broker:" in status.stdout and f"running, pid {hand.pid}" in status.stdout, status.stdout
            assert f"store:      {REDIS} (answering, this deployment's)" in status.stdout
        finally:
            hand.send_signal(signal.SIGTERM)
            out, _ = hand.communicate(timeout=20)
        assert f"(store {REDIS})" in out
        assert not (home / "run" / "broker.pid").exists()
        # an override that points elsewhere (the split the old `slicex actor` made) is refused
        other = _run(home, "actor", "broker", env={**_env_without_store(),
                                                   "SLICEX_STORE": f"sqlite:///{tmp_path / 'other.db'}"})
        assert other.returncode == 2 and "not this deployment's store" in other.stderr, other.stderr
    finally:
        RedisStore(REDIS).flush()


def test_kill_9_of_the_deployment_takes_its_actors_with_it_and_the_next_up_is_its_own(tmp_path):
    import signal

    from slicex.store.redis_store import RedisStore

    RedisStore(REDIS).flush()
    home = tmp_path / "home"
    ports = configure(home, "kill.test", store=REDIS)
    assert _run(home, "up", "--distributed", "--detach").returncode == 0
    try:
        first = {role: _record(home, role)["pid"] for role in ("slicex", "broker", "authority")}
        os.kill(first["slicex"], signal.SIGKILL)
        assert _wait(lambda: _gone(first["broker"]) and _gone(first["authority"])), "actors outlived their deployment"
        assert _run(home, "status").returncode == 3
        up = _run(home, "up", "--distributed", "--detach")
        assert up.returncode == 0, up.stdout + up.stderr
        second = {role: _record(home, role)["pid"] for role in ("slicex", "broker", "authority")}
        assert not set(second.values()) & set(first.values())
        status = _run(home, "status")
        # the aggregate, its store and each actor's process; then each actor role's active process (its lease)
        assert status.returncode == 0 and status.stdout.count("(answering") == 6, status.stdout
        assert "broker role: active" in status.stdout and "authority role: active" in status.stdout, status.stdout
        # an actor that dies is restarted by its deployment
        os.kill(second["broker"], signal.SIGKILL)
        assert _wait(lambda: _record(home, "broker")["pid"] != second["broker"])
        assert _wait(lambda: _run(home, "status").returncode == 0)
    finally:
        down = _run(home, "down")
    assert down.returncode == 0 and not list((home / "run").glob("*.pid")), down.stdout
    for key in ("sa_port", "am_port", "broker_port", "authority_port"):
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", ports[key])) != 0
    RedisStore(REDIS).flush()


def test_up_stops_actors_left_running_and_refuses_ports_held_by_strangers(tmp_path):
    import signal

    from slicex.store.redis_store import RedisStore

    RedisStore(REDIS).flush()
    home = tmp_path / "home"
    ports = configure(home, "orphan.test", store=REDIS)
    assert _run(home, "up", "--distributed", "--detach").returncode == 0
    assert _run(home, "down").returncode == 0
    # an actor that no `up` supervises (started by hand, or one whose `up` died without taking it along)
    orphan = subprocess.Popen([sys.executable, "-m", "cli", "--home", str(home), "actor", "broker"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env_without_store())
    try:
        assert _wait(lambda: (home / "run" / "broker.pid").exists())
        up = _run(home, "up", "--distributed", "--detach")
        assert up.returncode == 0 and "stopping the broker actor left running" in up.stdout, up.stdout + up.stderr
        assert orphan.wait(20) is not None and _record(home, "broker")["pid"] != orphan.pid
        assert _run(home, "status").returncode == 0
        assert _run(home, "down").returncode == 0
        # a listener that is not this deployment's: `up` says so instead of reporting "up" on it
        with socket.socket() as stranger:
            stranger.bind(("127.0.0.1", ports["am_port"]))
            stranger.listen()
            up = _run(home, "up", "--distributed", "--detach")
            assert up.returncode == 2 and f"port {ports['am_port']} (am_port)" in up.stderr, up.stdout + up.stderr
            assert not (home / "run" / "slicex.pid").exists()
        # a port derived from another unless set (the AM API v2 endpoint): refused the same way, by name (a
        # bare "Address already in use" from the detached child before)
        with socket.socket() as stranger:
            stranger.bind(("127.0.0.1", ports["am_v2_port"]))
            stranger.listen()
            up = _run(home, "up", "--distributed", "--detach")
            assert up.returncode == 2 and f"port {ports['am_v2_port']} (am_v2_port)" in up.stderr, up.stdout + up.stderr
    finally:
        if orphan.poll() is None:
            orphan.send_signal(signal.SIGKILL)
        _run(home, "down")
        RedisStore(REDIS).flush()


def test_a_zombie_or_a_reused_pid_is_not_running(tmp_path):
    import json
    import signal
    import time

    from slicex import procs

    home = tmp_path / "home"
    configure(home, "pid.test")
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        # until the child has exec'd, its command line is still this process's (a loaded host showed that)
        assert _wait(lambda: tuple(procs._cmdline(sleeper.pid))[:1] == ("sleep",))
        record = procs.ProcessRecord(sleeper.pid, procs._stat(sleeper.pid)[1], procs._cmdline(sleeper.pid))
        assert procs.alive(record)
        # the same pid with another start time (a reused pid) or another command line is someone else
        assert not procs.alive(procs.ProcessRecord(record.pid, record.start + 1, record.cmdline))
        assert not procs.alive(procs.ProcessRecord(record.pid, record.start, ("python", "-m", "cli")))
        # `down` leaves a stranger whose pid is in a stale pid file alone
        (home / "run").mkdir(exist_ok=True)
        (home / "run" / "slicex.pid").write_text(json.dumps({"pid": sleeper.pid, "start": record.start + 1,
                                                             "cmdline": list(record.cmdline)}))
        down = _run(home, "down")
        assert down.returncode == 0 and "not running" in down.stdout and sleeper.poll() is None
        assert not (home / "run" / "slicex.pid").exists()  # the stale file is gone
        os.kill(sleeper.pid, signal.SIGKILL)
        assert _wait(lambda: procs._stat(sleeper.pid)[0] == "Z")  # not reaped yet: a zombie
        assert not procs.alive(record)
        procs.write(home / "run" / "slicex.pid", record)
        start = time.monotonic()
        up = _run(home, "up", "--detach")
        assert up.returncode == 0, up.stdout + up.stderr  # not "already running (pid N)"
        assert time.monotonic() - start < 60
    finally:
        sleeper.kill()
        sleeper.wait()
        _run(home, "down")


def test_ca_init_port_base_gives_a_second_home_ports_of_its_own(tmp_path):
    home = tmp_path / "second"
    assert _run(home, "ca", "init", "--port-base", "18100").returncode == 0
    cfg = yaml.safe_load((home / "slicex.yaml").read_text())
    assert [cfg[k] for k in ("sa_port", "am_port", "broker_port", "authority_port", "dashboard_port")] == \
        [18100, 18101, 18102, 18103, 18104]
    assert _run(home, "ca", "init", "--port-base", "18200").returncode == 2  # the config exists: not rewritten


def test_up_refuses_a_mistyped_key_in_slicex_yaml_naming_it_before_anything_starts(tmp_path):
    home = tmp_path / "typo"
    assert _run(home, "ca", "init").returncode == 0
    config = home / "slicex.yaml"
    config.write_text(config.read_text() + "netns:\n  swtich_dir: /run/shared-ovs\n")
    up = _run(home, "up", "--detach")
    assert up.returncode == 2
    assert "unknown key 'netns.swtich_dir' (did you mean 'switch_dir'?)" in up.stderr
    assert len(up.stderr.strip().splitlines()) == 1  # one line, no traceback
    assert not (home / "run" / "slicex.pid").exists() and not (home / "state.db").exists()
    # every command that reads the home's configuration says the same
    status = _run(home, "config")
    assert status.returncode == 2 and "netns.swtich_dir" in status.stderr


def test_two_am_workers_from_copies_of_one_home_each_serve_their_own_actors(tmp_path):
    """AM workers sharing one store from copies of one home (same CA, config and deployment, ports of their
    own), as bench/am_api.py's redis-2workers starts them: both serve. Each serves its in-process broker and
    authority on 127.0.0.1 at a free port (they once both took the configured broker_port, and the second
    worker exited with "Address already in use"), and `slicex plan` on each home reaches its own broker."""
    import shutil

    from slicex.store.redis_store import RedisStore

    RedisStore(REDIS).flush()
    first = tmp_path / "w0"
    configure(first, "workers.test", store=REDIS)
    second = tmp_path / "w1"
    request = tmp_path / "one.xml"
    request.write_text(request_rspec([vm("n1")]))
    try:
        up = slicex(first, "up", "--detach")
        assert up.returncode == 0, up.stdout + up.stderr
        # the second worker: a copy of the first's home once its deployment exists, with ports of its own
        shutil.copytree(first, second, ignore=shutil.ignore_patterns("run", "logs", "state.db*"))
        cfg = yaml.safe_load((second / "slicex.yaml").read_text())
        cfg.update(dict(zip(("sa_port", "am_port", "am_v2_port", "chapi_port"), free_ports(4), strict=True)))
        (second / "slicex.yaml").write_text(yaml.safe_dump(cfg))
        up = slicex(second, "up", "--detach")
        assert up.returncode == 0, up.stdout + up.stderr
        urls = [Home(h).pid_file.read_text() for h in (first, second)]
        for home in (first, second):
            plan = slicex(home, "plan", str(request))
            assert plan.returncode == 0 and "answered by the broker actor at https://127.0.0.1:" in plan.stdout, \
                plan.stdout + plan.stderr
        assert urls[0] != urls[1]
    finally:
        for home in (first, second):
            slicex(home, "down")
        RedisStore(REDIS).flush()


def test_up_detach_on_a_home_without_local_users_says_it_is_up(tmp_path):
    """A testbed whose only users are its peers' has no local user certificate: the readiness check asked the
    AM as a local user, found none, and `up --detach` said "did not answer within 60 s" of an aggregate that
    was serving. It asks with the AM's own certificate then, and says there is no omni config to write."""
    import time

    home = tmp_path / "nousers"
    assert slicex(home, "ca", "init", "--authority", "nousers.test").returncode == 0
    cfg = yaml.safe_load((home / "slicex.yaml").read_text())
    cfg.update({**dict(zip(("sa_port", "am_port", "broker_port", "authority_port", "am_v2_port", "chapi_port"),
                           free_ports(6), strict=True)), "dashboard_port": 0})
    (home / "slicex.yaml").write_text(yaml.safe_dump(cfg))
    assert Home(home).users() == []
    try:
        began = time.monotonic()
        up = slicex(home, "up", "--detach")
        took = time.monotonic() - began
        assert up.returncode == 0, up.stdout + up.stderr
        assert "slicex is up" in up.stdout and "no local users" in up.stdout, up.stdout
        assert took < 30, f"up --detach took {took:.1f} s"
        h = Home(home)
        reply = client(f"https://127.0.0.1:{cfg['am_port']}/", str(h.am_cert), str(h.am_key)).GetVersion()
        assert reply["value"]["geni_api"] == 3
        status = slicex(home, "status")
        assert "(answering)" in status.stdout, status.stdout  # `slicex status` asked the same way
    finally:
        slicex(home, "down")
