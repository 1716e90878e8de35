"""Login to netns nodes: an sshd inside each node's namespace, reached through a port on the host.

Per node, in `<base>/<netns>/` (base: /run/slicex-<prefix>-nodes, readable by the node's users since sshd
reads authorized_keys as the user; the switch's run directory is root-only):
- `ssh_host_ed25519_key` (the node's own host key), `sshd_config`, `sshd.pid`, `sshd.log`;
- `keys/<user>`: the user's authorized keys (from the slice's `geni_users`; geni_update_users rewrites them);
- `home/<user>`: the user's home directory.
The node's users exist only inside the node: their passwd/group entries are written to `/etc/netns/<ns>/`,
which `ip netns exec` bind-mounts over /etc, so the host's /etc/passwd is never touched. Users are
unprivileged inside the node (a namespace shares the host's kernel and file system: root in a node would be
root on the host); ping works for them (net.ipv4.ping_group_range is opened in the namespace).

sshd runs inside the namespace (`ip netns exec <ns> unshare --uts`, so `hostname` prints the node's name)
listening on port 22 of every address of the node; `login_forward.py` relays a host port (bound by the
driver on the login address, 127.0.0.1 by default) into it. The port is chosen when the node is created,
kept in the driver's record, and bound again after a restart. sshd runs while the node is started
(geni_start .. geni_stop); the relay lives as long as the sliver."""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from am.substrate import hostnet
from slicex.errors import BadArgs, ServerError

SSHD = "/usr/sbin/sshd"
UID_BASE, UID_SPAN = 2_000_000, 1_000_000  # far above any host account: files a node user writes show this uid
NODE_GROUP, NODE_GID = "slicex-users", UID_BASE - 1
FORWARD = Path(__file__).with_name("login_forward.py")


@dataclass(frozen=True)
class Account:
    """A slice user on a node: the login name (last part of the user URN), a uid derived from the URN
    (the same on every node), and the public keys sshd accepts."""

    name: str
    uid: int
    keys: tuple[str, ...]


def _valid_name(name: str) -> bool:
    return bool(name) and len(name) <= 32 and name[0].isalpha() and all(c.isalnum() or c in "-_" for c in name)


def accounts(logins: Iterable[Mapping]) -> list[Account]:
    """Accounts from the slice manager's login records ({username, urn, keys}). A user named twice gets
    the keys of both entries; names a Unix account cannot have are refused rather than mangled."""
    by_name: dict[str, tuple[int, list[str]]] = {}
    for lg in logins:
        name = str(lg.get("username") or "")
        if not _valid_name(name) or name in ("root", "sshd", "nobody"):
            raise BadArgs(f"user {lg.get('urn') or name!r}: login name {name!r} cannot be an account on a node "
                          f"(letters, digits, '-', '_', starting with a letter, at most 32; not root/sshd/nobody)")
        ident = str(lg.get("urn") or name)
        uid = UID_BASE + int(hashlib.sha256(ident.encode()).hexdigest()[:8], 16) % UID_SPAN
        keys = [line.strip() for k in lg.get("keys") or () for line in str(k).splitlines() if line.strip()]
        if name in by_name:
            by_name[name][1].extend(keys)
        else:
            by_name[name] = (uid, keys)
    return [Account(n, uid, tuple(dict.fromkeys(keys))) for n, (uid, keys) in by_name.items()]


def passwd_text(accts: Iterable[Account], home: Path) -> str:
    """The node's /etc/passwd: root, sshd (its privilege separation user), nobody, and the slice's users."""
    lines = []
    for system in ("root", "sshd", "nobody"):
        try:
            p = pwd.getpwnam(system)
            lines.append(f"{p.pw_name}:x:{p.pw_uid}:{p.pw_gid}:{p.pw_gecos}:{p.pw_dir}:{p.pw_shell}")
        except KeyError:
            pass
    lines += [f"{a.name}:*:{a.uid}:{NODE_GID}:slice user:{home / a.name}:/bin/bash" for a in accts]
    return "\n".join(lines) + "\n"


def group_text(accts: Iterable[Account]) -> str:
    import grp

    lines = []
    for system in ("root", "nogroup"):
        try:
            g = grp.getgrnam(system)
            lines.append(f"{g.gr_name}:x:{g.gr_gid}:")
        except KeyError:
            pass
    lines.append(f"{NODE_GROUP}:x:{NODE_GID}:{','.join(a.name for a in accts)}")
    return "\n".join(lines) + "\n"


def sshd_config(d: Path) -> str:
    """Keys only, slice users only (the node's group), no root, no host paths but the node's own."""
    return "\n".join([
        "Port 22", "ListenAddress 0.0.0.0", f"HostKey {d / 'ssh_host_ed25519_key'}", f"PidFile {d / 'sshd.pid'}",
        f"AuthorizedKeysFile {d / 'keys'}/%u", "AuthenticationMethods publickey", "PubkeyAuthentication yes",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", "PermitRootLogin no",
        f"AllowGroups {NODE_GROUP}", "X11Forwarding no", "PrintMotd no", "PrintLastLog no", "UseDNS no",
        "Subsystem sftp internal-sftp", "LogLevel VERBOSE", ""])


def _write_in_place(path: Path, text: str) -> None:
    """Rewrite a file keeping its inode: `ip netns exec` bind-mounted it over /etc in processes already
    running (sshd), and a rename would leave them the old one."""
    with open(path, "a+") as f:
        f.seek(0)
        f.truncate()
        f.write(text)


def _alive(pid_file: Path, marker: str) -> int | None:
    """The pid in `pid_file` if that process runs and its command line names `marker` (never a reused pid)."""
    try:
        pid = int(pid_file.read_text().split()[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, ValueError, IndexError):
        return None
    if marker not in cmdline:
        return None
    try:  # a zombie (our own unreaped child) is not running
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return None
    except (OSError, IndexError):
        return None
    return pid


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


class NodeLogin:
    """The login service of one node: accounts, host key, sshd and the relay from a host port."""

    def __init__(self, base: Path, netns: str, hostname: str, bind: str = "127.0.0.1"):
        self.dir = base / netns
        self.netns = netns
        self.hostname = hostname
        self.bind = bind

    # ---- set up ----------------------------------------------------------------------------------------------
    def prepare(self, accts: list[Account]) -> None:
        """Directories, host key, sshd_config and the accounts (idempotent)."""
        for d, mode in ((self.dir.parent, 0o755), (self.dir, 0o755), (self.dir / "keys", 0o755),
                        (self.dir / "home", 0o755)):
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(mode)
        key = self.dir / "ssh_host_ed25519_key"
        if not key.exists():
            hostnet.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{self.hostname}", "-f", str(key)])
        (self.dir / "sshd_config").write_text(sshd_config(self.dir))
        self.set_accounts(accts)
        hostnet.exec_in(self.netns, ["sysctl", "-q", "-w", "net.ipv4.ping_group_range=0 2147483647"])

    def set_accounts(self, accts: list[Account]) -> None:
        """The node's users and their keys as given (a user no longer listed cannot log in any more)."""
        etc = hostnet.NETNS_ETC / self.netns
        etc.mkdir(parents=True, exist_ok=True)
        _write_in_place(etc / "passwd", passwd_text(accts, self.dir / "home"))
        _write_in_place(etc / "group", group_text(accts))
        keys = self.dir / "keys"
        for old in keys.iterdir():
            if old.name not in {a.name for a in accts}:
                old.unlink()
        for a in accts:
            tmp = keys / f".{a.name}.tmp"
            tmp.write_text("".join(k + "\n" for k in a.keys))
            tmp.chmod(0o644)
            tmp.replace(keys / a.name)
            home = self.dir / "home" / a.name
            home.mkdir(exist_ok=True)
            os.chown(home, a.uid, NODE_GID)
            home.chmod(0o700)

    def ensure_forward(self, port: int | None) -> int:
        """The relay from `bind:port` on the host (a free port when None) to the node's sshd; returns the
        port. A relay already running is kept."""
        pid_file = self.dir / "forward.pid"
        if _alive(pid_file, self.netns) and port:
            return port
        sock = socket.socket(socket.AF_INET6 if ":" in self.bind else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.bind, port or 0))
        except OSError as exc:
            sock.close()
            if not port:
                raise ServerError(f"node {self.hostname}: no login port on {self.bind}: {exc}") from None
            raise ServerError(f"node {self.hostname}: its login port {self.bind}:{port} is taken by another "
                              f"program ({exc})") from None
        try:
            sock.listen(64)
            port = sock.getsockname()[1]
            fd = sock.fileno()
            proc = subprocess.Popen(["ip", "netns", "exec", self.netns, sys.executable, str(FORWARD), "--fd", str(fd),
                                     "--to", "127.0.0.1:22", "--netns", self.netns], pass_fds=(fd,),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=open(self.dir / "forward.log", "ab"), start_new_session=True)
        finally:
            sock.close()
        pid_file.write_text(f"{proc.pid}\n")
        return port

    def start_sshd(self) -> None:
        """sshd in the node (its own UTS namespace named after the node); returns once it listens."""
        pid_file = self.dir / "sshd.pid"
        if _alive(pid_file, str(self.dir)):
            return
        pid_file.unlink(missing_ok=True)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        script = 'hostname "$1" && exec "$2" -D -f "$3" -E "$4"'
        proc = subprocess.Popen(["ip", "netns", "exec", self.netns, "unshare", "--uts", "sh", "-c", script, "sx",
                                 self.hostname, SSHD, str(self.dir / "sshd_config"), str(self.dir / "sshd.log")],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                err = (proc.stderr.read().decode(errors="replace") if proc.stderr else "").strip()
                log = (self.dir / "sshd.log").read_text(errors="replace")[-500:] if (
                    self.dir / "sshd.log").exists() else ""
                raise ServerError(f"node {self.hostname}: sshd exited with {proc.returncode}: {err or log}")
            if _alive(pid_file, str(self.dir)) and self._listening():
                if proc.stderr:
                    proc.stderr.close()
                return
            time.sleep(0.02)
        proc.kill()
        raise ServerError(f"node {self.hostname}: sshd did not listen within 10 s (see {self.dir / 'sshd.log'})")

    def _listening(self) -> bool:
        out = hostnet.exec_in(self.netns, ["ss", "-Hltn", "sport = :22"], timeout=5)
        return ":22" in out.stdout

    # ---- state and removal ---------------------------------------------------------------------------------
    def sshd_running(self) -> bool:
        return _alive(self.dir / "sshd.pid", str(self.dir)) is not None

    def forward_running(self) -> bool:
        return _alive(self.dir / "forward.pid", self.netns) is not None

    def stop_sshd(self) -> None:
        _kill(self.dir / "sshd.pid", str(self.dir))

    def remove(self) -> None:
        """Stop sshd, its sessions and the relay; delete the node's directory (homes included)."""
        self.stop_sshd()
        _kill(self.dir / "forward.pid", self.netns)
        kill_netns_processes(self.netns)  # sessions and whatever users left running
        shutil.rmtree(self.dir, ignore_errors=True)


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
