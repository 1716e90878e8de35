"""Suite-wide settings for running the suite in parallel. `make test` runs
`python -m pytest -n 3 --dist loadfile --no-loadscope-reorder tests` (pytest-xdist); a plain `python -m pytest
tests` runs the same tests in one process.

- Each worker gets a Redis database of its own (the base of SLICEX_REDIS_URL plus the worker's index; tests
  flush the database they use).
- The test files that use the host's network — namespaces, taps, Open vSwitch, of which only one userspace
  instance can run on a host; "netns" in their name, or USES_HOST_NETWORK = True — are one xdist work unit
  (HostNetworkAsOneFile), so one worker runs them one after the other while the others run everything else,
  and they are collected first so that worker starts on them at once (they are the longest chain of the run).
  Every other file is a work unit of its own (one worker runs a file, its module fixtures set up once).
  (xdist's `--dist loadgroup` cannot do this under pytest 9: it renames items through `item._nodeid`, which
  pytest 9 no longer reads, so its groups are silently ignored.)
- A host-network file also holds a host-wide lock (hostnet.host_lock) from before its first test to after its
  last test's tear-down, for other pytest processes on the host. The wait for that lock is outside the test's
  pytest-timeout budget: a file queued behind another process's tests is not failed for waiting.
- Whoever takes that lock first stops the private Open vSwitch instances a killed test run left behind (run
  directories named as the tests name them): nobody else may hold one while the lock is free, and one
  leftover switch would fail every host-network test after it ("is another ovs-vswitchd ... running?")."""

from __future__ import annotations

import ast
import functools
import os
import re
from collections.abc import Generator, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
from xdist.scheduler import LoadFileScheduling

from authority.substrate import hostnet

HOST_NETWORK_GROUP = "host-network"

_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER:
    _index = int(re.sub(r"\D", "", _WORKER) or 0)
    _base = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/1")
    _server, _, _db = _base.rpartition("/")
    # set before any test module reads it at import time; subprocesses (`slicex up`) inherit it
    os.environ["SLICEX_REDIS_URL"] = f"{_server}/{(int(_db or 0) + _index) % 16}"


@functools.cache
def uses_host_network(path: Path) -> bool:
    """"netns" in the file's name, or a module-level `USES_HOST_NETWORK = True` — read from the source, so
    xdist's controller (which imports no test module) and the workers decide alike."""
    if "netns" in path.name:
        return True
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return False
    return any(isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and node.value.value is True
               and any(isinstance(t, ast.Name) and t.id == "USES_HOST_NETWORK" for t in node.targets)
               for node in tree.body)


def _item_uses_host_network(item: pytest.Item) -> bool:
    return uses_host_network(Path(str(item.fspath)))


class HostNetworkAsOneFile(LoadFileScheduling):
    """--dist loadfile, with every host-network file in one work unit: one worker runs them in turn (they
    could only take turns on the lock anyway) while the others run the rest."""

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        return HOST_NETWORK_GROUP if uses_host_network(self.config.rootpath / path) else path


@pytest.hookimpl(optionalhook=True)  # a hook of xdist's: unknown where it is disabled (-p no:xdist)
def pytest_xdist_make_scheduler(config: pytest.Config, log) -> LoadFileScheduling | None:
    return HostNetworkAsOneFile(config, log) if config.getoption("dist") == "loadfile" else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Host-network files first (a stable sort, so every worker's collection is the same), so the worker that
    takes them starts at once: they are the longest chain of the run."""
    items.sort(key=lambda item: not _item_uses_host_network(item))


@contextmanager
def host_network_lock() -> Iterator[None]:
    """The host's network, for this pytest process: the host-wide lock, and then (no live test owns a switch
    while the lock is free) the switches a killed run left are stopped."""
    with hostnet.host_lock(HOST_NETWORK_GROUP):
        for name in stop_orphaned_test_switches():
            print(f"\nstopped the Open vSwitch a killed test run left in /run/{name}")
        yield


TEST_SWITCH_DIRS = re.compile(r"slicex-(t[0-9a-f]{4}|s[0-9a-f]{6}|ov[0-9a-f]{4})")  # netns_support, SEP, overlay


def stop_orphaned_test_switches(run: Path = Path("/run")) -> list[str]:
    """Stop the Open vSwitch pairs of test run directories (call with the host-network lock held: then no
    live test owns one); the names of those stopped."""
    from authority.substrate.ovs import OvsSwitch

    stopped = []
    for d in sorted(run.glob("slicex-*")):
        switch = OvsSwitch(d)
        if TEST_SWITCH_DIRS.fullmatch(d.name) and (d / "ovs-vswitchd.pid").exists() and switch.running():
            switch.stop(remove=True)
            stopped.append(d.name)
    return stopped


_HOST_TURN = pytest.StashKey[ExitStack]()  # the host-network lock this pytest process holds, while it does


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    """Outside pytest-timeout's wrapper: the lock is taken before the first test's timer starts and given up
    after the last test's module tear-down (it runs inside that test's protocol)."""
    stash = item.config.stash
    if _item_uses_host_network(item) and _HOST_TURN not in stash:
        turn = ExitStack()
        turn.enter_context(host_network_lock())
        stash[_HOST_TURN] = turn
    try:
        yield
    finally:
        if _HOST_TURN in stash and (nextitem is None or nextitem.fspath != item.fspath):
            stash[_HOST_TURN].close()
            del stash[_HOST_TURN]
