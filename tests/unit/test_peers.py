"""Federation peers: slicex.yaml `peers:` parsing (clear errors naming peer and key) and the pure policy
decision (slicex/peers.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from slicex import pki
from slicex.errors import Forbidden, OutOfRange, Refused
from slicex.peers import (
    Held,
    PeerConfigError,
    PeerGate,
    Usage,
    Wanted,
    decide,
    load_peers,
    parse_peer,
    peer_config,
    peer_of,
)

NOW = datetime(2030, 1, 1, 12, tzinfo=UTC)
AM_B = "urn:publicid:IDN+b.test+authority+am"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "peers").mkdir()
    (tmp_path / "peers" / "a.pem").write_bytes(pki.create_ca("a.test", "A CA")[0])
    (tmp_path / "peers" / "c.pem").write_bytes(pki.create_ca("c.test", "C CA")[0])
    return tmp_path


def peer(home: Path, **policy):
    return parse_peer("testbed-a", {"root": "peers/a.pem", "policy": policy}, home, "b.test")


def test_minimal_peer_takes_its_namespace_from_its_root(home: Path) -> None:
    p = parse_peer("testbed-a", {"root": "peers/a.pem"}, home, "b.test")
    assert p.namespaces == ("a.test",)
    assert p.root == home / "peers" / "a.pem"
    assert p.policy.aggregates == ("*",) and p.policy.max_slivers is None
    assert p.covers("urn:publicid:IDN+a.test+user+alice")
    assert p.covers("urn:publicid:IDN+A.TEST:proj+slice+s1")  # sub-authorities, case-insensitive
    assert not p.covers("urn:publicid:IDN+b.test+user+bob")
    assert not p.covers("urn:publicid:IDN+aa.test+user+x")


def test_round_trip_through_config(home: Path) -> None:
    raw = {"root": "peers/a.pem", "namespaces": ["a.test", "a2.test"], "trust_roots_url": "http://127.0.0.1:1/r.pem",
           "refresh_seconds": 60, "am_urls": {"urn:publicid:IDN+a.test+authority+am": "https://127.0.0.1:9/"},
           "policy": {"aggregates": [AM_B], "sliver_types": ["m1.small"], "max_lease_hours": 2,
                      "max_slivers": 3, "max_nodes": 2, "max_cores": 4}}
    p = parse_peer("testbed-a", raw, home, "b.test")
    assert parse_peer("testbed-a", peer_config(p, home), home, "b.test") == p
    assert peer_config(p, home)["root"] == "peers/a.pem"


@pytest.mark.parametrize("raw, words", [
    ({}, "peers.testbed-a.root: the path"),
    ({"root": "peers/missing.pem"}, "does not exist"),
    ({"root": "peers/a.pem", "colour": 1}, "unknown key(s) colour"),
    ({"root": "peers/a.pem", "namespace": "b.test"}, "overlaps this deployment's own namespace b.test"),
    ({"root": "peers/a.pem", "namespace": "b.test:site1"}, "overlaps"),
    ({"root": "peers/a.pem", "namespace": "a test"}, "peers.testbed-a.namespaces"),
    ({"root": "peers/a.pem", "namespace": "a.test", "namespaces": ["a.test"]}, "not both"),
    ({"root": "peers/a.pem", "trust_roots_url": "ftp://x"}, "peers.testbed-a.trust_roots_url"),
    ({"root": "peers/a.pem", "refresh_seconds": 0}, "refresh_seconds"),
    ({"root": "peers/a.pem", "policy": {"max_slivers": -1}}, "policy.max_slivers: a whole number"),
    ({"root": "peers/a.pem", "policy": {"max_cores": True}}, "policy.max_cores"),
    ({"root": "peers/a.pem", "policy": {"max_lease_hours": "long"}}, "policy.max_lease_hours"),
    ({"root": "peers/a.pem", "policy": {"aggregates": ["urn:publicid:IDN+b.test+node+pc1"]}}, "node URN"),
    ({"root": "peers/a.pem", "policy": {"aggregates": []}}, "policy.aggregates: a non-empty list"),
    ({"root": "peers/a.pem", "policy": {"quota": 1}}, "unknown key(s) quota"),
    ({"root": "peers/a.pem", "am_urls": {"urn:publicid:IDN+a.test+authority+am": "nope"}}, "am_urls"),
])
def test_config_mistakes_name_peer_and_key(home: Path, raw: dict, words: str) -> None:
    with pytest.raises(PeerConfigError) as err:
        parse_peer("testbed-a", raw, home, "b.test")
    assert words in err.value.message
    assert err.value.code == 1  # BADARGS, as other slicex.yaml mistakes


def test_bad_peer_name_and_root_without_authority(home: Path) -> None:
    with pytest.raises(PeerConfigError, match="not a peer name"):
        parse_peer("bad name", {"root": "peers/a.pem"}, home, "b.test")
    (home / "peers" / "junk.pem").write_text("not a certificate")
    with pytest.raises(PeerConfigError, match="holds no PEM certificate"):
        parse_peer("x", {"root": "peers/junk.pem"}, home, "b.test")
    with pytest.raises(PeerConfigError, match="holds no PEM certificate"):
        parse_peer("x", {"root": "peers/junk.pem", "namespace": "x.test"}, home, "b.test")


def test_peers_may_not_share_namespaces(home: Path) -> None:
    cfg = {"authority": "b.test", "peers": {"a": {"root": "peers/a.pem"},
                                            "c": {"root": "peers/c.pem", "namespace": "a.test:sub"}}}
    with pytest.raises(PeerConfigError, match="overlapping namespaces"):
        load_peers(cfg["peers"], cfg["authority"], home)
    assert load_peers(None, "b.test", home) == []
    with pytest.raises(PeerConfigError, match="a mapping of peer name"):
        load_peers(["a"], "b.test", home)


def test_peer_of_prefers_the_caller_then_the_slice(home: Path) -> None:
    a = peer(home)
    c = parse_peer("c", {"root": "peers/c.pem"}, home, "b.test")
    assert peer_of([a, c], "urn:publicid:IDN+c.test+user+u", "urn:publicid:IDN+a.test+slice+s") is c
    assert peer_of([a, c], "urn:publicid:IDN+b.test+user+u", "urn:publicid:IDN+a.test+slice+s") is a
    assert peer_of([a, c], "urn:publicid:IDN+b.test+user+u", "urn:publicid:IDN+b.test+slice+s") is None


def test_decide_allows_within_policy(home: Path) -> None:
    p = peer(home, aggregates=[AM_B], sliver_types=["m1.small"], max_lease_hours=2, max_slivers=3, max_nodes=2,
             max_cores=4)
    d = decide(p, "Allocate", AM_B, NOW, NOW + timedelta(hours=1), [Wanted("n1", "m1.small", 1)], links=1,
               usage=Usage(1, 1, 1))
    assert d.allowed and d.reason == ""


@pytest.mark.parametrize("policy, kwargs, rule, words", [
    ({"aggregates": ["urn:publicid:IDN+other.test+authority+am"]}, {}, "aggregates", f"may not use aggregate {AM_B}"),
    ({"sliver_types": ["m1.small"]}, {"nodes": [Wanted("n1", "raw-pc", 8)]}, "sliver_types",
     "node n1 asks for sliver type raw-pc; allowed: m1.small"),
    ({"max_lease_hours": 2}, {"end": NOW + timedelta(hours=3)}, "max_lease_hours", "at most 2 hours ahead"),
    ({"max_slivers": 2}, {"nodes": [Wanted("n1", "x", 1)], "links": 1, "usage": Usage(1, 1, 1)}, "max_slivers",
     "hold 1 slivers here and this request adds 2; at most 2"),
    ({"max_nodes": 1}, {"nodes": [Wanted("n1", "x", 1)], "usage": Usage(1, 1, 1)}, "max_nodes", "at most 1"),
    ({"max_cores": 4}, {"nodes": [Wanted("n1", "x", 2)], "usage": Usage(2, 2, 3)}, "max_cores",
     "hold 3 cores here and this request adds 2; at most 4"),
])
def test_decide_denies_naming_peer_and_rule(home: Path, policy: dict, kwargs: dict, rule: str, words: str) -> None:
    d = decide(peer(home, **policy), "Allocate", AM_B, NOW, **kwargs)
    assert not d.allowed and d.rule == rule
    assert d.reason.startswith("peer testbed-a: ") and words in d.reason and f"policy.{rule}" in d.reason


def test_quotas_count_only_new_slivers_at_allocate(home: Path) -> None:
    p = peer(home, max_slivers=1)
    assert decide(p, "Provision", AM_B, NOW, NOW + timedelta(hours=1), usage=Usage(5, 5, 5)).allowed
    assert decide(p, "Renew", AM_B, NOW, NOW + timedelta(hours=1), usage=Usage(5, 5, 5)).allowed
    assert not decide(p, "Allocate", AM_B, NOW, nodes=[Wanted("n", "x", 1)], usage=Usage(1, 1, 1)).allowed


class _Req:
    def __init__(self, nodes: int, links: int = 0):
        self.nodes = [object()] * nodes
        self.links = [object()] * links


def test_gate_maps_rules_to_geni_errors_and_leaves_locals_alone(home: Path) -> None:
    p = peer(home, sliver_types=["default-vm"], max_lease_hours=1, max_nodes=2)
    held = [Held("urn:publicid:IDN+a.test+user+u1", "urn:publicid:IDN+a.test+slice+s1", "node", 1),
            Held("urn:publicid:IDN+b.test+user+local", "urn:publicid:IDN+a.test+slice+s2", "link"),
            Held("urn:publicid:IDN+b.test+user+local", "urn:publicid:IDN+b.test+slice+s3", "node", 4)]
    asked: list[Wanted] = []
    gate = PeerGate(lambda: [p], AM_B, lambda peer: held, lambda req: asked)
    assert gate.usage(p) == Usage(2, 1, 1)
    user, slice_ = "urn:publicid:IDN+a.test+user+u2", "urn:publicid:IDN+a.test+slice+s4"
    asked[:] = [Wanted("n1", "default-vm", 1)]
    gate.admit("Allocate", user, slice_, NOW, NOW + timedelta(minutes=10), _Req(1))
    asked[:] = [Wanted("n1", "default-vm", 1), Wanted("n2", "default-vm", 1)]
    with pytest.raises(Refused, match="peer testbed-a: its users hold 1 nodes"):
        gate.admit("Allocate", user, slice_, NOW, NOW + timedelta(minutes=10), _Req(2))
    asked[:] = [Wanted("n1", "raw-pc", 8)]
    with pytest.raises(Forbidden, match="sliver type raw-pc"):
        gate.admit("Allocate", user, slice_, NOW, NOW + timedelta(minutes=10), _Req(1))
    with pytest.raises(OutOfRange, match="max_lease_hours"):
        gate.admit("Renew", user, slice_, NOW, NOW + timedelta(hours=2))
    # a local user on a local slice: no peer policy at all
    asked[:] = [Wanted("n1", "raw-pc", 8)] * 5
    gate.admit("Allocate", "urn:publicid:IDN+b.test+user+local", "urn:publicid:IDN+b.test+slice+x", NOW,
               NOW + timedelta(days=20), _Req(5))


def test_a_default_end_is_cut_to_the_peers_maximum_an_asked_one_refused(home: Path) -> None:
    gate = PeerGate(lambda: [peer(home, max_lease_hours=2)], AM_B, lambda peer: [], lambda req: [])
    user, slice_ = "urn:publicid:IDN+a.test+user+u", "urn:publicid:IDN+a.test+slice+s"
    far = NOW + timedelta(days=1)
    assert gate.admit("Provision", user, slice_, NOW, far, asked=False) == NOW + timedelta(hours=2)
    with pytest.raises(OutOfRange):
        gate.admit("Provision", user, slice_, NOW, far, asked=True)
    local = "urn:publicid:IDN+b.test+user+u"
    assert gate.admit("Provision", local, "urn:publicid:IDN+b.test+slice+s", NOW, far, asked=False) == far
