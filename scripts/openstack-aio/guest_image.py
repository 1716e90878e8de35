"""The all-in-one cloud's bootable image: the VM form of a slicex catalogue image (authority/substrate/vm_image.py,
the same builder `slicex image build` uses) in Glance, for Nova's libvirt driver to boot by direct kernel boot.

    guest_image.py accel STATE              print the libvirt virt_type: kvm when a probe boot with KVM works, else qemu
                                            (building the VM form first, as below, if it has none)
    guest_image.py upload STATE CLOUDS_YAML  build the VM form into STATE/vm-image if it has none of this builder and
                                            this catalogue image, and put it in Glance (once per build): the kernel
                                            (aki), the initramfs (ari) and the root disk (qcow2) naming both

Run by scripts/openstack-aio.sh with the repository's virtualenv (it imports slicex and openstacksdk). The catalogue
image is SLICEX_AIO_BASE_IMAGE (default debian-12) of the host's catalogue (`slicex image build` makes it)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from authority.substrate import vm_image  # noqa: E402
from authority.substrate.images import ImageCatalogue  # noqa: E402
from authority.substrate.vm import accel_of, kernel_args, probe_accel  # noqa: E402

IMAGE = "slicex-aio-vm"  # the root disk's name in Glance; its kernel and initramfs are IMAGE-kernel, IMAGE-initrd


def catalogue_image():
    name = os.environ.get("SLICEX_AIO_BASE_IMAGE", "debian-12")
    img = ImageCatalogue().get(name)
    if img is None:
        sys.exit(f"guest_image: no catalogue image {name!r}: build it first (`slicex image build --vm`)")
    return img


def stamp(build_id: str) -> str:
    """What the VM form is made of: the catalogue image's build and the builder's guest scripts."""
    text = "\n".join((build_id, vm_image.INITRD_INIT, vm_image.GUEST_INIT, vm_image.CONFIG_DRIVE_INIT))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def vm_form(state: Path) -> dict:
    """The VM form in STATE/vm-image, built when missing or made by another builder or image."""
    img = catalogue_image()
    want = stamp(img.build_id)
    root = state / "vm-image"
    form = vm_image.vm_form(root)
    if form is None or form.get("stamp") != want:
        root.mkdir(parents=True, exist_ok=True)
        work = root / f".build-{uuid.uuid4().hex[:6]}"
        try:
            vm_image.build_vm_form(root, img.rootfs, img.build_id, work, lambda m: print(m, file=sys.stderr, flush=True))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        meta_file = root / vm_image.VM_DIR / "vm.json"
        meta = json.loads(meta_file.read_text())
        meta_file.write_text(json.dumps({**meta, "stamp": want}, indent=1) + "\n")
        form = vm_image.vm_form(root)
    assert form is not None
    return form


def accel(state: Path) -> str:
    """The probe boots the VM form's kernel (built first if missing): once per cloud state (STATE/accel.json)."""
    probe = probe_accel(vm_form(state), cache=state / "accel.json")
    return "kvm" if accel_of(probe) == "kvm" else "qemu"


def upload(state: Path, clouds_yaml: str) -> None:
    import openstack

    form = vm_form(state)
    os.environ["OS_CLIENT_CONFIG_FILE"] = clouds_yaml
    conn = openstack.connect(cloud="slicex-aio")
    tag = form["stamp"]
    have = conn.image.find_image(IMAGE)
    if have is not None and (have.properties or {}).get("slicex_vm_form") == tag:
        print(f"glance: {IMAGE} is this VM form ({tag})", flush=True)
        return
    for name in (IMAGE, f"{IMAGE}-kernel", f"{IMAGE}-initrd"):
        for old in list(conn.image.images(name=name)):
            conn.image.delete_image(old)
    kernel = conn.image.create_image(name=f"{IMAGE}-kernel", filename=form["vmlinuz"], disk_format="aki",
                                     container_format="aki", visibility="public", wait=True)
    ramdisk = conn.image.create_image(name=f"{IMAGE}-initrd", filename=form["initrd"], disk_format="ari",
                                      container_format="ari", visibility="public", wait=True)
    cmdline = kernel_args(form["cmdline"], "kvm" if accel(state) == "kvm" else "tcg")
    conn.image.create_image(name=IMAGE, filename=form["disk"], disk_format="qcow2", container_format="bare",
                            visibility="public", wait=True, kernel_id=kernel.id, ramdisk_id=ramdisk.id,
                            os_command_line=cmdline, hw_disk_bus="virtio", slicex_vm_form=tag)
    print(f"glance: {IMAGE} uploaded ({tag}, kernel {form['kernel']}, command line {cmdline!r})", flush=True)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "accel":
        print(accel(Path(sys.argv[2])))
    elif len(sys.argv) >= 4 and sys.argv[1] == "upload":
        upload(Path(sys.argv[2]), sys.argv[3])
    else:
        sys.exit(__doc__)
