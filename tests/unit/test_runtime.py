"""Process settings of a slicex server, from slicex.yaml."""

from __future__ import annotations

import sys

import pytest

from slicex.config import parse_config
from slicex.errors import BadArgs
from slicex.runtime import tune_process


def test_the_switch_interval_defaults_to_one_millisecond_and_is_applied():
    before = sys.getswitchinterval()
    try:
        tune_process(parse_config({}))
        assert sys.getswitchinterval() == pytest.approx(0.001)
        tune_process(parse_config({"gil_switch_interval_ms": "2.5"}))
        assert sys.getswitchinterval() == pytest.approx(0.0025)
    finally:
        sys.setswitchinterval(before)


@pytest.mark.parametrize("bad", [0, -1, 101, "fast", None, [1]])
def test_a_bad_switch_interval_names_the_key(bad):
    with pytest.raises(BadArgs, match="gil_switch_interval_ms"):
        parse_config({"gil_switch_interval_ms": bad})  # refused as slicex.yaml is read
