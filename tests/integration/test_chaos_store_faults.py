"""Chaos of the store's ground (issue 22): a Redis that comes back empty, a disk that fills up, a home on a
read-only file system. Each ends with the deployment refusing or reporting it plainly (`slicex up` on the
terminal, `/health`, `slicex status` exiting non-zero, `/metrics`, a GENI code naming the cause at the AM
API) and nothing lost: once the disk has room again the store is whole and serves as before.

Run as `slicex` runs for an operator (`up --detach`, `status`, `down`), on a home of its own; the full disk is
a small tmpfs, the read-only home a read-only bind mount (root only)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.factories import request_rspec, vm
from tests.integration.conftest import REDIS_URL
from tests.integration.test_chaos import Deployment, _wait

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="tmpfs and bind mounts need root")


def _creds(dep: Deployment, name: str) -> tuple[str, list[dict[str, str]]]:
    _am, sa = dep.proxy()
    urn = f"urn:publicid:IDN+chaos.test+slice+{name}"
    cred = sa.CreateSlice(urn)
    assert isinstance(cred, str), cred
    return urn, [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": cred}]


def _allocate(dep: Deployment, urn: str, creds: list[dict[str, str]], node: str) -> dict:
    am, _sa = dep.proxy()
    return am.Allocate(urn, creds, request_rspec([vm(node)]), {})


def _health(dep: Deployment) -> dict:
    url = f"http://127.0.0.1:{dep.cfg.dashboard_port}/health"
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return json.load(reply)
    except urllib.error.HTTPError as exc:
        return json.load(exc)


def _metric(dep: Deployment, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{dep.cfg.dashboard_port}/metrics", timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


@contextmanager
def small_disk(where: Path, size: str = "24m") -> Iterator[Path]:
    """A tmpfs of `size` mounted at `where`, unmounted afterwards."""
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(disk: Path) -> Path:
    """Write until the disk is full; the file that filled it (remove it to give the space back)."""
    filler = disk / "filler"
    try:
        open(filler, "wb").close()
    except OSError as exc:  # full before the test filled it: say what filled it (it happened under load)
        usage = subprocess.run(["du", "-a", str(disk)], capture_output=True, text=True).stdout
        top = "\n".join(sorted(usage.splitlines(), key=lambda line: -int(line.split()[0]))[:10])
        logs = "".join(p.read_text(errors="replace")[-3000:] for p in disk.rglob("*.log"))
        raise AssertionError(f"the small disk was full already ({exc}); largest:\n{top}\nlogs:\n{logs}") from None
    # Unbuffered: a buffered writer keeps what the full disk refused and raises ENOSPC again when it closes
    # (CI saw that OSError at the `with` line).
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * (1 << 16))
        except OSError:
            pass
    return filler


def _up_here(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("SLICEX_STORE", "SLICEX_REDIS_URL")}
    return subprocess.run([sys.executable, "-m", "cli", "--home", str(root), "up", *args],
                          capture_output=True, text=True, timeout=120, env=env)


def test_redis_wiped_under_a_running_deployment_is_refused_and_reported(tmp_path: Path):
    """Redis restarted empty under a running distributed deployment: writes refused (UNAVAILABLE naming the
    lost record), /health, /metrics and `slicex status` say so; after `down`, `up` refuses the empty store
    instead of adopting it, and only `up --init-store` starts on it (saying so). On main every Allocate
    succeeded on the empty store, /health said serving and the next `up` adopted it silently."""
    from slicex.store.redis_store import RedisStore

    RedisStore(REDIS_URL).flush()
    dep = Deployment(tmp_path / "home", distributed=True, store=REDIS_URL)
    try:
        dep.up()
        urn, creds = _creds(dep, "kept")
        assert _allocate(dep, urn, creds, "a")["code"]["geni_code"] == 0
        RedisStore(REDIS_URL).flush()  # what a Redis without persistence looks like after a restart

        assert _wait(lambda: not _health(dep)["serving"], 10), _health(dep)
        assert "lost this deployment's record" in _health(dep)["checks"]["store"]
        reply = _allocate(dep, urn, creds, "b")
        assert reply["code"]["geni_code"] == 11 and "lost this deployment's record" in reply["output"], reply
        assert _metric(dep, "slicex_serving") == 0
        status = dep.cli("status", check=False)
        assert status.returncode == 3 and "NOT SERVING" in status.stdout, status.stdout

        dep.cli("down")
        refused = dep.cli("up", "--detach", "--distributed", check=False)
        assert refused.returncode == 2 and "--init-store" in refused.stderr, refused.stdout + refused.stderr
        assert dep.pid("slicex") is None and dep.cli("status", check=False).returncode == 3
        started = dep.cli("up", "--detach", "--distributed", "--init-store", check=False)
        assert started.returncode == 0 and "initialised for deployment" in started.stdout, started.stdout
        assert dep.status_ok(10)
        assert _metric(dep, "slicex_serving") == 1
    finally:
        dep.cli("down", check=False)
        RedisStore(REDIS_URL).flush()


def test_full_disk_is_reported_refused_and_nothing_is_lost(tmp_path: Path):
    """The disk of an embedded deployment's home (its SQLite store, its log) fills while it runs: /health,
    /metrics and `slicex status` (exit 3) say the disk is full and Allocate is refused naming it; once the
    space is back it serves again, the store passes SQLite's integrity check and holds what it held. `up` on
    the full disk says why on the terminal. On main, status said "serving" (exit 0) on the full disk and `up`
    printed only "slicex exited with 1; see slicex.log"."""
    with small_disk(tmp_path / "disk") as disk:
        dep = Deployment(disk / "home", distributed=False)
        try:
            dep.up()
            urn, creds = _creds(dep, "kept")
            assert _allocate(dep, urn, creds, "a")["code"]["geni_code"] == 0
            filler = _fill(disk)

            assert _wait(lambda: not _health(dep)["serving"], 10), _health(dep)
            assert "full" in _health(dep)["checks"]["disk"]
            status = dep.cli("status", check=False)
            assert status.returncode == 3 and "full" in status.stdout, status.stdout
            assert _metric(dep, "slicex_serving") == 0
            reply = _allocate(dep, urn, creds, "b")
            assert reply["code"]["geni_code"] != 0 and "full" in reply["output"], reply

            filler.unlink()
            assert _wait(lambda: _health(dep)["serving"], 10), _health(dep)
            assert dep.status_ok(10)
            am, _sa = dep.proxy()
            kept = am.Status([urn], creds, {})
            assert kept["code"]["geni_code"] == 0 and len(kept["value"]["geni_slivers"]) == 1, kept
            assert _allocate(dep, urn, creds, "c")["code"]["geni_code"] == 0
            assert am.Delete([urn], creds, {})["code"]["geni_code"] == 0
            with sqlite3.connect(disk / "home" / "state.db") as db:
                assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"

            dep.cli("down")
            filler = _fill(disk)
            refused = _up_here(disk / "home", "--detach")
            assert refused.returncode == 2 and "is full" in refused.stderr, refused.stdout + refused.stderr
            assert "Traceback" not in refused.stderr
            filler.unlink()
        finally:
            dep.cli("down", check=False)


def test_read_only_home_is_refused_plainly(tmp_path: Path):
    """A home on a read-only file system: `up` (detached or not) exits 2 saying so, no traceback (main
    printed one from unlinking the pid file)."""
    dep = Deployment(tmp_path / "home", distributed=False)
    dep.up()
    dep.cli("down")
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "--bind", str(tmp_path / "home"), str(ro)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True)
        for args in (("--detach",), ()):
            out = _up_here(ro, *args)
            assert out.returncode == 2 and "read-only file system" in out.stderr, out.stdout + out.stderr
            assert "Traceback" not in out.stderr and "remount it read-write" in out.stderr, out.stderr
        status = subprocess.run([sys.executable, "-m", "cli", "--home", str(ro), "status"], capture_output=True,
                                text=True, timeout=60)
        assert status.returncode == 3 and "read-only" in status.stdout, status.stdout + status.stderr
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=False)


def test_a_home_that_ran_embedded_starts_distributed_on_a_new_store_and_refuses_that_store_wiped(tmp_path: Path):
    """The documented path from the demo to the scaled-out deployment (`make demo`, then `slicex up
    --distributed`): Redis is a store this home never ran on, so its first `up` there initialises it and says
    so; once it has run there, the same store wiped is refused like any other."""
    from slicex.store.redis_store import RedisStore

    RedisStore(REDIS_URL).flush()
    dep = Deployment(tmp_path / "home", distributed=False)
    try:
        dep.up()
        assert dep.status_ok(10)
        dep.cli("down")
        dep.distributed = True
        dep.env["SLICEX_STORE"] = REDIS_URL
        started = dep.cli("up", "--detach", "--distributed", check=False)
        assert started.returncode == 0 and "first `slicex up` on this store" in started.stdout, \
            started.stdout + started.stderr
        assert dep.status_ok(10)
        dep.cli("down")
        RedisStore(REDIS_URL).flush()
        refused = dep.cli("up", "--detach", "--distributed", check=False)
        assert refused.returncode == 2 and "--init-store" in refused.stderr, refused.stdout + refused.stderr
    finally:
        dep.cli("down", check=False)
        RedisStore(REDIS_URL).flush()


@pytest.mark.parametrize("distributed", [False, True], ids=["embedded", "distributed"])
def test_up_on_its_own_store_of_an_older_layout_migrates_it_and_serves(tmp_path: Path, distributed: bool):
    """An upgrade: a deployment that ran on its store restarts with a slicex whose layout is ahead. `slicex up`
    migrates the store, then serves; an actor started by hand on it before that is refused, naming `slicex up`.
    Found by bench/scale.py: `up` checked the layout (refusing, exit 2) before the step that migrates it, so a
    deployment's own store could never be brought forward; only a store `up` took as new was."""
    from deployment.migrations import STEPS
    from slicex.store import open_store
    from slicex.store.migration import MARK_KEY, MARK_TABLE, layout_of
    from slicex.store.redis_store import RedisStore

    RedisStore(REDIS_URL).flush()
    dep = Deployment(tmp_path / "home", distributed=distributed, store=REDIS_URL if distributed else None)
    try:
        dep.up()
        urn, creds = _creds(dep, "kept")
        assert _allocate(dep, urn, creds, "a")["code"]["geni_code"] == 0
        dep.cli("down")
        url = str(dep.home.config().store)
        store = open_store(url)
        try:  # what the slicex before the last two steps left (the steps are idempotent)
            store.put(MARK_TABLE, MARK_KEY, {"done": STEPS[-3].number, "name": STEPS[-3].name})
        finally:
            store.close()
        refused = dep.cli("actor", "broker", check=False)
        assert refused.returncode != 0 and "slicex up" in refused.stdout + refused.stderr, refused
        started = dep.cli("up", "--detach", *(["--distributed"] if distributed else []), check=False)
        assert started.returncode == 0, started.stdout + started.stderr
        assert dep.status_ok(20)
        store = open_store(url)
        try:
            assert layout_of(store) == STEPS[-1].number
        finally:
            store.close()
        am, _sa = dep.proxy()
        described = am.Describe([urn], creds, {"geni_rspec_version": {"type": "GENI", "version": "3"}})
        assert described["code"]["geni_code"] == 0 and 'client_id="a"' in described["value"]["geni_rspec"]
    finally:
        dep.cli("down", check=False)
        RedisStore(REDIS_URL).flush()
