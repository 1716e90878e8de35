"""Nodes' login relays take their ports from the operator's `netns.login_ports` ranges (a firewall opens
those), as public ports come from the substrate's `public_ports`; without the setting, any free port. An
invalid range is refused naming the key."""

from __future__ import annotations

import socket

import pytest

from authority.substrate.login import LoginRelay, free_port_in
from deployment.service import host_driver
from slicex.config import ConfigError, parse_config
from slicex.errors import ServerError
from slicex.home import Home
from tests.ports import free_ports


def test_login_ports_are_ranges_or_single_ports():
    cfg = parse_config({"netns": {"login_ports": ["30100-30199", 30000]}})
    assert cfg.netns.login_port_ranges() == ((30000, 30000), (30100, 30199))
    assert parse_config({}).netns.login_port_ranges() == ()  # unset: any free port


@pytest.mark.parametrize(("value", "why"), [
    (["3000-20"], "within 1-65535, low first"), (["0-10"], "within 1-65535"), (["70000"], "within 1-65535"),
    (["ssh"], "not a port or a LOW-HIGH range"), (["30000-30099", "30050-30060"], "overlaps 30000-30099")])
def test_an_invalid_login_port_range_is_refused_naming_the_key(value, why):
    with pytest.raises(ConfigError, match=f"netns.login_ports.*{why}"):
        parse_config({"netns": {"login_ports": value}})


def test_the_first_free_port_of_the_ranges_is_taken_and_a_full_range_says_so():
    a, b = free_ports(2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", a))
        taken.listen(1)
        assert free_port_in("127.0.0.1", ((a, a), (b, b)), "node n1: no login port") == b
        with pytest.raises(ServerError, match=f"node n1: no login port: every port of netns.login_ports \\({a}\\)"):
            free_port_in("127.0.0.1", ((a, a),), "node n1: no login port")


def test_a_new_login_relay_listens_in_the_range(tmp_path):
    (port,) = free_ports(1)
    relay = LoginRelay(tmp_path, "slicex-no-such-netns", "n1", "127.0.0.1", ((port, port),))
    try:
        assert relay.ensure_forward(None) == port  # (its relay process finds no namespace and exits)
    finally:
        relay.remove()


def test_the_netns_driver_is_given_the_configured_ranges(tmp_path):
    cfg = parse_config({"substrate_driver": "netns", "netns": {"login_ports": ["30000-30009"]}})
    assert host_driver(cfg, Home(tmp_path)).login_ports == ((30000, 30009),)
