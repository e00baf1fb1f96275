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
    per_rank = [[10.0, 20.0, 30.0, 5.0], [12.0, 18.0, 31.0, 4.0], [11.0, 25.0, 29.0, 6.0]]
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


# ---------------------------------------------------------------- intervals worked by hand
#
# t quantiles from a printed Student-t table: t(0.975, 1) = 12.706, t(0.975, 2) = 4.303.


def test_summarize_two_values_have_a_cv():
    # sd of (1, 3) = sqrt(2), mean 2: cv = 0.7071 (one value is the only case without one)
    assert stats.summarize([1.0, 3.0])["cv"] == pytest.approx(np.sqrt(2) / 2)


def test_t_ci_by_hand():
    # (1, 2, 3): mean 2, sd 1, standard error 1/sqrt(3); half width 4.303 / sqrt(3) = 2.484
    mean, lo, hi = stats.t_ci([1.0, 2.0, 3.0])
    assert (mean, lo, hi) == (2.0, pytest.approx(-0.484, abs=1e-3), pytest.approx(4.484, abs=1e-3))
    # two values: (1, 3), sd sqrt(2), standard error 1: 2 -+ 12.706
    assert stats.t_ci([1.0, 3.0]) == (2.0, pytest.approx(-10.706, abs=1e-3), pytest.approx(14.706, abs=1e-3))
    assert stats.t_ci([5.0]) == (5.0, 5.0, 5.0)


def test_paired_t_ci_by_hand():
    # differences (2, 3, 4): mean 3, sd 1: 3 -+ 4.303 / sqrt(3) = 3 -+ 2.484
    mean, lo, hi = stats.paired_t_ci([3.0, 5.0, 7.0], [1.0, 2.0, 3.0])
    assert (mean, lo, hi) == (3.0, pytest.approx(0.516, abs=1e-3), pytest.approx(5.484, abs=1e-3))


def test_positive_ci_by_hand():
    # logs of (0.5, 2, 8) are ln2 x (-1, 1, 3): mean ln 2, sd 2 ln 2 = 1.386, standard
    # error 0.800, half width 4.303 x 0.800 = 3.444; so 2 x exp(-+3.444) = 0.0639 .. 62.6
    centre, lo, hi = stats.positive_ci([0.5, 2.0, 8.0])
    assert centre == pytest.approx(2.0)
    assert lo == pytest.approx(0.0639, abs=1e-4) and hi == pytest.approx(62.6, abs=0.05)
    assert stats.positive_ci([5.0]) == pytest.approx((5.0, 5.0, 5.0))


def test_welch_t_ci_by_hand():
    # a = (1, 3), b = (4, 6): variances 2 and 2, so va = vb = 1, se = sqrt(2), and the
    # Welch-Satterthwaite dof = (1 + 1)^2 / (1/1 + 1/1) = 2: -3 -+ 4.303 x 1.414 = -3 -+ 6.085
    delta, lo, hi = stats.welch_t_ci([1.0, 3.0], [4.0, 6.0])
    assert (delta, lo, hi) == (-3.0, pytest.approx(-9.085, abs=1e-3), pytest.approx(3.085, abs=1e-3))
    assert stats.welch_t_ci([2.0, 2.0], [5.0, 5.0]) == (-3.0, -3.0, -3.0)  # no spread
    with pytest.raises(ValueError):
        stats.welch_t_ci([1.0], [2.0, 3.0])


def test_welch_t_ci_matches_scipys_welch_test_on_unequal_samples():
    from scipy.stats import ttest_ind

    a = [27.5, 21.0, 19.0, 23.6, 17.0, 17.9, 16.9, 20.1, 21.9]
    b = [27.1, 22.0, 20.8, 23.4, 23.4, 23.5, 25.8, 22.0, 24.8, 20.2, 21.9, 22.1, 22.9, 20.5]
    for confidence in (0.9, 0.95):
        ref = ttest_ind(a, b, equal_var=False).confidence_interval(confidence)
        delta, lo, hi = stats.welch_t_ci(a, b, confidence)
        assert delta == pytest.approx(np.mean(a) - np.mean(b))
        assert (lo, hi) == (pytest.approx(ref.low), pytest.approx(ref.high))


def test_bootstrap_intervals_of_two_values_by_hand():
    # Resampling (4, 6) gives medians 4, 5, 6 with probabilities 1/4, 1/2, 1/4: the 95%
    # interval spans (4, 6); a 40% one (30th to 70th percentile) is 5 alone.
    assert stats.bootstrap_ci([4.0, 6.0]) == (4.0, 6.0)
    assert stats.bootstrap_ci([4.0, 6.0], confidence=0.4) == (5.0, 5.0)
    # 1 against (3, 5): differences -2, -3, -4 with the same probabilities.
    assert stats.bootstrap_diff_ci([1.0], [3.0, 5.0]) == (-3.0, -4.0, -2.0)
    assert stats.bootstrap_diff_ci([1.0], [3.0, 5.0], confidence=0.4) == (-3.0, -3.0, -3.0)
    assert stats.bootstrap_diff_ci([3.0, 5.0], [1.0]) == (3.0, 2.0, 4.0)  # and the other way
    with pytest.raises(ValueError):
        stats.bootstrap_diff_ci([], [1.0, 2.0])


def test_identical_rounds_are_tied_and_touching_zero_is_no_difference():
    assert stats.tied({1: 1.0, 2: 1.1, 3: 0.9}, {1: 1.0, 2: 1.1, 3: 0.9}) is True  # interval [0, 0]
    assert stats.verdict(-1.0, 0.0) == stats.NO_DIFFERENCE  # an interval that reaches 0
    assert stats.verdict(0.0, 1.0) == stats.NO_DIFFERENCE


def test_mann_whitney_with_two_values_a_side():
    # (1, 2) against (3, 4): U = 0, the most extreme of C(4, 2) = 6 equally likely orders;
    # two-sided exact p = 2 / 6
    assert stats.mann_whitney_p([1.0, 2.0], [3.0, 4.0]) == pytest.approx(1 / 3)


def test_rate_ci_by_hand():
    # (100, 110) tok/s: mean 105; logs 4.6052 and 4.7005, sd 0.0674, standard error 0.0477,
    # half width 12.706 x 0.04766 = 0.6055: exp(4.6528 -+ 0.6055) = 57.24 .. 192.16
    mean, (lo, hi) = stats.rate_ci([100.0, 110.0])
    assert mean == 105.0 and lo == pytest.approx(57.24, abs=0.01) and hi == pytest.approx(192.16, abs=0.01)
    mean, (lo, hi) = stats.rate_ci([0.5, 2.0, 8.0])  # below 1 is still a rate
    assert mean == 3.5 and lo == pytest.approx(0.0639, abs=1e-4) and hi == pytest.approx(62.6, abs=0.05)
    assert stats.rate_ci([100.0, None]) == (100.0, None)  # one value: no interval
    assert stats.rate_ci([0.0, 100.0]) == (50.0, None)  # a zero rate: no log-scale interval
    assert stats.rate_ci([100.0, float("inf")])[1] is None
    assert stats.rate_ci([]) == (None, None) and stats.rate_ci([None]) == (None, None)


@pytest.mark.parametrize("trials", [0, 0.0, -1])
def test_wilson_ci_without_trials_is_a_value_error(trials):
    # no trials, no proportion: 0 / 0 must be the function's own ValueError, not a
    # ZeroDivisionError from p = successes / trials
    with pytest.raises(ValueError, match="no trials"):
        stats.wilson_ci(0, trials)


def test_wilson_ci_of_one_trial():
    # one success in one trial, z = 1.95996: centre = (1 + z^2/2) / (1 + z^2), half =
    # z sqrt(z^2/4) / (1 + z^2) = (z^2/2) / (1 + z^2), so lo = 1 / (1 + z^2) = 1 / 4.84146
    # = 0.20655 and hi = 1 (one trial is enough for an interval)
    assert stats.wilson_ci(1, 1) == (1.0, pytest.approx(0.20655, abs=5e-5), pytest.approx(1.0))
