"""Login to netns nodes: the slice users' accounts and the relays from host ports to the node's ports.

The node's sshd runs inside its container (container.py) with the users and keys the driver writes to the
node's read-only host directory. This module makes the accounts from the slice manager's login records and
runs the relay: a port bound by the driver on the login address (127.0.0.1 by default) and handed to
`login_forward.py`, which runs inside the node's network namespace and connects to port 22 there. No veth,
route or bridge joins the host and a node, so a node reaches nothing on the host through its login path.
The relay's files (pid, log) are in `<base>/<netns>/`, root's alone. The port is chosen when the node is
created, kept in the driver's record, and bound again after a restart; the relay lives as long as the sliver.
A node's public ports (resources/public_port.py) are relays of the same kind, one per port, bound on the
gateway's address to the node port each names: one way to forward into a node."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from slicex.errors import BadArgs, ServerError

FORWARD = Path(__file__).with_name("login_forward.py")
RESERVED_NAMES = ("root", "sshd", "nobody", "daemon", "bin", "sys", "sync", "games", "man", "lp", "mail", "news",
                  "uucp", "proxy", "www-data", "backup", "list", "irc", "_apt", "messagebus", "systemd-network")


@dataclass(frozen=True)
class Account:
    """A slice user on a node: the login name (last part of the user URN), the URN and the public keys sshd
    accepts. The uid inside the node is the node's to assign (container.assign_uids)."""

    name: str
    urn: str
    keys: tuple[str, ...]


def _valid_name(name: str) -> bool:
    return bool(name) and len(name) <= 32 and name[0].isalpha() and all(c.isalnum() or c in "-_" for c in name)


def accounts(logins: Iterable[Mapping]) -> list[Account]:
    """Accounts from the slice manager's login records ({username, urn, keys}). A user named twice gets
    the keys of both entries; names a Unix account cannot have, or the node's system accounts, are refused
    rather than mangled."""
    by_name: dict[str, tuple[str, list[str]]] = {}
    for lg in logins:
        name = str(lg.get("username") or "")
        if not _valid_name(name) or name in RESERVED_NAMES:
            raise BadArgs(f"user {lg.get('urn') or name!r}: login name {name!r} cannot be an account on a node "
                          f"(letters, digits, '-', '_', starting with a letter, at most 32; not a system account "
                          f"such as root, sshd or nobody)")
        ident = str(lg.get("urn") or name)
        keys = [line.strip() for k in lg.get("keys") or () for line in str(k).splitlines() if line.strip()]
        if name in by_name:
            by_name[name][1].extend(keys)
        else:
            by_name[name] = (ident, keys)
    return [Account(n, urn, tuple(dict.fromkeys(keys))) for n, (urn, keys) in by_name.items()]


def _cmdline(pid: int) -> str:
    """The command line of `pid`. It reads empty while the process is inside execve (`ip netns exec` replacing
    itself with the relay, just after it was started), so an empty one is read again for a moment."""
    deadline = time.monotonic() + 0.5
    while True:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        if raw or time.monotonic() > deadline:
            return raw.replace(b"\0", b" ").decode(errors="replace")
        time.sleep(0.005)


def _alive(pid_file: Path, marker: str) -> int | None:
    """The pid in `pid_file` if that process runs and its command line names `marker` (never a reused pid)."""
    try:
        pid = int(pid_file.read_text().split()[0])
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return None  # a zombie (our own unreaped child) is not running
        cmdline = _cmdline(pid)
    except (OSError, ValueError, IndexError):
        return None
    return pid if marker in cmdline else None


def _kill(pid_file: Path, marker: str, timeout: float = 3.0) -> None:
    pid = _alive(pid_file, marker)
    if pid is not None:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _alive(pid_file, marker) == pid:
            _reap(pid)
            time.sleep(0.02)
        if _alive(pid_file, marker) == pid:
            os.kill(pid, signal.SIGKILL)
        _reap(pid)
    pid_file.unlink(missing_ok=True)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


LOGIN = "forward"  # the login relay's name (its pid and log files)


def public_relay(port: int) -> str:
    """The name of the relay of a node's public port to its `port`."""
    return f"public-{port}"


class LoginRelay:
    """The relays into one node: its login port (from `bind:port` on the host to the node's port 22) and its
    public ports (from the gateway's address to the node's ports), each a `login_forward.py` process."""

    def __init__(self, base: Path, netns: str, hostname: str, bind: str = "127.0.0.1",
                 ports: tuple[tuple[int, int], ...] = ()):
        self.dir = base / netns
        self.netns = netns
        self.hostname = hostname
        self.bind = bind
        self.ports = ports  # where a new login port is taken from (slicex.yaml netns.login_ports); () any free

    def ensure_forward(self, port: int | None, to_port: int = 22, bind: str | None = None,
                       name: str = LOGIN) -> int:
        """The relay `name` from `bind:port` on the host (a free port when None; `bind` defaults to the login
        address) to the node's `to_port`; returns the port. A relay already running is kept."""
        bind = bind or self.bind
        what = "login port" if name == LOGIN else f"public port for its port {to_port}"
        self.dir.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.dir.mkdir(mode=0o700, exist_ok=True)
        pid_file = self.dir / f"{name}.pid"
        if _alive(pid_file, self.netns) and port:
            return port
        if not port and name == LOGIN and self.ports:
            port = free_port_in(bind, self.ports, f"node {self.hostname}: no {what}")
        sock = socket.socket(socket.AF_INET6 if ":" in bind else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((bind, port or 0))
        except OSError as exc:
            sock.close()
            if not port:
                raise ServerError(f"node {self.hostname}: no {what} on {bind}: {exc}") from None
            raise ServerError(f"node {self.hostname}: its {what} {bind}:{port} is taken by another "
                              f"program ({exc})") from None
        try:
            sock.listen(64)
            port = sock.getsockname()[1]
            fd = sock.fileno()
            proc = subprocess.Popen(["ip", "netns", "exec", self.netns, sys.executable, str(FORWARD), "--fd", str(fd),
                                     "--to", f"127.0.0.1:{to_port}", "--netns", self.netns], pass_fds=(fd,),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=open(self.dir / f"{name}.log", "ab"), start_new_session=True)
        finally:
            sock.close()
        pid_file.write_text(f"{proc.pid}\n")
        return port

    def forward_running(self, name: str = LOGIN) -> bool:
        return _alive(self.dir / f"{name}.pid", self.netns) is not None

    def remove(self) -> None:
        """Stop every relay of the node and delete its directory."""
        for pid_file in self.dir.glob("*.pid") if self.dir.is_dir() else ():
            _kill(pid_file, self.netns)
        shutil.rmtree(self.dir, ignore_errors=True)


def free_port_in(bind: str, ranges: tuple[tuple[int, int], ...], what: str) -> int:
    """The first port of `ranges` free on `bind` (a firewall opens the operator's range, not the kernel's
    ephemeral ports); ServerError saying `what` and the range when every port is taken."""
    for low, high in ranges:
        for port in range(low, high + 1):
            with socket.socket(socket.AF_INET6 if ":" in bind else socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind((bind, port))
                    return port
                except OSError:
                    continue
    shown = ", ".join(f"{lo}-{hi}" if lo != hi else str(lo) for lo, hi in ranges)
    raise ServerError(f"{what}: every port of netns.login_ports ({shown}) on {bind} is taken; widen the range "
                      f"in slicex.yaml")


def netns_processes(ns: str) -> list[int]:
    """Pids of processes whose network namespace is `ns` (what must die before a node is gone)."""
    try:
        target = os.stat(f"/run/netns/{ns}")
    except OSError:
        return []
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            st = os.stat(p / "ns" / "net")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
            out.append(int(p.name))
    return out


def kill_netns_processes(ns: str) -> list[int]:
    """SIGKILL everything running in namespace `ns` (sshd, sessions, services and what they started)."""
    pids = netns_processes(ns)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in pids:
        _reap(pid)
    return pids
