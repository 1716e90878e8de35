"""A qemu-vm node's pure parts: QEMU's command line names no host path and sandboxes itself, the seed holds what
the guest's init needs, TCG guests boot without mitigations, and the netns substrate offers qemu-vm only where
the file has no VM size of its own."""

from __future__ import annotations

import io
import tarfile

from authority.substrate.container import NodeLimits
from authority.substrate.vm import MGMT_MAC, kernel_args, qemu_argv, seed_tar, tap_name
from deployment.service import with_qemu_vm
from rspec.substrate import QEMU_VM, VmSize

LIMITS = NodeLimits(1.5, 512, "0,1", 1024, 10)


def test_qemu_opens_no_host_path_and_runs_sandboxed():
    argv = qemu_argv("xab12-node", "tcg", LIMITS, "console=ttyS0", [("tapv", "02:aa:bb:cc:dd:ee")], [22, 8080])
    text = " ".join(argv)
    assert "/var/" not in text and "/run/" not in text and "/etc/" not in text and "/root" not in text
    assert argv[argv.index("-sandbox") + 1].startswith("on,")
    assert argv[argv.index("-smp") + 1] == "2" and argv[argv.index("-m") + 1] == "512"
    assert "tcg,tb-size=64" in argv and "kvm" not in text
    assert "restrict=on,hostfwd=tcp:127.0.0.1:22-:22,hostfwd=tcp:127.0.0.1:8080-:8080" in text
    assert "ifname=tapv,script=no,downscript=no" in text and "mac=02:aa:bb:cc:dd:ee,csum=off" in text
    assert qemu_argv("n", "kvm", LIMITS, "", [], [22])[3:7] == ["-accel", "kvm", "-cpu", "host"]


def test_seed_holds_the_interfaces_users_keys_and_init():
    data = seed_tar("v1", [("02:aa:bb:cc:dd:ee", "10.10.0.1/24"), ("02:aa:bb:cc:dd:ef", "")], "alice 2042\n",
                    {"alice": "ssh-ed25519 AAAA alice\n"})
    assert len(data) % 512 == 0  # read by the guest as a disk
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        files = {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}
    assert files["hostname"] == "v1\n" and files["users"] == "alice 2042\n"
    assert files["keys/alice"] == "ssh-ed25519 AAAA alice\n"
    assert files["interfaces"].splitlines() == [f"{MGMT_MAC} 10.0.2.15/24", "02:aa:bb:cc:dd:ee 10.10.0.1/24",
                                                "02:aa:bb:cc:dd:ef -"]
    assert "exec /usr/sbin/sshd -D" in files["vm-init"] and "AuthorizedKeysFile" in files["sshd_config"]


def test_tcg_guests_boot_without_mitigations_kvm_guests_with_them():
    assert kernel_args("root=/dev/vda", "tcg") == "root=/dev/vda mitigations=off"
    assert kernel_args("root=/dev/vda", "kvm") == "root=/dev/vda"


def test_tap_names_fit_linux_and_differ_from_the_veth_end():
    assert tap_name("xab12deadbeefn") == "xab12deadbeefv" and len(tap_name("xab12deadbeefn")) <= 15


def test_qemu_vm_is_added_only_where_the_file_defines_none_and_the_host_can_boot_one(monkeypatch):
    monkeypatch.setattr("authority.substrate.vm_image.qemu_missing", lambda: [])
    small = VmSize("small", 1, 1024)
    assert with_qemu_vm((small,), True) == (small, QEMU_VM)
    assert with_qemu_vm((small,), False) == (small,)  # the default image has no VM form yet
    mine = VmSize("big-vm", 4, 8192, 40, "qemu")
    assert with_qemu_vm((small, mine), True) == (small, mine)
    monkeypatch.setattr("authority.substrate.vm_image.qemu_missing", lambda: ["qemu-img (Debian package qemu-utils)"])
    assert with_qemu_vm((small,), True) == (small,)


def test_a_node_directory_with_a_boot_record_is_a_vm(tmp_path):
    from authority.substrate.vm import NodeVM, machine_at

    (tmp_path / "xab12-aaaa").mkdir()
    (tmp_path / "xab12-bbbb").mkdir()
    (tmp_path / "xab12-bbbb" / "vm.json").write_text('{"hostname": "v1", "accel": "tcg"}')
    assert not isinstance(machine_at(tmp_path, "xab12-aaaa"), NodeVM)
    vm = machine_at(tmp_path, "xab12-bbbb")
    assert isinstance(vm, NodeVM) and vm.meta() == {"hostname": "v1", "accel": "tcg"}
