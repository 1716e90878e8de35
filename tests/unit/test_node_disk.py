"""A node's disk, without a host: the authority's admission arithmetic (a node is made only while the disks of
the nodes there fit the layers' file system's free space less the reserve), the sizes a placement books, and
the memory a node is said to use without the page cache of its files."""

from __future__ import annotations

import pytest

from authority.substrate.container import disk_admission, memory_in_use, node_limits
from deployment.service import shared_disk_note
from resources import STANDARD
from resources.compute import DISK_CHUNK_GB, Compute, disk
from resources.kind import Constraints
from rspec.request import parse_request
from rspec.substrate import default_substrate
from slicex.config import parse_config
from slicex.errors import BadArgs, Forbidden, InsufficientNodes
from slicex.home import Home
from tests.factories import request_rspec, vm

GIB = 2**30


def test_a_node_fits_while_free_space_less_promises_and_reserve_holds_it():
    assert disk_admission(10, promised_bytes=0, free_bytes=20 * GIB, reserve_bytes=2 * GIB) is None
    assert disk_admission(10, promised_bytes=8 * GIB, free_bytes=20 * GIB, reserve_bytes=2 * GIB) is None


def test_a_node_is_refused_when_the_disks_already_promised_leave_too_little_naming_the_numbers():
    why = disk_admission(10, promised_bytes=9 * GIB, free_bytes=20 * GIB, reserve_bytes=2 * GIB)
    assert why is not None
    assert "10 GB" in why and "20.0 GiB free" in why and "9.0 GiB" in why and "2.0 GiB kept free" in why
    assert "9.0 GiB left" in why


def test_the_reserve_alone_can_refuse_a_node():
    assert disk_admission(1, promised_bytes=0, free_bytes=3 * GIB, reserve_bytes=2 * GIB + 1) is not None
    assert disk_admission(1, promised_bytes=0, free_bytes=3 * GIB, reserve_bytes=2 * GIB) is None


def test_node_limits_carry_the_disk_size_and_refuse_a_nonsense_one():
    assert node_limits({"cores": 1, "memory_mb": 256, "disk_gb": 3}, "k", 2).disk_gb == 3
    assert node_limits({"cores": 1, "memory_mb": 256}, "k", 2).disk_gb == 10
    with pytest.raises(BadArgs, match="disk"):
        node_limits({"cores": 1, "memory_mb": 256, "disk_gb": "many"}, "k", 2)
    with pytest.raises(BadArgs, match="GB of disk"):
        node_limits({"cores": 1, "memory_mb": 256, "disk_gb": -1}, "k", 2)


def test_memory_in_use_leaves_out_the_page_cache_of_files_but_not_shared_memory():
    stat = "cache 900\nrss 100\nshmem 50\ntotal_active_file 300\ntotal_inactive_file 550\n"
    assert memory_in_use(1000, stat) == 150  # anonymous memory and the 50 of tmpfs stay counted
    assert memory_in_use(1000, "active_file 100\ninactive_file 200\n") == 700  # cgroup v2's names
    assert memory_in_use(100, "total_inactive_file 500\n") == 0


def _placed(request_xml: str, taken: set[str]):
    sub = default_substrate()
    node = parse_request(request_xml).nodes[0]
    return sub, node, STANDARD.place_node(sub, node, taken, Constraints())


def test_a_vm_books_its_sizes_disk_on_its_host_as_units_of_their_own():
    sub, node, p = _placed(request_rspec([vm("a", sliver_type="m1.medium")], []), set())
    disks = [k for k in p.keys if k.startswith("disk:")]
    assert len(disks) == 40 // DISK_CHUNK_GB and all(k.startswith(f"disk:{p.component_id}:") for k in disks)
    assert p.details["disk_gb"] == 40
    assert STANDARD.held("node", p.details).disk_gb == 40
    assert Compute().asked(sub, node).disk_gb == 40
    assert "disk" in STANDARD.unit_kinds


def test_a_host_whose_disk_is_booked_takes_no_more_vms_though_cores_are_free():
    sub = default_substrate()
    full = {disk(h.component_id, i) for h in sub.hosts for i in range(h.disk_gb // DISK_CHUNK_GB)}
    node = parse_request(request_rspec([vm("a")], [])).nodes[0]
    with pytest.raises(InsufficientNodes, match="GB of disk"):
        STANDARD.place_node(sub, node, full, Constraints())
    needs = STANDARD.node_needs(sub, node, full)
    assert {"resource": "disk_gb", "site": "rack1", "asked": 10, "available": 0} in needs


def test_up_says_when_the_store_shares_a_file_system_with_the_node_disks(tmp_path):
    home = Home(tmp_path / "home")
    home.root.mkdir()
    shared = parse_config({"substrate_driver": "netns", "store": f"sqlite:///{home.root / 'state.db'}",
                           "netns": {"prefix": "t0000", "layers_dir": str(tmp_path / "layers")}}, "slicex.yaml")
    note = shared_disk_note(shared, home)
    assert note is not None and str(tmp_path / "layers") in note and "state.db" in note
    assert "layers_reserve_mb (2048 MB)" in note
    apart = shared.model_copy(update={"netns": shared.netns.model_copy(update={"layers_dir": "/dev/shm/x"})})
    assert shared_disk_note(apart, home) is None  # a file system of its own (a tmpfs here)
    emulated = shared.model_copy(update={"substrate_driver": "emulated"})
    assert shared_disk_note(emulated, home) is None


def test_a_disk_quota_refuses_what_would_pass_it_naming_the_limit():
    from operations.quotas import check_amounts, policy_from_config
    from resources.kind import Amounts

    alice = "urn:publicid:IDN+t.org+user+alice"
    policy = policy_from_config({"users": {"default": {"disk_gb": 30}}})
    check_amounts(alice, None, policy, Amounts(disk_gb=20), Amounts(), Amounts(disk_gb=10, nodes=1))
    with pytest.raises(Forbidden, match="may hold 30 GB of node disk \\(holds 20, asked 20\\)"):
        check_amounts(alice, None, policy, Amounts(disk_gb=20), Amounts(), Amounts(disk_gb=20, nodes=1))


def test_a_hosts_disk_is_advertised_beside_its_cores_and_memory_and_survives_ndl():
    from datetime import UTC, datetime

    from lxml import etree

    from rspec.advertisement import Usage, build_advertisement
    from rspec.ndl import substrate_from_advertisement, substrate_from_graph, substrate_graph

    sub = default_substrate()
    ad = build_advertisement(sub, Usage(), datetime(2030, 1, 1, tzinfo=UTC))
    computes = [e for e in etree.fromstring(ad.encode()).iter() if etree.QName(e).localname == "compute"]
    assert any(e.get("disk_gb") == "1000" and e.get("cores") == "16" for e in computes)  # a host
    assert any(e.get("disk_gb") == "10" and e.get("cores") == "1" for e in computes)  # a sliver type
    assert [h.disk_gb for h in substrate_from_graph(substrate_graph(sub)).hosts] == [h.disk_gb for h in sub.hosts]
    assert [h.disk_gb for h in substrate_from_advertisement(ad).hosts] == [h.disk_gb for h in sub.hosts]


def test_slicex_status_lists_each_nodes_disk_beside_its_memory(tmp_path):
    import yaml

    from authority.substrate.container import NodeContainer
    from cli.main import _node_lines

    home = Home(tmp_path / "home")
    home.root.mkdir()
    state = tmp_path / "state"
    home.config_file.write_text(yaml.safe_dump({"substrate_driver": "netns",
                                                "netns": {"prefix": "t0001", "state_dir": str(state)}}))
    c = NodeContainer(state / "lxc", "t0001-000000000001")
    c.dir.mkdir(parents=True)
    (c.dir / "config").write_text("lxc.uts.name = n1\n")
    c.host_dir.mkdir(parents=True)
    (c.host_dir / "limits").write_text("cores=1\nmemory_mb=256\ncpus=0\npids=1024\ndisk_gb=3\n")
    (line,) = [x for x in _node_lines(home) if "t0001-000000000001" in x]
    assert "memory 256 MB (using 0.0 MB), disk 3 GB (using 0.0 MB)" in line


def test_metrics_count_the_disk_units_each_site_offers():
    from operations.metrics import Sites

    assert Sites.of(default_substrate()).totals[("rack1", "disk")] == 3 * 1000 // DISK_CHUNK_GB
