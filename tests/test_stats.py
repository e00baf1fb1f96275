"""nccl_tune.stats: summaries against numpy, slowest-rank reduction, intervals, tests."""

from __future__ import annotations

import numpy as np
import pytest

from nccl_tune import stats

SAMPLES = [12.0, 15.5, 11.2, 30.1, 12.8, 13.3, 12.1, 14.9, 11.9, 95.0, 12.4, 13.0]


def test_summarize_matches_numpy():
    s = stats.summarize(SAMPLES)
    x = np.array(SAMPLES)
    assert s["n"] == len(SAMPLES)
    assert s["min"] == x.min() and s["max"] == x.max()
    for key, q in (("p10", 10), ("p50", 50), ("p90", 90), ("p99", 99)):
        assert s[key] == pytest.approx(np.percentile(x, q))
    assert s["mean"] == pytest.approx(x.mean())
    assert s["cv"] == pytest.approx(x.std(ddof=1) / x.mean())


def test_summarize_known_small_values():
    s = stats.summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (s["p50"], s["p10"], s["p90"]) == (3.0, pytest.approx(1.4), pytest.approx(4.6))
    assert s["cv"] == pytest.approx(np.sqrt(2.5) / 3.0)


def test_summarize_edge_cases():
    empty = stats.summarize([])
    assert empty["n"] == 0 and all(empty[k] is None for k in stats_keys() if k != "n")
    one = stats.summarize([7.0])
    assert one["p50"] == 7.0 and one["n"] == 1
    assert one["cv"] is None  # no spread can be estimated from one sample
    assert stats.summarize([0.0, 0.0])["cv"] is None  # zero mean: undefined


def stats_keys():
    return ("min", "p10", "p50", "p90", "p99", "max", "mean", "cv", "n")


def test_slowest_rank_takes_the_max_per_iteration():
    per_rank = [[10.0, 20.0, 30.0, 5.0],
                [12.0, 18.0, 31.0, 4.0],
                [11.0, 25.0, 29.0, 6.0]]
    assert stats.slowest_rank(per_rank) == [12.0, 25.0, 31.0, 6.0]
    assert stats.slowest_rank([[1.0, 2.0]]) == [1.0, 2.0]


def test_slowest_rank_differs_from_a_pooled_view():
    rng = np.random.default_rng(1)
    per_rank = rng.gamma(4.0, 5.0, size=(8, 500))
    slowest = np.array(stats.slowest_rank(per_rank))
    assert np.all(slowest >= per_rank.max(axis=0) - 1e-12) and np.all(slowest <= per_rank.max(axis=0) + 1e-12)
    assert np.median(slowest) > np.median(per_rank)  # the max of 8 sits above any rank's median


def test_slowest_rank_rejects_ragged_input():
    with pytest.raises(ValueError, match="different numbers of samples"):
        stats.slowest_rank([[1.0, 2.0], [3.0]])
    with pytest.raises(ValueError):
        stats.slowest_rank([])


def test_bootstrap_ci_contains_the_median_and_is_reproducible():
    lo, hi = stats.bootstrap_ci(SAMPLES, seed=3)
    assert lo <= np.median(SAMPLES) <= hi
    assert (lo, hi) == stats.bootstrap_ci(SAMPLES, seed=3)
    assert stats.bootstrap_ci([4.0]) == (4.0, 4.0)
    with pytest.raises(ValueError):
        stats.bootstrap_ci([])


def test_bootstrap_ci_coverage_is_near_nominal():
    # Median of an exponential(1) is ln 2; a 90% interval from n=60 should cover it
    # in roughly 85-95% of samples (percentile bootstrap runs a little narrow).
    rng = np.random.default_rng(7)
    hits = 0
    trials = 200
    for i in range(trials):
        lo, hi = stats.bootstrap_ci(rng.exponential(1.0, 60), confidence=0.90, n_boot=500, seed=i)
        hits += lo <= np.log(2) <= hi
    assert 0.78 <= hits / trials <= 0.98


def test_bootstrap_diff_ci_separates_shifted_samples():
    rng = np.random.default_rng(2)
    a = rng.normal(20.0, 1.0, 200)
    b = rng.normal(25.0, 1.0, 200)
    delta, lo, hi = stats.bootstrap_diff_ci(a, b)
    assert delta == pytest.approx(np.median(a) - np.median(b))
    assert lo <= delta <= hi < 0
    assert stats.verdict(lo, hi) == stats.FASTER
    assert stats.bootstrap_diff_ci([1.0], [3.0]) == (-2.0, -2.0, -2.0)


def test_bootstrap_diff_ci_same_distribution_is_no_difference():
    rng = np.random.default_rng(4)
    a, b = rng.normal(20.0, 1.0, 300), rng.normal(20.0, 1.0, 300)
    _, lo, hi = stats.bootstrap_diff_ci(a, b)
    assert stats.verdict(lo, hi) == stats.NO_DIFFERENCE


def test_paired_diff_ci_cancels_round_drift():
    drift = np.array([0.0, 10.0, 20.0, 30.0, 40.0, 50.0])
    a = 20.0 + drift + np.array([0.1, -0.1, 0.2, 0.0, -0.2, 0.1])
    b = 21.0 + drift
    median, lo, hi = stats.paired_diff_ci(a, b)
    assert median == pytest.approx(np.median(a - b))
    assert hi < 0  # about -1 in every round despite the drift


def test_paired_helpers_reject_unequal_lengths():
    # Before the fix, numpy broadcast a single b against every a silently.
    with pytest.raises(ValueError, match="equal lengths"):
        stats.paired_diff_ci([1.0, 2.0, 3.0], [1.0])
    with pytest.raises(ValueError, match="equal lengths"):  # renamed or removed: this fails
        stats.paired_t_ci([1.0, 2.0, 3.0], [1.0])


def test_mann_whitney_and_verdict():
    assert stats.mann_whitney_p([1.0], [2.0, 3.0]) == 1.0
    assert stats.mann_whitney_p([1.0, 1.0, 1.0], [1.0, 1.0, 1.0]) == 1.0
    assert stats.mann_whitney_p(list(range(20)), list(range(100, 120))) < 1e-6
    assert stats.verdict(-3.0, -1.0) == stats.FASTER
    assert stats.verdict(1.0, 3.0) == stats.SLOWER
    assert stats.verdict(-1.0, 1.0) == stats.NO_DIFFERENCE
