"""tests/conftest.py's parallel run, on a throw-away suite run by pytester: each host-network chain's files go
to one worker (the two chains to two different ones), and a file waiting for its chain's lock is not failed by
pytest-timeout for the wait."""

from __future__ import annotations

import fcntl
import re
import time
from pathlib import Path

pytest_plugins = ["pytester"]

CONFTEST = (Path(__file__).resolve().parents[1] / "conftest.py").read_text()


def _suite(pytester, lock_file: Path | None = None) -> None:
    text = CONFTEST
    if lock_file is not None:  # the host-network lock on a file of this test's own, not the host's
        text += f'''

import contextlib as _contextlib
import fcntl as _fcntl


@_contextlib.contextmanager
def host_network_lock(chain):
    with open({str(lock_file)!r} + "." + chain, "a") as f:
        _fcntl.flock(f, _fcntl.LOCK_EX)
        yield
'''
    pytester.makeconftest(text)


def _workers_by_file(pytester, files: dict[str, str], passed: int) -> dict[str, set[str]]:
    """Run `files` (name: source) under the suite's conftest as `make test` schedules them; which xdist workers
    ran each file."""
    _suite(pytester, pytester.path / "turn.lock")
    pytester.makepyfile(**files)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "3", "--dist", "loadfile",
                                           "--no-loadscope-reorder", "-v")
    result.assert_outcomes(passed=passed)
    workers: dict[str, set[str]] = {}
    for line in result.outlines:
        m = re.match(r"\[(gw\d)\].* (test_\w+)\.py::", line)
        if m:
            workers.setdefault(m.group(2), set()).add(m.group(1))
    return workers


def test_host_network_files_run_on_one_worker_and_first(pytester):
    workers = _workers_by_file(pytester, {"test_a.py": "def test_a(): pass",
                                          "test_b_netns.py": "def test_b1(): pass\ndef test_b2(): pass",
                                          "test_c.py": "USES_HOST_NETWORK = True\ndef test_c(): pass",
                                          "test_d_netns.py": "def test_d(): pass",
                                          "test_e.py": "def test_e(): pass"}, passed=6)
    host = workers["test_b_netns"] | workers["test_c"] | workers["test_d_netns"]
    assert len(host) == 1, workers


def test_the_lab_chain_runs_on_one_worker_beside_the_root_namespaces_chain(pytester):
    workers = _workers_by_file(pytester, {
        "test_a.py": "def test_a(): pass", "test_b_netns.py": "def test_b(): pass",
        "test_c_lab_netns.py": 'USES_HOST_NETWORK = "lab"\ndef test_c1(): pass\ndef test_c2(): pass',
        "test_d.py": 'USES_HOST_NETWORK = "lab"\ndef test_d(): pass', "test_e.py": "USES_HOST_NETWORK = True\ndef test_e(): pass",
        "test_f.py": "def test_f(): pass"}, passed=7)
    root = workers["test_b_netns"] | workers["test_e"]
    lab = workers["test_c_lab_netns"] | workers["test_d"]
    assert len(root) == 1 and len(lab) == 1 and root != lab, workers


def test_waiting_for_the_host_network_lock_does_not_count_against_the_timeout(pytester, tmp_path):
    lock_file = tmp_path / "turn.lock"
    _suite(pytester, lock_file)
    pytester.makepyfile(test_x_netns="def test_x(): pass")
    with open(f"{lock_file}.host-network", "a") as held:  # another pytest process's netns file holds the turn for 3 s
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = pytester.popen([*pytester._getpytestargs(), "-p", "no:cacheprovider", "--timeout=1", "-q"],
                              stdout=open(tmp_path / "out", "w"), stderr=open(tmp_path / "err", "w"))
        time.sleep(3)
    assert proc.wait(60) == 0, (tmp_path / "out").read_text() + (tmp_path / "err").read_text()
    assert "1 passed" in (tmp_path / "out").read_text()


def test_a_suite_on_a_lock_of_its_own_stops_no_switch_of_the_host(pytester, tmp_path):
    """Leftover switches are stopped only under the host's own lock: a throw-away suite here (its own lock)
    must not, or it stops the switch of a host-network test running beside it (it did, in `make test`)."""
    marker = tmp_path / "reaped"
    _suite(pytester, tmp_path / "turn.lock")
    conftest = pytester.path / "conftest.py"
    conftest.write_text(conftest.read_text() + f'''

def stop_orphaned_test_switches(chain=None, run=None):
    open({str(marker)!r}, "a").write("reaped\\n")
    return []
''')
    pytester.makepyfile(test_y_netns="def test_y(): pass")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=1)
    assert not marker.exists()
