"""*Unit*: an Update cannot change a kept node's datasets in place (slice_manager/update.py NODE_FIXED). Before,
a blockstore added to (or changed on) a kept node in the desired RSpec was ignored silently: the node kept what
it had mounted while the request said otherwise. Now BADARGS, as for its image; the same blockstore repeated is
no change."""

from __future__ import annotations

import pytest

from rspec.request import parse_request
from slice_manager import update as up
from slicex.errors import BadArgs
from tests.factories import request_rspec, vm

EMULAB = "http://www.protogeni.net/resources/rspec/ext/emulab/1"


def one(dataset: str | None) -> str:
    store = (f'<emulab:blockstore xmlns:emulab="{EMULAB}" name="bs" dataset="{dataset}" mountpoint="/data"/>'
             if dataset else "")
    return request_rspec([vm("n1", extra=store)])


def existing(xml: str) -> list[up.Existing]:
    return [up.Existing(f"s-{n.client_id}", n.client_id, "node", n) for n in parse_request(xml).nodes]


@pytest.mark.parametrize("before, after", [(None, "theirs"), ("mine", "theirs"), ("mine", None)])
def test_a_kept_nodes_blockstores_cannot_change_in_place(before, after):
    with pytest.raises(BadArgs, match="n1 cannot change blockstores"):
        up.diff(existing(one(before)), parse_request(one(after)))


def test_the_same_blockstore_again_is_no_change():
    assert up.diff(existing(one("mine")), parse_request(one("mine"))).empty
