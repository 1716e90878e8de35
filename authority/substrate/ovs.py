"""Open vSwitch edge: a private ovsdb-server + ovs-vswitchd (userspace `netdev` datapath) in a run directory
of the deployment's own, its bridges and ports. Never the system's Open vSwitch service: that needs a kernel
module this kind of host may lack, and a deployment must be able to stop everything it started.

The run directory holds conf.db (created with ovsdb-tool from Debian's vswitch.ovsschema), the sockets, pid
files and logs. Unix socket paths are limited to 108 bytes, so it lives under /run (or /tmp), not in a deep
home directory."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from slicex.errors import ServerError, Unsupported

SCHEMAS = (Path("/usr/share/openvswitch/vswitch.ovsschema"),)
TOOLS = ("ovsdb-tool", "ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovs-ofctl")


def missing_tools() -> list[str]:
    """What this host lacks to run the private switch (empty when it can)."""
    missing = [t for t in TOOLS if shutil.which(t) is None and not Path("/usr/sbin", t).exists()]
    if not any(s.exists() for s in SCHEMAS):
        missing.append("vswitch.ovsschema (Debian package openvswitch-common)")
    return missing


def default_run_dir(prefix: str) -> Path:
    base = Path("/run") if os.access("/run", os.W_OK) else Path("/tmp")
    return base / f"slicex-{prefix}"


def _pid_alive(path: Path) -> int | None:
    try:
        pid = int(path.read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    try:  # a reused pid is not ours: the process must be the OVS program this file belongs to
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None
    return pid if Path(exe).name.startswith(path.stem) else None


def parse_statistics(text: str) -> dict[str, int]:
    """`ovs-vsctl get Interface X statistics` ({collisions=0, rx_bytes=1180, ...}) as numbers by name."""
    out = {}
    for item in text.strip().strip("{}").split(","):
        key, _, value = item.strip().partition("=")
        if key and value.strip().lstrip("-").isdigit():
            out[key] = int(value)
    return out


class OvsSwitch:
    """The private Open vSwitch of one deployment."""

    def __init__(self, run_dir: Path, timeout: float = 10.0, netns: str | None = None):
        """`netns`: the network namespace its datapath runs in (a rack's switch on another lab host); its
        sockets are files, so it is driven from here all the same."""
        self.run_dir = Path(run_dir)
        self.timeout = timeout
        self.netns = netns
        if len(str(self.run_dir / "ovs-vswitchd.12345.ctl")) > 100:
            raise ServerError(f"OVS run directory {self.run_dir} is too long for its Unix sockets (108 bytes)")

    # ---- processes -------------------------------------------------------------------------------------------
    @property
    def db(self) -> str:
        return f"unix:{self.run_dir / 'db.sock'}"

    def running(self) -> bool:
        return all(_pid_alive(self.run_dir / f"{p}.pid") for p in ("ovsdb-server", "ovs-vswitchd"))

    def start(self) -> None:
        """Start the private switch, or adopt the one a previous process of this deployment left running."""
        missing = missing_tools()
        if missing:
            raise Unsupported(f"the netns substrate needs Open vSwitch (userspace datapath): missing "
                              f"{', '.join(missing)}; install Debian package openvswitch-switch "
                              f"(scripts/system-deps.sh)")
        if self.running():
            return
        self.stop()  # half of a pair: start both afresh (the database file keeps bridges and ports)
        self.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        conf = self.run_dir / "conf.db"
        if not conf.exists():
            schema = next(s for s in SCHEMAS if s.exists())
            self._run(["ovsdb-tool", "create", str(conf), str(schema)])
        d = self.run_dir
        self._run(["ovsdb-server", str(conf), f"--remote=punix:{d / 'db.sock'}", f"--pidfile={d / 'ovsdb-server.pid'}",
                   f"--unixctl={d / 'ovsdb-server.ctl'}", f"--log-file={d / 'ovsdb-server.log'}", "--detach",
                   "--no-chdir"])
        self.vsctl("--no-wait", "init")
        env = {**os.environ, "OVS_RUNDIR": str(d), "OVS_DBDIR": str(d)}
        enter = ["nsenter", f"--net=/run/netns/{self.netns}"] if self.netns else []
        self._run([*enter, "ovs-vswitchd", self.db, f"--pidfile={d / 'ovs-vswitchd.pid'}", f"--unixctl={d / 'ovs-vswitchd.ctl'}",
                   f"--log-file={d / 'ovs-vswitchd.log'}", "--detach", "--no-chdir"], env=env)
        if not self.running():
            raise ServerError(f"Open vSwitch did not start; see {d / 'ovs-vswitchd.log'}")

    def stop(self, remove: bool = False) -> None:
        """Stop both daemons (bridges die with ovs-vswitchd); `remove` also deletes the run directory."""
        for name in ("ovs-vswitchd", "ovsdb-server"):
            pid = _pid_alive(self.run_dir / f"{name}.pid")
            if pid is None:
                continue
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + self.timeout
            while time.monotonic() < deadline and _pid_alive(self.run_dir / f"{name}.pid") == pid:
                time.sleep(0.05)
            if _pid_alive(self.run_dir / f"{name}.pid") == pid:
                os.kill(pid, signal.SIGKILL)
        if remove:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    # ---- commands --------------------------------------------------------------------------------------------
    def _run(self, argv: list[str], env: Mapping[str, str] | None = None) -> str:
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout + 5, env=env)
        except subprocess.TimeoutExpired:
            raise ServerError(f"{argv[0]} did not answer within {self.timeout + 5:.0f} s") from None
        if out.returncode != 0:
            raise ServerError(f"{' '.join(argv[:4])} failed: {(out.stderr or out.stdout).strip()}")
        return out.stdout

    def vsctl(self, *args: str) -> str:
        return self._run(["ovs-vsctl", f"--db={self.db}", f"--timeout={int(self.timeout)}", *args])

    def ofctl(self, command: str, bridge: str, *args: str) -> str:
        return self._run(["ovs-ofctl", "-O", "OpenFlow13", command, self.mgmt(bridge), *args])

    def appctl(self, *args: str) -> str:
        """A command to this switch's ovs-vswitchd (its own control socket, not the host's)."""
        return self._run(["ovs-appctl", "-t", str(self.run_dir / "ovs-vswitchd.ctl"), *args])

    def mgmt(self, bridge: str) -> str:
        return f"unix:{self.run_dir / (bridge + '.mgmt')}"

    # ---- bridges and ports -----------------------------------------------------------------------------------
    def ensure_bridge(self, bridge: str, dpid: int, controller: str | None) -> None:
        """A netdev bridge in secure fail mode (no rule, no forwarding) speaking OpenFlow 1.3."""
        self.vsctl("--may-exist", "add-br", bridge, "--", "set", "bridge", bridge, "datapath_type=netdev",
                   "fail_mode=secure", "protocols=OpenFlow13", f"other-config:datapath-id={dpid:016x}")
        # Q-in-Q: match the C-tag after popping the S-tag. vlan-limit is a switch-wide setting (Open_vSwitch
        # table; the default 1 parses only the outer tag, so the inner one never matches)
        self.vsctl("set", "Open_vSwitch", ".", "other_config:vlan-limit=2")
        if controller:
            self.vsctl("set-controller", bridge, controller)
        else:
            self.vsctl("del-controller", bridge)
        self._wait_for_mgmt(bridge)

    def _wait_for_mgmt(self, bridge: str) -> None:
        """ovs-vswitchd opens the bridge's OpenFlow socket a moment after ovsdb records it, and never when it
        cannot create its userspace datapath (another ovs-vswitchd with datapath_type=netdev already runs on this
        host): wait for it, and name that cause rather than fail later on a missing socket."""
        sock = self.run_dir / (bridge + ".mgmt")
        deadline = time.monotonic() + self.timeout
        while not sock.exists():
            if time.monotonic() > deadline:
                raise ServerError(f"Open vSwitch bridge {bridge} did not come up within {self.timeout:.0f} s (no "
                                  f"{sock}); is another ovs-vswitchd with the userspace datapath running on this "
                                  f"host? Only one can (see docs/substrate-netns.md, switch_dir)")
            time.sleep(0.05)

    def bridges(self) -> list[str]:
        return self.vsctl("list-br").split()

    def add_port(self, bridge: str, port: str, tag: int | None = None) -> int:
        """Add `port` (an existing device) and return its OpenFlow port number. The tag is for the record
        (`ovs-vsctl show`); forwarding follows the controller's rules."""
        extra = ["--", "set", "port", port, f"tag={tag}"] if tag is not None else []
        self.vsctl("--may-exist", "add-port", bridge, port, *extra)
        return self.ofport(port)

    def ofport(self, port: str) -> int:
        deadline = time.monotonic() + self.timeout
        while True:
            value = self.vsctl("get", "Interface", port, "ofport").strip()
            if value.lstrip("-").isdigit() and int(value) > 0:
                return int(value)
            if time.monotonic() > deadline:
                err = self.vsctl("get", "Interface", port, "error").strip()
                raise ServerError(f"OVS gave port {port} no OpenFlow number ({value}; error {err})")
            time.sleep(0.05)

    def del_port(self, bridge: str, port: str) -> None:
        self.vsctl("--if-exists", "del-port", bridge, port)

    def ports(self, bridge: str) -> list[str]:
        return self.vsctl("list-ports", bridge).split()

    def port_counters(self, port: str) -> dict[str, int]:
        """The switch's counters of one port (rx/tx packets and bytes, drops, errors; rx is what the switch
        received from the port's device)."""
        return parse_statistics(self.vsctl("get", "Interface", port, "statistics"))

    def set_mirror(self, bridge: str, name: str, selected: Sequence[str], output: str) -> None:
        """Mirror every packet received on or sent to the `selected` ports to `output` (one mirror per name:
        an older one of that name is replaced)."""
        self.del_mirror(bridge, name)
        ids = [f"@s{k}" for k in range(len(selected))]
        argv: list[str] = []
        for ref, port in zip(ids, selected, strict=True):
            argv += ["--", f"--id={ref}", "get", "Port", port]
        argv += ["--", "--id=@out", "get", "Port", output,
                 "--", "--id=@m", "create", "Mirror", f"name={name}", f"select-src-port={','.join(ids)}",
                 f"select-dst-port={','.join(ids)}", "output-port=@out",
                 "--", "add", "Bridge", bridge, "mirrors", "@m"]
        self.vsctl(*argv)

    def mirrors(self, bridge: str) -> dict[str, str]:
        """name -> uuid of the bridge's mirrors."""
        out = {}
        for uuid in self.vsctl("get", "Bridge", bridge, "mirrors").strip("[] \n").replace(",", " ").split():
            out[self.vsctl("get", "Mirror", uuid, "name").strip().strip('"')] = uuid
        return out

    def del_mirror(self, bridge: str, name: str) -> None:
        uuid = self.mirrors(bridge).get(name)
        if uuid is not None:
            self.vsctl("remove", "Bridge", bridge, "mirrors", uuid)

    def connected(self, bridge: str) -> bool:
        return "true" in self.vsctl("--columns=is_connected", "list", "Controller")
