"""The pure parts of netns login and services: accounts from geni_users, the sshd config, the services'
runner, their verdict, and execute services carried from a request into a node's details."""

from __future__ import annotations

from pathlib import Path

import pytest

from am.substrate.execute import Service, runner_script, services_of, verdict
from am.substrate.login import UID_BASE, accounts, passwd_text, sshd_config
from rspec.request import parse_request
from slicex.errors import BadArgs
from tests.factories import request_rspec, vm


def test_accounts_merge_keys_of_one_name_and_uids_follow_the_urn():
    a = accounts([{"username": "alice", "urn": "urn:publicid:IDN+x+user+alice", "keys": ["ssh-ed25519 A a\nssh-rsa B b"]},
                  {"username": "alice", "urn": "urn:publicid:IDN+x+user+alice", "keys": ["ssh-ed25519 A a"]},
                  {"username": "bob", "urn": "urn:publicid:IDN+x+user+bob", "keys": []}])
    assert [(x.name, x.keys) for x in a] == [("alice", ("ssh-ed25519 A a", "ssh-rsa B b")), ("bob", ())]
    assert all(x.uid >= UID_BASE for x in a) and a[0].uid != a[1].uid
    assert accounts([{"username": "alice", "urn": "urn:publicid:IDN+x+user+alice"}])[0].uid == a[0].uid


@pytest.mark.parametrize("name", ["root", "sshd", "9lives", "a b", "x" * 33, ""])
def test_names_that_cannot_be_accounts_are_refused(name):
    with pytest.raises(BadArgs):
        accounts([{"username": name, "keys": []}])


def test_sshd_allows_keys_of_slice_users_only():
    cfg = sshd_config(Path("/run/slicex-x-nodes/ns"))
    for line in ("PasswordAuthentication no", "PermitRootLogin no", "AllowGroups slicex-users",
                 "AuthorizedKeysFile /run/slicex-x-nodes/ns/keys/%u"):
        assert line in cfg.splitlines()
    text = passwd_text(accounts([{"username": "carol", "keys": []}]), Path("/h"))
    assert any(line.startswith("carol:*:") and line.endswith(":/h/carol:/bin/bash") for line in text.splitlines())


def test_runner_records_each_service_and_the_verdict_names_the_first_failure(tmp_path):
    script = runner_script([Service("sh", "echo 'a b'"), Service("bash", "exit 2")], tmp_path)
    assert f"/bin/bash -c \"$(cat {tmp_path}/1.cmd)\"" in script and f">{tmp_path}/1.rc.tmp" in script
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
