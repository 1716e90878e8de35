"""The node image catalogue without debootstrap: images found, advertised and removed; a root file system
copied into a slice's uid range with setuid bits kept; the build's progress bar; uid range claims."""

from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path

import pytest

from authority.substrate.container import SUBID_LINE, UidRanges, ensure_subids
from authority.substrate.images import ImageCatalogue, check_name, image_urn, offered_images, shift_copy
from cli.image import BuildProgress
from slicex.errors import BadArgs


def _fake_image(root: Path, name: str, suite: str = "bookworm") -> None:
    d = root / name
    (d / "rootfs" / "etc").mkdir(parents=True)
    (d / "image.json").write_text(json.dumps({"name": name, "suite": suite, "build_id": "b1",
                                              "packages": ["openssh-server"], "size_bytes": 1024,
                                              "built": "2026-11-26T00:00:00Z", "description": "test"}))


def test_the_catalogue_lists_finds_advertises_and_removes_images(tmp_path):
    cat = ImageCatalogue(tmp_path)
    assert cat.list() == []
    _fake_image(tmp_path, "debian-12")
    _fake_image(tmp_path, "alpha", suite="trixie")
    (tmp_path / ".build-x-123").mkdir()  # a build in progress is no image
    (tmp_path / "broken").mkdir()  # nor a directory without image.json
    assert [i.name for i in cat.list()] == ["alpha", "debian-12"]
    assert cat.get("urn:publicid:IDN+a.b+image+debian-12").version == "12"
    assert cat.get("alpha").version == "13"
    assert cat.get("../etc") is None and cat.get("nope") is None
    offered = offered_images(cat, "a.b", default="debian-12")
    assert [i.name for i in offered] == ["debian-12", "alpha"]  # the default first: nodes naming none get it
    assert offered[0].urn == image_urn("a.b", "debian-12") == "urn:publicid:IDN+a.b+image+debian-12"
    assert cat.remove("alpha") and not cat.remove("alpha") and not cat.remove("../x")
    assert [i.name for i in cat.list()] == ["debian-12"]


@pytest.mark.parametrize("name", ["", "Debian", "a/b", "../x", "-x", "x" * 41, "x\n"])
def test_image_names_are_checked(name):
    with pytest.raises(BadArgs):
        check_name(name)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_shifted_copy_moves_every_owner_into_the_range_and_keeps_setuid(tmp_path):
    src = tmp_path / "src"
    (src / "usr/bin").mkdir(parents=True)
    tool = src / "usr/bin/sudo"
    tool.write_text("#!/bin/sh\n")
    os.chown(tool, 0, 0)
    tool.chmod(0o4755)  # after chown, which clears it
    home = src / "home/u"
    home.mkdir(parents=True)
    os.chown(home, 1000, 1000)
    (src / "link").symlink_to("/etc/shadow")
    shift_copy(src, tmp_path / "dst", 100_000_000)
    dst = tmp_path / "dst"
    assert os.lstat(dst).st_uid == 100_000_000
    st = os.lstat(dst / "usr/bin/sudo")
    assert (st.st_uid, st.st_gid) == (100_000_000, 100_000_000) and stat.S_IMODE(st.st_mode) == 0o4755
    assert os.lstat(dst / "home/u").st_uid == 100_001_000
    assert os.lstat(dst / "link").st_uid == 100_000_000 and os.readlink(dst / "link") == "/etc/shadow"
    assert os.stat("/etc/shadow").st_uid == 0  # the link was not followed
    assert os.lstat(src / "home/u").st_uid == 1000  # the image itself unchanged


def test_uid_ranges_are_one_per_owner_and_come_back_when_released(tmp_path):
    ranges = UidRanges(tmp_path)
    a, b = ranges.claim("x1 slice-a"), ranges.claim("x1 slice-b")
    assert a != b and ranges.claim("x1 slice-a") == a
    other = UidRanges(tmp_path)  # another deployment on the host sees the same claims
    assert other.claim("x2 slice-c") not in (a, b)
    ranges.release("x1 slice-a")
    assert ranges.claim("x2 slice-d") == a
    assert set(ranges.claims().values()) == {"x1 slice-b", "x2 slice-c", "x2 slice-d"}


def test_subordinate_ids_are_given_once(tmp_path):
    subuid, subgid = tmp_path / "subuid", tmp_path / "subgid"
    subuid.write_text("someone:100000:65536")
    assert ensure_subids((subuid, subgid)) == [str(subuid), str(subgid)]
    assert ensure_subids((subuid, subgid)) == []
    assert subuid.read_text().splitlines() == ["someone:100000:65536", SUBID_LINE]


def test_the_build_progress_bar_grows_with_debootstraps_steps():
    out = io.StringIO()
    bar = BuildProgress(out)
    for line in ["Retrieving InRelease", "Retrieving packages...", "Retrieving adduser 3.134",
                 "Retrieving apt 2.6.1", "Validating adduser 3.134", "Validating apt 2.6.1", "Extracting...",
                 "Extracting adduser...", "Unpacking required packages...", "Unpacking adduser...",
                 "Configuring required packages...", "Configuring apt...", "Unpacking the base system..."]:
        bar(line)
    text = out.getvalue()
    assert "Retrieving packages..." in text and "Unpacking the base system..." in text  # a log: stages only
    assert "Retrieving apt" not in text and "Configuring apt" not in text
    assert bar.packages == {"adduser", "apt"} and bar.done == 7
    assert text.splitlines()[-1].split("]")[1].strip().startswith("70%")  # 7 of 2 packages x 5 steps


def test_a_netns_deployment_offers_its_catalogue_and_refuses_other_images(tmp_path):
    """ListResources advertises the catalogue (the default image first); Allocate of an image it lacks is
    BADARGS naming what is offered; a node naming none gets the default."""
    from datetime import UTC, datetime

    from broker.placement import plan
    from deployment.service import deployment_substrate
    from rspec.advertisement import Usage, build_advertisement
    from rspec.namespaces import RSPEC3
    from rspec.request import parse_request
    from slicex.config import parse_config
    from tests.factories import request_rspec, vm

    _fake_image(tmp_path, "debian-12")
    _fake_image(tmp_path, "lab")
    cfg = {"substrate": None, "authority": "a.b", "substrate_driver": "netns",
           "netns": {"images_dir": str(tmp_path), "default_image": "debian-12"}}
    sub = deployment_substrate(parse_config(cfg))
    assert [i.name for i in sub.images] == ["debian-12", "lab"]
    assert deployment_substrate(parse_config({**cfg, "substrate_driver": "emulated"})).images != sub.images
    ad = build_advertisement(sub, Usage(), datetime.now(UTC)).encode()
    from lxml import etree

    names = {i.get("name") for i in etree.fromstring(ad).iter(f"{{{RSPEC3}}}disk_image")}
    assert names == {"urn:publicid:IDN+a.b+image+debian-12", "urn:publicid:IDN+a.b+image+lab"}
    with pytest.raises(BadArgs, match="offered: urn:publicid:IDN\\+a.b\\+image\\+debian-12, .*lab"):
        plan(sub, parse_request(request_rspec([vm("n1", image="urn:publicid:IDN+a.b+image+windows")])), set())
    (placed,) = plan(sub, parse_request(request_rspec([vm("n1")])), set())
    assert placed.details["disk_image"] == "urn:publicid:IDN+a.b+image+debian-12"
    (placed,) = plan(sub, parse_request(request_rspec([vm("n1", image="lab")])), set())
    assert placed.details["disk_image"] == "urn:publicid:IDN+a.b+image+lab"


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_shifted_copy_is_made_once_per_range_and_build_and_goes_with_its_image(tmp_path):
    root = tmp_path / "images"
    cat = ImageCatalogue(root)
    _fake_image(root, "snap")
    _fake_image(root, "snap-2")  # a name that merely starts with the other's keeps its copies
    image, other = cat.get("snap"), cat.get("snap-2")
    first = cat.shifted(image, 3, 100_000_000)
    assert os.lstat(first / "etc").st_uid == 100_000_000 and stat.S_IMODE(os.lstat(first.parent.parent).st_mode) == 0o700
    marker = first / "etc" / "made-once"
    marker.write_text("")
    assert cat.shifted(image, 3, 100_000_000) == first and marker.exists()  # not copied again
    kept = cat.shifted(other, 3, 100_000_000)
    in_range_4 = cat.shifted(image, 4, 100_065_536)
    assert os.lstat(in_range_4 / "etc").st_uid == 100_065_536

    assert cat.remove("snap")
    assert not first.exists() and not in_range_4.exists() and kept.is_dir()
