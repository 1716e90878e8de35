"""Suite-wide settings for running the suite in parallel. `make test` runs
`python -m pytest -n 3 --dist loadfile --no-loadscope-reorder tests` (pytest-xdist); a plain `python -m pytest
tests` runs the same tests in one process.

- Each worker gets a Redis database of its own (the base of SLICEX_REDIS_URL plus the worker's index; tests
  flush the database they use).
- The test files that use the host's network — namespaces, taps, Open vSwitch, of which only one userspace
  instance can run per network namespace — form two chains, each one xdist work unit (HostNetworkChains) that
  one worker runs file after file while the other workers run everything else:
  - "host-network": "netns" in the file's name, or USES_HOST_NETWORK = True. These may run a switch in the
    root network namespace (the one pytest runs in), so they take turns.
  - "host-network-lab": USES_HOST_NETWORK = "lab". These run their switches, `slicex up`s and routers only
    inside the namespaces of multi-host labs (lab/, docs/lab.md: each lab host runs its own userspace switch),
    so they run beside the first chain. What they share with it, and why that is safe: /run/netns (their
    labs' namespaces are `sxlab-<lab>-*` with lab names no file of the first chain uses; node namespaces,
    veths, cgroups, LXC containers, /var/lib/slicex-<prefix> and /run/slicex-<prefix>* are named by the
    driver prefix, "l…" here and "t…" there, netns_support.new_prefix); the root namespace's links (only
    the labs' `sxl<lab>-*` management veths) and routes (each lab's own /16: the first chain's labs name
    theirs outside the range lab names choose from); the host-wide uid-range claims (taken under a lock,
    designed for deployments sharing a host); the node image catalogue (built before the run by `make
    node-image`, shared read-only, and its uid-shifted copies made once per range under a lock); Redis (a
    database per worker); ports (the lab chain's servers listen on lab addresses inside lab namespaces).
  Both chains are collected first, the root namespace's first, so two workers start on them at once (they
  are the longest chains of the run).
  Every other file is a work unit of its own (one worker runs a file, its module fixtures set up once).
  (xdist's `--dist loadgroup` cannot do this under pytest 9: it renames items through `item._nodeid`, which
  pytest 9 no longer reads, so its groups are silently ignored.)
- A host-network file also holds its chain's host-wide lock (hostnet.host_lock) from before its first test
  to after its last test's tear-down, for other pytest processes on the host. The wait for that lock is
  outside the test's pytest-timeout budget: a file queued behind another process's tests is not failed for
  waiting.
- Whoever takes a chain's lock first stops the private Open vSwitch instances a killed test run of that chain
  left behind (run directories named as that chain's tests name them, ovs-vswitchd in that chain's kind of
  namespace): nobody else may hold one while the lock is free, and one leftover switch in the root namespace
  would fail every host-network test after it ("is another ovs-vswitchd ... running?"). Neither chain's
  reaper can match a switch of the other's: the names differ and so do the namespaces."""

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

HOST_NETWORK_GROUP = "host-network"  # may run a switch in the root network namespace
LAB_NETWORK_GROUP = "host-network-lab"  # runs switches only inside lab hosts' namespaces
HOST_NETWORK_CHAINS = (HOST_NETWORK_GROUP, LAB_NETWORK_GROUP)  # in the order they are collected

_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER:
    _index = int(re.sub(r"\D", "", _WORKER) or 0)
    _base = os.environ.get("SLICEX_REDIS_URL", "redis://127.0.0.1:6379/1")
    _server, _, _db = _base.rpartition("/")
    # set before any test module reads it at import time; subprocesses (`slicex up`) inherit it
    os.environ["SLICEX_REDIS_URL"] = f"{_server}/{(int(_db or 0) + _index) % 16}"


@functools.cache
def host_network_chain(path: Path) -> str | None:
    """The host-network chain a test file belongs to (None: it uses no host network): LAB_NETWORK_GROUP for a
    module-level `USES_HOST_NETWORK = "lab"`, HOST_NETWORK_GROUP for `USES_HOST_NETWORK = True` or "netns" in
    its name. Read from the source, so xdist's controller (which imports no test module) and the workers
    decide alike."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        tree = ast.Module(body=[], type_ignores=[])
    declared = [node.value.value for node in tree.body
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                and any(isinstance(t, ast.Name) and t.id == "USES_HOST_NETWORK" for t in node.targets)]
    if "lab" in declared:
        return LAB_NETWORK_GROUP
    return HOST_NETWORK_GROUP if True in declared or "netns" in path.name else None


def uses_host_network(path: Path) -> bool:
    return host_network_chain(path) is not None


def _item_chain(item: pytest.Item) -> str | None:
    return host_network_chain(Path(str(item.fspath)))


class HostNetworkChains(LoadFileScheduling):
    """--dist loadfile, with each host-network chain's files in one work unit: one worker runs them in turn
    (they could only take turns on the chain's lock anyway) while the others run the rest."""

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        return host_network_chain(self.config.rootpath / path) or path


@pytest.hookimpl(optionalhook=True)  # a hook of xdist's: unknown where it is disabled (-p no:xdist)
def pytest_xdist_make_scheduler(config: pytest.Config, log) -> LoadFileScheduling | None:
    return HostNetworkChains(config, log) if config.getoption("dist") == "loadfile" else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The root namespace's chain first, then the labs' chain, then the rest (a stable sort, so every worker's
    collection is the same): the workers that take the chains start at once, as they are the longest."""
    order = {chain: i for i, chain in enumerate(HOST_NETWORK_CHAINS)}
    items.sort(key=lambda item: order.get(_item_chain(item), len(order)))


@contextmanager
def host_network_lock(chain: str) -> Iterator[None]:
    """The host's network for this pytest process, as far as `chain` uses it: the chain's host-wide lock, and
    then (no live test of the chain owns a switch while the lock is free) the switches a killed run of the
    chain left are stopped."""
    with hostnet.host_lock(chain):
        for name in stop_orphaned_test_switches(chain):
            print(f"\nstopped the Open vSwitch a killed test run left in /run/{name}")
        yield


# the run directories of the switches each chain's tests start: netns_support.new_prefix ("t…", "l…" in lab
# hosts), the SEP and stitching tests' shared switches ("s…"), the overlay tests' ("ov…")
TEST_SWITCH_DIRS = {HOST_NETWORK_GROUP: re.compile(r"slicex-(t[0-9a-f]{4}|s[0-9a-f]{6}|ov[0-9a-f]{4})"),
                    LAB_NETWORK_GROUP: re.compile(r"slicex-l[0-9a-f]{4}")}


def _in_root_namespace(pid_file: Path) -> bool | None:
    """Whether the process of `pid_file` runs in this process's network namespace (None: it is gone)."""
    try:
        pid = int(pid_file.read_text().strip())
        return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino
    except (OSError, ValueError):
        return None


def stop_orphaned_test_switches(chain: str = HOST_NETWORK_GROUP, run: Path = Path("/run")) -> list[str]:
    """Stop the Open vSwitch pairs of `chain`'s test run directories whose ovs-vswitchd runs where that chain
    runs switches (the root chain's in this namespace, the lab chain's in a lab host's): call with the chain's
    lock held, when no live test of it owns one. The names of those stopped."""
    from authority.substrate.ovs import OvsSwitch

    stopped = []
    for d in sorted(run.glob("slicex-*")):
        switch = OvsSwitch(d)
        if not TEST_SWITCH_DIRS[chain].fullmatch(d.name) or not switch.running():
            continue
        if _in_root_namespace(d / "ovs-vswitchd.pid") is (chain == HOST_NETWORK_GROUP):
            switch.stop(remove=True)
            stopped.append(d.name)
    return stopped


_HOST_TURN = pytest.StashKey[ExitStack]()  # the host-network lock this pytest process holds, while it does


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    """Outside pytest-timeout's wrapper: the file's chain lock is taken before its first test's timer starts
    and given up after its last test's module tear-down (it runs inside that test's protocol)."""
    stash = item.config.stash
    chain = _item_chain(item)
    if chain is not None and _HOST_TURN not in stash:
        turn = ExitStack()
        turn.enter_context(host_network_lock(chain))
        stash[_HOST_TURN] = turn
    try:
        yield
    finally:
        if _HOST_TURN in stash and (nextitem is None or nextitem.fspath != item.fspath):
            stash[_HOST_TURN].close()
            del stash[_HOST_TURN]
