"""slicex.yaml as one typed model (slicex/config.py): defaults in one place, mistakes refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from slicex.config import ConfigError, SlicexConfig, load_config, parse_config, reference, reference_table
from slicex.home import Home


def test_an_empty_file_gives_every_default():
    cfg = parse_config({})
    assert (cfg.authority, cfg.host, cfg.sa_port, cfg.am_port, cfg.broker_port, cfg.authority_port) == \
        ("slicex.local", "127.0.0.1", 8000, 8001, 8002, 8003)
    assert cfg.am.allocation_lifetime_minutes == 10 and cfg.sa.max_slice_lifetime_days == 60
    assert cfg.substrate_driver == "emulated" and cfg.netns.pids_max == 1024 and cfg.scs is None
    assert cfg.dashboard_port == 8004 and cfg.tick_seconds == 1.0 and cfg.gil_switch_interval_ms == 1.0


def test_a_section_set_in_part_keeps_the_defaults_of_the_rest():
    cfg = parse_config({"am": {"max_lease_days": 3}, "netns": {"controller": "ovs-ofctl"}})
    assert cfg.am.max_lease_days == 3 and cfg.am.default_lease_hours == 24
    assert cfg.netns.controller == "ovs-ofctl" and cfg.netns.install_max_mb == 256


def test_an_unknown_top_level_key_is_refused_with_the_nearest_known_one():
    with pytest.raises(ConfigError, match=r"slicex.yaml: unknown key 'am_prot' \(did you mean 'am_port'\?\)"):
        parse_config({"am_prot": 9001})


def test_an_unknown_nested_key_is_refused_naming_its_path():
    with pytest.raises(ConfigError, match=r"unknown key 'netns.swtich_dir' \(did you mean 'switch_dir'\?\)"):
        parse_config({"netns": {"swtich_dir": "/run/ovs"}})
    with pytest.raises(ConfigError, match=r"unknown key 'quotas.users.default.coers' \(did you mean 'cores'\?\)"):
        parse_config({"quotas": {"users": {"default": {"coers": 4}}}})
    with pytest.raises(ConfigError, match=r"unknown key 'scs.hots'"):
        parse_config({"scs": {"topology": "t.yaml", "hots": "0.0.0.0"}})


def test_a_key_with_nothing_near_it_lists_the_keys_of_its_section():
    with pytest.raises(ConfigError, match=r"unknown key 'sa.zzz' \(known here: slice_lifetime_days, "):
        parse_config({"sa": {"zzz": 1}})


@pytest.mark.parametrize(("doc", "key", "expected"), [
    ({"am_port": "eighty"}, "am_port", "valid integer"),
    ({"am": {"max_lease_days": "long"}}, "am.max_lease_days", "valid number"),
    ({"substrate_driver": "xen"}, "substrate_driver", "'emulated', 'netns' or 'openstack'"),
    ({"operators": "urn:x"}, "operators", "valid list"),
    ({"dashboard_tls": "maybe"}, "dashboard_tls", "valid boolean"),
    ({"quotas": {"users": {"default": {"cores": -1}}}}, "quotas.users.default.cores", "greater than or equal to 0"),
])
def test_a_wrong_type_is_refused_naming_the_key_and_the_type_expected(doc, key, expected):
    with pytest.raises(ConfigError) as refused:
        parse_config(doc)
    assert f"'{key}'" in refused.value.message and expected in refused.value.message
    assert "\n" not in refused.value.message


def test_the_scs_section_needs_its_topology():
    with pytest.raises(ConfigError, match="'scs.topology' is required"):
        parse_config({"scs": {"port": 8081}})


def test_ports_derived_unless_set():
    assert parse_config({}).am_v2_endpoint_port() == 8006 and parse_config({}).chapi_endpoint_port() == 8007
    assert parse_config({"am_v2_port": None}).am_v2_endpoint_port() is None  # null: no v2 endpoint
    assert parse_config({"am_port": 0, "sa_port": 0}).am_v2_endpoint_port() == 0
    assert parse_config({"am_port": 0, "sa_port": 0}).chapi_endpoint_port() == 0
    assert parse_config({"am_v2_port": 9000, "chapi_port": 9001}).chapi_endpoint_port() == 9001


def test_empty_sections_written_as_null_read_as_empty():
    cfg = parse_config({"netns": None, "operators": None, "substrate_driver": None, "peers": None})
    assert cfg.netns.pids_max == 1024 and cfg.operators == [] and cfg.substrate_driver == "emulated"


def test_a_new_home_writes_a_file_the_model_reads_back(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("SLICEX_STORE", raising=False)
    home = Home(tmp_path)
    home.write_default_config(authority="a.test", am_port=9001)
    written = yaml.safe_load(home.config_file.read_text())
    assert written["authority"] == "a.test" and written["am"]["max_lease_days"] == 30
    assert "am_v2_port" not in written  # left out: derived from am_port, as before
    cfg = home.config()
    assert cfg.am_port == 9001 and cfg.am_v2_endpoint_port() == 9006
    assert cfg.store == f"sqlite:///{tmp_path / 'state.db'}"


def test_keys_written_by_up_are_part_of_the_model(tmp_path: Path):
    path = tmp_path / "slicex.yaml"
    path.write_text("deployment_id: 0123abcd\ndeployment_stores: [sqlite:///x/state.db]\nsubstrate_driver: netns\n")
    cfg = load_config(path)
    assert cfg.deployment_id == "0123abcd" and cfg.deployment_stores == ["sqlite:///x/state.db"]
    assert cfg.deployment_key(tmp_path) == "0123abcd"


def test_slicex_store_overrides_the_file(tmp_path: Path, monkeypatch):
    (tmp_path / "slicex.yaml").write_text("store: sqlite:///elsewhere.db\n")
    monkeypatch.setenv("SLICEX_STORE", "redis://127.0.0.1:6379/2")
    assert Home(tmp_path).config().store == "redis://127.0.0.1:6379/2"


def test_a_file_that_is_not_a_mapping_is_refused(tmp_path: Path):
    path = tmp_path / "slicex.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="expected key: value pairs"):
        load_config(path)
    path.write_text("am: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


def test_the_configuration_is_read_only_once_loaded():
    with pytest.raises(Exception, match="frozen"):
        parse_config({}).am_port = 1  # type: ignore[misc]


def test_the_reference_lists_every_key_with_a_description():
    rows = {key: (kind, default, what) for key, kind, default, what in reference()}
    assert set(SlicexConfig.model_fields) <= set(rows)
    assert rows["netns.switch_dir"][2] and rows["am.max_lease_days"][1] == "30"
    assert all(what for _key, _kind, _default, what in reference())


def test_the_operator_guide_carries_the_reference_as_the_model_makes_it():
    guide = (Path(__file__).parents[2] / "docs" / "operator-guide.md").read_text()
    assert reference_table() in guide, "regenerate: python -c 'from slicex.config import reference_table; " \
                                       "print(reference_table())'"


def test_a_key_slicex_records_replaces_a_block_list_whole_and_keeps_the_rest(tmp_path: Path):
    """`slicex up` records `deployment_stores`; written by a YAML tool (or an operator) as a block list, the
    old items stayed behind the new line and the next `up` refused slicex.yaml as not valid YAML."""
    from cli.main import _record_config

    home = Home(tmp_path)
    home.config_file.write_text("# the operator's comment\nauthority: x.test\ndeployment_stores:\n- sqlite:///a.db\n"
                                "- sqlite:///b.db\nam:\n  max_lease_days: 3\n")
    _record_config(home, "deployment_stores", ["sqlite:///c.db"])
    text = home.config_file.read_text()
    assert text.startswith("# the operator's comment\n")
    assert yaml.safe_load(text) == {"authority": "x.test", "deployment_stores": ["sqlite:///c.db"],
                                    "am": {"max_lease_days": 3}}
    _record_config(home, "am", {"max_lease_days": 4})  # a nested block replaced whole too
    assert yaml.safe_load(home.config_file.read_text())["am"] == {"max_lease_days": 4}
