"""ListResources advertises the node image catalogue as it is at the call (deployment.service.AdvertisedImages):
an image made public, or deleted, since the aggregate started is advertised, or gone, at once. Before, the
images were read once at the start and a public snapshot was advertised only after a restart."""

from __future__ import annotations

import json
from pathlib import Path

from authority.substrate.images import ImageCatalogue, offered_images
from deployment.service import AdvertisedImages
from rspec.substrate import default_substrate

AUTHORITY = "images.test"


def _image(root: Path, name: str, owner: str = "", public: bool = True) -> None:
    d = root / name
    (d / "rootfs").mkdir(parents=True)
    (d / "image.json").write_text(json.dumps({"name": name, "suite": "bookworm", "owner": owner, "public": public}))


def test_an_image_made_public_after_the_start_is_advertised_at_once_and_gone_once_deleted(tmp_path: Path):
    catalogue = ImageCatalogue(tmp_path)
    _image(tmp_path, "debian-12")
    substrate = default_substrate(AUTHORITY)
    live = AdvertisedImages(substrate, lambda: offered_images(catalogue, AUTHORITY, "debian-12"))
    first = live.substrate()
    assert [i.name for i in first.images] == ["debian-12"]
    assert live.substrate() is first  # unchanged images: the same object (the advertisement cache's key)

    _image(tmp_path, "mine", owner="urn:publicid:IDN+images.test+user+alice", public=False)
    assert live.substrate() is first  # a private image is never advertised
    _image(tmp_path, "shared", owner="urn:publicid:IDN+images.test+user+alice", public=True)
    now = live.substrate()
    assert [i.name for i in now.images] == ["debian-12", "shared"]
    assert now.hosts == substrate.hosts  # only the images differ

    (tmp_path / "shared" / "image.json").unlink()  # deleted (the catalogue no longer holds it)
    assert [i.name for i in live.substrate().images] == ["debian-12"]


def test_without_a_catalogue_the_started_substrate_is_advertised():
    substrate = default_substrate(AUTHORITY)
    assert AdvertisedImages(substrate, None).substrate() is substrate
