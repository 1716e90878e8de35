"""Policies rank bins; labels are chosen from what is free; the FIFO queue never lets anyone overtake."""

from datetime import UTC, datetime

from broker.policy import BestFit, BinView, FirstFit, WorstFit, choose_label, policy_named, rank

T0 = datetime(2030, 1, 1, tzinfo=UTC)
BINS = [BinView("pc1", {"core": 8}, {"core": 8}, 0), BinView("pc2", {"core": 2}, {"core": 8}, 1),
        BinView("pc3", {"core": 5}, {"core": 8}, 2), BinView("pc4", {"core": 1}, {"core": 8}, 3)]


def names(bins):
    return [b.name for b in bins]


def test_first_fit_keeps_inventory_order_and_skips_what_does_not_fit():
    assert names(rank(FirstFit(), BINS, {"core": 2})) == ["pc1", "pc2", "pc3"]


def test_best_fit_packs_into_the_fullest_bin_that_fits():
    assert names(rank(BestFit(), BINS, {"core": 2})) == ["pc2", "pc3", "pc1"]


def test_worst_fit_spreads_into_the_emptiest():
    assert names(rank(WorstFit(), BINS, {"core": 2})) == ["pc1", "pc3", "pc2"]


def test_nothing_fits_is_an_empty_ranking():
    assert rank(BestFit(), BINS, {"core": 9}) == [] and rank(FirstFit(), BINS, {"mem": 1}) == []


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
