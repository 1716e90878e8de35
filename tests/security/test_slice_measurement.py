"""Per-slice measurement (Describe with slicex_measurement) is the slice's members' alone, over mutual TLS on
both deployments: the member reads its slice's counters; a valid user without the slice's credential, with
his own slice's credential or with forged credentials for it reads nothing; and a member of one slice sees
only that slice's nodes."""

from __future__ import annotations

from slicex import pki
from slicex.credentials import parse_credential
from tests.factories import request_rspec, vm
from tests.integration.test_am_api import RSPEC_V3, code, ok
from tests.security.attacks import ATTACKS, Attacker

MEASURE = {"geni_rspec_version": RSPEC_V3, "slicex_measurement": True}


def _sfa(xml: str) -> list[dict]:
    return [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": xml}]


def test_only_the_slices_members_read_its_counters(running):
    alice, bob = running.user("alice"), running.user("bob")
    urn, creds = alice.slice_credential("measured")
    ok(alice.am.Allocate(urn, creds, request_rspec([vm("meter-one"), vm("meter-two")]), {}))
    b_urn, b_creds = bob.slice_credential("bobs-measured")
    ok(bob.am.Allocate(b_urn, b_creds, request_rspec([vm("b1")]), {}))

    mine = ok(alice.am.Describe([urn], creds, MEASURE))["slicex_measurement"]
    assert set(mine["nodes"]) == {"meter-one", "meter-two"}
    assert "slicex_measurement" not in ok(alice.am.Describe([urn], creds, {"geni_rspec_version": RSPEC_V3}))
    assert set(ok(bob.am.Describe([b_urn], b_creds, MEASURE))["slicex_measurement"]["nodes"]) == {"b1"}

    refused = {
        "no credential of the slice (his user credential)": bob.am.Describe([urn], bob.user_credential(), MEASURE),
        "no credential at all": bob.am.Describe([urn], [], MEASURE),
        "another slice's credential": bob.am.Describe([urn], b_creds, MEASURE),
    }
    victim_cert = parse_credential(creds[0]["geni_value"]).target_gid[0].public_bytes(pki.serialization.Encoding.PEM)
    chain = [running.home.sa_cert.read_bytes(), running.home.ca_cert.read_bytes()]
    attacker = Attacker(bob.cert.read_bytes(), bob.key.read_bytes(), b_creds[0]["geni_value"], urn, victim_cert,
                        chain)
    for name in ("self_signed_as_user", "self_signed_with_sa_certificate", "wrap_in_forged_parent",
                 "keyinfo_substituted"):
        refused[f"forged: {name}"] = bob.am.Describe([urn], _sfa(ATTACKS[name](attacker)), MEASURE)
    for what, reply in refused.items():
        assert code(reply) != 0, (what, reply)
        assert not reply["value"], (what, reply)  # nothing of the slice, its counters least of all
        assert "meter-one" not in str(reply), (what, reply)  # a name no hex digest contains by chance
    forged = {w: code(r) for w, r in refused.items() if w.startswith("forged")}
    assert set(forged.values()) == {20}, forged  # CREDENTIAL_INVALID
