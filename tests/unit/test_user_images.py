"""Users' images (CreateImage, ListImages, DeleteImage) without containers: a node's overlay layer applied
over its base image, the catalogue's ownership and visibility rules, names, the per-user size limit, and the
images the slice manager vouches for to the broker. Every trust decision has its refusal here."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from authority.substrate.images import (
    ImageCatalogue,
    UserImages,
    apply_layer,
    image_name,
    image_urn,
    offered_images,
    usable_image,
)
from broker.broker import with_images
from broker.placement import plan
from protocol.messages import Demands, demands_of
from rspec.request import Request, RequestNode
from rspec.substrate import default_substrate
from slicex.codec import decode, encode
from slicex.errors import AlreadyExists, BadArgs, Forbidden, SearchFailed, TooBig

AUTH = "a.b"
ALICE = f"urn:publicid:IDN+{AUTH}+user+alice"
BOB = f"urn:publicid:IDN+{AUTH}+user+bob"
OFFSET = 100_000_000  # the slice's uid range: what uid 0 inside a node is on the host
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="chown and mknod need root")


def _base(cat: ImageCatalogue, name: str = "debian-12") -> None:
    d = cat.root / name
    (d / "rootfs/etc/ssh").mkdir(parents=True)
    (d / "rootfs/etc/motd").write_text("base\n")
    (d / "rootfs/etc/ssh/ssh_host_ed25519_key").write_text("the base's key\n")
    (d / "rootfs/opt/tool").mkdir(parents=True)
    (d / "rootfs/opt/tool/old").write_text("old\n")
    (d / "image.json").write_text(json.dumps({"name": name, "suite": "bookworm", "build_id": "b1",
                                              "packages": ["openssh-server"], "size_bytes": 4096,
                                              "built": "2026-11-26T00:00:00Z", "description": "base"}))


def _layer(tmp_path: Path) -> Path:
    """A node's upper layer as the kernel writes it, owned by host uids of the slice's range."""
    up = tmp_path / "upper"
    (up / "root").mkdir(parents=True)
    (up / "root/hello").write_text("written in the node\n")
    (up / "etc").mkdir()
    (up / "etc/motd").write_text("changed\n")
    (up / "opt/tool").mkdir(parents=True)
    os.setxattr(up / "opt/tool", "trusted.overlay.opaque", b"y")  # rm -rf /opt/tool; mkdir /opt/tool
    (up / "opt/tool/new").write_text("new\n")
    os.mknod(up / "etc/gone", stat.S_IFCHR | 0o000, os.makedev(0, 0))  # a whiteout
    for p in [up, *up.rglob("*")]:
        os.lchown(p, OFFSET, OFFSET)
    os.lchown(up / "root/hello", OFFSET + 1000, OFFSET + 1000)
    return up


@root_only
def test_a_layer_applies_as_the_merged_view_showed_it_with_owners_moved_back(tmp_path):
    target = tmp_path / "t"
    (target / "etc").mkdir(parents=True)
    (target / "etc/gone").write_text("deleted in the node\n")
    (target / "etc/motd").write_text("base\n")
    (target / "opt/tool").mkdir(parents=True)
    (target / "opt/tool/old").write_text("old\n")
    up = _layer(tmp_path)
    (up / "usr/bin").mkdir(parents=True)
    suid = up / "usr/bin/tool"
    suid.write_text("#!/bin/sh\n")
    os.chown(suid, OFFSET, OFFSET)
    suid.chmod(0o4755)
    (up / "stranger").write_text("owned by a uid outside the range\n")
    os.chown(up / "stranger", 5, 5)
    os.setxattr(up / "root/hello", "user.overlay.origin", b"x")
    os.setxattr(up / "root/hello", "user.note", b"kept")
    apply_layer(up, target, OFFSET)
    assert (target / "root/hello").read_text() == "written in the node\n"
    assert (target / "root/hello").stat().st_uid == 1000 and (target / "root").stat().st_uid == 0
    assert (target / "etc/motd").read_text() == "changed\n" and not (target / "etc/gone").exists()
    assert sorted(p.name for p in (target / "opt/tool").iterdir()) == ["new"]  # opaque: the old one is gone
    assert stat.S_IMODE((target / "usr/bin/tool").stat().st_mode) == 0o755  # no setuid file of host root's
    assert (target / "stranger").stat().st_uid == 65534
    assert os.listxattr(target / "root/hello") == ["user.note"]  # overlay's own attributes are not copied
    assert os.listxattr(target / "opt/tool") == []


@root_only
def test_a_link_planted_below_never_leads_a_write_out_of_the_image(tmp_path):
    """A node replaced a directory of its image with a link to a host path, then the layer holds a real
    directory of that name: the link is removed, never written through."""
    outside = tmp_path / "host-dir"
    outside.mkdir()
    target = tmp_path / "t"
    target.mkdir()
    (target / "data").symlink_to(outside)
    up = tmp_path / "upper"
    (up / "data").mkdir(parents=True)
    (up / "data/x").write_text("payload\n")
    (up / "link").symlink_to("/etc/shadow")
    apply_layer(up, target, OFFSET)
    assert list(outside.iterdir()) == []
    assert (target / "data").is_dir() and not (target / "data").is_symlink()
    assert os.readlink(target / "link") == "/etc/shadow"  # a link is copied as a link, not followed


@root_only
def test_a_snapshot_is_the_users_private_image_of_the_base_with_the_nodes_files(tmp_path):
    cat = ImageCatalogue(tmp_path / "images")
    _base(cat)
    img = cat.snapshot("MyImage", cat.get("debian-12"), _layer(tmp_path), OFFSET, ALICE, False, "of n1")
    assert (img.name, img.owner, img.public, img.base) == ("myimage", ALICE, False, "debian-12")
    assert (img.rootfs / "root/hello").read_text() == "written in the node\n"
    assert (img.rootfs / "etc/motd").read_text() == "changed\n"
    assert not list((img.rootfs / "etc/ssh").glob("ssh_host_*"))  # every node booted from it makes its own key
    assert cat.get("debian-12").owner == "" and (cat.root / "debian-12/rootfs/etc/motd").read_text() == "base\n"
    assert img.size_bytes > 0 and cat.get("urn:publicid:IDN+a.b+image+proj//MYIMAGE") == img
    again = cat.snapshot("myimage", cat.get("debian-12"), _layer(tmp_path / "2"), OFFSET, ALICE, True, "of n1")
    assert again.public and again.build_id != img.build_id  # its owner replaces it, as ProtoGENI does


@root_only
def test_a_name_of_another_users_or_the_operators_image_is_refused(tmp_path):
    cat = ImageCatalogue(tmp_path / "images")
    _base(cat)
    cat.snapshot("mine", cat.get("debian-12"), _layer(tmp_path), OFFSET, ALICE, False, "")
    with pytest.raises(AlreadyExists):
        cat.snapshot("mine", cat.get("debian-12"), _layer(tmp_path / "b"), OFFSET, BOB, False, "")
    with pytest.raises(AlreadyExists):
        cat.snapshot("debian-12", cat.get("debian-12"), _layer(tmp_path / "c"), OFFSET, ALICE, False, "")
    assert cat.get("mine").owner == ALICE and cat.get("debian-12").owner == ""


@root_only
@pytest.mark.parametrize("name", ["../x", "a/b", "..", "x" * 41, "", "a b", ".hidden", "x\n"])
def test_a_snapshot_name_cannot_leave_the_catalogue(tmp_path, name):
    cat = ImageCatalogue(tmp_path / "images")
    _base(cat)
    with pytest.raises(BadArgs):
        cat.snapshot(name, cat.get("debian-12"), _layer(tmp_path), OFFSET, ALICE, False, "")
    assert sorted(p.name for p in cat.root.iterdir() if p.name != ".lock") == ["debian-12"]
    assert not (tmp_path / "x").exists()


@root_only
def test_a_snapshot_past_the_users_limit_is_refused_and_leaves_nothing(tmp_path):
    cat = ImageCatalogue(tmp_path / "images")
    _base(cat)
    (tmp_path / "upper").mkdir()
    with pytest.raises(TooBig):  # the base alone (24 bytes of files) is over the limit: refused before any copy
        cat.snapshot("big", cat.get("debian-12"), tmp_path / "upper", OFFSET, ALICE, False, "", max_user_bytes=16)
    first = cat.snapshot("one", cat.get("debian-12"), _layer(tmp_path), OFFSET, ALICE, False, "")
    with pytest.raises(TooBig):  # with what alice already holds
        cat.snapshot("two", cat.get("debian-12"), _layer(tmp_path / "2"), OFFSET, ALICE, False, "",
                     max_user_bytes=first.size_bytes + 16)
    cat.snapshot("two", cat.get("debian-12"), _layer(tmp_path / "3"), OFFSET, BOB, False, "",
                 max_user_bytes=first.size_bytes + 8192 * 4)  # bob's own limit is untouched by alice's images
    assert sorted(p.name for p in cat.root.iterdir()) == [".lock", "debian-12", "one", "two"]


def _user_image(cat: ImageCatalogue, name: str, owner: str, public: bool) -> None:
    d = cat.root / name
    (d / "rootfs").mkdir(parents=True)
    (d / "image.json").write_text(json.dumps({"name": name, "suite": "bookworm", "build_id": "u1",
                                              "size_bytes": 10, "built": "2026-11-26T00:00:00Z",
                                              "owner": owner, "public": public, "base": "debian-12"}))


@pytest.fixture
def catalogue(tmp_path) -> ImageCatalogue:
    cat = ImageCatalogue(tmp_path)
    _user_image(cat, "debian-12", "", True)  # the operator's (an image.json without owner reads the same)
    _user_image(cat, "secret", ALICE, False)
    _user_image(cat, "shared", ALICE, True)
    return cat


def test_another_users_private_image_is_neither_advertised_listed_nor_bootable(catalogue):
    assert [i.name for i in offered_images(catalogue, AUTH)] == ["debian-12", "shared"]
    assert usable_image(catalogue, AUTH, ALICE, "secret") == image_urn(AUTH, "secret")
    assert usable_image(catalogue, AUTH, ALICE.upper().replace("URN:PUBLICID:IDN", "urn:publicid:IDN"),
                        f"urn:publicid:IDN+{AUTH}+image+SECRET") == image_urn(AUTH, "secret")
    assert usable_image(catalogue, AUTH, BOB, "secret") is None
    assert usable_image(catalogue, AUTH, BOB, "shared") == image_urn(AUTH, "shared")
    assert usable_image(catalogue, AUTH, BOB, "debian-12") is None  # offered to everyone by the substrate
    assert usable_image(catalogue, AUTH, BOB, "../secret") is None
    images = UserImages(catalogue, AUTH)
    assert [r["name"] for r in images.listed(ALICE, ALICE, operator=False)] == ["secret", "shared"]
    assert [r["name"] for r in images.listed(ALICE, BOB, operator=False)] == ["shared"]
    assert [r["name"] for r in images.listed(ALICE, BOB, operator=True)] == ["secret", "shared"]
    assert images.listed(BOB, BOB, operator=False) == []
    rec = images.listed(ALICE, ALICE, operator=False)[0]
    assert rec["urn"] == image_urn(AUTH, "secret") and rec["owner"] == ALICE and rec["public"] is False
    assert {"size_bytes", "base", "created"} <= rec.keys()


def test_only_the_owner_or_an_operator_deletes_an_image(catalogue):
    images = UserImages(catalogue, AUTH)
    with pytest.raises(SearchFailed):  # another's private image: as if it did not exist
        images.delete(image_urn(AUTH, "secret"), BOB, operator=False)
    with pytest.raises(Forbidden):  # another's public image: seen, not deletable
        images.delete(image_urn(AUTH, "shared"), BOB, operator=False)
    with pytest.raises(Forbidden):  # the operator's image
        images.delete(image_urn(AUTH, "debian-12"), ALICE, operator=False)
    with pytest.raises(SearchFailed):
        images.delete(f"urn:publicid:IDN+{AUTH}+image+..//..", ALICE, operator=False)
    assert {i.name for i in catalogue.list()} == {"debian-12", "secret", "shared"}
    assert images.delete(image_urn(AUTH, "secret"), ALICE, operator=False)["name"] == "secret"
    assert images.delete(image_urn(AUTH, "shared"), BOB, operator=True)["name"] == "shared"
    with pytest.raises(SearchFailed):
        images.delete(image_urn(AUTH, "secret"), ALICE, operator=False)
    assert [i.name for i in catalogue.list()] == ["debian-12"]


@pytest.mark.parametrize(("spelled", "name"), [
    ("debian-12", "debian-12"), ("MyImage", "myimage"), (f"urn:publicid:IDN+{AUTH}+image+MyImage", "myimage"),
    (f"urn:publicid:IDN+{AUTH}+image+proj//MyImage", "myimage"), (f"urn:publicid:IDN+{AUTH}+image+proj:mine", "mine")])
def test_image_names_are_read_as_protogeni_and_cloudlab_users_write_them(spelled, name):
    assert image_name(spelled) == name


def test_the_broker_places_an_image_the_slice_manager_vouches_for_and_nothing_else():
    substrate = default_substrate(AUTH)
    urn = image_urn(AUTH, "secret")
    request = Request((RequestNode("n1", disk_image="secret"),), ())
    demands = demands_of(request, {"n1": "r1"}, images={"secret": urn, "other": image_urn(AUTH, "other")})
    assert dict(demands.images) == {"secret": urn}  # only what the request names travels
    assert decode(encode(demands), Demands, "demands").images == {"secret": urn}
    with pytest.raises(BadArgs, match="not offered"):
        plan(substrate, request, set())
    placed = plan(with_images(substrate, demands.images), request, set())
    assert placed[0].details["disk_image"] == urn


def test_slicex_image_list_shows_owner_public_size_and_base(catalogue, capsys):
    import argparse

    from cli.image import cmd_image_list

    assert cmd_image_list(argparse.Namespace(images_dir=str(catalogue.root))) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert "(operator)" in rows["debian-12"] and " yes " in rows["debian-12"]
    assert ALICE in rows["secret"] and " no " in rows["secret"] and rows["secret"].endswith("debian-12")


def _version(cat: ImageCatalogue, name: str, build: str) -> None:
    d = cat.root / name
    (d / "rootfs/etc").mkdir(parents=True, exist_ok=True)
    (d / "image.json").write_text(json.dumps({"name": name, "suite": "bookworm", "build_id": build,
                                              "size_bytes": 10, "built": "2026-11-26T00:00:00Z", "owner": ALICE,
                                              "public": False}))


@root_only
def test_a_slices_image_copies_are_kept_while_a_node_boots_from_them(tmp_path):
    """Booting `snap` removed the copy of `snap-2` (its name starts the same), and replacing an image removed
    the copy a running node of the slice has under its root."""
    from authority.substrate.netns import NetnsDriver

    cat = ImageCatalogue(tmp_path / "images")
    _version(cat, "snap-2", "bbbbbbbb")
    _version(cat, "snap", "aaaaaaaa")
    driver = NetnsDriver("tq1", state_dir=tmp_path / "state", images=cat, uid_ranges_dir=tmp_path / "ranges")
    other = driver._lower(cat.get("snap-2"), 0)
    first = driver._lower(cat.get("snap"), 0)
    assert other.is_dir() and first.is_dir()
    node = driver.lxcpath / "tq1-node"
    node.mkdir(parents=True)
    (node / "lower").symlink_to(first)  # the image copy its root is made from (NodeContainer.mount_root)
    _version(cat, "snap", "cccccccc")  # alice replaced her image while the node runs on the first build
    second = driver._lower(cat.get("snap"), 0)
    assert second.is_dir() and first.is_dir() and other.is_dir()
    (node / "lower").unlink()  # that node is gone
    _version(cat, "snap", "dddddddd")
    driver._lower(cat.get("snap"), 0)
    assert not first.exists() and not second.exists() and other.is_dir()


@root_only
@pytest.mark.parametrize("can_exchange", [True, False])
def test_a_replacing_snapshot_publishes_the_new_image_whole_and_lists_it_once(tmp_path, monkeypatch, can_exchange):
    from authority.substrate import images

    if not can_exchange:  # a file system without RENAME_EXCHANGE: the old image is moved aside first
        monkeypatch.setattr(images, "exchange", lambda a, b: False)
    cat = ImageCatalogue(tmp_path / "images")
    _base(cat)
    cat.snapshot("snap", cat.get("debian-12"), _layer(tmp_path / "1"), OFFSET, ALICE, False, "first")
    cat.snapshot("snap", cat.get("debian-12"), _layer(tmp_path / "2"), OFFSET, ALICE, False, "second")
    assert [i.description for i in cat.list() if i.name == "snap"] == ["second"]
    assert sorted(p.name for p in cat.root.iterdir()) == [".lock", "debian-12", "snap"]


@root_only
def test_recover_finishes_what_a_cut_build_replacement_or_removal_left(tmp_path):
    cat = ImageCatalogue(tmp_path / "images")
    _base(cat)
    _user_image(cat, "kept", ALICE, False)
    for leftover, name in ((".build-kept-aaaaaa", "kept"), (".removed-gone-bbbbbb", "gone"),
                           (".replaced-kept-cccccc", "kept"), (".replaced-lost-dddddd", "lost")):
        _user_image(cat, leftover, ALICE, False)  # a whole image's files under the leftover's name
        (cat.root / leftover / "image.json").write_text(json.dumps({"name": name, "owner": ALICE}))
    assert [i.name for i in cat.list()] == ["debian-12", "kept"]  # a build in progress is not listed
    done = cat.recover()
    assert sorted(p.name for p in cat.root.iterdir()) == [".lock", "debian-12", "kept", "lost"], done
    assert cat.get("lost") is not None  # moved aside by a replacement whose new image never arrived
    assert stat.S_IMODE(cat.root.stat().st_mode) == 0o700
    assert cat.remove("lost") and cat.get("lost") is None and cat.recover() == []
