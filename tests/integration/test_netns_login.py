"""Login and post-boot services on netns nodes, through the AM API as omni drives it: `slicex up --substrate
netns` in its own process; Provision with a user's key; after geni_start the user logs in with ssh through
the manifest's login port and `hostname` prints the node's name; execute services' output and exit codes
show in the manifest and a failing one fails its node, naming the command; geni_update_users changes who
can log in; after Delete no sshd, relay or node directory is left."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from xml.sax.saxutils import quoteattr

import pytest
from lxml import etree

from authority.substrate.netns import NetnsDriver
from rspec.manifest import SERVICES_EXT
from slicex import procs
from slicex.tls_xmlrpc import client
from tests.factories import RSPEC3, request_rspec, vm
from tests.integration.conftest import AUTHORITY, make_home
from tests.integration.netns_support import new_prefix, require_host
from tests.integration.test_netns_am import ok, up_then_down


def _execute(*commands: str) -> str:
    return "<services>" + "".join(f'<execute shell="sh" command={quoteattr(c)}/>' for c in commands) + "</services>"


def _kill_node_processes(prefix: str) -> None:
    driver = NetnsDriver(prefix)
    for pid, _cmd in driver.processes():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(driver.nodes_dir, ignore_errors=True)


@pytest.fixture
def netns_up(tmp_path: Path):
    require_host()
    if shutil.which("ssh") is None or not Path("/usr/sbin/sshd").exists():
        pytest.skip("needs openssh-client and openssh-server (scripts/system-deps.sh installs them)")
    prefix = new_prefix()
    home = make_home(tmp_path / "home", substrate_driver="netns", netns={"prefix": prefix}, sa_port=0, am_port=0)
    try:
        with up_then_down(home, prefix) as up:
            yield home, up, prefix
    finally:
        _kill_node_processes(prefix)  # after the driver's cleanup: what the nodes started outlives it


def ssh(home, user: str, port: int, *command: str, key_of: str | None = None) -> subprocess.CompletedProcess:
    key = home.user_ssh_key(key_of or user)
    os.chmod(key, 0o600)
    return subprocess.run(["ssh", "-i", str(key), "-p", str(port), "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                           "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                           "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR", f"{user}@127.0.0.1", *command],
                          capture_output=True, text=True, timeout=30)


def nodes_of(manifest: str) -> dict[str, etree._Element]:
    return {n.get("client_id"): n for n in etree.fromstring(manifest.encode()).iter(f"{{{RSPEC3}}}node")}


def logins_of(node: etree._Element) -> dict[str, tuple[str, int]]:
    return {lg.get("username"): (lg.get("hostname"), int(lg.get("port")))
            for lg in node.iter(f"{{{RSPEC3}}}login")}


def test_users_log_in_with_ssh_services_run_after_boot_and_delete_leaves_no_process(netns_up):
    home, up, prefix = netns_up
    am_url = up.start()
    sa_url = procs.read(home.pid_file).info["sa_url"]
    cert, key = str(home.user_cert("alice")), str(home.user_key("alice"))
    am, sa = client(am_url, cert, key), client(sa_url, cert, key)
    urn = f"urn:publicid:IDN+{AUTHORITY}+slice+login"
    creds = [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": sa.CreateSlice(urn)}]
    alice = {"urn": f"urn:publicid:IDN+{AUTHORITY}+user+alice", "keys": [home.user_ssh_pub("alice").read_text()]}
    bob = {"urn": f"urn:publicid:IDN+{AUTHORITY}+user+bob", "keys": [home.user_ssh_pub("bob").read_text()]}
    request = request_rspec(
        [vm("n1", ifaces=["n1:if0"], extra=_execute("echo hello from $(hostname) as $(id -un)", "pwd")),
         vm("n2", ifaces=["n2:if0"], extra=_execute("echo broken >&2; exit 3"))],
        [{"client_id": "lan0", "ifaces": ["n1:if0", "n2:if0"]}])
    driver = NetnsDriver(prefix)
    try:
        ok(am.Allocate(urn, creds, request, {}))
        manifest = ok(am.Provision([urn], creds, {"geni_users": [alice]}))["geni_rspec"]
        logins = {cid: logins_of(n) for cid, n in nodes_of(manifest).items()}
        assert set(logins["n1"]) == {"alice"} and logins["n1"]["alice"][0] == "127.0.0.1", manifest
        port1, port2 = logins["n1"]["alice"][1], logins["n2"]["alice"][1]
        assert port1 != port2 and port1 != 22
        assert ssh(home, "alice", port1, "true").returncode != 0  # not started: no sshd yet

        ok(am.PerformOperationalAction([urn], creds, "geni_start", {}))
        deadline = time.monotonic() + 20
        while True:
            slivers = {s["geni_sliver_urn"]: s for s in ok(am.Status([urn], creds, {}))["geni_slivers"]}
            states = sorted(s["geni_operational_status"] for s in slivers.values())
            if "geni_configuring" not in states or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert states == ["geni_failed", "geni_ready", "geni_ready"], slivers  # n2's service exits 3
        failed = next(s for s in slivers.values() if s["geni_operational_status"] == "geni_failed")
        assert "exit 3" in failed["geni_error"] and "exited with 3: broken" in failed["geni_error"], failed

        out = ssh(home, "alice", port1, "hostname")
        assert out.returncode == 0 and out.stdout.strip() == "n1", out.stderr
        out = ssh(home, "alice", port1, "id -un; ping -c 1 -W 2 10.10.0.2 >/dev/null && echo reached")
        assert out.stdout.split() == ["alice", "reached"], (out.stdout, out.stderr)  # unprivileged, on the LAN
        assert ssh(home, "bob", port1, "true", key_of="bob").returncode != 0  # not a user of this slice

        n1 = nodes_of(ok(am.Describe([urn], creds, {"geni_rspec_version": {"type": "GENI", "version": "3"}}))
                      ["geni_rspec"])["n1"]
        box = n1.find(f"{{{SERVICES_EXT}}}container")  # what the machine got, as the kernel enforces it
        assert (box.get("image"), box.get("cores"), box.get("memory_mb")) == ("debian-12", "1.0", "1024"), \
            etree.tostring(n1)
        assert int(box.get("memory_bytes")) > 0
        out = ssh(home, "alice", port1, "nproc; cat /sys/fs/cgroup/memory/memory.limit_in_bytes; sudo -n id -u; ls /home")
        assert out.stdout.split() == ["1", str(1024 * 2**20), "0", "alice"], (out.stdout, out.stderr)
        results = [x.find(f"{{{SERVICES_EXT}}}result") for x in n1.iter(f"{{{RSPEC3}}}execute")]
        assert [(r.get("state"), r.get("exit_code")) for r in results] == [("exited", "0"), ("exited", "0")]
        assert results[0].text.strip() == "hello from n1 as alice"
        assert results[1].text.strip().endswith("/home/alice")

        n1_urn = n1.get("sliver_id")
        refused = am.PerformOperationalAction([n1_urn], creds, "geni_update_users", {"geni_users": [bob]})
        assert refused["code"]["geni_code"] == 3 and "neither you" in refused["output"], refused  # not a member
        chapi_sa = client(procs.read(home.pid_file).info["chapi_url"] + "/SA", cert, key)
        assert chapi_sa.modify_slice_membership(urn, [], {"members_to_add": [
            {"SLICE_MEMBER": bob["urn"], "SLICE_ROLE": "MEMBER"}]})["code"] == 0
        ok(am.PerformOperationalAction([n1_urn], creds, "geni_update_users", {"geni_users": [bob]}))
        out = ssh(home, "bob", port1, "id -un", key_of="bob")
        assert out.returncode == 0 and out.stdout.strip() == "bob", out.stderr
        assert ssh(home, "alice", port1, "true").returncode != 0  # no longer a user of n1
        assert set(logins_of(nodes_of(ok(am.Describe([urn], creds, {"geni_rspec_version": {
            "type": "GENI", "version": "3"}}))["geni_rspec"])["n1"])) == {"bob"}

        ok(am.Delete([urn], creds, {}))
        assert driver.leftovers() == []
        assert ssh(home, "bob", port1, "true", key_of="bob").returncode != 0
        assert not [p for p in driver.processes()]
    finally:
        _kill_node_processes(prefix)
