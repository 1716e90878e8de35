"""The exchange point trusts the home's federation peers as the home's aggregate does: each peer's root bound
to the namespaces slicex.yaml binds it to, not to whatever its own URN names.

Home H (authority fed:h) has two peers: A, whose root names the whole federation (`fed`) in its own URN and
which H binds to `fed:a`, and B (`fed:b`). `slicex sep init` is run as an operator would, `--trust`ing the
peers' roots as well. A user and slice authority that A's CA mints in B's namespace, or in H's, are refused by
the exchange point (CREDENTIAL_SIGNER_UNTRUSTED, 23) before anything is relayed; A's genuine user in `fed:a`
gets through (to an aggregate that does not answer: nothing is relayed anywhere in this file). Over real
mutual TLS on 127.0.0.1, no aggregate running."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from federation.sep.config import load_config
from federation.sep.sdk import speaks_for_credential
from federation.sep.server import SepServer
from slicex import pki
from slicex.credentials import create_credential
from slicex.devpki import add_user, init_ca
from slicex.home import Home
from slicex.tls_xmlrpc import client
from tests.integration.test_cli_processes import slicex
from tests.ports import free_ports

RSPEC3 = "http://www.geni.net/resources/rspec/3"


def home(root: Path, authority: str) -> Home:
    h = Home(root)
    root.mkdir(parents=True)
    (root / "slicex.yaml").write_text(yaml.safe_dump({"authority": authority, "sa_port": 0, "am_port": 0}))
    init_ca(h, authority)
    return h


def minted(ca: Home, tmp: Path, authority: str, user: str) -> tuple[Path, Path, str, str]:
    """With `ca`'s CA key: a user and a slice authority in `authority`'s namespace and a slice credential that
    slice authority signs for the user (cert file, key file, slice URN, credential)."""
    ca_pem, ca_key = ca.ca_cert.read_bytes(), ca.ca_key.read_bytes()
    sa, sa_key = pki.issue_certificate(ca_pem, ca_key, f"urn:publicid:IDN+{authority}+authority+sa", "sa", is_ca=True)
    cert, key = pki.issue_certificate(ca_pem, ca_key, f"urn:publicid:IDN+{authority}+user+{user}", user)
    slice_urn = f"urn:publicid:IDN+{authority}+slice+s{user}"
    target, _ = pki.issue_certificate(sa, sa_key, slice_urn, "s")
    (tmp / f"{user}-cert.pem").write_bytes(cert)
    pki.write_key(tmp / f"{user}-key.pem", key)
    cred = create_credential(owner_cert=cert, target_cert=target, privileges={"*": True},
                             expires=datetime.now(UTC) + timedelta(days=1), signer_cert_chain=[sa, ca_pem],
                             signer_key_pem=sa_key)
    return tmp / f"{user}-cert.pem", tmp / f"{user}-key.pem", slice_urn, cred


@pytest.fixture(scope="module")
def sep(tmp_path_factory):
    root: Path = tmp_path_factory.mktemp("seppeers")
    h = home(root / "h", "fed:h")
    add_user(h, "fed:h", "alice")
    peers = {"a": home(root / "a", "fed"), "b": home(root / "b", "fed:b")}  # A's root names all of `fed`
    (h.root / "peers").mkdir()
    for name, peer in peers.items():
        (h.root / "peers" / f"testbed-{name}.pem").write_bytes(peer.ca_cert.read_bytes())
    cfg = yaml.safe_load(h.config_file.read_text())
    cfg["peers"] = {f"testbed-{n}": {"root": f"peers/testbed-{n}.pem", "namespaces": [f"fed:{n}"]} for n in peers}
    h.config_file.write_text(yaml.safe_dump(cfg))
    dead = free_ports(1)[0]  # the aggregate: nothing listens, so a call that gets through is answered 11
    sep_yaml = root / "sep" / "sep.yaml"
    init = slicex(h.root, "sep", "init", "--config", str(sep_yaml), "--port", "0",
                  "--aggregate", f"urn:publicid:IDN+fed:h+authority+am=https://127.0.0.1:{dead}/",
                  *(a for n in peers for a in ("--trust", str(h.root / "peers" / f"testbed-{n}.pem"))))
    assert init.returncode == 0, init.stdout + init.stderr
    server = SepServer(load_config(sep_yaml))
    server.start()
    try:
        yield {"server": server, "yaml": sep_yaml, "peers": peers, "tmp": root}
    finally:
        server.stop()


def allocate(sep, cert: Path, key: Path, slice_urn: str, cred: str) -> dict:
    speaks = speaks_for_credential(str(cert), str(key), (sep["yaml"].parent / "sep-cert.pem").read_bytes())
    rspec = f"""<rspec xmlns="{RSPEC3}" type="request"><node client_id="n1"
      component_manager_id="urn:publicid:IDN+fed:h+authority+am" exclusive="false"/></rspec>"""
    return client(sep["server"].url, str(cert), str(key)).Allocate(
        slice_urn, [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": cred}, speaks], rspec, {})


def test_sep_yaml_binds_each_peer_root_to_the_namespaces_the_home_binds_it_to(sep):
    cfg = yaml.safe_load(sep["yaml"].read_text())
    assert cfg["trusted_root_namespaces"] == {"peer-testbed-a.pem": ["fed:a"], "peer-testbed-b.pem": ["fed:b"]}
    names = {p.name for p in (sep["yaml"].parent / "trusted_roots").iterdir()}
    # a peer's root --trust'ed again is recognised, not copied beside it bound to its own URN's authority
    assert {"peer-testbed-a.pem", "peer-testbed-b.pem"} <= names and not names & {"testbed-a.pem", "testbed-b.pem"}


@pytest.mark.parametrize("namespace", ["fed:b", "fed:h"])
def test_a_peer_root_minting_for_another_peers_or_the_homes_namespace_is_refused(sep, namespace):
    """A's root names `fed`; bound by that alone (what `--trust` did), it vouched at the exchange point for
    B's users and H's own, and the exchange point relayed their calls."""
    cert, key, slice_urn, cred = minted(sep["peers"]["a"], sep["tmp"], namespace, f"mallory{namespace[-1]}")
    out = allocate(sep, cert, key, slice_urn, cred)
    assert out["code"]["geni_code"] == 23, out
    assert "outside the namespace" in out["output"] and "fed:a" in out["output"], out["output"]


def test_a_peer_root_vouches_for_its_own_namespace(sep):
    cert, key, slice_urn, cred = minted(sep["peers"]["a"], sep["tmp"], "fed:a", "amy")
    out = allocate(sep, cert, key, slice_urn, cred)
    assert out["code"]["geni_code"] == 11 and "did not answer" in out["output"], out  # relayed: nobody answers
