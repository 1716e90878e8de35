"""Policies order hosts for the planner; labels are chosen from what is free."""

from dataclasses import replace
from datetime import UTC, datetime

from broker.policy import BestFit, FirstFit, WorstFit, choose_label, policy_named
from rspec.substrate import default_substrate

T0 = datetime(2030, 1, 1, tzinfo=UTC)
PC = next(h for h in default_substrate("t.org").hosts if not h.exclusive)
HOSTS = [replace(PC, name=f"pc{i}", component_id=f"pc{i}", cores=8) for i in range(1, 5)]
USED = {f"core:{host}:{i}" for host, n in (("pc2", 6), ("pc3", 3), ("pc4", 7)) for i in range(n)}  # 8, 2, 5, 1 free


def names(hosts):
    return [h.name for h in hosts]


def test_first_fit_keeps_inventory_order():
    assert names(FirstFit().order(HOSTS, USED)) == ["pc1", "pc2", "pc3", "pc4"]


def test_best_fit_packs_into_the_fullest_host():
    assert names(BestFit().order(HOSTS, USED)) == ["pc4", "pc2", "pc3", "pc1"]


def test_worst_fit_spreads_into_the_emptiest():
    assert names(WorstFit().order(HOSTS, USED)) == ["pc1", "pc3", "pc2", "pc4"]


def test_policies_by_name():
    assert policy_named("best-fit").name == "best-fit"
    try:
        policy_named("random")
    except ValueError as exc:
        assert "first-fit, best-fit, worst-fit" in str(exc)
    else:
        raise AssertionError("an unknown policy was accepted")


def test_labels_suggested_if_free_else_lowest_not_avoided():
    assert choose_label([5, 7, 9], suggested=7) == 7
    assert choose_label([5, 7, 9], suggested=8) is None  # the caller asked for exactly that one
    assert choose_label([5, 7, 9], avoid={5}) == 7
    assert choose_label([], None) is None
