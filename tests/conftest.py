"""Suite-wide settings for running the suite in parallel: `make test` runs it in one process; a developer
may run `python -m pytest -n 3 --dist loadfile tests` (pytest-xdist, a test file per worker at a time).

Each worker then gets a Redis database of its own (tests flush the database they use), and the test files
that use the host's network — namespaces, taps, Open vSwitch, of which only one userspace instance can run on
a host; "netns" in their name, or USES_HOST_NETWORK = True — take turns: each holds a host-wide lock from its first test's set-up to its last test's tear-down.
Known hazard of the parallel run: every file on a worker shares that worker's database, so a background
thread a test leaves running can write into a later file's state (seen once in test_redis_workers.py); the
serial run gives most files a database of their own."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import pytest

from authority.substrate import hostnet

_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER:
    _index = int(re.sub(r"\D", "", _WORKER) or 0)
    _base = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/1")
    _server, _, _db = _base.rpartition("/")
    # set before any test module reads it at import time; subprocesses (`slicex up`) inherit it
    os.environ["SLICEX_REDIS_URL"] = f"{_server}/{(int(_db or 0) + _index) % 16}"


@pytest.fixture(scope="module", autouse=True)
def _host_network_turn(request) -> Iterator[None]:
    """Module-scoped and autouse, so it is set up before the module's other fixtures and torn down after."""
    if "netns" not in request.path.name and not getattr(request.module, "USES_HOST_NETWORK", False):
        yield
        return
    with hostnet.host_lock("host-network"):
        yield
