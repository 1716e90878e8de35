"""The VM form of a catalogue image: what a `qemu-vm` node boots (netns substrate, authority/substrate/vm.py).

Made from the same debootstrap tree as the container form (images.py), beside it in the image's directory:

    <dir>/<name>/vm/disk.qcow2   the tree plus Debian's cloud kernel's modules and `kmod` (so `modprobe` works
                                 inside), as an ext4 file system in a qcow2 base (nodes boot copy-on-write
                                 overlays of it; the guest grows its file system to its disk's size at boot)
    <dir>/<name>/vm/vmlinuz      Debian's `linux-image-cloud-amd64` kernel (booted directly by QEMU)
    <dir>/<name>/vm/initrd       a small initramfs: busybox (Debian's busybox-static), the virtio modules the
                                 root disk needs (the cloud kernel has them as modules), mount, switch_root
    <dir>/<name>/vm/vm.json      kernel version, the image build it was made from, sizes

Everything comes from Debian's packages through the host's apt (`apt-get download`, `dpkg-deb -x`): the host's
apt must offer the kernel for the image's architecture (a Debian 12 host does). The guest boots no init system:
`/sbin/slicex-init` mounts the kernel file systems, unpacks the node's seed (a tar archive on its second disk,
written by the host at each start: host name, addresses, users, keys, sshd configuration and the node's init
script) into /run/slicex and runs it, so under TCG a node is ready seconds after its kernel is. With no seed
(a server OpenStack booted: scripts/openstack-aio/guest_image.py puts the form in Glance) it runs
`/sbin/slicex-config-drive`, which reads Nova's config drive instead.

The form is built in `<dir>/.build-<name>-vm<id>/` and renamed into place, so a cut build leaves none (the
catalogue's `recover` removes the directory)."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from slicex.errors import ServerError

KERNEL_META = "linux-image-cloud-amd64"
EXTRA_DEBS = ("kmod", "libkmod2")  # modprobe inside the guest
INITRD_DEB = "busybox-static"
# what the root disk needs before the root is mounted (the cloud kernel builds them as modules)
ROOT_MODULES = ("virtio_pci", "virtio_blk")
VM_DIR = "vm"
SLACK = 1.25  # the base file system's size over its files (the guest grows it to its disk at boot)
ProgressFn = Callable[[str], None]

INITRD_INIT = """#!/bin/busybox sh
# slicex initramfs: the virtio modules of the root disk, then the root file system's /sbin/slicex-init
/bin/busybox mkdir -p /proc /sys /dev /root
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t devtmpfs dev /dev
for m in $(/bin/busybox cat /modules.order); do /bin/busybox insmod "/modules/$m"; done
n=0
while [ ! -b /dev/vda ] && [ $n -lt 100 ]; do /bin/busybox sleep 0.05; n=$((n+1)); done
/bin/busybox mount -t ext4 -o rw /dev/vda /root || { echo "slicex: cannot mount /dev/vda"; exec /bin/busybox sh; }
/bin/busybox umount /proc
/bin/busybox mount --move /dev /root/dev
exec /bin/busybox switch_root /root /sbin/slicex-init
"""

# in the image: PID 1 until the seed's init replaces it
GUEST_INIT = """#!/bin/sh
# slicex VM init: kernel file systems, the node's seed (its second disk, a tar archive) into /run/slicex, then
# the seed's init (which ends as the node's sshd)
mount -t proc proc /proc
mount -t sysfs sys /sys
mountpoint -q /dev || mount -t devtmpfs dev /dev
mount -t tmpfs -o mode=755,nosuid,nodev run /run
mkdir -p /run/slicex
tar -xf /dev/vdb -C /run/slicex 2>/dev/null || echo "slicex: no seed on /dev/vdb"
[ -f /run/slicex/vm-init ] && exec /bin/sh /run/slicex/vm-init
# no slicex seed: booted by a cloud (OpenStack's config drive)
[ -x /sbin/slicex-config-drive ] && exec /sbin/slicex-config-drive
echo "slicex: the seed has no vm-init"
exec /bin/sh
"""

# in the image: the guest's init when a cloud booted it (authority/substrate/openstack.py's servers): Nova's config
# drive (label config-2; vfat or iso9660) gives the host name, the addresses (network_data.json: no DHCP needed)
# and root's keys; then, so a test can see the VLAN carry traffic, the guest answers broadcast pings, asks its
# links' broadcast addresses who is there and pings each neighbour, saying so on the console; then sshd.
# Reading Nova's config drive with sed alone (the image has no JSON tool): Nova writes each file on one line, its
# objects flat but for `links`/`networks`/`services` lists and `meta`/`public_keys` maps. Unit-tested on Nova's
# own output (tests/unit/test_vm_image.py).
CONFIG_DRIVE_PARSE = r"""
# cd_field NAME OBJECT: the string value of NAME in a flat JSON object
cd_field() { echo "$2" | sed -n "s/.*\"$1\": *\"\([^\"]*\)\".*/\1/p"; }
# cd_networks network_data.json: "LINK ADDRESS NETMASK MAC" for each network with a fixed address
cd_networks() {
  objs=$(tr '{}' '\n\n' < "$1")
  echo "$objs" | grep '"ip_address"' | while read -r line; do
    link=$(cd_field link "$line")
    mac=$(echo "$objs" | grep "\"id\": \"$link\"" | head -1)
    echo "$link $(cd_field ip_address "$line") $(cd_field netmask "$line") $(cd_field ethernet_mac_address "$mac")"
  done
}
# cd_hostname meta_data.json: the short host name
cd_hostname() { cd_field hostname "$(cat "$1")" | cut -d. -f1; }
# cd_keys meta_data.json: the public keys, one a line
cd_keys() { tr ',{}' '\n\n\n' < "$1" | sed -n 's/^ *"[^"]*": *"\(ssh-[^"]*\)".*/\1/p' | sort -u; }
"""

CONFIG_DRIVE_INIT = r"""#!/bin/sh
# slicex VM init on a cloud: Nova's config drive (network_data.json, meta_data.json), then sshd
say() { echo "slicex: $*" > /dev/console; }
""" + CONFIG_DRIVE_PARSE + r"""
for m in virtio_net ata_piix sr_mod isofs vfat nls_cp437 nls_iso8859_1; do modprobe -q $m; done
ip link set lo up
cd=/run/slicex/config-drive
mkdir -p $cd
n=0
until dev=$(blkid -L config-2) || [ $n -ge 50 ]; do sleep 0.1; n=$((n+1)); done
if [ -z "$dev" ] || ! mount -o ro "$dev" $cd; then say "no seed and no config drive (label config-2)"; exec /bin/sh; fi
meta=$cd/openstack/latest/meta_data.json
host=$(cd_hostname $meta)
[ -n "$host" ] && hostname "$host" && echo "$host" > /etc/hostname
brds=""
cd_networks $cd/openstack/latest/network_data.json > /run/slicex/networks
while read -r link addr mask mac; do
  dev=""
  for d in /sys/class/net/*; do [ "$(cat $d/address)" = "$mac" ] && dev=${d##*/}; done
  if [ -z "$dev" ]; then say "no interface has MAC $mac (link $link)"; continue; fi
  ip link set "$dev" up
  ip addr add "$addr/$mask" brd + dev "$dev" && say "$dev $mac $addr/$mask"
  brds="$brds $(ip -4 -o addr show dev "$dev" | sed -n 's/.* brd \([0-9.]*\).*/\1/p')"
done < /run/slicex/networks
mkdir -p /root/.ssh && chmod 700 /root/.ssh
cd_keys $meta > /root/.ssh/authorized_keys
umount $cd
sysctl -q -w net.ipv4.icmp_echo_ignore_broadcasts=0
(
  own=" $(ip -4 -o addr show | sed -n 's/.* inet \([0-9.]*\)\/.*/\1/p' | tr '\n' ' ')"
  t=0
  while [ $t -lt 60 ]; do
    found=""
    for b in $brds; do
      for peer in $(ping -b -c 2 -W 2 "$b" 2>/dev/null | sed -n 's/^[0-9]* bytes from \([0-9.]*\):.*/\1/p' | sort -u); do
        case "$own" in *" $peer "*) continue ;; esac
        found=1
        say "ping $peer: $(ping -c 3 -W 2 "$peer" | grep 'packets transmitted')"
      done
    done
    [ -n "$found" ] && break
    sleep 3; t=$((t+1))
  done
  [ -n "$found" ] || say "no neighbour answered a ping on$brds"
) &
ssh-keygen -A > /dev/null 2>&1
mkdir -p /run/sshd
say "ready"
exec /usr/sbin/sshd -D -e
"""


# ---- the pure part -------------------------------------------------------------------------------------------

def kernel_package(depends: str) -> str | None:
    """The versioned kernel package `apt-cache depends linux-image-cloud-amd64` names."""
    m = re.search(r"Depends:\s*(linux-image-\d\S*-cloud-amd64)\b", depends)
    return m.group(1) if m else None


def module_closure(modules_dep: str, wanted: Iterable[str]) -> list[str]:
    """The module files (paths relative to the modules directory) that load `wanted` (names without .ko), each
    after what it needs: depmod's modules.dep lists a module's dependencies, the last to load first."""
    deps: dict[str, list[str]] = {}
    for line in modules_dep.splitlines():
        if ":" in line:
            mod, _, rest = line.partition(":")
            deps[mod.strip()] = rest.split()
    by_name = {Path(m).name.split(".ko", 1)[0].replace("-", "_"): m for m in deps}
    order: list[str] = []

    def add(path: str) -> None:
        if path in order:
            return
        for d in reversed(deps.get(path, [])):
            add(d)
        order.append(path)

    for name in wanted:
        path = by_name.get(name.replace("-", "_"))
        if path is None:
            raise ServerError(f"the VM kernel has no module {name} (its modules.dep does not list it)")
        add(path)
    return order


def cpio_newc(entries: Sequence[tuple[str, int, bytes]]) -> bytes:
    """An uncompressed `newc` cpio archive (what the kernel unpacks as an initramfs) of (path, mode, data):
    directories (mode S_IFDIR) carry no data; owners are root."""
    out = bytearray()

    def entry(name: str, mode: int, data: bytes, ino: int) -> None:
        nb = name.encode() + b"\0"
        head = "070701" + "".join(f"{v:08x}" for v in (
            ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(nb), 0))
        out.extend(head.encode() + nb)
        out.extend(b"\0" * (-len(out) % 4))
        out.extend(data)
        out.extend(b"\0" * (-len(out) % 4))

    for n, (name, mode, data) in enumerate(entries, start=1):
        entry(name, mode, data, n)
    entry("TRAILER!!!", 0, b"", 0)
    return bytes(out)


def fs_size_bytes(tree_bytes: int) -> int:
    """The base file system's size for a tree of `tree_bytes`: room for ext4's metadata and a little more,
    rounded to MiB."""
    size = int(tree_bytes * SLACK) + 96 * 2**20
    return -(-size // 2**20) * 2**20


# ---- the host side -------------------------------------------------------------------------------------------

def vm_form(image_dir: Path) -> dict | None:
    """The VM form's record (vm.json with its files' paths) of the image in `image_dir`, or None."""
    d = image_dir / VM_DIR
    try:
        meta = json.loads((d / "vm.json").read_text())
    except (OSError, ValueError):
        return None
    files = {k: d / k for k in ("disk.qcow2", "vmlinuz", "initrd")}
    if not all(f.is_file() for f in files.values()):
        return None
    return {**meta, **{k.split(".")[0]: str(v) for k, v in files.items()}}


def qemu_missing() -> list[str]:
    """What VM nodes and their images need and this host lacks (scripts/system-deps.sh installs them)."""
    return [f"{t} (Debian package {p})" for t, p in (("qemu-system-x86_64", "qemu-system-x86"),
                                                    ("qemu-img", "qemu-utils"), ("mkfs.ext4", "e2fsprogs"),
                                                    ("depmod", "kmod"), ("dpkg-deb", "dpkg"),
                                                    ("apt-get", "apt")) if shutil.which(t) is None]


def _run(argv: list[str], cwd: Path | None = None, timeout: float = 900) -> str:
    out = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise ServerError(f"building the VM form: {' '.join(argv[:3])} failed: {(out.stderr or out.stdout)[-400:]}")
    return out.stdout


def _download(debs: Iterable[str], into: Path) -> dict[str, Path]:
    """Debian packages fetched with the host's apt (no install): package name -> .deb file."""
    into.mkdir(parents=True, exist_ok=True)
    into.chmod(0o755)  # apt's download user writes here
    names = list(debs)
    _run(["apt-get", "download", "-q", *names], cwd=into)
    found = {}
    for name in names:
        hits = sorted(into.glob(f"{name}_*.deb"))
        if not hits:
            raise ServerError(f"building the VM form: apt-get download {name} left no package")
        found[name] = hits[-1]
    return found


def build_vm_form(image_dir: Path, rootfs: Path, build_id: str, work: Path,
                  progress: ProgressFn | None = None) -> Path:
    """Make the VM form of the image whose tree is `rootfs` in `work` (a fresh directory) and move it to
    `image_dir/vm` (replacing one of an older build). Returns its directory."""
    say = progress or (lambda _m: None)
    missing = qemu_missing()
    if missing:
        raise ServerError(f"building the VM form of an image needs {', '.join(missing)} "
                          f"(scripts/system-deps.sh installs them)")
    work.mkdir(mode=0o700)
    debs_dir = work / "debs"
    say("VM form: finding Debian's cloud kernel")
    found = subprocess.run(["apt-cache", "depends", KERNEL_META], capture_output=True, text=True, timeout=120)
    kpkg = kernel_package(found.stdout)
    if kpkg is None:
        raise ServerError(f"building the VM form: the host's apt offers no {KERNEL_META} (a Debian amd64 host's "
                          f"does once its package lists are there: apt-get update)")
    say(f"VM form: downloading {kpkg}, {', '.join(EXTRA_DEBS)}, {INITRD_DEB}")
    debs = _download([kpkg, *EXTRA_DEBS, INITRD_DEB], debs_dir)
    kdir, bbdir = work / "kernel", work / "busybox"
    _run(["dpkg-deb", "-x", str(debs[kpkg]), str(kdir)])
    _run(["dpkg-deb", "-x", str(debs[INITRD_DEB]), str(bbdir)])
    version = kpkg.removeprefix("linux-image-")
    say("VM form: the guest's tree (the image, the kernel's modules, kmod)")
    tree = work / "tree"
    _run(["cp", "-a", "--reflink=auto", str(rootfs), str(tree)])
    for name in EXTRA_DEBS:
        unpacked = work / f"deb-{name}"
        _run(["dpkg-deb", "-x", str(debs[name]), str(unpacked)])
        merge_into(unpacked, tree)
    mods = tree / "lib" / "modules" / version
    if mods.exists():
        shutil.rmtree(mods)
    shutil.copytree(kdir / "lib" / "modules" / version, mods, symlinks=True)
    _run(["depmod", "-b", str(tree), version])
    init = tree / "sbin" / "slicex-init"
    init.write_text(GUEST_INIT)
    init.chmod(0o755)
    cloud_init = tree / "sbin" / "slicex-config-drive"
    cloud_init.write_text(CONFIG_DRIVE_INIT)
    cloud_init.chmod(0o755)
    say("VM form: the initramfs")
    order = module_closure((mods / "modules.dep").read_text(), ROOT_MODULES)
    entries: list[tuple[str, int, bytes]] = [("bin", 0o40755, b""), ("modules", 0o40755, b""),
                                            ("bin/busybox", 0o100755, (bbdir / "bin" / "busybox").read_bytes())]
    names = []
    for rel in order:
        name = Path(rel).name
        names.append(name)
        entries.append((f"modules/{name}", 0o100644, (mods / rel).read_bytes()))
    entries += [("modules.order", 0o100644, "".join(n + "\n" for n in names).encode()),
                ("init", 0o100755, INITRD_INIT.encode())]
    out = work / "out"
    out.mkdir()
    (out / "initrd").write_bytes(gzip.compress(cpio_newc(entries), compresslevel=6))
    shutil.copy2(kdir / "boot" / f"vmlinuz-{version}", out / "vmlinuz")
    say("VM form: the ext4 file system and its qcow2 base")
    tree_bytes = int(_run(["du", "-sb", str(tree)]).split()[0])
    raw = work / "root.raw"
    with open(raw, "wb") as f:
        f.truncate(fs_size_bytes(tree_bytes))
    _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-L", "slicex-root", "-d", str(tree), str(raw)])
    _run(["qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", str(raw), str(out / "disk.qcow2")])
    raw.unlink()
    for f in ("vmlinuz", "initrd", "disk.qcow2"):
        (out / f).chmod(0o644)  # handed to QEMU as open descriptors; the catalogue directory stays root's
    meta = {"kernel": version, "kernel_package": kpkg, "image_build_id": build_id, "build_id": uuid.uuid4().hex[:8],
            "fs_bytes": raw_size(out / "disk.qcow2"), "tree_bytes": tree_bytes,
            "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "cmdline": "console=ttyS0 root=/dev/vda rw quiet panic=-1"}
    (out / "vm.json").write_text(json.dumps(meta, indent=1) + "\n")
    target = image_dir / VM_DIR
    if target.exists():
        old = work / "old"
        target.rename(old)
    out.rename(target)
    return target


def merge_into(src: Path, tree: Path) -> None:
    """Copy an unpacked package `src` into `tree` through the tree's own directory links (a merged-/usr tree's
    /bin, /sbin and /lib are links into /usr: unpacking over it would replace them with directories)."""
    for dirpath, dirs, files in os.walk(src):
        rel = Path(dirpath).relative_to(src)
        here = Path(os.path.realpath(tree / rel)) if (tree / rel).exists() else tree / rel
        if not str(here).startswith(str(tree)):
            raise ServerError(f"building the VM form: {rel} of a package leads out of the tree")
        here.mkdir(parents=True, exist_ok=True)
        for name in dirs:
            d = Path(dirpath) / name
            if d.is_symlink():
                target = here / name
                if not target.exists() and not target.is_symlink():
                    target.symlink_to(os.readlink(d))
        for name in files:
            f, target = Path(dirpath) / name, here / name
            if target.is_symlink() or target.exists():
                target.unlink()
            if f.is_symlink():
                target.symlink_to(os.readlink(f))
            else:
                shutil.copy2(f, target)


def raw_size(qcow2: Path) -> int:
    """The virtual size of a qcow2 file (its header's big-endian size at byte 24), 0 for another file."""
    try:
        with open(qcow2, "rb") as f:
            head = f.read(32)
    except OSError:
        return 0
    return int.from_bytes(head[24:32], "big") if head[:4] == b"QFI\xfb" else 0


def remove_work(work: Path) -> None:
    if work.exists():
        shutil.rmtree(work, ignore_errors=True)
