"""`slicex image build|list|remove`: the node images container nodes boot (netns substrate; authority/substrate/images.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from authority.substrate.images import DEFAULT_DIR, DEFAULT_IMAGE, DEFAULT_SUITE, PACKAGES, ImageCatalogue
from authority.substrate.vm_image import qemu_missing, vm_form
from slicex.errors import GeniError

STAGES = ("Retrieving", "Validating", "Extracting", "Unpacking", "Configuring")
# debootstrap's stage headings ("Retrieving packages...", "Unpacking the base system...") are not package steps
HEADINGS = {"", "packages", "required", "the", "core", "base", "Release", "InRelease", "Packages"}
STEPS_PER_PACKAGE = 5  # retrieved, validated, extracted, unpacked, configured (the base ones are not extracted)


class BuildProgress:
    """A progress bar over debootstrap's steps: every package is retrieved, validated, extracted, unpacked and
    configured, so the bar's total is known once retrieval has named them all (it grows until then)."""

    def __init__(self, out: TextIO = sys.stderr, width: int = 30):
        self.out = out
        self.tty = out.isatty()
        self.width = width
        self.packages: set[str] = set()
        self.done = 0

    def __call__(self, line: str) -> None:
        word, _, rest = line.partition(" ")
        first = rest.split(" ", 1)[0].rstrip(".")
        step = word in STAGES and bool(first) and first not in HEADINGS
        if step:
            if word == "Retrieving":
                self.packages.add(first)
            self.done += 1
        share = min(0.99, self.done / max(1, STEPS_PER_PACKAGE * len(self.packages)))
        filled = int(share * self.width)
        text = f"[{'#' * filled}{'.' * (self.width - filled)}] {share:4.0%} {line[:60]}"
        if self.tty:
            self.out.write("\r" + text.ljust(self.width + 70))
        elif not step:  # a log: the stages only
            self.out.write(text + "\n")
        self.out.flush()

    def finish(self) -> None:
        if self.tty:
            self.out.write("\r" + f"[{'#' * self.width}] 100% done".ljust(self.width + 70) + "\n")
            self.out.flush()


def catalogue_for(args: argparse.Namespace) -> ImageCatalogue:
    return ImageCatalogue(Path(args.images_dir) if getattr(args, "images_dir", None) else DEFAULT_DIR)


def build_with_progress(catalogue: ImageCatalogue, name: str = DEFAULT_IMAGE, suite: str = DEFAULT_SUITE,
                        mirror: str | None = None, replace: bool = False, quiet: bool = False, vm: bool = False):
    """The image (built when missing or `replace`), and with `vm` its VM form (made when it has none of this
    build; skipped, saying why, where QEMU's tools are missing)."""
    existing = catalogue.get(name)
    if vm and qemu_missing():
        print(f"not making the VM form of {name} (qemu-vm nodes): this host lacks {', '.join(qemu_missing())}",
              file=sys.stderr)
        vm = False
    if existing is not None and not replace and not vm:
        return existing
    if existing is None or replace:
        print(f"building node image {name} (Debian {suite}, debootstrap into {catalogue.root}; about a minute)",
              file=sys.stderr)
    if vm:
        print(f"making the VM form of {name} if it has none (Debian's cloud kernel, an initramfs, a qcow2 base; "
              f"about a minute)", file=sys.stderr)
    progress = None if quiet else BuildProgress()
    img = catalogue.build(name, suite, PACKAGES, mirror, progress, replace, vm=vm)
    if progress is not None:
        progress.finish()
    return img


def cmd_image_build(args: argparse.Namespace) -> int:
    try:
        img = build_with_progress(catalogue_for(args), args.name, args.suite, args.mirror, args.replace, args.quiet,
                                  vm=not args.no_vm)
    except GeniError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    print(f"{img.name}: {img.size_bytes / 2**20:.0f} MiB, built {img.built} ({img.rootfs})")
    form = vm_form(img.rootfs.parent)
    if form is not None:
        print(f"{img.name} VM form: kernel {form['kernel']}, base disk {Path(form['disk']).stat().st_size / 2**20:.0f} "
              f"MiB ({Path(form['disk']).parent})")
    return 0


def cmd_image_list(args: argparse.Namespace) -> int:
    images = catalogue_for(args).list()
    if not images:
        print("no node images (slicex image build makes the default one)")
        return 0
    print(f"{'name':<20} {'debian':<8} {'size':>8}  built                 {'owner':<40} {'public':<6} base")
    for i in images:
        owner = i.owner or "(operator)"
        print(f"{i.name:<20} {i.version:<8} {i.size_bytes / 2**20:>6.0f} MiB  {i.built:<21} {owner:<40} "
              f"{'yes' if i.public else 'no':<6} {i.base or '-'}")
    return 0


def cmd_image_remove(args: argparse.Namespace) -> int:
    if not catalogue_for(args).remove(args.name):
        print(f"no image {args.name}", file=sys.stderr)
        return 1
    print(f"removed {args.name} (nodes booted from it keep their copy until they are deleted)")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    image = sub.add_parser("image", help="node images of the netns substrate's container nodes (built with "
                                         "debootstrap from Debian packages)")
    image.add_argument("--images-dir", help=f"the catalogue directory (default {DEFAULT_DIR}; slicex.yaml "
                                            f"netns.images_dir)")
    image_sub = image.add_subparsers(dest="image_command", required=True)
    build = image_sub.add_parser("build", help="debootstrap an image: minbase with sshd, iproute2, ping, iperf3, "
                                               "procps, ethtool, sudo; and its VM form for qemu-vm nodes")
    build.add_argument("name", nargs="?", default=DEFAULT_IMAGE, help=f"image name (default {DEFAULT_IMAGE})")
    build.add_argument("--suite", default=DEFAULT_SUITE, help=f"Debian suite (default {DEFAULT_SUITE})")
    build.add_argument("--mirror", help="Debian mirror URL (default: the one this host's apt uses)")
    build.add_argument("--replace", action="store_true", help="build again even if the image exists")
    build.add_argument("--quiet", action="store_true", help="no progress bar")
    build.add_argument("--no-vm", action="store_true", help="skip the VM form qemu-vm nodes boot (Debian's cloud "
                                                            "kernel, an initramfs and a qcow2 base, made by default "
                                                            "where QEMU's tools are installed)")
    build.set_defaults(func=cmd_image_build)
    ls = image_sub.add_parser("list", help="the catalogue: name, Debian version, size, when built, owner (users' "
                                           "images made with CreateImage), public, the image it was made from")
    ls.set_defaults(func=cmd_image_list)
    rm = image_sub.add_parser("remove", help="remove an image, the operator's or a user's (running nodes keep "
                                             "theirs)")
    rm.add_argument("name")
    rm.set_defaults(func=cmd_image_remove)
