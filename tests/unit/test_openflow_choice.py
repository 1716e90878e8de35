"""The OpenFlow controller is the operator's choice (slicex.yaml `netns: {controller: ...}`): os-ken by default,
refused with the reason where it cannot be imported, never quietly replaced by ovs-ofctl. Nothing here touches
the host: the choice is made when the driver is built."""

from __future__ import annotations

import pytest

from authority.substrate import openflow
from authority.substrate.netns import NetnsDriver
from slicex.errors import BadArgs, Unsupported


def test_the_default_controller_is_os_ken(tmp_path):
    pytest.importorskip("os_ken", reason="os-ken is not installed here (pip install os-ken)")
    d = NetnsDriver("tq01", run_dir=tmp_path)
    assert d.flows.name == "os-ken" and "OpenFlow rules from os-ken" in d.description


def test_without_os_ken_the_default_is_refused_naming_the_other_choice(tmp_path, monkeypatch):
    monkeypatch.setattr(openflow, "osken_available", lambda: "ModuleNotFoundError: No module named 'os_ken'")
    with pytest.raises(Unsupported, match=r"os-ken controller cannot be imported.*No module named 'os_ken'"
                                          r".*controller: ovs-ofctl"):
        NetnsDriver("tq02", run_dir=tmp_path)
    with pytest.raises(Unsupported, match="os-ken"):
        NetnsDriver("tq02", run_dir=tmp_path, controller="os-ken")


def test_ovs_ofctl_is_used_only_when_chosen(tmp_path, monkeypatch):
    monkeypatch.setattr(openflow, "osken_available", lambda: "ModuleNotFoundError: No module named 'os_ken'")
    d = NetnsDriver("tq03", run_dir=tmp_path, controller="ovs-ofctl")
    assert d.flows.name == "ovs-ofctl" and "OpenFlow rules from ovs-ofctl" in d.description


@pytest.mark.parametrize("name", ["auto", "ryu", ""])
def test_an_unknown_controller_is_refused_with_the_choices(tmp_path, name):
    with pytest.raises(BadArgs, match="os-ken, ovs-ofctl"):
        NetnsDriver("tq04", run_dir=tmp_path, controller=name)
