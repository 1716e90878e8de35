"""slicex.yaml `public_hostname`: the DNS name a deployment is reached by, apart from the address it listens on
(`host`). `slicex ca init --public-hostname` names the AM after it (URN and certificate, as Fed4FIRE asks of an
aggregate), a home that sets it later gets its AM certificate issued again with the name, and the omni configs
slicex writes point at it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from cryptography import x509

from cli.main import main
from slicex import pki
from slicex.config import ConfigError, parse_config
from slicex.devpki import ACTOR_ROLES, actor_files, add_user, ensure_actor_identities, init_ca
from slicex.home import Home

NAME = "am.testbed.example.org"


def dns_names(path: Path) -> list[str]:
    cert = pki.load_cert(path.read_bytes())
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName)


def test_public_hostname_is_what_urls_carry_and_host_is_where_it_listens():
    assert parse_config({}).public_hostname is None
    assert parse_config({"host": "0.0.0.0"}).advertised_host() == "0.0.0.0"
    cfg = parse_config({"host": "0.0.0.0", "public_hostname": "AM.Testbed.Example.org."})
    assert (cfg.host, cfg.public_hostname, cfg.advertised_host()) == ("0.0.0.0", NAME, NAME)


@pytest.mark.parametrize("bad", ["localhost", "127.0.0.1", "https://am.example.org/", "am.example.org:8001",
                                 "am example.org", ""])
def test_a_loopback_or_malformed_public_hostname_is_refused_naming_the_key(bad):
    with pytest.raises(ConfigError, match="public_hostname"):
        parse_config({"public_hostname": bad})


def test_ca_init_with_a_public_hostname_names_the_am_after_it(tmp_path: Path):
    assert main(["--home", str(tmp_path), "ca", "init", "--public-hostname", NAME]) == 0
    home = Home(tmp_path)
    cfg = home.config()
    assert (cfg.public_hostname, cfg.authority, cfg.host) == (NAME, NAME, "127.0.0.1")
    am = pki.load_cert(home.am_cert.read_bytes())
    assert pki.cert_urn(am) == f"urn:publicid:IDN+{NAME}+authority+am"  # the URN Fed4FIRE expects
    assert dns_names(home.am_cert) == [NAME]
    assert [role for role in ACTOR_ROLES if dns_names(actor_files(home, role)[0])] == ["am"]  # only it is reached so


def test_ca_init_keeps_an_authority_given_beside_the_hostname(tmp_path: Path):
    assert main(["--home", str(tmp_path), "ca", "init", "--authority", "testbed.example.org",
                 "--public-hostname", NAME]) == 0
    cfg = Home(tmp_path).config()
    assert (cfg.authority, cfg.public_hostname) == ("testbed.example.org", NAME)
    assert dns_names(Home(tmp_path).am_cert) == [NAME]


def test_a_home_that_sets_the_name_later_gets_its_am_certificate_again_with_the_same_key(tmp_path: Path):
    home = Home(tmp_path)
    (tmp_path / "slicex.yaml").write_text(yaml.safe_dump({"authority": "slicex.test"}))
    init_ca(home, "slicex.test")
    assert dns_names(home.am_cert) == []
    others = {p: p.read_bytes() for role in ACTOR_ROLES if role != "am" for p in actor_files(home, role)}
    key = home.am_key.read_bytes()
    assert ensure_actor_identities(home, "slicex.test") == []  # nothing to do without the name
    (tmp_path / "slicex.yaml").write_text(yaml.safe_dump({"authority": "slicex.test", "public_hostname": NAME}))
    assert ensure_actor_identities(home, "slicex.test") == [home.am_cert, home.am_key]  # what `slicex up` runs
    assert dns_names(home.am_cert) == [NAME] and home.am_key.read_bytes() == key
    assert pki.cert_urn(pki.load_cert(home.am_cert.read_bytes())) == "urn:publicid:IDN+slicex.test+authority+am"
    assert {p: p.read_bytes() for p in others} == others
    assert ensure_actor_identities(home, "slicex.test") == []


def test_ca_init_refuses_a_different_hostname_on_an_existing_config(tmp_path: Path, capsys):
    (tmp_path / "slicex.yaml").write_text(yaml.safe_dump({"authority": "slicex.test"}))
    assert main(["--home", str(tmp_path), "ca", "init", "--public-hostname", NAME]) == 2
    assert "set public_hostname there" in capsys.readouterr().err


def test_omni_configs_point_at_the_public_hostname(tmp_path: Path, capsys):
    home = Home(tmp_path)
    (tmp_path / "slicex.yaml").write_text(yaml.safe_dump({"authority": "slicex.test", "sa_port": 18600,
                                                          "am_port": 18601, "public_hostname": NAME}))
    init_ca(home, "slicex.test")
    add_user(home, "slicex.test", "alice")
    assert main(["--home", str(tmp_path), "omni-config", "--show"]) == 0
    gcf = capsys.readouterr().out
    assert f"ch = https://{NAME}:18600/" in gcf and f",https://{NAME}:18601/" in gcf and "127.0.0.1" not in gcf
    assert main(["--home", str(tmp_path), "omni-config", "--framework", "chapi", "--show"]) == 0
    chapi = capsys.readouterr().out
    assert f"https://{NAME}:18607" in chapi and "127.0.0.1" not in chapi
