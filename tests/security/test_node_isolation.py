"""A node is a machine an experimenter may be handed as a stranger: each case runs inside real container nodes
(netns substrate) as the slice's user over ssh and as the node's root (sudo), and tries to reach what is not
theirs: the host's files and control ports, another slice's processes, files and traffic, more CPU, memory or
processes than the sliver type gives, the node's own interfaces and qdiscs, and the aggregate itself through
what it reads back from a node (service output replaced by symlinks, FIFOs, huge files, a node root that
rewrites the programs the aggregate runs inside). The two attacks of issue 20 are regression tests here:
service output pointed at host files (the CA key, /etc/shadow), and a slice naming another user's URN to run
as their host uid."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from authority.substrate import hostnet
from authority.substrate.container import UID_RANGE_SIZE, UID_RANGES_START, lxc_missing
from authority.substrate.netns import NetnsDriver
from protocol.messages import SliverSpec
from tests.integration.netns_support import require_host, started_driver

USES_HOST_NETWORK = True  # its nodes' switch: one userspace Open vSwitch per host (tests/conftest.py)
NOW = datetime.now(UTC)
ALICE = "urn:publicid:IDN+slicex.local+user+alice"
BOB = "urn:publicid:IDN+slicex.local+user+bob"
SECRET = f"slicex-host-secret-{secrets.token_hex(8)}"

# alice's services on node a1: a huge output, then the last one replaces the others' output by what should
# never reach the aggregate (a FIFO, links to the node's /etc/shadow, to the host's CA key and to /dev/zero)
ATTACKS = [
    "head -c 30000000 /dev/zero | tr '\\0' x; echo; echo END-OF-HUGE",
    "echo one",
    "echo two",
    "echo three",
    "cd /var/lib/slicex-services && rm -f 1.out && mkfifo 1.out && ln -sf /etc/shadow 2.out && "
    "ln -sf {secret} 3.out && ln -sf /dev/zero 4.out",
]


def _node(slice_urn: str, sliver: str, client_id: str, vlan: int, ip: str, cores: float, memory_mb: int,
          user: tuple[str, str], execute: list[str] | None = None, disk_gb: int = 10) -> SliverSpec:
    ref = f"{client_id}:if0"
    return SliverSpec(sliver, "node", client_id, labels=(("vlan", vlan),), details={
        "slice_urn": slice_urn, "cores": cores, "memory_mb": memory_mb, "disk_gb": disk_gb,
        "interfaces": {ref: {"component_id": "x", "ip": ip, "netmask": "255.255.255.0"}},
        "logins": [{"username": "alice", "urn": user[0], "keys": [user[1]]}],
        "execute": [{"shell": "sh", "command": c} for c in execute or ()]})


def _lan(sliver: str, vlan: int, refs: list[str]) -> SliverSpec:
    return SliverSpec(sliver, "link", "lan0", labels=(("vlan", vlan),),
                      details={"capacity_kbps": 0, "subnet": "10.10.0", "interface_refs": refs})


class Nodes:
    """Two slices on one driver: alice's (a1, a2 on a LAN) and bob's (b1, whose login names alice's URN
    with bob's key: the impersonation of issue 20)."""

    def __init__(self, driver: NetnsDriver, keys: Path, secret_file: Path):
        self.driver, self.keys, self.secret_file = driver, keys, secret_file
        a_key, b_key = ((keys / f"{u}.pub").read_text().strip() for u in ("alice", "bob"))
        attacks = [a.format(secret=secret_file) for a in ATTACKS]
        self.specs = {
            "lan_a": _lan("urn:sa:lan", 1500, ["a1:if0", "a2:if0"]),
            "a1": _node("urn:slice:a", "urn:sa:a1", "a1", 1500, "10.10.0.1", 0.5, 128, (ALICE, a_key), attacks),
            "a2": _node("urn:slice:a", "urn:sa:a2", "a2", 1500, "10.10.0.2", 1, 256, (ALICE, a_key), disk_gb=1),
            "lan_b": _lan("urn:sb:lan", 1501, ["b1:if0"]),
            "b1": _node("urn:slice:b", "urn:sb:b1", "b1", 1501, "10.10.0.3", 1, 256, (ALICE, b_key)),
        }
        self.status: dict[str, dict] = {}
        for name, spec in self.specs.items():
            self.status[name] = driver.create(spec, NOW)
        for name, spec in self.specs.items():
            self.status[name] = driver.modify(spec, self.status[name], "geni_start", NOW)

    def port(self, node: str) -> int:
        return int(self.status[node]["login_port"])

    def ssh(self, node: str, command: str, key: str = "alice", timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(["ssh", "-i", str(self.keys / key), "-p", str(self.port(node)), "-o", "BatchMode=yes",
                               "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=no",
                               "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR",
                               "alice@127.0.0.1", command], capture_output=True, text=True, timeout=timeout)

    def root(self, node: str, command: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """As the node's root: the slice user's sudo (what an experimenter has)."""
        return self.ssh(node, f"sudo -n sh -c {_quote(command)}", timeout=timeout)

    def container(self, node: str):
        return self.driver._container(self.driver._node_plan(self.specs[node]))

    def _services(self, node: str):
        return self.driver._services(self.driver._node_plan(self.specs[node]))

    def wait_services(self, timeout: float = 60) -> list[dict]:
        deadline = time.monotonic() + timeout
        while True:
            results = self.driver.view(self.specs["a1"], self.status["a1"])["execute"]
            if all(r["state"] in ("exited", "interrupted") for r in results) or time.monotonic() > deadline:
                return results
            time.sleep(0.3)


def _quote(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    require_host()
    missing = lxc_missing()
    if missing:
        pytest.skip("container nodes need: " + "; ".join(missing) + " (make test installs them)")
    tmp = tmp_path_factory.mktemp("isolation")
    for user in ("alice", "bob"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / user)], check=True)
    secret_file = tmp / "ca-key.pem"  # stands for the deployment's CA key: readable by host root only
    secret_file.write_text(SECRET + "\n")
    secret_file.chmod(0o600)
    world = tmp / "world-readable"
    world.write_text(SECRET + "\n")
    world.chmod(0o644)
    with started_driver(pids_max=96) as driver:
        yield Nodes(driver, tmp, secret_file)


def test_both_slices_nodes_run_and_their_users_log_in(nodes):
    for node in ("a1", "a2", "b1"):
        out = nodes.ssh(node, "hostname; id -un", key="bob" if node == "b1" else "alice")
        assert out.returncode == 0 and out.stdout.split() == [node, "alice"], (node, out.stderr)
    assert nodes.ssh("a1", "true", key="bob").returncode != 0  # bob's key opens only bob's slice's node


def test_host_files_are_not_in_a_node(nodes):
    """The CA key (host root's file), a world-readable host file, /etc/shadow and the deployment's home are
    nowhere in the node, as its user or as its root."""
    for path in (nodes.secret_file, nodes.keys / "world-readable", nodes.keys):
        for run in (nodes.ssh, nodes.root):
            out = run("a1", f"cat {path} 2>&1; ls {path.parent} 2>&1")
            assert SECRET not in out.stdout and "No such file" in out.stdout, (path, out.stdout)
    host_shadow = Path("/etc/shadow").read_text()
    node_shadow = nodes.root("a1", "cat /etc/shadow").stdout
    assert node_shadow and node_shadow != host_shadow  # the node's own
    assert nodes.ssh("a1", "cat /etc/shadow").returncode != 0  # and not the user's to read
    found = nodes.root("a1", f"grep -rl {SECRET} / --exclude-dir=proc --exclude-dir=sys 2>/dev/null | head -3")
    assert found.stdout.strip() == "", found.stdout


def test_a_node_sees_only_its_own_processes_and_files(nodes):
    marker = secrets.token_hex(6)
    assert nodes.ssh("b1", f"nohup sleep 3{marker[:2]} >/dev/null 2>&1 & echo {marker} > ~/mine; echo ok",
                     key="bob").stdout.strip() == "ok"
    ps = nodes.root("a1", "ps -eo pid,args").stdout
    assert f"sleep 3{marker[:2]}" not in ps and "sshd" in ps
    assert len(ps.strip().splitlines()) < 20, ps  # the node's init, sshd, sessions: not the host's hundreds
    assert "lxc" not in ps and "ovs" not in ps and "redis" not in ps
    out = nodes.root("a1", f"cat /home/alice/mine 2>&1; grep -rl {marker} /home /tmp 2>/dev/null")
    assert marker not in out.stdout


def test_a_node_reaches_neither_the_host_nor_another_slice(nodes):
    """No route to the host's addresses, the host's 127.0.0.1 (Redis, the AM, the actors' ports) is not the
    node's, and another slice's node on the same subnet is on another segment."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    try:
        host_ips = ["127.0.0.1"] + [a for a in _host_ipv4() if not a.startswith("127.")]
        for ip in host_ips:
            for run in (nodes.ssh, nodes.root):
                out = run("a1", f"timeout 3 bash -c 'echo > /dev/tcp/{ip}/{port}' && echo CONNECTED")
                assert "CONNECTED" not in out.stdout, (ip, out.stdout)
        out = nodes.ssh("a1", "timeout 3 bash -c 'echo > /dev/tcp/127.0.0.1/6379' && echo REDIS")
        assert "REDIS" not in out.stdout
    finally:
        listener.close()
    assert "1 received" in nodes.ssh("a1", "ping -c 1 -W 2 10.10.0.2").stdout  # its own slice's LAN works
    assert "0 received" in nodes.ssh("a1", "ping -c 2 -W 1 10.10.0.3").stdout  # bob's node: not on its segment


def _host_ipv4() -> list[str]:
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True).stdout
    return [line.split()[3].split("/")[0] for line in out.splitlines()]


def test_a_node_filling_its_disk_gets_enospc_there_and_another_slice_writes_on(nodes):
    """Issue 34: a slice user (no sudo) writes until its node's 1 GB disk is full; the write fails inside that
    node (ENOSPC), `df /` shows the node's own size, and bob's node keeps writing."""
    size = int(nodes.ssh("a2", "df -B1 --output=size / | tail -1").stdout)
    assert size <= 2**30
    out = nodes.ssh("a2", "dd if=/dev/zero of=$HOME/fill bs=1M count=3000 2>&1; echo rc=$?", timeout=120)
    try:
        assert "No space left on device" in out.stdout and "rc=1" in out.stdout, out.stdout
        assert nodes.ssh("b1", "echo ok > $HOME/after && cat $HOME/after", key="bob").stdout.strip() == "ok"
    finally:
        nodes.ssh("a2", "rm -f $HOME/fill")


def test_the_nodes_root_cannot_change_its_interfaces_addresses_or_qdiscs(nodes):
    plan = nodes.driver._node_plan(nodes.specs["a2"])
    iface = plan.interfaces[0].ns_if
    before = hostnet.qdisc(plan.netns, iface)
    for cmd in (f"ip addr add 10.99.0.1/24 dev {iface}", f"ip link set {iface} address 02:00:00:00:00:01",
                f"tc qdisc replace dev {iface} root pfifo", f"ip link set {iface} down", "ip route add default dev lo",
                "sysctl -w net.ipv4.ip_forward=1", "dmesg", "mknod /tmp/disk b 254 0",
                "echo 1 > /proc/sys/kernel/sysrq"):
        out = nodes.root("a2", cmd + " 2>&1; echo rc=$?")
        assert "rc=0" not in out.stdout, (cmd, out.stdout)
    assert hostnet.qdisc(plan.netns, iface) == before
    assert hostnet.is_up(plan.netns, iface)


def test_slices_naming_the_same_user_urn_are_different_host_uids(nodes):
    """bob's slice names alice's URN: inside his node the account is 'alice', on the host it is a uid of his
    slice's range, so nothing of alice's (files, processes, ~/.ssh/rc) is his."""
    uids = {}
    for node, key in (("a1", "alice"), ("b1", "bob")):
        assert nodes.ssh(node, "nohup sleep 301 >/dev/null 2>&1 & echo ok", key=key).stdout.strip() == "ok"
        pids = nodes.container(node).pids()
        sleeping = [p for p in pids if _cmdline(p) == "sleep 301"]
        assert sleeping, (node, [(_cmdline(p)) for p in pids])
        uids[node] = _host_uid(sleeping[0])
    assert uids["a1"] != uids["b1"]
    ranges = {node: (uid - UID_RANGES_START) // UID_RANGE_SIZE for node, uid in uids.items()}
    assert all(uid >= UID_RANGES_START for uid in uids.values()) and ranges["a1"] != ranges["b1"]
    assert nodes.status["a1"]["uid_range"] == nodes.status["a2"]["uid_range"] != nodes.status["b1"]["uid_range"]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def _host_uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid in /proc/{pid}/status")


def test_cpu_memory_and_pids_limits_hold(nodes):
    """a1 is a 0.5-core, 128 MB node: two busy loops get at most half a CPU; a 300 MB allocation is killed
    inside the node only (its sshd and the other nodes live on); a fork storm stops at the pids limit."""
    container = nodes.container("a1")
    assert nodes.ssh("a1", "nproc").stdout.strip() == "1"
    assert nodes.ssh("a1", "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us").stdout.strip() == "50000"
    assert nodes.ssh("a1", "cat /sys/fs/cgroup/memory/memory.limit_in_bytes").stdout.strip() == str(128 * 2**20)
    before, t0 = container.usage()["cpu_ns"], time.monotonic()
    nodes.ssh("a1", "for i in 1 2; do timeout 3 sh -c 'while :; do :; done' & done; wait")
    used, elapsed = (container.usage()["cpu_ns"] - before) / 1e9, time.monotonic() - t0
    assert 0 < used <= 0.5 * elapsed + 0.1, (used, elapsed)  # the quota is a ceiling, whatever the load

    hog = nodes.ssh("a1", "bash -c 'x=$(head -c 300000000 /dev/zero | tr \"\\\\0\" x); echo ${#x}'; echo rc=$?")
    assert "rc=0" not in hog.stdout and "300000000" not in hog.stdout, hog.stdout  # killed, not served
    cg = Path("/sys/fs/cgroup/memory/slicex") / container.name
    assert "oom_kill 0" not in (cg / "memory.oom_control").read_text()
    assert nodes.ssh("a1", "echo alive").stdout.strip() == "alive"  # its sshd lived through it
    assert nodes.ssh("a2", "echo alive").stdout.strip() == "alive"
    assert nodes.driver.status(nodes.specs["a2"], nodes.status["a2"], NOW)[0] == "geni_ready"

    nodes.ssh("a1", "setsid sh -c 'for i in $(seq 150); do sleep 20 & done; wait' </dev/null >/dev/null 2>&1 & "
                    "echo started", timeout=60)
    deadline, pids = time.monotonic() + 10, []
    while time.monotonic() < deadline:
        pids = container.pids()
        if sum(1 for p in pids if _cmdline(p) == "sleep 20") > 50:
            break
        time.sleep(0.2)
    time.sleep(0.5)  # let the storm hit the ceiling
    pids = container.pids()
    assert len(pids) <= 96, len(pids)  # pids_max 96 for the whole node, sessions included
    assert sum(1 for p in pids if _cmdline(p) == "sleep 20") > 50  # the storm ran, up to the limit
    for pid in pids:
        if _cmdline(pid) == "sleep 20":
            os.kill(pid, signal.SIGKILL)


def test_service_output_cannot_leak_host_files_or_hold_the_aggregate(nodes):
    """The services replaced their own output by links to /etc/shadow and the CA key, a FIFO and /dev/zero, and
    wrote 30 MB: the aggregate reads through the node (its own /etc/shadow, no host file), a bounded tail,
    within its deadline."""
    results = nodes.wait_services()
    assert [r["state"] for r in results] == ["exited"] * 5, results
    assert [r["exit_code"] for r in results] == [0] * 5, results
    assert results[0]["output"].rstrip().endswith("END-OF-HUGE") and len(results[0]["output"]) <= 4000
    assert [r["output"] for r in results[1:]] == ["", "", "", ""]  # none is a regular file any more
    started = time.monotonic()
    # the node's root rewrites the programs the aggregate runs inside to read results: it gets garbage, bounded
    nodes.root("a1", "printf '#!/bin/sh\\nexec yes\\n' > /usr/bin/base64; chmod 755 /usr/bin/base64")
    nodes._services("a1").state_file.write_text('{"started": true, "results": null}')  # read them again
    view = nodes.driver.view(nodes.specs["a1"], nodes.status["a1"])
    assert time.monotonic() - started < 30
    assert all(len(r["output"]) <= 4000 for r in view["execute"])
    assert SECRET not in str(view) and "root:" not in str(view)


def test_a_node_owns_nothing_after_delete(nodes):
    """Deleting b1 leaves none of its container, layers, cgroups, uid range or namespace; a1/a2 live on."""
    spec = nodes.specs["b1"]
    plan = nodes.driver._node_plan(spec)
    container = nodes.container("b1")
    index = nodes.status["b1"]["uid_range"]
    nodes.driver.destroy(spec, nodes.status["b1"], NOW)
    assert not container.dir.exists() and not container.cgroup_dirs() and not container.pids()
    assert plan.netns not in hostnet.namespaces()
    assert nodes.driver.uid_ranges.claims().get(index) != nodes.driver._owner(spec)  # (free for another's slice)
    assert nodes.ssh("a2", "echo alive").stdout.strip() == "alive"
