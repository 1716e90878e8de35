"""`slicex up --workers N` decided before anything starts, and the slice manager names of its AM workers."""

from __future__ import annotations

import yaml

from cli.main import _workers_refused
from deployment.service import AmWorker
from slicex.home import Home


def _home(tmp_path, **cfg) -> Home:
    (tmp_path / "slicex.yaml").write_text(yaml.safe_dump({"authority": "w.test", **cfg}))
    return Home(tmp_path)


def test_several_workers_need_the_distributed_deployment_and_fixed_am_ports(tmp_path):
    home = _home(tmp_path, am_port=18001)
    assert _workers_refused(home, 1, distributed=False) is None
    assert _workers_refused(home, 2, distributed=True) is None
    assert "needs --distributed" in _workers_refused(home, 2, distributed=False)
    assert "at least one" in _workers_refused(home, 0, distributed=True)
    assert "must name a port, not 0" in _workers_refused(_home(tmp_path, am_port=0), 2, distributed=True)
    assert "must name a port, not 0" in _workers_refused(_home(tmp_path, am_port=18001, am_v2_port=0), 2,
                                                         distributed=True)


def test_each_am_worker_has_a_slice_manager_name_of_its_own_that_a_restart_keeps():
    base = "sm-host-8001"
    names = [AmWorker(i, 3).sm_name(base) for i in range(3)]
    assert names[0] == base  # a one-worker deployment's name, so its earlier work is its own after an upgrade
    assert len(set(names)) == 3
    assert AmWorker(2, 3).sm_name(base) == AmWorker(2, 5).sm_name(base)  # the same worker after a restart
