"""The pure parts of container nodes, their login and services: accounts from geni_users, uids inside a node,
the limits and LXC configuration a sliver type yields, the sshd config, results read from inside a node, the
services' verdict, and execute services carried from a request into a node's details."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from authority.substrate.container import (
    UID_RANGE_SIZE,
    USER_UIDS,
    NodeLimits,
    assign_uids,
    container_config,
    node_limits,
    parse_users,
    sshd_config,
    uid_base,
    users_text,
)
from authority.substrate.execute import Service, parse_results, services_of, verdict
from authority.substrate.images import host_mirror, image_name
from authority.substrate.login import accounts
from rspec.request import parse_request
from slicex.errors import BadArgs
from tests.factories import request_rspec, vm


def test_accounts_merge_keys_of_one_name():
    a = accounts([{"username": "alice", "urn": "urn:publicid:IDN+x+user+alice", "keys": ["ssh-ed25519 A a\nssh-rsa B b"]},
                  {"username": "alice", "urn": "urn:publicid:IDN+x+user+alice", "keys": ["ssh-ed25519 A a"]},
                  {"username": "bob", "urn": "urn:publicid:IDN+x+user+bob", "keys": []}])
    assert [(x.name, x.urn, x.keys) for x in a] == [
        ("alice", "urn:publicid:IDN+x+user+alice", ("ssh-ed25519 A a", "ssh-rsa B b")),
        ("bob", "urn:publicid:IDN+x+user+bob", ())]


@pytest.mark.parametrize("name", ["root", "sshd", "nobody", "daemon", "9lives", "a b", "x" * 33, ""])
def test_names_that_cannot_be_accounts_are_refused(name):
    with pytest.raises(BadArgs):
        accounts([{"username": name, "keys": []}])


def test_a_user_keeps_their_uid_on_a_node_and_new_users_never_take_one():
    first = assign_uids([("alice", "urn:a"), ("bob", "urn:b")], {})
    assert len({uid for _n, uid in first}) == 2
    assert all(USER_UIDS[0] <= uid < USER_UIDS[1] for _n, uid in first)
    again = assign_uids([("carol", "urn:c"), ("bob", "urn:b")], dict(first))
    assert dict(again)["bob"] == dict(first)["bob"]
    assert parse_users(users_text(again)) == dict(again)


@given(st.lists(st.text(alphabet="abcdefgh", min_size=1, max_size=6), min_size=1, max_size=40, unique=True))
def test_uids_inside_a_node_are_distinct_for_any_set_of_users(names):
    uids = [uid for _n, uid in assign_uids([(n, f"urn:{n}") for n in names], {})]
    assert len(set(uids)) == len(uids)


def test_limits_follow_the_sliver_type_and_nproc_gets_its_cores():
    lim = node_limits({"cores": 1, "memory_mb": 512}, "x-1", host_cpus=2)
    assert (lim.cores, lim.memory_mb, lim.cfs_quota_us) == (1.0, 512, 100_000)
    assert lim.cpuset in ("0", "1")
    assert node_limits({"cores": 4, "memory_mb": 2048}, "x-1", host_cpus=2).cpuset == "0,1"
    assert node_limits({"cores": 0.5}, "x-1", host_cpus=8).cfs_quota_us == 50_000
    spread = {node_limits({"cores": 1}, f"x-{i}", host_cpus=2).cpuset for i in range(20)}
    assert spread == {"0", "1"}
    with pytest.raises(BadArgs):
        node_limits({"cores": "many"}, "x", 2)
    with pytest.raises(BadArgs):
        node_limits({"cores": -1}, "x", 2)


def test_container_config_is_unprivileged_in_the_nodes_namespace_with_its_limits():
    cfg = container_config("x1-ab", "n1", Path("/c/rootfs"), uid_base(3), "/run/netns/x1-ab", Path("/c/host"),
                           NodeLimits(1.5, 256, "0,1"), Path("/c/lxc.log"), init=Path("/h/.init.lxc")).splitlines()
    base = 100_000_000 + 3 * UID_RANGE_SIZE
    assert f"lxc.idmap = u 0 {base} {UID_RANGE_SIZE}" in cfg and f"lxc.idmap = g 0 {base} {UID_RANGE_SIZE}" in cfg
    assert "lxc.namespace.share.net = /run/netns/x1-ab" in cfg
    assert "lxc.rootfs.path = dir:/c/rootfs" in cfg  # the overlay the host mounted (overlay_options)
    assert "lxc.mount.entry = /h/.init.lxc usr/sbin/init.lxc none bind,ro,create=file 0 0" in cfg
    assert "lxc.cgroup.cpu.cfs_quota_us = 150000" in cfg and "lxc.cgroup.memory.limit_in_bytes = 256M" in cfg
    assert "lxc.cgroup.cpuset.cpus = 0,1" in cfg
    assert any(line.startswith("lxc.mount.entry = /c/host run/slicex none bind,ro") for line in cfg)
    assert not any("sys:" in line or "sysfs" in line for line in cfg)  # no host sysfs in a node
    v2 = container_config("x", "n", Path("/f"), uid_base(0), "/n", Path("/h"), NodeLimits(1, 64, "0"),
                          Path("/g"), cgroup_v1=False)
    assert "lxc.cgroup2.memory.max = 64M" in v2 and "lxc.cgroup2.cpu.max = 100000 100000" in v2


def test_sshd_allows_keys_of_slice_users_only_from_the_hosts_directory():
    cfg = sshd_config().splitlines()
    for line in ("PasswordAuthentication no", "PermitRootLogin no", "AllowGroups slicex-users",
                 "AuthorizedKeysFile /run/slicex/keys/%u"):
        assert line in cfg


def test_results_from_inside_a_node_are_parsed_defensively():
    services = [Service("sh", "a"), Service("sh", "b")]
    b64 = base64.b64encode(b"hello\n").decode()
    text = f"0 0 {b64}\n1 - -\n7 0 {b64}\nnoise\n1 x !!!\n"
    assert parse_results(text, services) == {0: (0, "hello\n"), 1: (None, "")}
    assert parse_results("0 99999999999 -\n", services) == {0: (None, "")}


def test_the_verdict_names_the_first_failure():
    ok = {"state": "exited", "exit_code": 0, "command": "true", "output": ""}
    assert verdict([ok, {**ok, "state": "running"}]) == ("running", "")
    how, why = verdict([ok, {**ok, "exit_code": 2, "command": "make", "output": "x\nError 2\n"}])
    assert how == "failed" and why == "execute service 2 (`make`) exited with 2: Error 2"
    assert verdict([{**ok, "state": "interrupted"}])[0] == "failed"
    assert verdict([ok]) == ("done", "")


def test_execute_services_of_a_request_reach_the_node_details():
    req = parse_request(request_rspec([vm("n1", extra='<services><execute shell="bash" command="echo hi"/>'
                                                      '<execute shell="csh" command="x"/></services>')]))
    assert req.nodes[0].execute == (("bash", "echo hi"), ("csh", "x"))
    details = {"execute": [{"shell": s, "command": c} for s, c in req.nodes[0].execute]}
    with pytest.raises(BadArgs, match="csh"):
        services_of(details, "n1")
    assert services_of({"execute": details["execute"][:1]}) == [Service("bash", "echo hi")]


def test_image_names_and_the_hosts_mirror(tmp_path):
    assert image_name("urn:publicid:IDN+slicex.local+image+debian-12") == "debian-12"
    assert image_name("debian-12") == "debian-12"
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n")
    assert host_mirror(tmp_path) == "http://mirror.example/debian"
    assert host_mirror(tmp_path / "none") == "http://deb.debian.org/debian"


def test_install_services_come_only_from_the_operators_file_servers():
    from authority.substrate.install import Install, allowed_source, installs_of

    sources = ["http://files.example/pub", "https://mirror.example:8443/"]
    assert allowed_source("http://files.example/pub/a.tgz", sources)
    assert allowed_source("https://mirror.example:8443/x/y.tar", sources)
    for url in ("http://files.example.evil/pub/a.tgz", "http://files.example/public/a.tgz",
                "http://files.example:81/pub/a.tgz", "https://files.example/pub/a.tgz", "ftp://files.example/pub/a",
                "http://user:pw@files.example/pub/a.tgz", "file:///etc/shadow", "http://127.0.0.1:6379/pub/x",
                "https://mirror.example/x.tar", "not a url"):
        assert not allowed_source(url, sources), url
    details = {"install": [{"url": "http://files.example/pub/a.tgz", "install_path": "/local"}]}
    assert installs_of(details, "n1", sources) == [Install("http://files.example/pub/a.tgz", "/local")]
    with pytest.raises(BadArgs, match="none are configured"):
        installs_of(details, "n1", [])
    with pytest.raises(BadArgs, match="absolute"):
        installs_of({"install": [{"url": "http://files.example/pub/a.tgz", "install_path": "local"}]}, "n1", sources)
    req = parse_request(request_rspec([vm("n1", extra='<services><install url="http://f/a.tgz" install_path="/l"/>'
                                                      '</services>')]))
    assert req.nodes[0].install == (("http://f/a.tgz", "/l"),)


def test_tar_is_told_the_compression_of_an_install_archive():
    import gzip

    from authority.substrate.install import compression_flag

    assert compression_flag(gzip.compress(b"x")[:8]) == ["-z"]
    assert compression_flag(b"BZh91AY&") == ["-j"]
    assert compression_flag(b"\xfd7zXZ\x00\x00\x04") == ["-J"]
    assert compression_flag(b"tools/he") == []
