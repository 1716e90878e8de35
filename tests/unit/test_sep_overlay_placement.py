"""Where the exchange point's overlay starts each testbed's router (federation/sep/overlay_netns.py): the
placement seam, read from overlay_options `where:` or named as `placement: "module:factory"`."""

from __future__ import annotations

import pytest

from federation.sep.overlay_netns import RouterPlace, StaticPlacement, load_placement
from slicex.errors import BadArgs


def test_a_named_testbed_runs_its_router_on_its_host_and_others_run_here():
    placement = load_placement({"where": {"A.test": {"run": ["nsenter", "--net=/run/netns/h1"],
                                                     "listen": "10.0.0.1:0", "advertise": "10.0.0.9"}}})
    a = placement.place("urn:publicid:IDN+a.test+authority+am")
    assert a == RouterPlace(("nsenter", "--net=/run/netns/h1"), "10.0.0.1:0", "10.0.0.9")
    assert a.argv() == ["--listen", "10.0.0.1:0", "--advertise", "10.0.0.9"]
    assert placement.place("b.test") == RouterPlace() and RouterPlace().argv() == []


@pytest.mark.parametrize("where, words", [
    ({"a.test": {"host": "x"}}, "unknown key.*host"),
    ({"a.test": {"run": "nsenter --net=/run/netns/h1"}}, "run must be a list"),
])
def test_a_malformed_placement_is_bad_args_naming_it(where, words):
    with pytest.raises(BadArgs, match=words):
        StaticPlacement(where)


def test_a_placement_factory_is_loaded_by_name_and_a_missing_one_is_bad_args():
    assert isinstance(load_placement({"placement": "federation.sep.overlay_netns:static_placement"}),
                      StaticPlacement)
    with pytest.raises(BadArgs, match="cannot be loaded"):
        load_placement({"placement": "federation.sep.overlay_netns:nowhere"})
