"""What stock geni-tools programs read from slicex, over mutual TLS as they call it: omni's gcf framework's
ListAggregates, readyToLogin.py's node readiness in the manifest, renewSliceAndSlivers.py's v2 RenewSliver
output, and a slice credential delegated with delegateSliceCred.py (which omni labels `geni_unknown`)."""

from __future__ import annotations

from datetime import timedelta

from lxml import etree

from slicex.clock import parse_time, rfc3339
from slicex.credentials import create_credential
from slicex.tls_xmlrpc import client
from tests.factories import RSPEC3, request_rspec, vm
from tests.integration.conftest import AUTHORITY, Running, User
from tests.integration.test_am_api import code, ok

RSPEC_V3 = {"type": "GENI", "version": "3"}
SLIVER_INFO_EXT = "http://groups.geni.net/exogeni/attachment/wiki/RspecExtensions/sliver-info/1"  # readyToLogin.py's


def test_list_aggregates_answers_urn_url_pairs_as_gcfs_clearinghouse(running: Running):
    """omni's gcf framework does `for (urn, url) in sites`: a struct {urn: url} made it fail."""
    listed = running.user("alice").sa.ListAggregates()
    assert listed == [[f"urn:publicid:IDN+{AUTHORITY}+authority+am", running.deployment.endpoints.am_url]]


def _node_states(manifest: str) -> dict[str, tuple[str | None, list[dict]]]:
    """What readyToLogin.py reads per node: the geni_sliver_info state and the login elements."""
    out = {}
    for node in etree.fromstring(manifest.encode()).iter(f"{{{RSPEC3}}}node"):
        infos = node.findall(f"{{{SLIVER_INFO_EXT}}}geni_sliver_info")
        assert len(infos) <= 1
        logins = [dict(lg.attrib) for lg in node.iterfind(f"{{{RSPEC3}}}services/{{{RSPEC3}}}login")]
        out[node.get("client_id")] = (infos[0].get("state") if infos else None, logins)
    return out


def test_manifest_says_each_node_is_ready_where_ready_to_login_reads_it(running: Running):
    alice = running.user("alice")
    urn, creds = alice.slice_credential("ready")
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("n1"), vm("n2")]), {}))
    users = [{"urn": alice.urn, "keys": ["ssh-rsa AAAA alice@test"]}]
    provisioned = ok(alice.am.Provision([urn], creds, {"geni_users": users}))
    before = _node_states(provisioned["geni_rspec"])
    assert {state for state, _ in before.values()} == {"notready"}
    ok(alice.am.PerformOperationalAction([urn], creds, "geni_start", {}))
    running.clock.advance(timedelta(seconds=10))
    assert {s["geni_operational_status"] for s in ok(alice.am.Status([urn], creds, {}))["geni_slivers"]} \
        == {"geni_ready"}
    after = _node_states(ok(alice.am.Describe([urn], creds, {"geni_rspec_version": RSPEC_V3}))["geni_rspec"])
    assert set(after) == {"n1", "n2"}
    for state, logins in after.values():
        assert state == "ready"
        assert logins and {"username", "hostname", "port"} <= logins[0].keys() and logins[0]["username"] == "alice"


def test_v2_renew_sliver_as_long_as_possible_answers_the_new_expiration(running: Running):
    """omni parses a time from `output` after geni_extend_alap and records it: it must be the one granted."""
    alice = running.user("alice")
    v2 = client(running.deployment.endpoints.am_v2_url, str(alice.cert), str(alice.key))
    urn, creds = alice.slice_credential("alap")
    xml = [c["geni_value"] for c in creds]
    ok(v2.CreateSliver(urn, xml, request_rspec([vm("n1")]), [{"urn": alice.urn, "keys": []}], {}))
    asked = running.clock.now() + timedelta(days=365)
    renewed = v2.RenewSliver(urn, xml, rfc3339(asked), {"geni_extend_alap": True})
    assert ok(renewed) is True
    granted = parse_time(renewed["output"])
    assert running.clock.now() < granted < asked
    assert parse_time(ok(v2.SliverStatus(urn, xml, {}))["geni_expires"]) == granted
    exact = running.clock.now() + timedelta(hours=2)
    assert parse_time(v2.RenewSliver(urn, xml, rfc3339(exact), {})["output"]) == exact


def delegate(owner: User, slice_cred: str, to: User, privileges: dict[str, bool] | None = None) -> str:
    """`owner` delegates their slice credential to `to`, signed with the owner's own key (delegateSliceCred.py)."""
    parsed = etree.fromstring(slice_cred.split("?>", 1)[-1].encode())
    return create_credential(owner_cert=to.cert.read_bytes(), target_cert=parsed.findtext("credential/target_gid").encode(),
                             privileges=privileges or {"*": True},
                             expires=parse_time(parsed.findtext("credential/expires")) - timedelta(minutes=1),
                             signer_cert_chain=[owner.cert.read_bytes()], signer_key_pem=owner.key.read_bytes(),
                             parent=slice_cred)


def as_omni_labels(xml: str) -> list[dict]:
    """omni labels a credential with two <type> elements (a delegation's and its parent's) geni_unknown 0."""
    return [{"geni_type": "geni_unknown", "geni_version": "0", "geni_value": xml}]


def test_a_slice_credential_delegated_as_delegate_slice_cred_does_is_accepted_under_omnis_label(running: Running):
    alice, bob = running.user("alice"), running.user("bob")
    urn, creds = alice.slice_credential("shared")
    allocated = ok(alice.am.Allocate(urn, creds, request_rspec([vm("n1")]), {}))
    delegated = as_omni_labels(delegate(alice, creds[0]["geni_value"], bob))
    described = ok(bob.am.Describe([urn], delegated, {"geni_rspec_version": RSPEC_V3}))
    assert [s["geni_sliver_urn"] for s in described["geni_slivers"]] == \
        [s["geni_sliver_urn"] for s in allocated["geni_slivers"]]
    sliver = allocated["geni_slivers"][0]["geni_sliver_urn"]  # slivers named alone: the credential names the slice
    assert [s["geni_sliver_urn"] for s in ok(bob.am.Status([sliver], delegated, {}))["geni_slivers"]] == [sliver]
    assert code(alice.am.Describe([urn], delegated, {"geni_rspec_version": RSPEC_V3})) != 0  # bob's, not alice's
