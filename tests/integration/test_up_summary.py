"""`slicex up --detach` tells the operator what the foreground `up` tells them: where the slice authority,
the aggregate and the dashboard listen, the substrate, the store (and, distributed, each actor), the omni
config; before, it printed its pid and the omni config, and the rest went to the log alone."""

from __future__ import annotations

import os

import pytest

from tests.integration.test_cli_processes import REDIS, configure, slicex


@pytest.mark.parametrize("distributed", [False, True])
def test_up_detach_prints_the_summary_the_foreground_up_prints(tmp_path, distributed):
    from slicex.store.redis_store import RedisStore

    home = tmp_path / "home"
    ports = configure(home, "summary.test")
    env = {"SLICEX_STORE": REDIS} if distributed else {k: v for k, v in os.environ.items() if k != "SLICEX_STORE"}
    if distributed:
        RedisStore(REDIS).flush()
    up = slicex(home, "up", "--detach", *(["--distributed"] if distributed else []), env=env)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        lines = up.stdout.splitlines()
        first = next(i for i, line in enumerate(lines) if line.startswith("slicex is up (pid "))
        summary = lines[first + 1:]
        labels = [line.split(":")[0] for line in summary]
        expected = ["slice authority", "aggregate", "substrate", "dashboard", "store"]
        expected += ["broker actor", "authority actor"] if distributed else []
        assert labels == [*expected, "omni config"], up.stdout
        assert f"https://127.0.0.1:{ports['am_port']}/" in summary[1]
        # the very lines the `up` running in the background printed to its log, in the same order
        log = (home / "logs" / "slicex.log").read_text().splitlines()
        start = log.index(summary[0])
        assert log[start:start + len(summary)] == summary
    finally:
        slicex(home, "down")
        if distributed:
            RedisStore(REDIS).flush()
