"""Container nodes: each netns node is an unprivileged LXC container joined to the node's network namespace.

What a node gets (docs/substrate-netns.md, "What a node is"):
- its own mount, pid, uts, ipc, user and cgroup namespaces; the network namespace the driver made (links,
  Open vSwitch ports, tc shaping and reconcile are unchanged). That namespace belongs to the host's user
  namespace, so root in the container cannot change its interfaces, addresses or qdiscs.
- a copy-on-write root: an overlay whose lower layer is the slice's uid-shifted copy of a catalogue image
  (images.py) and whose upper layer is the node's own, on a file system of the sliver type's disk size (an
  ext4 in a sparse file under the operator's layers directory, loop-mounted by the host): a node that fills it
  gets ENOSPC in that node alone, and `df /` in the node shows its own size. The host mounts the overlay
  itself with paths relative to the node's directory, and the files it hands the node come from a small
  tmpfs of the deployment, so the node's mount table names no host path;
- its uids 0..65535 mapped to a host range no other slice holds (`UidRanges`), so a slice's root and users
  are host uids of that slice alone;
- CPU (CFS quota and a cpuset, so `nproc` says the cores it got), memory and pids limits from the sliver type;
- a read-only directory from the host at /run/slicex (sshd_config, the users and their public keys, the init
  and account scripts): the aggregate writes only host paths it owns, never a path inside the node, and reads
  what happens inside only through `lxc-attach` with a deadline and a size bound.

The pure part (`node_limits`, `container_config`, the scripts) is plain text from plain data; `NodeContainer`
and `UidRanges` run lxc-* commands and touch the host."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import math
import os
import select
import shutil
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from authority.substrate.images import remove_tree
from slicex.errors import BadArgs, ServerError

UID_RANGES_START = 100_000_000
UID_RANGE_SIZE = 65_536
UID_RANGES = 4096
SUBID_LINE = f"root:{UID_RANGES_START}:{UID_RANGE_SIZE * UID_RANGES}"
USERS_GID = 1999  # the node's `slicex-users` group: sshd admits it alone, sudo gives it root in the node
USER_UIDS = (2000, 60000)  # where slice users' uids inside a node come from
LXC_INIT = Path("/usr/sbin/init.lxc.static")
CGROUP_ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "pids")
MOUNT_POINT = "run/slicex"  # where the host directory appears inside the node
DEFAULT_PIDS = 1024
DEFAULT_DISK_GB = 10  # a node whose placement names no disk size (the substrate's VM sizes all do)
# the node's layer file system: no reserved blocks (the node may use all it booked), inode tables and journal
# left for the kernel and never initialised in the background (a sparse file keeps only what was written)
MKFS_LAYER = ("mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard")
LAYER_MOUNT_OPTIONS = "loop,nosuid,nodev,noatime,noinit_itable"


# ---- the pure part -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NodeLimits:
    """What the sliver type promises, as the kernel enforces it."""

    cores: float
    memory_mb: int
    cpuset: str  # the host CPUs it may run on ("0,1"): as many as the cores rounded up
    pids: int = DEFAULT_PIDS
    disk_gb: int = DEFAULT_DISK_GB  # the size of the node's own layer (its writable root file system)

    @property
    def cfs_quota_us(self) -> int:
        return max(1000, int(self.cores * 100_000))

    def to_doc(self) -> dict[str, object]:
        return {"cores": self.cores, "memory_mb": self.memory_mb, "cpuset": self.cpuset, "pids": self.pids,
                "disk_gb": self.disk_gb}


def node_limits(details: Mapping, key: str, host_cpus: int, pids: int = DEFAULT_PIDS) -> NodeLimits:
    """Limits from a node's details (`cores`, `memory_mb`, `disk_gb` from the broker's placement). The cpuset
    starts at a CPU chosen from `key`, so nodes spread over the host's CPUs."""
    try:
        cores = float(details.get("cores") or 1)
        memory_mb = int(details.get("memory_mb") or 1024)
        disk_gb = int(details.get("disk_gb") or DEFAULT_DISK_GB)
    except (TypeError, ValueError):
        raise BadArgs(f"node limits: cores {details.get('cores')!r}, memory_mb {details.get('memory_mb')!r} and "
                      f"disk_gb {details.get('disk_gb')!r} must be numbers") from None
    if cores <= 0 or memory_mb < 16 or disk_gb < 1:
        raise BadArgs(f"node limits: {cores} cores, {memory_mb} MB and {disk_gb} GB of disk cannot run a node")
    n = min(max(1, math.ceil(cores)), max(1, host_cpus))
    first = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % max(1, host_cpus)
    cpuset = ",".join(str(c) for c in sorted((first + i) % max(1, host_cpus) for i in range(n)))
    return NodeLimits(cores, memory_mb, cpuset, pids, disk_gb)


def disk_admission(asked_gb: int, promised_bytes: int, free_bytes: int, reserve_bytes: int) -> str | None:
    """Why a node of `asked_gb` may not be made on a layers file system with `free_bytes` free (None: it fits).
    `promised_bytes`: what the nodes already there may still write (each one's size less what its layer
    holds), so the file system's free space is never promised twice; `reserve_bytes` stays free for the
    aggregate (its store, logs and images when they share the file system)."""
    asked = asked_gb * 2**30
    room = free_bytes - reserve_bytes - promised_bytes
    if asked <= room:
        return None
    gib = 2**30
    return (f"a node disk of {asked_gb} GB does not fit: the node layers' file system has {free_bytes / gib:.1f} GiB "
            f"free, {promised_bytes / gib:.1f} GiB of it promised to the nodes already there and "
            f"{reserve_bytes / gib:.1f} GiB kept free for the aggregate ({max(0, room) / gib:.1f} GiB left)")


def uid_base(index: int) -> int:
    return UID_RANGES_START + index * UID_RANGE_SIZE


def overlay_options() -> str:
    """The root overlay's options, relative to the node's directory (the mount runs there): what the node's
    mount table shows of them."""
    return "lowerdir=lower,upperdir=fs/upper,workdir=fs/work,nodev"


def container_config(name: str, hostname: str, rootfs: Path, base: int, netns_path: str, host_dir: Path,
                     limits: NodeLimits, log_file: Path, cgroup_v1: bool = True,
                     mounts: Sequence[tuple[Path, str]] = (), init: Path = LXC_INIT) -> str:
    """The LXC configuration of one node (pure). Unprivileged (an id map), its root the overlay the host
    mounted at `rootfs`, sharing the driver's network namespace, no sysfs of its own (a read-only view of its
    own cgroups instead), a read-only /run/slicex, and the host directories of `mounts` (its datasets: host
    path, absolute mountpoint in the node)."""
    lines = [
        f"lxc.uts.name = {hostname}",
        f"lxc.rootfs.path = dir:{rootfs}",
        f"lxc.idmap = u 0 {base} {UID_RANGE_SIZE}",
        f"lxc.idmap = g 0 {base} {UID_RANGE_SIZE}",
        f"lxc.namespace.share.net = {netns_path}",
        "lxc.mount.auto =",
        "lxc.mount.auto = proc:mixed",
        "lxc.autodev = 1",
        "lxc.tty.max = 0",
        "lxc.pty.max = 256",
        "lxc.cap.drop = sys_module sys_rawio sys_time mac_admin mac_override",
        "lxc.mount.entry = tmpfs sys tmpfs rw,nosuid,nodev,noexec,size=64k,mode=755,create=dir 0 0",
        f"lxc.mount.entry = {host_dir} {MOUNT_POINT} none bind,ro,nosuid,nodev,create=dir 0 0",
        f"lxc.mount.entry = {init} usr/sbin/init.lxc none bind,ro,create=file 0 0",
        *(f"lxc.mount.entry = {host} {inside.lstrip('/')} none bind,nosuid,nodev,create=dir 0 0"
          for host, inside in mounts),
        f"lxc.init.cmd = /usr/sbin/init.lxc -n {name} -- /bin/sh /{MOUNT_POINT}/init",
        f"lxc.cgroup.dir.container = slicex/{name}",
        f"lxc.cgroup.dir.monitor = slicex-monitor/{name}",
        f"lxc.log.file = {log_file}",
        "lxc.log.level = WARN",
    ]
    if cgroup_v1:
        lines += [
            "lxc.cgroup.cpu.cfs_period_us = 100000",
            f"lxc.cgroup.cpu.cfs_quota_us = {limits.cfs_quota_us}",
            f"lxc.cgroup.cpuset.cpus = {limits.cpuset}",
            f"lxc.cgroup.memory.limit_in_bytes = {limits.memory_mb}M",
            f"lxc.cgroup.pids.max = {limits.pids}",
        ]
        # the node reads its own limits (read-only): what `slicex status` and the manifest say it got
        lines += [f"lxc.mount.entry = {CGROUP_ROOT / c / 'slicex' / name} sys/fs/cgroup/{c} none "
                  f"bind,ro,nosuid,nodev,noexec,create=dir 0 0" for c in ("cpu", "cpuset", "memory", "pids")]
    else:
        lines += [
            f"lxc.cgroup2.cpu.max = {limits.cfs_quota_us} 100000",
            f"lxc.cgroup2.cpuset.cpus = {limits.cpuset}",
            f"lxc.cgroup2.memory.max = {limits.memory_mb}M",
            f"lxc.cgroup2.pids.max = {limits.pids}",
        ]
    return "\n".join(lines) + "\n"


def sshd_config() -> str:
    """Keys only, slice users only (the node's group), no root login; keys from the host's read-only
    directory (sshd's strict modes would refuse files the node does not own: they are the host's)."""
    return "\n".join([
        "Port 22", "ListenAddress 0.0.0.0", "HostKey /etc/ssh/ssh_host_ed25519_key", "PidFile /run/sshd.pid",
        f"AuthorizedKeysFile /{MOUNT_POINT}/keys/%u", "StrictModes no", "AuthenticationMethods publickey",
        "PubkeyAuthentication yes", "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no",
        "PermitRootLogin no", "AllowGroups slicex-users", "X11Forwarding no", "PrintMotd no", "UseDNS no",
        "Subsystem sftp internal-sftp", "LogLevel VERBOSE", ""])


INIT_SCRIPT = f"""#!/bin/sh
# slicex node init (PID 1 is LXC's init.lxc): host name, accounts, ssh host key, then sshd in the foreground
h=$(hostname)
grep -q " $h\\$" /etc/hosts 2>/dev/null || echo "127.0.1.1 $h" >> /etc/hosts
echo "$h" > /etc/hostname
mkdir -p /run/sshd && chmod 755 /run/sshd
[ -s /etc/ssh/ssh_host_ed25519_key ] || ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key
/bin/sh /{MOUNT_POINT}/sync-users
exec /usr/sbin/sshd -D -f /{MOUNT_POINT}/sshd_config -E /var/log/sshd.log
"""

SYNC_USERS_SCRIPT = f"""#!/bin/sh
# slicex: the node's accounts follow /{MOUNT_POINT}/users ("name uid" per line), keys only ('*': no password,
# not locked); users no longer listed are locked (their keys are gone from /{MOUNT_POINT}/keys already)
getent group slicex-users >/dev/null || groupadd -g {USERS_GID} slicex-users
listed=" "
while read -r name uid; do
  [ -n "$name" ] || continue
  listed="$listed$name "
  if getent passwd "$name" >/dev/null; then
    usermod -p '*' "$name"
  else
    useradd -m -u "$uid" -g slicex-users -s /bin/bash -p '*' "$name"
  fi
done < /{MOUNT_POINT}/users
getent passwd | while IFS=: read -r name _x _uid gid _rest; do
  [ "$gid" = "{USERS_GID}" ] || continue
  case "$listed" in *" $name "*) ;; *) usermod -L "$name" 2>/dev/null ;; esac
done
exit 0
"""

# run inside the node as a user: each service in turn, output and exit code in $D (their own directory)
SERVICES_SCRIPT = """D=$1; shift; cd "$HOME" 2>/dev/null || cd /
n=0
while [ $# -ge 2 ]; do
  sh_=$1; cmd=$2; shift 2
  "$sh_" -c "$cmd" </dev/null >"$D/$n.out" 2>&1; echo $? >"$D/$n.rc.tmp"; mv "$D/$n.rc.tmp" "$D/$n.rc"
  n=$((n+1))
done
"""

# run inside the node as its root: per service "<n> <rc or -> <base64 of the output's tail>"; only regular
# files are read (a symlink, FIFO or device there reads as nothing)
RESULTS_SCRIPT = """D=$1; N=$2; T=$3; n=0
while [ $n -lt $N ]; do
  rc=-; [ -f "$D/$n.rc" ] && [ ! -L "$D/$n.rc" ] && rc=$(head -c 8 "$D/$n.rc" | tr -dc 0-9)
  out=; [ -f "$D/$n.out" ] && [ ! -L "$D/$n.out" ] && out=$(tail -c "$T" "$D/$n.out" | base64 -w0)
  echo "$n ${rc:--} ${out:--}"
  n=$((n+1))
done
"""


def users_text(users: Iterable[tuple[str, int]]) -> str:
    return "".join(f"{name} {uid}\n" for name, uid in users)


def assign_uids(names_and_ids: Sequence[tuple[str, str]], existing: Mapping[str, int]) -> list[tuple[str, int]]:
    """(login name, uid inside the node) for each (name, user URN): a user keeps the uid they had on this
    node; a new one gets a uid derived from the URN, moved on past any uid already taken."""
    taken = {uid for name, uid in existing.items() if name in {n for n, _ in names_and_ids}}
    out = []
    lo, hi = USER_UIDS
    for name, ident in names_and_ids:
        if name in existing:
            out.append((name, existing[name]))
            continue
        uid = lo + int(hashlib.sha256(ident.encode()).hexdigest()[:8], 16) % (hi - lo)
        while uid in taken:
            uid = lo + (uid - lo + 1) % (hi - lo)
        taken.add(uid)
        out.append((name, uid))
    return out


def parse_users(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


# ---- the host side -------------------------------------------------------------------------------------------

def ensure_subids(files: Iterable[Path] = (Path("/etc/subuid"), Path("/etc/subgid"))) -> list[str]:
    """Give root the host ids node ranges come from (newuidmap refuses a map /etc/subuid does not grant);
    returns the files changed."""
    changed = []
    for f in files:
        try:
            text = f.read_text()
        except FileNotFoundError:
            text = ""
        if SUBID_LINE not in text.splitlines():
            with open(f, "a") as out:
                out.write(("" if not text or text.endswith("\n") else "\n") + SUBID_LINE + "\n")
            changed.append(str(f))
    return changed


def lxc_missing() -> list[str]:
    """What container nodes need and this host lacks (scripts/system-deps.sh installs lxc and uidmap)."""
    out = [f"{t} (Debian package lxc)" for t in ("lxc-start", "lxc-attach", "lxc-stop") if shutil.which(t) is None]
    if not LXC_INIT.exists():
        out.append(f"{LXC_INIT} (Debian package lxc)")
    if shutil.which("newuidmap") is None:
        out.append("newuidmap (Debian package uidmap)")
    try:
        if int(Path("/proc/sys/user/max_user_namespaces").read_text()) == 0:
            out.append("user namespaces (user.max_user_namespaces is 0)")
    except (OSError, ValueError):
        pass
    return out


def cgroup_v1() -> bool:
    return (CGROUP_ROOT / "memory" / "memory.limit_in_bytes").exists()


class UidRanges:
    """Host-wide claims on uid ranges, one per slice: `<dir>/<index>` holds its owner. Claims are files made
    with O_EXCL under a lock, so deployments sharing the host never hand one range to two slices."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def claim(self, owner: str) -> int:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            held = self.claims()
            for index, who in held.items():
                if who == owner:
                    return index
            for index in range(UID_RANGES):
                if index in held:
                    continue
                try:
                    fd = os.open(self.root / str(index), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:
                    continue
                with os.fdopen(fd, "w") as f:
                    f.write(owner + "\n")
                return index
        raise ServerError(f"all {UID_RANGES} node uid ranges of this host are held by slices")

    def release(self, owner: str) -> None:
        for index, who in self.claims().items():
            if who == owner:
                (self.root / str(index)).unlink(missing_ok=True)

    def claims(self) -> dict[int, str]:
        out = {}
        if self.root.is_dir():
            for f in self.root.iterdir():
                if f.name.isdigit():
                    try:
                        out[int(f.name)] = f.read_text().strip()
                    except OSError:
                        pass
        return out


class NodeContainer:
    """One node's container under `lxcpath/<name>/`: `config`, `lxc.log`, `fs/` (the node's layer file system,
    mounted from `<layers>/<name>.img`: its upper and work directories), `lower` (a link to the image copy it
    boots), `rootfs/` (the overlay of both, mounted by the host), `layer` (a link to the layer's file, so it is
    found again whatever the configuration says later), `services.pid`; and `<state>/host/<digest>/` (on the
    deployment's tmpfs when the driver mounted it; mounted read-only at /run/slicex)."""

    def __init__(self, lxcpath: Path, name: str, layers: Path | None = None):
        self.lxcpath = Path(lxcpath)
        self.name = name
        self.dir = self.lxcpath / name
        self.fs = self.dir / "fs"
        self.rootfs = self.dir / "rootfs"
        self.host_root = self.lxcpath.parent / "host"
        # named by a digest: the node's mount table shows this name (its path on that tmpfs), not the deployment's
        self.host_dir = self.host_root / hashlib.sha256(name.encode()).hexdigest()[:16]
        self.layer = Path(layers or self.lxcpath.parent / "layers") / f"{name}.img"

    # ---- definition ------------------------------------------------------------------------------------------
    def define(self, hostname: str, lower: Path, base: int, netns: str, limits: NodeLimits,
               mounts: Sequence[tuple[Path, str]] = ()) -> None:
        """Write the node's configuration, layer file system, root overlay and host directory (idempotent: a
        layer that exists is kept, with what the node wrote)."""
        self.lxcpath.mkdir(parents=True, exist_ok=True)
        self.lxcpath.chmod(0o711)
        self.dir.mkdir(exist_ok=True)
        self.dir.chmod(0o711)
        self.mount_layer(limits.disk_gb)
        for d in (self.fs / "upper", self.fs / "work"):
            d.mkdir(exist_ok=True)
            os.chown(d, base, base)
        self.fs.chmod(0o700)
        self.mount_root(lower)
        self.host_root.mkdir(exist_ok=True)
        self.host_root.chmod(0o711)
        init = self.host_root / ".init.lxc"  # the node's mount table names this file by its path on that tmpfs
        if not init.exists():
            tmp = self.host_root / f".init.lxc.{os.getpid()}.tmp"
            shutil.copy2(LXC_INIT, tmp)
            tmp.replace(init)
        self.host_dir.mkdir(exist_ok=True)
        self.host_dir.chmod(0o755)
        (self.host_dir / "keys").mkdir(exist_ok=True)
        (self.host_dir / "keys").chmod(0o755)
        for name, text in (("init", INIT_SCRIPT), ("sync-users", SYNC_USERS_SCRIPT), ("sshd_config", sshd_config()),
                           ("limits", "".join(f"{k}={v}\n" for k, v in limits.to_doc().items()))):
            write_atomic(self.host_dir / name, text)
        if not (self.host_dir / "users").exists():
            write_atomic(self.host_dir / "users", "")
        write_atomic(self.dir / "config", container_config(
            self.name, hostname, self.rootfs, base, f"/run/netns/{netns}", self.host_dir, limits,
            self.dir / "lxc.log", cgroup_v1(), mounts, init))

    def mount_layer(self, size_gb: int) -> None:
        """The node's layer file system made (once, `size_gb`) and mounted at `fs/`. It is made under a
        temporary name and renamed, so a cut leaves no half-made one; the link `layer` is written first, so a
        cut after it still finds the file to remove."""
        self.layer.parent.mkdir(parents=True, exist_ok=True)
        self.layer.parent.chmod(0o700)
        link = self.dir / "layer"
        if not link.is_symlink():
            link.symlink_to(self.layer)
        if not self.layer.exists():
            make_layer(self.layer, size_gb)
        self.fs.mkdir(exist_ok=True)
        if os.path.ismount(self.fs):
            return
        if any(self.fs.iterdir()):  # a node made before nodes had disks: its layer moves onto its disk
            moving = self.dir / ".fs.new"
            if os.path.ismount(moving):
                unmount(moving)  # a move cut before: made again
            moving.mkdir(exist_ok=True)
            self._mount_disk(moving)
            out = subprocess.run(["cp", "-a", f"{self.fs}/.", f"{moving}/"], capture_output=True, text=True,
                                 timeout=3600)
            unmount(moving)
            if out.returncode != 0:
                raise ServerError(f"node {self.name}: moving its layer onto its {size_gb} GB disk failed: "
                                  f"{out.stderr.strip()[-300:]}")
            remove_tree(self.fs)
            remove_tree(moving)
            self.fs.mkdir()
        self._mount_disk(self.fs)

    def _mount_disk(self, point: Path) -> None:
        out = subprocess.run(["mount", "-o", LAYER_MOUNT_OPTIONS, str(self.layer), str(point)],
                             capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise ServerError(f"node {self.name}: mounting its disk failed: {out.stderr.strip()[-300:]}")

    def mount_root(self, lower: Path) -> None:
        """The node's root: an overlay of `lower` (through the link `lower`) and its layer, mounted by the
        host with paths relative to the node's directory (what the node's mount table shows)."""
        link = self.dir / "lower"
        if os.path.ismount(self.rootfs):
            if link.is_symlink() and os.readlink(link) == str(lower):
                return
            unmount(self.rootfs)  # booted from another copy before (a stopped node defined again)
        tmp = self.dir / ".lower.tmp"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(lower)
        tmp.replace(link)
        self.rootfs.mkdir(exist_ok=True)
        out = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", overlay_options(), "rootfs"],
                             cwd=self.dir, capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise ServerError(f"node {self.name}: mounting its root failed: {out.stderr.strip()[-300:]}")

    def lower(self) -> Path | None:
        """The image copy the node's root is made from (None before it is defined)."""
        try:
            return Path(os.readlink(self.dir / "lower"))
        except OSError:
            return None

    def release_layer(self) -> None:
        """Unmount the node's root and layer, detach every loop device of its layer's file and remove the
        file (a stopped node's; nothing of it may remain after a delete, or a crash in the middle of one)."""
        for point in mounts_under(self.dir):
            unmount(point)
        link = self.dir / "layer"
        layer = Path(os.readlink(link)) if link.is_symlink() else self.layer
        for image in dict.fromkeys((layer, self.layer)):
            detach_loops(image)
            image.unlink(missing_ok=True)
            image.with_name(f".{image.name}.tmp").unlink(missing_ok=True)

    def users(self) -> dict[str, int]:
        try:
            return parse_users((self.host_dir / "users").read_text())
        except OSError:
            return {}

    def set_users(self, users: Sequence[tuple[str, int, Sequence[str]]]) -> None:
        """The node's users (name, uid, public keys): keys at once (sshd reads them per login); accounts
        inside a running node are made by its own root (`sync_users`)."""
        keys = self.host_dir / "keys"
        listed = {name for name, _uid, _keys in users}
        for old in keys.iterdir():
            if old.name not in listed:
                old.unlink()
        for name, _uid, ks in users:
            write_atomic(keys / name, "".join(k + "\n" for k in ks))
        write_atomic(self.host_dir / "users", users_text((n, u) for n, u, _k in users))

    def sync_users(self) -> None:
        rc, out = self.attach(["/bin/sh", f"/{MOUNT_POINT}/sync-users"], timeout=20)
        if rc != 0:
            raise ServerError(f"node {self.name}: making its accounts failed ({rc}): {out[-300:].decode(errors='replace')}")

    # ---- lifecycle -------------------------------------------------------------------------------------------
    def start(self, timeout: float = 15.0) -> None:
        if self.running():
            return
        self.remove_cgroups()  # a failed start leaves empty monitor cgroups that block the next one
        out = subprocess.run(["lxc-start", "-P", str(self.lxcpath), "-n", self.name, "-d"], capture_output=True,
                             text=True, timeout=timeout)
        if out.returncode != 0 or not self.running():
            log = _tail(self.dir / "lxc.log", 600)
            raise ServerError(f"node container {self.name} did not start: {out.stderr.strip()[-300:]} {log}")

    def stop(self, timeout: float = 3.0) -> None:
        """Stop every process of the node (asked first, killed after `timeout`); a frozen node is thawed
        first (a frozen process cannot act on a signal, not even SIGKILL)."""
        self.thaw()
        if self.running():
            subprocess.run(["lxc-stop", "-P", str(self.lxcpath), "-n", self.name, "-t", str(int(timeout))],
                           capture_output=True, timeout=timeout + 15)
            if self.running():
                subprocess.run(["lxc-stop", "-P", str(self.lxcpath), "-n", self.name, "-k"], capture_output=True,
                               timeout=15)
        self.kill_all()
        self.remove_cgroups()

    def kill_all(self) -> None:
        """SIGKILL whatever is left in the node's cgroups (lxc-stop's monitor gone after a crash)."""
        for _ in range(50):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)

    def destroy(self) -> None:
        self.stop(timeout=1)
        self.release_layer()
        remove_tree(self.dir)
        remove_tree(self.host_dir)

    def freeze(self) -> bool:
        """Pause every process of a running node (its files stop changing while they are read); whether it
        was frozen."""
        if not self.running():
            return False
        out = subprocess.run(["lxc-freeze", "-P", str(self.lxcpath), "-n", self.name], capture_output=True,
                             timeout=30)
        return out.returncode == 0

    def unfreeze(self) -> None:
        subprocess.run(["lxc-unfreeze", "-P", str(self.lxcpath), "-n", self.name], capture_output=True, timeout=30)

    def frozen(self) -> bool:
        """Whether the node's processes are paused (a freezer cgroup FROZEN or FREEZING; cgroup v2's
        `frozen 1`): a snapshot in progress, or one cut before it could thaw them."""
        v1 = CGROUP_ROOT / "freezer" / "slicex" / self.name / "freezer.state"
        try:
            return v1.read_text().strip() in ("FROZEN", "FREEZING")
        except OSError:
            pass
        events = CGROUP_ROOT / "slicex" / self.name / "cgroup.events"
        try:
            return "frozen 1" in events.read_text().splitlines()
        except OSError:
            return False

    def thaw(self) -> bool:
        """Thaw the node if it is frozen (what a snapshot cut by kill -9 left); whether it was. Written to
        its cgroup directly when lxc-unfreeze cannot (its monitor died with the aggregate)."""
        if not self.frozen():
            return False
        self.unfreeze()
        if self.frozen():
            for f, value in ((CGROUP_ROOT / "freezer" / "slicex" / self.name / "freezer.state", "THAWED"),
                             (CGROUP_ROOT / "slicex" / self.name / "cgroup.freeze", "0")):
                try:
                    f.write_text(value)
                except OSError:
                    pass
        return True

    def note_failure(self, reason: str) -> None:
        """Keep why the node failed to start (Status says it until a start succeeds or the node stops)."""
        write_atomic(self.dir / "start-error", reason)

    def failure(self) -> str:
        try:
            return (self.dir / "start-error").read_text()
        except OSError:
            return ""

    def clear_failure(self) -> None:
        (self.dir / "start-error").unlink(missing_ok=True)

    def running(self) -> bool:
        return bool(self.pids())

    def pids(self) -> list[int]:
        """Every process in the node's (container's) cgroup, nested ones included."""
        base = self._cgroup("pids") or self._cgroup("memory")
        return sorted(cgroup_pids(base)) if base is not None else []

    def process_names(self) -> list[str]:
        out = []
        for pid in self.pids():
            try:
                out.append(Path(f"/proc/{pid}/comm").read_text().strip())
            except OSError:
                pass
        return out

    def usage(self) -> dict[str, int]:
        """What the node uses now: memory (bytes, without the page cache of its files: the kernel drops that
        before it counts against the limit), CPU time (ns), from its cgroups; its disk (bytes used of its
        layer's size)."""
        out = {}
        for key, ctrl, f in (("memory_bytes", "memory", "memory.usage_in_bytes"),
                             ("cpu_ns", "cpuacct", "cpuacct.usage")):
            d = self._cgroup(ctrl)
            try:
                out[key] = int((d / f).read_text()) if d else 0
            except (OSError, ValueError):
                out[key] = 0
        d = self._cgroup("memory")
        try:
            stat = (d / "memory.stat").read_text() if d else ""
        except OSError:
            stat = ""
        out["memory_bytes"] = memory_in_use(out["memory_bytes"], stat)
        if os.path.ismount(self.fs):
            st = os.statvfs(self.fs)
            out["disk_bytes"] = st.f_blocks * st.f_frsize
            out["disk_used_bytes"] = (st.f_blocks - st.f_bfree) * st.f_frsize
        return out

    def summary(self) -> dict[str, object]:
        """What `slicex status` says of a node: its name, whether it runs, its limits and what it uses."""
        limits: dict[str, str] = {}
        hostname = ""
        try:
            limits = dict(line.split("=", 1) for line in (self.host_dir / "limits").read_text().splitlines()
                          if "=" in line)
            hostname = next((line.split("=", 1)[1].strip() for line in (self.dir / "config").read_text().splitlines()
                             if line.startswith("lxc.uts.name")), "")
        except OSError:
            pass
        if "cpus" in limits:  # a node defined before the cpuset was named so
            limits["cpuset"] = limits.pop("cpus")
        return {"name": self.name, "hostname": hostname, "running": self.running(), **limits, **self.usage()}

    def _cgroup(self, controller: str) -> Path | None:
        d = CGROUP_ROOT / controller / "slicex" / self.name
        if (CGROUP_ROOT / controller).is_dir() and (CGROUP_ROOT / controller / "cgroup.procs").exists():
            return d
        if (CGROUP_ROOT / "cgroup.controllers").exists():  # unified hierarchy only
            return CGROUP_ROOT / "slicex" / self.name
        return None

    def cgroup_dirs(self) -> list[Path]:
        """The node's cgroup directories that exist (a stopped node has none)."""
        out = []
        for root in [p for p in CGROUP_ROOT.iterdir() if p.is_dir()] if CGROUP_ROOT.is_dir() else []:
            for top in ("slicex", "slicex-monitor"):
                d = root / top / self.name
                if d.is_dir():
                    out.append(d)
        return out

    def remove_cgroups(self) -> None:
        for d in self.cgroup_dirs():
            for dirpath, _dirs, _files in sorted(os.walk(d), key=lambda w: -len(w[0])):
                try:
                    os.rmdir(dirpath)
                except OSError as exc:
                    if exc.errno not in (errno.ENOENT, errno.EBUSY):
                        raise

    # ---- inside the node -------------------------------------------------------------------------------------
    def _attach_argv(self, argv: Sequence[str]) -> list[str]:
        return ["lxc-attach", "-P", str(self.lxcpath), "-n", self.name, "--clear-env",
                "--set-var", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--set-var", "LANG=C.UTF-8", "--", *argv]

    def attach(self, argv: Sequence[str], timeout: float = 5.0, limit: int = 1 << 20,
               stdin: Path | None = None) -> tuple[int | None, bytes]:
        """Run `argv` inside the node as its root, `stdin` (a host file) as its input; (exit code or None when
        cut, at most `limit` bytes of output). The node's own programs answer: whatever they print or however
        long they take, the aggregate reads no more than `limit` and waits no longer than `timeout`."""
        source = open(stdin, "rb") if stdin is not None else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(self._attach_argv(argv), stdin=source, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            if stdin is not None:
                source.close()
        assert proc.stdout is not None
        chunks: list[bytes] = []
        size = 0
        deadline = time.monotonic() + timeout
        cut = False
        fd = proc.stdout.fileno()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                cut = True
                break
            ready, _w, _x = select.select([fd], [], [], min(left, 0.5))
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            data = os.read(fd, 65536)
            if not data:
                break
            chunks.append(data)
            size += len(data)
            if size > limit:
                cut = True
                break
        if cut:
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
        proc.stdout.close()
        try:
            rc = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        return (None if cut else rc), b"".join(chunks)[:limit]

    def spawn(self, argv: Sequence[str], pid_file: Path, log: Path) -> subprocess.Popen:
        """Start `argv` inside the node in the background (it outlives the aggregate); its host pid (the
        lxc-attach that waits for it) goes to `pid_file`."""
        with open(log, "ab") as err:
            proc = subprocess.Popen(self._attach_argv(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=err, start_new_session=True)
        pid_file.write_text(f"{proc.pid}\n")
        return proc


def cgroup_pids(d: Path) -> set[int]:
    """Every process in cgroup directory `d` and the cgroups below it (none when it does not exist)."""
    out: set[int] = set()
    for dirpath, _dirs, _files in os.walk(d):
        try:
            out |= {int(x) for x in Path(dirpath, "cgroup.procs").read_text().split()}
        except (OSError, ValueError):
            pass
    return out


def memory_in_use(usage: int, stat: str) -> int:
    """A cgroup's memory use without its reclaimable page cache: `usage` (memory.usage_in_bytes) less the
    file pages on its LRU lists (cgroup v1 memory.stat `total_active_file` + `total_inactive_file`, or v2's
    `active_file` + `inactive_file`). Not `cache`: that holds tmpfs and shared memory too, which stay until
    removed."""
    fields = dict(line.split(None, 1) for line in stat.splitlines() if " " in line)

    def get(*names: str) -> int:
        for n in names:
            if n in fields and fields[n].strip().isdigit():
                return int(fields[n])
        return 0

    files = get("total_active_file", "active_file") + get("total_inactive_file", "inactive_file")
    return max(0, usage - files)


def make_layer(image: Path, size_gb: int) -> None:
    """A sparse file of `size_gb` with an empty ext4 file system, host root's alone, made under a temporary name
    and renamed into place."""
    tmp = image.with_name(f".{image.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.truncate(size_gb * 2**30)
    out = subprocess.run([*MKFS_LAYER, str(tmp)], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise ServerError(f"making a node disk of {size_gb} GB failed: {out.stderr.strip()[-300:]}")
    tmp.replace(image)


def mounts_under(root: Path) -> list[Path]:
    """The host's mount points at or below `root`, deepest (and latest) first."""
    root_s = str(root)
    out = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        parts = line.split()
        if len(parts) > 4:
            point = parts[4].encode().decode("unicode_escape")  # \040 for a space, as the kernel writes it
            if point == root_s or point.startswith(root_s + "/"):
                out.append(Path(point))
    return list(reversed(sorted(out, key=lambda p: len(p.parts))))


def unmount(point: Path) -> None:
    """Unmount `point` (detached lazily if something still holds it, so the name is free at once)."""
    if subprocess.run(["umount", str(point)], capture_output=True, timeout=60).returncode != 0:
        subprocess.run(["umount", "-l", str(point)], capture_output=True, timeout=60)


def loop_devices(backing: Path) -> list[str]:
    """The loop devices whose backing file is `backing`, or a file under it when it is a directory (a file
    deleted while attached is still found: losetup lists it with " (deleted)")."""
    out = subprocess.run(["losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE"], capture_output=True,
                         text=True, timeout=30)
    found = []
    b = str(backing)
    for line in out.stdout.splitlines():
        name, _, back = line.strip().partition(" ")
        back = back.strip().removesuffix(" (deleted)")
        if back == b or back.startswith(b + "/"):
            found.append(name)
    return found


def detach_loops(backing: Path) -> None:
    for dev in loop_devices(backing):
        subprocess.run(["losetup", "-d", dev], capture_output=True, timeout=30)


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Write by rename in a directory only the host writes (never follows a link someone else planted)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # writers may race
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    tmp.replace(path)


def _tail(path: Path, n: int) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    errors = [line for line in text.splitlines() if " ERROR " in line]
    return (" | ".join(errors[-3:]) or text[-n:]).strip()
