"""The lab's pure plan (lab/plan.py): addresses, point-to-point links, routes along the fewest fibres, a NAT
that lets its inside out and nothing in, and descriptions it refuses with the reason."""

from __future__ import annotations

import pytest

from lab.plan import Fibre, LabSpec, LabSpecError, Nat, default_network, line, plan


def test_hosts_take_the_low_addresses_and_the_operator_the_top_of_the_network():
    p = plan(line("ab", hosts=3, network="10.230.0.0/16"))
    assert [(h.name, h.address, h.namespace) for h in p.hosts] == [
        ("h1", "10.230.0.1", "sxlab-ab-h1"), ("h2", "10.230.0.2", "sxlab-ab-h2"), ("h3", "10.230.0.3", "sxlab-ab-h3")]
    assert p.operator_address == "10.230.255.254"
    assert p.mgmt_links == (("sxlab-h1", "h1"), ("sxlab-h2", "h2"), ("sxlab-h3", "h3"))


def test_routes_follow_the_fewest_fibres():
    p = plan(line("ab", hosts=3, network="10.230.0.0/16"))
    assert p.host("h1").routes == (("10.230.0.3", "10.230.0.2"),)  # h3 via h2; h2 is a neighbour
    assert p.host("h2").routes == ()
    assert [(link.ifname, link.peer_address) for link in p.host("h2").links] == [
        ("mgmt", "10.230.255.254"), ("f-h1", "10.230.0.1"), ("f-h3", "10.230.0.3")]


def test_a_nat_lets_its_inside_out_and_nothing_in():
    p = plan(line("ab", hosts=2, nat=True, network="10.230.0.0/16"))
    h1, h2, nat = p.host("h1"), p.host("h2"), p.host("nat")
    assert h1.routes == (("10.230.0.2", "10.230.0.3"),)  # h1 reaches h2 through the NAT
    assert h2.routes == ()  # h2 reaches the NAT host (a neighbour) and no host behind it
    assert (nat.nat_inside, nat.nat_outside) == (("f-h1",), ("f-h2",))


def test_a_nat_does_not_route_outside_hosts_through_to_a_second_outside_fibre_from_inside_only():
    spec = LabSpec("ab", ("a", "n", "b", "c"), (Fibre("a", "n"), Fibre("n", "b"), Fibre("n", "c")),
                   (Nat("n", ("a",)),), "10.230.0.0/16")
    p = plan(spec)
    assert dict(p.host("b").routes) == {}  # b reaches n; n forwards nothing that came from outside
    assert dict(p.host("a").routes) == {"10.230.0.3": "10.230.0.2", "10.230.0.4": "10.230.0.2"}


def test_a_shaped_fibre_shapes_both_ends():
    p = plan(line("ab", hosts=2, rate_mbit=1000))
    ends = [link for h in p.hosts for link in h.links if link.ifname.startswith("f-")]
    assert len(ends) == 2 and all(link.tbf and link.tbf[:2] == ("tbf", "rate") for link in ends)
    assert all(link.tbf is None for h in p.hosts for link in h.links if link.ifname == "mgmt")


def test_the_default_network_is_chosen_by_the_name_and_stable():
    assert line("ab").network == default_network("ab") == line("ab").network
    assert default_network("ab").startswith("10.") and default_network("ab").endswith(".0.0/16")


def test_the_document_form_round_trips():
    spec = line("ab", hosts=2, rate_mbit=250, nat=True)
    assert LabSpec.from_document(spec.document()) == spec


@pytest.mark.parametrize("doc, words", [
    ({"name": "toolong", "hosts": ["a"]}, "lab name"),
    ({"name": "ab", "hosts": ["a", "a"]}, "repeat"),
    ({"name": "ab", "hosts": ["Bad"]}, "host name"),
    ({"name": "ab", "hosts": ["a", "b"], "fibres": [["a", "c"]]}, "does not have"),
    ({"name": "ab", "hosts": ["a"], "fibres": [["a", "a"]]}, "itself"),
    ({"name": "ab", "hosts": ["a", "b"], "fibres": [["a", "b"], ["b", "a"]]}, "two fibres"),
    ({"name": "ab", "hosts": ["a", "b"], "fibres": [["a", "b", 0]]}, "outside"),
    ({"name": "ab", "hosts": ["a", "b"], "fibres": [["a", "b"]], "nats": {"b": ["a"]}}, "needs at least one outside"),
    ({"name": "ab", "hosts": ["a", "b", "c"], "fibres": [["a", "b"]], "nats": {"b": ["c"]}}, "no fibre joins"),
    ({"name": "ab", "hosts": ["a"], "network": "10.1.2.0/24"}, "/16"),
    ({"name": "ab", "hosts": ["a"], "colour": "red"}, "unknown keys"),
    ({"hosts": ["a"]}, "malformed"),
])
def test_a_description_that_cannot_be_realised_is_refused_with_the_reason(doc, words):
    with pytest.raises(LabSpecError, match=words):
        LabSpec.from_document(doc)
