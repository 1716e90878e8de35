"""Names in a request that point at another slice's things, over mutual TLS on both deployments: bob's
request names alice's capture interface in a `measure:mirror`, mirrors a link under her link's name, and asks
for her link's VLAN tag; his Update of his own slice does the same. Each is refused (BADARGS for a mirror to
an interface his request does not declare, VLAN_UNAVAILABLE for her tag) or stays his own (his link "lan0" is
his segment, whatever hers is called), and alice's slice is unchanged. All were already so: regression guards
(the driver's side, mirrors keyed by slice and segment, is tests/unit/test_slice_measurement.py)."""

from __future__ import annotations

from lxml import etree

from rspec.namespaces import MEASURE
from tests.factories import RSPEC3, request_rspec, vm
from tests.integration.test_am_api import RSPEC_V3, code, ok

V3 = {"geni_rspec_version": RSPEC_V3}


def lan(to: str | None, vlantag: str = "", capture: bool = True) -> str:
    """Nodes a, b on link lan0 (tagged `vlantag` if given), a capture node cap (if `capture`), lan0 mirrored to
    `to` (if given)."""
    nodes = [vm("a", ifaces=["a:if0"]), vm("b", ifaces=["b:if0"])] + ([vm("cap", ifaces=["cap:if0"])] if capture
                                                                     else [])
    xml = request_rspec(nodes, [{"client_id": "lan0", "ifaces": ["a:if0", "b:if0"], "vlantag": vlantag}])
    if to:
        xml = xml.replace("</link>", f'<measure:mirror xmlns:measure="{MEASURE}" to="{to}"/></link>')
    return xml


def vlan_of(manifest: str, link: str) -> str:
    root = etree.fromstring(manifest.encode())
    el = [lk for lk in root.iter(f"{{{RSPEC3}}}link") if lk.get("client_id") == link][0]
    return el.get("vlantag") or ""


def test_a_request_cannot_mirror_to_or_take_the_vlan_of_another_slices_link(running):
    alice, bob = running.user("alice"), running.user("bob")
    urn, creds = alice.slice_credential("watched")
    mine = ok(alice.am.Allocate(urn, creds, lan("cap:if0"), {}))["geni_rspec"]
    before = ok(alice.am.Describe([urn], creds, V3))
    b_urn, b_creds = bob.slice_credential("watcher")

    # her capture interface, named in his mirror: not one of his request's interfaces
    refused = bob.am.Allocate(b_urn, b_creds, lan("cap:if0", capture=False), {})
    assert code(refused) == 1 and "which no node of the request declares" in refused["output"], refused
    # her link's VLAN tag, as her manifest shows it: held by her slice
    tag = vlan_of(mine, "lan0")
    assert tag, mine
    taken = bob.am.Allocate(b_urn, b_creds, lan(None, vlantag=tag, capture=False), {})
    assert code(taken) == 24 and tag in taken["output"], taken  # VLAN_UNAVAILABLE
    assert ok(bob.am.Describe([b_urn], b_creds, V3))["geni_slivers"] == []  # nothing was allocated for him

    # his own slice, his own link under her link's name and a capture node under hers: his segment, his copy
    his = ok(bob.am.Allocate(b_urn, b_creds, lan("cap:if0"), {}))["geni_rspec"]
    assert vlan_of(his, "lan0") != tag
    # and an Update of his slice naming her capture interface again is refused, his slice unchanged
    updated = bob.am.Update([b_urn], b_creds, lan("cap:if0", capture=False), {})
    assert code(updated) == 1 and "which no node of the request declares" in updated["output"], updated
    after = ok(alice.am.Describe([urn], creds, V3))
    assert [s["geni_sliver_urn"] for s in after["geni_slivers"]] == [s["geni_sliver_urn"]
                                                                    for s in before["geni_slivers"]]
    assert after["geni_rspec"] == before["geni_rspec"]
