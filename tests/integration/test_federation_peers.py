"""Federation peers end to end: three slicex testbeds on 127.0.0.1, each with its own CA and namespace
(a.test, b.test, c.test), real TLS. B trusts A as a peer with a policy; nobody trusts C.

A user of A allocates at B with the slice credential A's slice authority gave them, within B's policy for A;
outside it (sliver type, lease, quota) B refuses naming the peer and the rule; a credential A's root minted
for B's namespace (or C's) is refused; C's user is refused; speaks-for works across testbeds; B refreshes A's
root from A's CH API (get_trust_roots) and keeps the last good one when a fetch fails."""

from __future__ import annotations

import ssl
import xmlrpc.client
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from slicex import pki
from slicex.clock import rfc3339
from slicex.credentials import create_credential
from slicex.devpki import add_user, init_ca
from slicex.home import Home
from slicex.peers import parse_peer
from slicex.speaksfor import create_speaks_for
from slicex.tls_xmlrpc import client
from slicex.trust_roots import PeerTrust
from tests.factories import request_rspec, vm
from tests.integration.conftest import Running, start, stop

RSPEC_V3 = {"type": "GENI", "version": "3"}
POLICY = {"sliver_types": ["default-vm", "m1.small"], "max_lease_hours": 2, "max_slivers": 3, "max_nodes": 2,
          "max_cores": 2}


def ok(reply: dict) -> object:
    assert reply["code"]["geni_code"] == 0, reply.get("output")
    return reply["value"]


def refused(reply: dict, code: int, *words: str) -> str:
    assert reply["code"]["geni_code"] == code, reply.get("output")
    for w in words:
        assert w in reply["output"], reply["output"]
    return reply["output"]


@dataclass
class Member:
    """A user of one testbed: their files, and clients to any URL with their certificate."""

    urn: str
    cert: Path
    key: Path

    def to(self, url: str) -> xmlrpc.client.ServerProxy:
        return client(url, str(self.cert), str(self.key))

    def slice_credential(self, tb: Bed, name: str) -> tuple[str, list[dict]]:
        """A slice at the user's home slice authority, and the credential it gives for it."""
        urn = f"urn:publicid:IDN+{tb.authority}+slice+{name}"
        return urn, [{"geni_type": "geni_sfa", "geni_version": "3",
                      "geni_value": self.to(tb.running.deployment.endpoints.sa_url).CreateSlice(urn)}]


@dataclass
class Bed:
    authority: str
    home: Home
    running: Running | None = None

    def member(self, name: str) -> Member:
        return Member(f"urn:publicid:IDN+{self.authority}+user+{name}", self.home.user_cert(name),
                      self.home.user_key(name))

    @property
    def am_url(self) -> str:
        return self.running.deployment.endpoints.am_url

    @property
    def am_urn(self) -> str:
        return f"urn:publicid:IDN+{self.authority}+authority+am"


def make(root: Path, authority: str, users: tuple[str, ...], **config) -> Bed:
    home = Home(root)
    root.mkdir(parents=True)
    cfg = {"authority": authority, "sa_port": 0, "am_port": 0, "tick_seconds": 0.05, "dashboard_port": None,
           **config}
    (root / "slicex.yaml").write_text(yaml.safe_dump(cfg))
    init_ca(home, authority)
    for u in users:
        add_user(home, authority, u)
    return Bed(authority, home)


def configure(tb: Bed, **extra) -> None:
    path = tb.home.config_file
    path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), **extra}))


def give_root(source: Bed, to: Bed, name: str) -> str:
    """What `slicex ca export-root` hands over, put where `slicex peer add` puts it."""
    target = to.home.root / "peers" / f"{name}.pem"
    target.parent.mkdir(exist_ok=True)
    target.write_bytes(source.home.ca_cert.read_bytes())
    return f"peers/{name}.pem"


@pytest.fixture(scope="module")
def fed(tmp_path_factory) -> Iterator[dict[str, Bed]]:
    root = tmp_path_factory.mktemp("federation")
    a = make(root / "a", "a.test", ("alice", "tool"))
    b = make(root / "b", "b.test", ("bob", "btool"))
    c = make(root / "c", "c.test", ("carol",))
    # A trusts B (so B's aggregate may call A's CH API for get_trust_roots); B trusts A with a policy
    configure(a, peers={"testbed-b": {"root": give_root(b, a, "testbed-b")}})
    a.running = start(a.home)
    chapi_url = f"{a.running.deployment.chapi.url}/CH"
    configure(b, peers={"testbed-a": {"root": give_root(a, b, "testbed-a"), "namespaces": ["a.test"],
                                      "ch_url": chapi_url, "refresh_seconds": 3600, "policy": POLICY}})
    b.running = start(b.home)
    c.running = start(c.home)
    yield {"a": a, "b": b, "c": c}
    for tb in (c, b, a):
        stop(tb.running)


def test_peer_user_allocates_at_b_with_a_credentials(fed) -> None:
    a, b = fed["a"], fed["b"]
    alice = a.member("alice")
    urn, creds = alice.slice_credential(a, "fed1")
    am = alice.to(b.am_url)
    value = ok(am.Allocate(urn, creds, request_rspec([vm("n1"), vm("n2", sliver_type="m1.small")]), {}))
    assert len(value["geni_slivers"]) == 2
    assert all(s["geni_sliver_urn"].startswith("urn:publicid:IDN+b.test+sliver+") for s in value["geni_slivers"])
    # Provision without an end: B's default lease (24 h) is cut to A's maximum (2 h), not refused
    now = b.running.clock.now()
    provisioned = ok(am.Provision([urn], creds, {"geni_rspec_version": RSPEC_V3}))
    ends = {s["geni_expires"] for s in provisioned["geni_slivers"]}
    assert ends == {rfc3339(now + timedelta(hours=2))}
    ok(am.Renew([urn], creds, rfc3339(now + timedelta(hours=1)), {}))
    # renewing as long as possible past A's maximum is cut to it, and says so
    reply = am.Renew([urn], creds, rfc3339(now + timedelta(hours=5)), {"geni_extend_alap": True})
    assert {s["geni_expires"] for s in ok(reply)} == {rfc3339(now + timedelta(hours=2))}
    assert "the latest the peer policy allows" in reply["output"]
    status = ok(am.Status([urn], creds, {}))
    assert status["geni_urn"] == urn and len(status["geni_slivers"]) == 2
    ok(am.Delete([urn], creds, {}))


def test_outside_bs_policy_for_a_is_refused_with_the_rule(fed) -> None:
    a, b = fed["a"], fed["b"]
    alice, bob = a.member("alice"), b.member("bob")
    am = alice.to(b.am_url)
    urn, creds = alice.slice_credential(a, "fed2")
    now = b.running.clock.now()
    # a sliver type A's users may not use: FORBIDDEN, naming the peer and the rule
    out = refused(am.Allocate(urn, creds, request_rspec([{"client_id": "bm", "sliver_type": "raw-pc"}]), {}),
                  3, "peer testbed-a", "raw-pc", "policy.sliver_types")
    assert "m1.small" in out
    refused(am.Allocate(urn, creds, request_rspec([vm("big", sliver_type="m1.large")]), {}), 3, "policy.sliver_types")
    # a lease longer than A's maximum: OUTOFRANGE, at Provision and at Renew
    ok(am.Allocate(urn, creds, request_rspec([vm("n1")]), {}))
    refused(am.Provision([urn], creds, {"geni_rspec_version": RSPEC_V3,
                                        "geni_end_time": rfc3339(now + timedelta(hours=3))}),
            19, "peer testbed-a", "policy.max_lease_hours", "at most 2 hours ahead")
    ok(am.Provision([urn], creds, {"geni_rspec_version": RSPEC_V3,
                                   "geni_end_time": rfc3339(now + timedelta(hours=1))}))
    refused(am.Renew([urn], creds, rfc3339(now + timedelta(hours=5)), {}), 19, "policy.max_lease_hours")
    # quotas count every A user's live slivers here: 1 node held; 2 more nodes would pass max_nodes 2
    urn2, creds2 = alice.slice_credential(a, "fed3")
    refused(am.Allocate(urn2, creds2, request_rspec([vm("x1"), vm("x2")]), {}), 7, "peer testbed-a",
            "hold 1 nodes here and this request adds 2", "policy.max_nodes")
    ok(am.Allocate(urn2, creds2, request_rspec([vm("x1")]), {}))
    refused(am.Allocate(urn2, creds2, request_rspec([vm("x3")]), {}), 7, "policy.max_nodes")
    ok(am.Delete([urn2], creds2, {}))
    ok(am.Allocate(urn2, creds2, request_rspec([vm("x3")]), {}))  # freed by the Delete
    ok(am.Delete([urn2], creds2, {}))
    ok(am.Delete([urn], creds, {}))
    # B's own users are untouched by A's policy: bare metal, three nodes, a day's lease
    burn, bcreds = bob.slice_credential(b, "local1")
    bam = bob.to(b.am_url)
    ok(bam.Allocate(burn, bcreds, request_rspec([{"client_id": "bm", "sliver_type": "raw-pc"}, vm("v1"),
                                                 vm("v2")]), {}))
    ok(bam.Provision([burn], bcreds, {"geni_rspec_version": RSPEC_V3,
                                      "geni_end_time": rfc3339(now + timedelta(hours=20))}))
    ok(bam.Delete([burn], bcreds, {}))


def _forge(a: Bed, tmp: Path, authority: str, slice_name: str, user: str) -> tuple[Member, str, str]:
    """With A's CA key: a user and a slice authority named in `authority`'s namespace, and a slice credential
    that slice authority signs for that user: everything a rogue peer root could mint."""
    ca, ca_key = a.home.ca_cert.read_bytes(), a.home.ca_key.read_bytes()
    sa, sa_key = pki.issue_certificate(ca, ca_key, f"urn:publicid:IDN+{authority}+authority+sa", "forged sa",
                                       is_ca=True)
    cert, key = pki.issue_certificate(ca, ca_key, f"urn:publicid:IDN+{authority}+user+{user}", user)
    slice_urn = f"urn:publicid:IDN+{authority}+slice+{slice_name}"
    target, _ = pki.issue_certificate(sa, sa_key, slice_urn, slice_name)
    (tmp / f"{user}-cert.pem").write_bytes(cert)
    pki.write_key(tmp / f"{user}-key.pem", key)
    cred = create_credential(owner_cert=cert, target_cert=target, privileges={"*": True},
                             expires=a.running.clock.now() + timedelta(days=1), signer_cert_chain=[sa, ca],
                             signer_key_pem=sa_key)
    return Member(f"urn:publicid:IDN+{authority}+user+{user}", tmp / f"{user}-cert.pem", tmp / f"{user}-key.pem"), \
        slice_urn, cred


def test_credential_minted_by_a_root_for_b_namespace_is_refused(fed, tmp_path: Path) -> None:
    a, b = fed["a"], fed["b"]
    for authority in ("b.test", "c.test"):  # ours, and a third testbed's
        mallory, slice_urn, cred = _forge(a, tmp_path, authority, "stolen", f"mallory-{authority[0]}")
        creds = [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": cred}]
        out = refused(mallory.to(b.am_url).Allocate(slice_urn, creds, request_rspec([vm("n1")]), {}), 23,
                      "outside the namespace")
        assert "a.test" in out
    # A's genuine slice authority signing for a slice in B's namespace, for A's genuine user: also refused
    alice = a.member("alice")
    slice_urn = "urn:publicid:IDN+b.test+slice+hijack"
    target, _ = pki.issue_certificate(a.home.sa_cert.read_bytes(), a.home.sa_key.read_bytes(), slice_urn, "hijack")
    cred = create_credential(owner_cert=alice.cert.read_bytes(), target_cert=target, privileges={"*": True},
                             expires=a.running.clock.now() + timedelta(days=1),
                             signer_cert_chain=[a.home.sa_cert.read_bytes()], signer_key_pem=a.home.sa_key.read_bytes())
    refused(alice.to(b.am_url).Allocate(slice_urn, [{"geni_type": "geni_sfa", "geni_version": "3",
                                                     "geni_value": cred}], request_rspec([vm("n1")]), {}),
            23, "may not issue credentials for", "outside its namespace a.test")
    assert b.running.deployment.sm.slivers(slice_urn, b.running.clock.now()) == []


def test_user_of_a_testbed_b_does_not_trust_is_refused(fed) -> None:
    b, c = fed["b"], fed["c"]
    carol = c.member("carol")
    urn, creds = carol.slice_credential(c, "outsider")
    ok(carol.to(c.am_url).Allocate(urn, creds, request_rspec([vm("n1")]), {}))  # fine at home
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):  # B's TLS does not know C's root
        carol.to(b.am_url).Allocate(urn, creds, request_rspec([vm("n1")]), {})
    # and through a tool B does trust (B's own), speaking for carol: her statement chains to no root B has
    tool = b.member("btool")
    statement = create_speaks_for(carol.cert.read_bytes(), carol.key.read_bytes(), tool.cert.read_bytes(),
                                  b.running.clock.now() + timedelta(hours=1))
    abac = [{"geni_type": "geni_abac", "geni_version": "1", "geni_value": statement}]
    refused(tool.to(b.am_url).Allocate(urn, creds + abac, request_rspec([vm("n1")]),
                                       {"geni_speaking_for": carol.urn}), 23, "does not chain to a root")


def test_speaks_for_across_testbeds(fed) -> None:
    a, b = fed["a"], fed["b"]
    now = b.running.clock.now()
    # A's tool speaks for B's user bob at B: both roots trusted, the statement signed by bob
    tool, bob = a.member("tool"), b.member("bob")
    urn, creds = bob.slice_credential(b, "spoken")
    statement = create_speaks_for(bob.cert.read_bytes(), bob.key.read_bytes(), tool.cert.read_bytes(),
                                  now + timedelta(hours=1))
    abac = [{"geni_type": "geni_abac", "geni_version": "1", "geni_value": statement}]
    am = tool.to(b.am_url)
    ok(am.Allocate(urn, creds + abac, request_rspec([{"client_id": "bm", "sliver_type": "raw-pc"}]),
                   {"geni_speaking_for": bob.urn}))  # bob is local: A's policy does not apply
    refused(am.Status([urn], creds, {}), 22)  # without speaks-for the tool is not bob
    ok(am.Delete([urn], creds + abac, {"geni_speaking_for": bob.urn}))
    # B's tool speaks for A's alice at B: alice's policy (A's) applies to what the tool does for her
    btool, alice = b.member("btool"), a.member("alice")
    aurn, acreds = alice.slice_credential(a, "spoken-a")
    statement = create_speaks_for(alice.cert.read_bytes(), alice.key.read_bytes(), btool.cert.read_bytes(),
                                  now + timedelta(hours=1))
    abac = [{"geni_type": "geni_abac", "geni_version": "1", "geni_value": statement}]
    bam = btool.to(b.am_url)
    options = {"geni_speaking_for": alice.urn}
    refused(bam.Allocate(aurn, acreds + abac, request_rspec([{"client_id": "bm", "sliver_type": "raw-pc"}]), options),
            3, "peer testbed-a", "policy.sliver_types")
    ok(bam.Allocate(aurn, acreds + abac, request_rspec([vm("n1")]), options))
    ok(bam.Delete([aurn], acreds + abac, options))
    # a statement signed by the tool rather than by alice does not make the tool alice
    forged = create_speaks_for(alice.cert.read_bytes(), btool.key.read_bytes(), btool.cert.read_bytes(),
                               now + timedelta(hours=1))
    out = bam.Allocate(aurn, acreds + [{"geni_type": "geni_abac", "geni_version": "1", "geni_value": forged}],
                       request_rspec([vm("n1")]), options)
    assert out["code"]["geni_code"] in (20, 22), out["output"]


def test_b_refreshes_a_root_from_a_ch_api_and_keeps_the_last_good(fed, caplog) -> None:
    a, b, c = fed["a"], fed["b"], fed["c"]
    trust: PeerTrust = b.running.deployment.peer_trust
    peer = trust.peers[0]
    assert peer.name == "testbed-a" and peer.ch_url
    a_root = pki.load_cert(a.home.ca_cert.read_bytes())
    trust.refresh(peer)  # get_trust_roots over mutual TLS, B's aggregate the client, pinned to A's root
    assert trust.last_error.get("testbed-a") == "", trust.last_error
    assert trust.current["testbed-a"] == [a_root]
    # a CH API that is not A's (C's: its certificate chains to C's root) is not believed: logged, last good kept
    impostor = parse_peer("testbed-a", {"root": str(b.home.root / "peers" / "testbed-a.pem"), "ch_url":
                                        f"{c.running.deployment.chapi.url}/CH"}, b.home.root, "b.test")
    store = pki.TrustStore(certs=[pki.load_cert(b.home.ca_cert.read_bytes())])
    other = PeerTrust([impostor], store, (str(b.home.am_cert), str(b.home.am_key)))
    assert other.refresh(impostor) is False
    assert "fetching" in other.last_error["testbed-a"] and other.current["testbed-a"] == [a_root]
    # A's users still work at B after all this
    alice = a.member("alice")
    urn, creds = alice.slice_credential(a, "after-refresh")
    ok(alice.to(b.am_url).Allocate(urn, creds, request_rspec([vm("n1")]), {}))
    ok(alice.to(b.am_url).Delete([urn], creds, {}))
