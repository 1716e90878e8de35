"""Delegation: an authority exports its substrate; the broker claims it; reclaim takes back what is not
promised and drains the rest."""

from datetime import UTC, datetime, timedelta

from broker.calendar import Calendar
from broker.delegation import claim, reclaim
from protocol.delegation import Delegation
from resources import export_substrate
from rspec.substrate import default_substrate
from slicex.term import Term

T0 = datetime(2030, 1, 1, tzinfo=UTC)
SUB = default_substrate("t.org")


def test_export_names_every_unit_the_planner_uses():
    d = export_substrate(SUB, "auth", "broker")
    h = next(h for h in SUB.hosts if not h.exclusive)
    cores = next(p for p in d.pools if p.name == f"core:{h.component_id}")
    assert cores.units[0] == f"core:{h.component_id}:0" and len(cores.units) == h.cores and cores.bin == h.component_id
    bare = next(h for h in SUB.hosts if h.exclusive)
    assert any(p.units == (f"node:{bare.component_id}",) for p in d.pools)
    sw = SUB.switches[0]
    labels = next(ls for ls in d.label_sets if ls.name == f"vlan:{sw.component_id}")
    assert labels.ranges == tuple(sw.vlan_range)
    assert Delegation.from_doc(d.to_doc()) == d


def test_claim_then_reclaim_free_and_drain_promised():
    d = export_substrate(SUB, "auth", "broker")
    cal = Calendar()
    claim(cal, d)
    h1, h2 = [h.component_id for h in SUB.hosts if not h.exclusive][:2]
    cal.book("t", [f"core:{h2}:0"], Term(T0, T0 + timedelta(hours=1)))
    done, busy = reclaim(cal, [f"core:{h1}", f"core:{h2}", "core:gone"], T0)
    assert done == [f"core:{h1}", "core:gone"] and busy == [f"core:{h2}"]
    assert f"core:{h1}" not in cal.pools and f"core:{h2}" in cal.draining
    assert cal.free_units(f"core:{h2}", Term(T0 + timedelta(hours=2), T0 + timedelta(hours=3))) == []
    cal.release("t")
    done, busy = reclaim(cal, [f"core:{h2}"], T0)
    assert done == [f"core:{h2}"] and busy == []


def test_a_promise_that_already_ended_does_not_block_a_reclaim():
    d = export_substrate(SUB, "auth", "broker")
    cal = Calendar()
    claim(cal, d)
    h = next(h for h in SUB.hosts if not h.exclusive).component_id
    cal.book("old", [f"core:{h}:0"], Term(T0, T0 + timedelta(hours=1)))
    assert reclaim(cal, [f"core:{h}"], T0 + timedelta(hours=2)) == ([f"core:{h}"], [])


def test_only_and_without_split_a_delegation():
    d = export_substrate(SUB, "auth", "broker")
    names = d.names()
    part = d.only(names[:2])
    assert part.names() == names[:2] and d.without(names[:2]).names() == names[2:]
    assert part.size == sum(len(p.units) for p in part.pools) + sum(ls.size for ls in part.label_sets)


def test_a_hosts_pools_are_its_own_and_not_those_of_a_host_whose_name_extends_it():
    """`slicex maintenance pc1` took the pools whose URN started with pc1's, so pc10 went too and pc1's
    interface bandwidth stayed in."""
    from rspec.substrate import substrate_from_dict

    sub = substrate_from_dict({"authority": "t.org", "switches": [{"name": "sw", "ports": [{"name": "p1"}]}],
                               "hosts": [{"name": "pc1", "interfaces": [{"name": "eth1", "switch_port": "sw:p1"}]},
                                         {"name": "pc10"}]})
    d = export_substrate(sub, "auth", "b")
    pc1 = sub.host("pc1")
    assert sorted(d.on(pc1.component_id)) == sorted(
        [f"core:{pc1.component_id}", f"mem:{pc1.component_id}", f"bw:{pc1.interfaces[0].component_id}"])
