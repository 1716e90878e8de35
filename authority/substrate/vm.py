"""VM nodes: a `qemu-vm` node of the netns substrate is a QEMU process with its own kernel.

What a VM node gets (docs/substrate-netns.md, "VM nodes"):
- the node's network namespace, as a container node does: each interface's veth pair, address plan, token
  buckets and switch port are the same; inside the namespace a tap device per interface is joined to the
  veth's inner end by two tc `mirred` redirects (no Linux bridge needed), so the guest's NIC, with the
  manifest's MAC, is where a container's interface is. The namespace's end holds no address: the guest does.
- a management NIC of QEMU's user-mode network, `restrict=on` (the guest reaches nothing through it), whose
  only use is forwarding 127.0.0.1:22 (and the node's public ports) of the node's namespace into the guest:
  the login relay and public-port relays connect there exactly as they do for a container.
- its disk: a qcow2 overlay of the sliver type's disk size over the image's VM form (vm_image.py), in the
  layers directory like a container's disk; its seed: a tar archive on a second disk, written at each start
  (host name, addresses, users and keys, sshd's configuration, the init script).
- an unprivileged QEMU: it runs as the slice's host uid (the root of the slice's range), with no
  capabilities, `-sandbox on`, in the node's cgroups (the sliver type's CPU quota and cpuset, its memory
  plus QEMU's own overhead, pids); it opens no host path: the root shell that starts it opens the base,
  overlay, seed, kernel and initramfs, and QEMU gets them as descriptors (`-add-fd`, /proc/self/fd).
- KVM where a probe boot shows it works (`probe_accel`), TCG otherwise.

Stop kills QEMU (the guest's disk keeps what it wrote); restart is a stop and a start. The pure part
(`qemu_argv`, `seed_tar`, `VM_INIT`) is data in, data out; `NodeVM` touches the host."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import tarfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from authority.substrate.container import (
    CGROUP_ROOT,
    MOUNT_POINT,
    SYNC_USERS_SCRIPT,
    NodeContainer,
    NodeLimits,
    sshd_config,
    write_atomic,
)
from authority.substrate.vm_image import raw_size
from slicex.errors import ServerError, Unsupported

MGMT_MAC = "02:00:00:00:00:01"  # the management NIC (QEMU's user-mode network, restricted)
GUEST_MGMT = "10.0.2.15/24"  # QEMU's user-mode network's guest address
OVERHEAD_MB = 192  # QEMU's own memory over the guest's: its code, TCG's translation cache, device buffers
TB_SIZE_MB = 64  # TCG's translation cache (QEMU's default, 1 GiB, would be charged to the node)
PROBE_FILE = Path("/run/slicex-qemu-accel.json")  # the probe's answer, per host boot
CONSOLE_TAIL = 16384  # what the console option shows of a node's console log
QEMU = "qemu-system-x86_64"

VM_INIT = f"""#!/bin/sh
# slicex qemu-vm node init (PID 1): host name, the file system grown to the disk, interfaces by MAC, accounts,
# ssh host key, then sshd in the foreground (it reaps what is left to it). Few processes: under TCG each costs.
D=/{MOUNT_POINT}
mkdir -p /dev/pts /dev/shm
mount -t devpts -o gid=5,mode=620 devpts /dev/pts
mount -t tmpfs -o nosuid,nodev tmpfs /dev/shm
mount -t tmpfs -o nosuid,nodev tmpfs /tmp
# geni_stop and geni_restart end QEMU as a power cut would: what the guest writes reaches its disk within ~1 s
mount -o remount,commit=1 /
echo 100 > /proc/sys/vm/dirty_expire_centisecs
echo 50 > /proc/sys/vm/dirty_writeback_centisecs
read -r h < $D/hostname
hostname "$h"
echo "$h" > /etc/hostname
grep -q " $h\\$" /etc/hosts 2>/dev/null || echo "127.0.1.1 $h" >> /etc/hosts
resize2fs /dev/vda >/dev/null 2>&1 &
ip link set lo up
modprobe virtio_net
count=0
while read -r mac addr; do count=$((count+1)); done < $D/interfaces
n=0
while [ ! -e /sys/class/net/eth$((count-1)) ] && [ $n -lt 200 ]; do sleep 0.05; n=$((n+1)); done
for d in /sys/class/net/eth*; do
  read -r m < $d/address
  while read -r mac addr; do
    [ "$m" = "$mac" ] || continue
    [ "$addr" = "-" ] || ip addr add "$addr" dev "${{d##*/}}"
    ip link set "${{d##*/}}" up
  done < $D/interfaces
done
mkdir -p /run/sshd && chmod 755 /run/sshd
[ -s /etc/ssh/ssh_host_ed25519_key ] || ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key
/bin/sh $D/sync-users
read -r up _rest < /proc/uptime
echo "slicex: $h ready after $up s"
exec /usr/sbin/sshd -D -f $D/sshd_config -E /var/log/sshd.log
"""

# the root shell that starts QEMU: into the node's cgroups, the files opened as root, then QEMU in the node's
# namespace as the slice's uid without capabilities ("$@": cgroup task files, "--", QEMU's command line); its
# console through `dd` (byte by byte: written as it comes; `head` holds it back until its buffer fills), so a
# guest writing to it without end fills no more than SX_CONSOLE_MAX bytes of the host's disk (dd's CPU is the
# node's: it runs in the node's cgroups)
LAUNCH = """while [ "$1" != "--" ]; do echo $$ > "$1" || exit 70; shift; done; shift
exec 3<"$SX_BASE" 4<>"$SX_TOP" 5<"$SX_SEED" 6<"$SX_KERNEL" 7<"$SX_INITRD" || exit 71
nsenter --net="/run/netns/$SX_NETNS" setpriv --reuid="$SX_UID" --regid="$SX_UID" --clear-groups \
  --inh-caps=-all --bounding-set=-all --no-new-privs "$@" 2>&1 | dd bs=1 count="$SX_CONSOLE_MAX" status=none 3<&- 4<&- 5<&- 6<&- 7<&-
"""
CONSOLE_MAX = 4 * 2**20  # what a node's console log may hold (from its start: the boot and init messages first)


# ---- the pure part -------------------------------------------------------------------------------------------

def tap_name(ns_if: str) -> str:
    """The tap device of a VM node's interface, in its namespace (beside the veth end `ns_if`)."""
    return ns_if[:-1] + "v"


def qemu_argv(name: str, accel: str, limits: NodeLimits, cmdline: str, nics: Sequence[tuple[str, str]],
              forwards: Sequence[int]) -> list[str]:
    """QEMU's command line for a node: `nics` (tap, MAC) per interface, `forwards` the guest ports reachable at
    127.0.0.1 of the node's namespace (22 and its public ports). Files come as descriptors 3-7 (LAUNCH)."""
    cpu = ["-accel", "kvm", "-cpu", "host"] if accel == "kvm" else ["-accel", f"tcg,tb-size={TB_SIZE_MB}"]
    fwd = ",".join(f"hostfwd=tcp:127.0.0.1:{p}-:{p}" for p in dict.fromkeys(forwards))
    argv = [QEMU, "-name", name, *cpu, "-m", str(limits.memory_mb), "-smp", str(max(1, int(-(-limits.cores // 1)))),
            "-nodefaults", "-no-user-config", "-display", "none", "-serial", "stdio", "-no-reboot",
            "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
            "-kernel", "/proc/self/fd/6", "-initrd", "/proc/self/fd/7", "-append", cmdline,
            "-add-fd", "fd=3,set=1", "-add-fd", "fd=4,set=2", "-add-fd", "fd=5,set=3",
            "-blockdev", "driver=file,node-name=basef,filename=/dev/fdset/1,read-only=on",
            "-blockdev", "driver=qcow2,node-name=base,file=basef,read-only=on",
            "-blockdev", "driver=file,node-name=topf,filename=/dev/fdset/2",
            "-blockdev", "driver=qcow2,node-name=top,file=topf,backing=base",
            "-device", "virtio-blk-pci,drive=top",
            "-blockdev", "driver=file,node-name=seed,filename=/dev/fdset/3,read-only=on",
            "-device", "virtio-blk-pci,drive=seed",
            "-netdev", f"user,id=mgmt,restrict=on{',' + fwd if fwd else ''}",
            "-device", f"virtio-net-pci,netdev=mgmt,mac={MGMT_MAC}"]
    for k, (tap, mac) in enumerate(nics):
        # checksums computed by the guest: the userspace switch passes partial checksums on as bad ones
        argv += ["-netdev", f"tap,id=d{k},ifname={tap},script=no,downscript=no,vhost=off",
                 "-device", f"virtio-net-pci,netdev=d{k},mac={mac},csum=off,gso=off,guest_csum=off,guest_tso4=off,"
                            f"guest_tso6=off,guest_ecn=off,guest_ufo=off"]
    return argv


def seed_tar(hostname: str, interfaces: Sequence[tuple[str, str]], users: str, keys: dict[str, str]) -> bytes:
    """The node's seed: what the guest's init unpacks into /run/slicex (`interfaces`: MAC, address or "")."""
    files = {"hostname": hostname + "\n", "vm-init": VM_INIT, "sync-users": SYNC_USERS_SCRIPT,
             "sshd_config": sshd_config(), "users": users,
             "interfaces": "".join(f"{mac} {addr or '-'}\n" for mac, addr in ((MGMT_MAC, GUEST_MGMT), *interfaces))}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        def add(name: str, data: bytes, mode: int = 0o644, kind: bytes = tarfile.REGTYPE) -> None:
            info = tarfile.TarInfo(name)
            info.mode, info.type, info.size = mode, kind, len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)

        add("keys", b"", 0o755, tarfile.DIRTYPE)
        for name, text in files.items():
            add(name, text.encode())
        for user, text in sorted(keys.items()):
            add(f"keys/{user}", text.encode())
    return buf.getvalue()


def kernel_args(cmdline: str, accel: str) -> str:
    """The guest kernel's command line: the VM form's, and under TCG without the CPU-vulnerability mitigations
    (page-table isolation flushes the emulated TLB at every system call, the costliest thing TCG does; they
    guard the guest's processes from each other only: the guest is the experimenter's)."""
    return f"{cmdline} mitigations=off" if accel == "tcg" else cmdline


def accel_of(probe: dict) -> str:
    return "kvm" if probe.get("kvm") else "tcg"


# ---- the host side -------------------------------------------------------------------------------------------

def cached_probe(cache: Path = PROBE_FILE) -> dict | None:
    """The answer of this host boot's probe (`probe_accel`), if one ran."""
    try:
        return json.loads(cache.read_text())
    except (OSError, ValueError):
        return None


def probe_accel(form: dict | None, cache: Path = PROBE_FILE, timeout: float = 10.0) -> dict:
    """Whether KVM boots a guest here: a boot of the VM form's kernel with KVM (no root disk: it must reach its
    root-mount panic within `timeout`). /dev/kvm accepting KVM_CREATE_VM is not enough (nested hosts where
    guests abort or stall); the answer is kept in `cache` for the host's boot. {"kvm": bool, "why": str}."""
    cached = cached_probe(cache)
    if cached is not None:
        return cached
    if form is None or not os.path.exists("/dev/kvm"):
        return {"kvm": False, "why": "no /dev/kvm" if form is not None else "no VM image to probe with"}
    argv = [QEMU, "-accel", "kvm", "-cpu", "host", "-m", "128", "-nodefaults", "-no-user-config", "-display",
            "none", "-serial", "stdio", "-no-reboot", "-kernel", form["vmlinuz"], "-append",
            "console=ttyS0 panic=-1 root=/dev/null"]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        text = out.stdout + out.stderr
        ok = "Kernel panic" in text or "VFS:" in text
        why = "a KVM guest booted its kernel" if ok else f"a KVM guest did not boot: {text.strip()[-160:]}"
    except subprocess.TimeoutExpired:
        ok, why = False, f"a KVM guest did not reach its kernel's root mount within {timeout:.0f} s"
    answer = {"kvm": ok, "why": why}
    try:
        write_atomic(cache, json.dumps(answer) + "\n")
    except OSError:
        pass
    return answer


def machine_at(lxcpath: Path, name: str, layers: Path | None = None) -> NodeContainer:
    """The machine whose directory is `lxcpath/<name>`: a VM's holds vm.json, else it is a container."""
    kind = NodeVM if (Path(lxcpath) / name / "vm.json").exists() else NodeContainer
    return kind(lxcpath, name, layers)


class NodeVM(NodeContainer):
    """One VM node under `lxcpath/<name>/`: `vm.json` (what it boots with: base disk, kernel, initramfs, its
    uid, namespace, host name, interfaces and forwards), `seed.tar`, `console.log`, `qemu.pid`, `start-error`;
    its overlay disk is `<layers>/<name>.img` (as a container's disk is), its users and keys in the same host
    directory a container's are."""

    @property
    def meta_file(self) -> Path:
        return self.dir / "vm.json"

    @property
    def console_log(self) -> Path:
        return self.dir / "console.log"

    def meta(self) -> dict:
        try:
            return json.loads(self.meta_file.read_text())
        except (OSError, ValueError):
            return {}

    def define_vm(self, hostname: str, form: dict, base: Path, uid: int, netns: str, limits: NodeLimits,
                  interfaces: Sequence[tuple[str, str, str]], forwards: Sequence[int], accel: str) -> None:
        """Write what the node boots with and make its overlay disk (once: a disk that exists keeps what the
        guest wrote). `base`: the VM form's disk the node's overlay is over (a deployment's pinned link);
        `interfaces`: (tap, MAC, address)."""
        self.lxcpath.mkdir(parents=True, exist_ok=True)
        self.lxcpath.chmod(0o711)
        self.dir.mkdir(exist_ok=True)
        self.dir.chmod(0o700)
        self.layer.parent.mkdir(parents=True, exist_ok=True)
        self.layer.parent.chmod(0o700)
        link = self.dir / "layer"
        if not link.is_symlink():
            link.symlink_to(self.layer)
        if not self.layer.exists():
            tmp = self.layer.with_name(f".{self.layer.name}.tmp")
            out = subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(base),
                                  str(tmp), f"{limits.disk_gb}G"], capture_output=True, text=True, timeout=60)
            if out.returncode != 0:
                raise ServerError(f"node {self.name}: making its disk failed: {out.stderr.strip()[-300:]}")
            tmp.rename(self.layer)
        lower = self.dir / "lower"
        if not lower.is_symlink() or os.readlink(lower) != str(base):
            tmp_link = self.dir / ".lower.tmp"
            tmp_link.unlink(missing_ok=True)
            tmp_link.symlink_to(base)
            tmp_link.replace(lower)
        self.host_dir.parent.mkdir(parents=True, exist_ok=True)
        self.host_dir.mkdir(exist_ok=True)
        self.host_dir.chmod(0o700)
        (self.host_dir / "keys").mkdir(exist_ok=True)
        if not (self.host_dir / "users").exists():
            write_atomic(self.host_dir / "users", "")
        write_atomic(self.host_dir / "limits", "".join(f"{k}={v}\n" for k, v in limits.to_doc().items()))
        meta = {"hostname": hostname, "kernel": form["vmlinuz"], "initrd": form["initrd"], "cmdline": form["cmdline"],
                "kernel_version": form.get("kernel", ""), "uid": uid, "netns": netns, "accel": accel,
                "limits": limits.to_doc(), "interfaces": [list(i) for i in interfaces],
                "forwards": sorted(set(forwards))}
        write_atomic(self.meta_file, json.dumps(meta, indent=1) + "\n", mode=0o600)

    def sync_users(self) -> None:
        """A running guest's accounts follow its seed at its next boot (no channel into a running guest yet)."""

    def start(self, timeout: float = 15.0) -> None:
        """Start QEMU (detached: it outlives the aggregate) in the node's cgroups, after writing the seed."""
        if self.running():
            return
        meta = self.meta()
        if not meta:
            raise ServerError(f"VM node {self.name} is not defined on this host")
        self.remove_cgroups()
        (self.dir / "ready").unlink(missing_ok=True)
        tasks = self._make_cgroups(NodeLimits(**{k: meta["limits"][k] for k in
                                                ("cores", "memory_mb", "cpuset", "pids", "disk_gb")}))
        keys = {}
        for f in sorted((self.host_dir / "keys").iterdir()):
            keys[f.name] = f.read_text()
        seed = self.dir / "seed.tar"
        seed.write_bytes(seed_tar(meta["hostname"], [(mac, addr) for _tap, mac, addr in meta["interfaces"]],
                                  (self.host_dir / "users").read_text(), keys))
        limits = NodeLimits(**meta["limits"])
        argv = qemu_argv(self.name, meta["accel"], limits, kernel_args(meta["cmdline"], meta["accel"]),
                         [(tap, mac) for tap, mac, _a in meta["interfaces"]], meta["forwards"])
        lower = self.dir / "lower"
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SX_BASE": str(lower), "SX_TOP": str(self.layer),
               "SX_SEED": str(seed), "SX_KERNEL": meta["kernel"], "SX_INITRD": meta["initrd"],
               "SX_NETNS": meta["netns"], "SX_UID": str(meta["uid"]), "SX_CONSOLE_MAX": str(CONSOLE_MAX)}
        with open(self.console_log, "wb") as console:
            proc = subprocess.Popen(["sh", "-c", LAUNCH, "sh", *map(str, tasks), "--", *argv], env=env,
                                    stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        write_atomic(self.dir / "qemu.pid", f"{proc.pid}\n")
        write_atomic(self.dir / "started", f"{time.time():.3f}\n")
        time.sleep(0.3)
        if proc.poll() is not None:
            raise ServerError(f"VM node {self.name}: QEMU exited at once ({proc.returncode}): "
                              f"{self.console(600)}")

    def _make_cgroups(self, limits: NodeLimits) -> list[Path]:
        """The node's cgroups with the sliver type's limits (memory: the guest's and QEMU's overhead); the
        task files QEMU's launcher joins."""
        tasks = []
        v1 = (CGROUP_ROOT / "memory" / "cgroup.procs").exists()
        if not v1:
            d = CGROUP_ROOT / "slicex" / self.name
            d.mkdir(parents=True, exist_ok=True)
            for f, v in (("cpu.max", f"{limits.cfs_quota_us} 100000"), ("cpuset.cpus", limits.cpuset),
                         ("memory.max", f"{(limits.memory_mb + OVERHEAD_MB) * 2**20}"), ("pids.max", str(limits.pids))):
                if (d / f).exists():
                    (d / f).write_text(v)
            return [d / "cgroup.procs"]
        for ctrl in ("cpu", "cpuacct", "cpuset", "memory", "pids", "freezer"):
            root = CGROUP_ROOT / ctrl
            if not (root / "cgroup.procs").exists():
                continue
            top = root / "slicex"
            top.mkdir(exist_ok=True)
            d = top / self.name
            d.mkdir(exist_ok=True)
            if ctrl == "cpuset":
                for f in ("cpuset.cpus", "cpuset.mems"):
                    if not (top / f).read_text().strip():
                        (top / f).write_text((root / f).read_text().strip())
                (d / "cpuset.mems").write_text((top / "cpuset.mems").read_text().strip())
                (d / "cpuset.cpus").write_text(limits.cpuset)
            elif ctrl == "cpu":
                (d / "cpu.cfs_period_us").write_text("100000")
                (d / "cpu.cfs_quota_us").write_text(str(limits.cfs_quota_us))
            elif ctrl == "memory":
                (d / "memory.limit_in_bytes").write_text(str((limits.memory_mb + OVERHEAD_MB) * 2**20))
            elif ctrl == "pids":
                (d / "pids.max").write_text(str(limits.pids))
            tasks.append(d / "cgroup.procs")
        return tasks

    def stop(self, timeout: float = 3.0) -> None:
        """QEMU is told to quit (SIGTERM: its disk is flushed), killed after `timeout`; the cgroups go."""
        self.thaw()
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.kill_all()
        self.remove_cgroups()
        (self.dir / "qemu.pid").unlink(missing_ok=True)

    def boot_state(self, netns_exec: Callable[[list[str]], subprocess.CompletedProcess],
                   timeout: float) -> str:
        """"ready" once the guest's sshd has answered with its banner at 127.0.0.1:22 of the node's namespace
        (QEMU accepts there at once and closes when nothing listens in the guest; `netns_exec(argv)` runs in
        the namespace), kept in the node's directory until its next start; "booting" before; why it failed
        once `timeout` seconds have passed since the start without an answer."""
        if (self.dir / "ready").exists():
            return "ready"
        probe = ["timeout", "3", "bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/22 && head -c 8 <&3"]
        if netns_exec(probe).stdout.startswith("SSH-"):
            write_atomic(self.dir / "ready", "")
            return "ready"
        try:
            since = time.time() - float((self.dir / "started").read_text())
        except (OSError, ValueError):
            since = 0.0
        if since > timeout:
            return (f"its VM's sshd did not answer within {timeout:.0f} s of its start (its console, Describe "
                    f"option slicex_console, ends: {self.console(300)[-300:]!r})")
        return "booting"

    def console(self, limit: int = CONSOLE_TAIL) -> str:
        """The end of the node's console log (the guest's kernel and init messages since its last start)."""
        try:
            with open(self.console_log, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - limit))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def usage(self) -> dict[str, int]:
        out = super().usage()
        try:
            st = self.layer.stat()
            out["disk_bytes"] = raw_size(self.layer)
            out["disk_used_bytes"] = st.st_blocks * 512
        except OSError:
            pass
        return out

    def summary(self) -> dict[str, object]:
        meta = self.meta()
        return {**super().summary(), "hostname": meta.get("hostname", ""), "machine": "qemu",
                "accel": meta.get("accel", "")}

    def attach(self, argv: Sequence[str], timeout: float = 5.0, limit: int = 1 << 20,
               stdin: Path | None = None) -> tuple[int | None, bytes]:
        raise Unsupported(f"node {self.name} is a VM: the aggregate runs nothing inside it (execute and install "
                          f"services are container nodes' for now)")

    def freeze(self) -> bool:
        raise Unsupported(f"node {self.name} is a VM: CreateImage of a qemu-vm node is not built yet")
