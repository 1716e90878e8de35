"""The omni configs `slicex omni-config` writes: framework chapi names CH, SA and MA and the project rule."""

from __future__ import annotations

import configparser
from pathlib import Path

from slicex.home import Home
from slicex.omniconfig import render, render_chapi


def parsed(text: str) -> configparser.RawConfigParser:
    cfg = configparser.RawConfigParser()
    cfg.read_string(text)
    return cfg


def test_chapi_config_names_the_three_services_and_the_default_project(tmp_path: Path):
    home = Home(tmp_path)
    cfg = parsed(render_chapi(home, "alice", "slicex.test", "https://h:8007/", "https://h:8001/", "proj1"))
    fw = cfg["slicex"]
    assert fw["type"] == "chapi" and fw["authority"] == "slicex.test"
    assert (fw["ch"], fw["sa"], fw["ma"]) == ("https://h:8007/CH", "https://h:8007/SA", "https://h:8007/MA")
    assert fw["default_project"] == "proj1" and "useprojects" not in fw
    assert cfg["omni"]["default_cf"] == "slicex" and cfg["omni"]["users"] == "alice"
    assert cfg["alice"]["urn"] == "urn:publicid:IDN+slicex.test+user+alice"
    assert cfg["aggregate_nicknames"]["slicex"] == "urn:publicid:IDN+slicex.test+authority+am,https://h:8001/"


def test_chapi_config_without_a_project_turns_projects_off(tmp_path: Path):
    cfg = parsed(render_chapi(Home(tmp_path), "bob", "slicex.test", "https://h:8007", "https://h:8001/", None))
    assert cfg["slicex"]["useprojects"] == "false" and "default_project" not in cfg["slicex"]


def test_gcf_config_is_unchanged(tmp_path: Path):
    fw = parsed(render(Home(tmp_path), "alice", "slicex.test", "https://h:8000/", "https://h:8001/"))["slicex"]
    assert fw["type"] == "gcf" and fw["ch"] == fw["sa"] == "https://h:8000/"
