"""The files stock geni-tools programs read from $SLICEX_HOME: the ssh key beside its `.pub` (readyToLogin.py
derives the private key's path from the omni config's `keys` by dropping `.pub`), and `omni-config --show`
leaving the omni config later omni runs use alone."""

from __future__ import annotations

import configparser
from pathlib import Path

import yaml

from cli.main import main
from slicex.devpki import add_user, init_ca
from slicex.home import Home

AUTHORITY = "slicex.test"


def _home(root: Path) -> Home:
    home = Home(root)
    (root / "slicex.yaml").write_text(yaml.safe_dump({"authority": AUTHORITY, "sa_port": 18500, "am_port": 18501}))
    init_ca(home, AUTHORITY)
    return home


def _omni_keys(text: str) -> str:
    cfg = configparser.RawConfigParser()
    cfg.read_string(text)
    return cfg[cfg["omni"]["users"]]["keys"]


def test_user_add_writes_the_private_key_where_ssh_tooling_looks_for_it(tmp_path: Path):
    home = _home(tmp_path)
    add_user(home, AUTHORITY, "alice")
    assert main(["--home", str(tmp_path), "omni-config", "--user", "alice"]) == 0
    pub = Path(_omni_keys(home.omni_config.read_text()))
    private = Path(str(pub).removesuffix(".pub"))  # what readyToLogin.py and ssh-keygen -y expect
    assert pub.exists() and private.exists()
    assert private.read_text().startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert home.user_ssh_key("alice") == private
    assert not (tmp_path / "alice-ssh.key").exists()


def test_a_home_made_before_keeps_its_key_under_the_old_name(tmp_path: Path):
    home = _home(tmp_path)
    add_user(home, AUTHORITY, "alice")
    home.user_ssh_private("alice").rename(tmp_path / "alice-ssh.key")  # as `slicex user add` wrote it before
    assert home.user_ssh_key("alice") == tmp_path / "alice-ssh.key"
    add_user(home, AUTHORITY, "alice")  # re-issued: the new pair only, no stale key under the old name
    assert home.user_ssh_key("alice") == tmp_path / "alice-ssh"
    assert not (tmp_path / "alice-ssh.key").exists()


def test_omni_config_show_prints_the_users_config_and_writes_nothing(tmp_path: Path, capsys):
    home = _home(tmp_path)
    for name in ("alice", "bob"):
        add_user(home, AUTHORITY, name)
    assert main(["--home", str(tmp_path), "omni-config"]) == 0
    alices = home.omni_config.read_text()
    capsys.readouterr()
    assert main(["--home", str(tmp_path), "omni-config", "--user", "bob", "--show"]) == 0
    shown = capsys.readouterr().out
    assert "users = bob" in shown and _omni_keys(shown).endswith("bob-ssh.pub")
    assert home.omni_config.read_text() == alices  # later omni runs stay alice's


def test_omni_config_show_for_chapi_writes_no_file(tmp_path: Path, capsys):
    home = _home(tmp_path)
    add_user(home, AUTHORITY, "bob")
    assert main(["--home", str(tmp_path), "omni-config", "--framework", "chapi", "--user", "bob", "--show"]) == 0
    assert "type = chapi" in capsys.readouterr().out
    assert not (tmp_path / "omni_config_chapi").exists()
