"""The inventory calendar: bookings of a unit never overlap in time; advance reservations; label sets."""

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.calendar import Calendar, CalendarError, common_free_labels
from protocol.delegation import LabelSet, Pool
from slicex.term import Term

T0 = datetime(2030, 1, 1, tzinfo=UTC)
H = timedelta(hours=1)


def term(a: float, b: float) -> Term:
    return Term(T0 + a * H, T0 + b * H)


def calendar(n: int = 4) -> Calendar:
    cal = Calendar()
    cal.add_pool(Pool("core:pc1", "core", tuple(f"core:pc1:{i}" for i in range(n)), "pc1"))
    cal.add_label_set(LabelSet("vlan:sw1", ((100, 103),)))
    cal.add_label_set(LabelSet("vlan:sw2", ((102, 110),)))
    return cal


def test_a_unit_is_promised_once_at_a_time_but_again_after():
    cal = calendar()
    cal.book("t1", ["core:pc1:0"], term(0, 2))
    with pytest.raises(CalendarError, match=r"core:pc1:0 is promised to someone else \(t1\)"):
        cal.book("t2", ["core:pc1:0"], term(1, 3))
    cal.book("t2", ["core:pc1:0"], term(2, 3))  # back to back is fine: terms are half-open
    assert cal.free_units("core:pc1", term(0, 3)) == ["core:pc1:1", "core:pc1:2", "core:pc1:3"]
    assert cal.free_units("core:pc1", term(3, 4), limit=2) == ["core:pc1:0", "core:pc1:1"]


def test_advance_reservation_blocks_only_its_term():
    cal = calendar(1)
    cal.book("later", ["core:pc1:0"], term(5, 6))
    assert cal.free_units("core:pc1", term(0, 5)) == ["core:pc1:0"]
    assert cal.free_units("core:pc1", term(0, 5.5)) == []
    cal.book("now", ["core:pc1:0"], term(0, 5))
    with pytest.raises(CalendarError, match="promised to someone else"):
        cal.extend("now", T0 + 5.5 * H)  # would run into the advance reservation
    assert cal.extend("now", T0 + 4 * H).term == term(0, 4)  # shortening always works


def test_release_and_expiry_free_units():
    cal = calendar(2)
    cal.book("a", ["core:pc1:0", "core:pc1:1"], term(0, 1))
    assert cal.free_count("core:pc1", term(0, 1)) == 0
    assert cal.release("a").units == {"core:pc1:0", "core:pc1:1"}
    assert cal.free_count("core:pc1", term(0, 1)) == 2 and cal.release("a") is None
    cal.book("b", ["core:pc1:0"], term(0, 1))
    assert [b.holder for b in cal.expire(T0 + H)] == ["b"] and cal.bookings == {}


def test_units_outside_the_inventory_and_draining_pools_are_refused():
    cal = calendar()
    with pytest.raises(CalendarError, match="not in the inventory"):
        cal.book("t", ["core:pc9:0"], term(0, 1))
    with pytest.raises(CalendarError, match="not in the inventory"):
        cal.book("t", ["vlan:sw1:99"], term(0, 1))  # outside the delegated range
    cal.draining.add("core:pc1")
    with pytest.raises(CalendarError, match="being reclaimed"):
        cal.book("t", ["core:pc1:0"], term(0, 1))
    assert cal.free_units("core:pc1", term(0, 1)) == []


def test_labels_common_to_several_sets():
    cal = calendar()
    assert common_free_labels(cal, ["vlan:sw1", "vlan:sw2"], term(0, 1)) == [102, 103]
    cal.book("t", ["vlan:sw2:102"], term(0, 1))
    assert common_free_labels(cal, ["vlan:sw1", "vlan:sw2"], term(0, 1)) == [103]
    assert common_free_labels(cal, ["vlan:sw1", "vlan:sw2"], term(1, 2)) == [102, 103]
    assert cal.owner_name("vlan:sw2:102") == "vlan:sw2" and cal.owner_name("vlan:sw2:1") is None


def test_promised_and_unavailable():
    cal = calendar()
    cal.book("t", ["core:pc1:1"], term(3, 4))
    assert cal.promised("core:pc1", T0) == ["core:pc1:1"] and cal.promised("core:pc1", T0 + 4 * H) == []
    assert cal.unavailable(term(0, 1)) == set() and cal.unavailable(term(0, 3.5)) == {"core:pc1:1"}
    cal.draining.add("vlan:sw1")
    assert {f"vlan:sw1:{t}" for t in range(100, 104)} <= cal.unavailable(term(0, 1))


def test_a_pool_cannot_shrink_under_a_promise():
    cal = calendar(2)
    cal.book("t", ["core:pc1:1"], term(0, 1))
    with pytest.raises(CalendarError, match="promised"):
        cal.add_pool(Pool("core:pc1", "core", ("core:pc1:0",), "pc1"))
    with pytest.raises(CalendarError, match="still promised"):
        cal.remove("core:pc1")
    cal.release("t")
    cal.remove("core:pc1")
    assert "core:pc1" not in cal.pools


OPS = st.lists(st.tuples(st.sampled_from(["book", "extend", "release"]), st.integers(0, 5),
                         st.lists(st.integers(0, 5), min_size=1, max_size=3, unique=True),
                         st.integers(0, 10), st.integers(1, 6)), max_size=40)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_bookings_of_a_unit_never_overlap_and_free_units_agree_with_brute_force(ops):
    cal = calendar(6)
    for op, holder, units, start, length in ops:
        h = f"t{holder}"
        keys = [f"core:pc1:{u}" for u in units]
        try:
            if op == "book":
                cal.book(h, keys, term(start, start + length))
            elif op == "extend":
                cal.extend(h, T0 + (start + length) * H)
            else:
                cal.release(h)
        except CalendarError:
            pass
        spans = [(b.term, u) for b in cal.bookings.values() for u in b.units]
        for i, (t1, u1) in enumerate(spans):
            for t2, u2 in spans[i + 1:]:
                assert not (u1 == u2 and t1.overlaps(t2)), f"{u1} promised twice"
    for a in range(0, 12, 3):
        q = term(a, a + 2)
        brute = [u for u in cal.pools["core:pc1"].units
                 if not any(u in b.units and b.term.overlaps(q) for b in cal.bookings.values())]
        assert cal.free_units("core:pc1", q) == brute
        assert cal.free_count("core:pc1", q) == len(brute)
