"""`slicex up --workers N` decided before anything starts, and the slice manager names of its AM workers."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

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


def test_a_worker_joined_from_another_host_has_a_name_of_its_own_that_a_restart_keeps():
    joined = AmWorker.joined("10.99.0.2")
    names = {AmWorker(0, 2).sm_name("sm-x"), AmWorker(1, 2).sm_name("sm-x"), joined.sm_name("sm-x"),
             AmWorker.joined("10.99.0.3").sm_name("sm-x")}
    assert len(names) == 4  # homes copied between hosts share `sm_name`: the host's address tells them apart
    assert AmWorker.joined("10.99.0.2").sm_name("sm-x") == joined.sm_name("sm-x") == "sm-x-at-10.99.0.2"
    assert joined.index != 0  # not the first: no slice authority, CH API or dashboard on the joined host


def test_joining_needs_a_redis_store_and_the_actors_urls_saying_which(tmp_path):
    from cli.main import _join_refused
    from slicex.config import SlicexConfig

    assert "Redis" in _join_refused(SlicexConfig(store="sqlite:///x.db"))
    assert "broker_url" in _join_refused(SlicexConfig(store="redis://10.0.0.1:6379/3"))
    joined = SlicexConfig(store="redis://10.0.0.1:6379/3", broker_url="https://10.0.0.1:8002/",
                          authority_url="https://10.0.0.1:8003/")
    assert _join_refused(joined) is None
    assert joined.actor_url("broker") == "https://10.0.0.1:8002/"
    assert SlicexConfig(host="10.0.0.2").actor_url("authority") == "https://10.0.0.2:8003/"
    for bad in ("http://10.0.0.1:8002/", "https://:8002/", "10.0.0.1:8002", "https://10.0.0.1/"):
        with pytest.raises(ValidationError):
            SlicexConfig(broker_url=bad)
