"""A node's cpuset is named a cpuset: `<sx:container cpus="0">` read as "zero CPUs" when it meant "runs on
host CPU 0". The manifest and `slicex status` say `cpuset`; records and nodes written before the rename
(which say `cpus`) read the same."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from lxml import etree

from authority.substrate.container import NodeContainer, node_limits
from rspec.manifest import SERVICES_EXT, SliverView, build_manifest
from rspec.validate import validate_rspec
from tests.factories import request_rspec, vm

NOW = datetime(2030, 1, 1, tzinfo=UTC)
CM = "urn:publicid:IDN+t.org+authority+am"


@pytest.mark.parametrize("machine", [{"cores": 2, "memory_mb": 2048, "cpuset": "0,1", "pids": 1024},
                                     {"cores": 2, "memory_mb": 2048, "cpus": "0,1", "pids": 1024}],
                         ids=["record", "record-before-the-rename"])
def test_the_manifest_publishes_a_nodes_cpuset_under_that_name(machine):
    view = SliverView("n1", "urn:publicid:IDN+t.org+sliver+1", "node", "", {"container": machine}, "geni_ready")
    text = build_manifest([request_rspec([vm("n1")])], [view], CM, NOW)
    assert validate_rspec(text, "manifest") == []
    box = etree.fromstring(text.encode()).find(f".//{{{SERVICES_EXT}}}container")
    assert (box.get("cpuset"), box.get("cpus"), box.get("cores")) == ("0,1", None, "2")


def test_a_nodes_limits_say_cpuset_and_an_old_nodes_read_the_same(tmp_path):
    assert node_limits({"cores": 2, "memory_mb": 512}, "x-1", host_cpus=2).to_doc()["cpuset"] == "0,1"
    for name, written in (("new", "cpuset=0,1\n"), ("old", "cpus=0,1\n")):
        node = NodeContainer(tmp_path, f"slicex-cpuset-test-{name}")  # no such container runs: limits only
        node.host_dir.mkdir(parents=True)
        (node.host_dir / "limits").write_text("cores=2.0\n" + written)
        summary = node.summary()
        assert summary["cpuset"] == "0,1" and "cpus" not in summary and summary["running"] is False
