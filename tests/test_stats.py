"""Return statistics against hand-computed values: the interquartile mean, percentile
bootstrap intervals (plain and stratified over runs x tasks) and evaluation summaries."""

import numpy as np
import pytest
from scipy import stats as scipy_stats

from shoal.core import stats
from shoal.core.stats import bootstrap_ci, iqm, stratified_bootstrap_ci, summary


def test_iqm_cuts_a_quarter_from_each_end():
    # 8 values: drop the 2 smallest and the 2 largest, mean of 3, 4, 5, 6.
    assert iqm([8, 1, 7, 2, 6, 3, 5, 4]) == pytest.approx(4.5)
    assert iqm([10, 1, 2, 3, 100]) == pytest.approx(5.0)  # 5 values: cut 1 each end
    assert iqm([3.0]) == 3.0 and np.isnan(iqm([]))
    x = np.random.default_rng(0).normal(size=37)
    assert iqm(x) == pytest.approx(scipy_stats.trim_mean(x, 0.25))  # rliable's definition


def test_bootstrap_interval_matches_the_exact_bootstrap_distribution():
    """[0, 0, 0, 1]: a resample's mean is k / 4 with k ~ Binomial(4, 1/4), so P(mean = 0) =
    0.316 and P(mean <= 1/2) = 0.949, P(mean <= 3/4) = 0.996: the exact 95% percentile
    interval is [0, 3/4], which enough resamples find exactly (both ends lie inside an
    atom of the distribution, far from its edges)."""
    assert bootstrap_ci([0.0, 0.0, 0.0, 1.0], resamples=20_000, seed=3) == (0.0, 0.75)
    # Two values: means 0, 1/2, 1 with probabilities 1/4, 1/2, 1/4; 90%: [0, 1].
    assert bootstrap_ci([0.0, 1.0], confidence=0.9, resamples=20_000) == (0.0, 1.0)
    # The median of [1, 2, 4, 8]: its exact bootstrap distribution from the 256 equally
    # likely resamples, enumerated.
    values = np.array([1.0, 2.0, 4.0, 8.0])
    grid = np.stack(np.meshgrid(*[values] * 4, indexing="ij"), -1).reshape(-1, 4)
    exact = np.quantile(np.median(grid, axis=1), [0.025, 0.975], method="inverted_cdf")
    low, high = bootstrap_ci(values, statistic=np.median, resamples=20_000)
    assert (low, high) == pytest.approx(tuple(exact), abs=0.5)
    assert values.min() <= low < values.mean() < high <= values.max()
    assert bootstrap_ci([5.0]) == (5.0, 5.0)
    # A tighter sample gives a tighter interval; the interval shrinks like 1/sqrt(n).
    wide = np.random.default_rng(1).normal(size=100)
    narrow = np.random.default_rng(1).normal(size=1600)
    w, n = np.subtract(*bootstrap_ci(wide)[::-1]), np.subtract(*bootstrap_ci(narrow)[::-1])
    assert n == pytest.approx(w / 4, rel=0.25)


def test_stratified_bootstrap_resamples_runs_within_each_task():
    # Task 0's runs all score 0, task 1's all 10: any within-task resample keeps half zeros and
    # half tens, so the mean is exactly 5 in every resample (a plain bootstrap would vary).
    scores = np.array([[0.0, 10.0]] * 5)
    assert stratified_bootstrap_ci(scores, statistic=np.mean) == (5.0, 5.0)
    low, high = bootstrap_ci(scores.ravel())
    assert low < 5.0 < high
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(10, 3))
    low, high = stratified_bootstrap_ci(scores, resamples=300, seed=7)
    assert low < iqm(scores) < high


def test_summary_of_an_evaluation():
    s = summary([1.0, 2.0, 3.0, 10.0])
    assert s["n"] == 4 and s["mean"] == 4.0 and s["median"] == 2.5
    assert s["min"] == 1.0 and s["max"] == 10.0 and s["iqm"] == 2.5
    assert s["std"] == pytest.approx(np.std([1.0, 2.0, 3.0, 10.0]))
    assert s["ci_low"] < s["mean"] < s["ci_high"]


def test_t_interval_by_hand(monkeypatch):
    # [1, 2, 3]: mean 2, sample std 1, t(0.975, 2) = 4.3027 -> half-width 4.3027 / sqrt(3)
    mean, half = stats.t_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.302653 / 3**0.5, rel=1e-5)
    assert np.isnan(stats.t_interval([5.0])[1]) and stats.t_interval([5.0])[0] == 5.0
    import builtins

    real = builtins.__import__

    def no_scipy(name, *args, **kwargs):
        if name.startswith("scipy"):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_scipy)  # the table, rounded down: wider
    assert stats.t_interval([1.0, 2.0, 3.0])[1] == pytest.approx(4.303 / 3**0.5)
    assert stats.t_quantile(12) == 2.228 and stats.t_quantile(100) == 1.96


def test_wilson_interval_by_hand():
    """7 of 10: centre (0.7 + 1.96^2/20) / (1 + 1.96^2/10) = 0.64449, half-width
    1.96 / 1.38416 * sqrt(0.021 + 0.009604) = 0.24772; 0 of 20: [0, 2 * 0.080565]."""
    from shoal.core.stats import rate, wilson_interval

    low, high = wilson_interval(7, 10)
    assert low == pytest.approx(0.64449 - 0.24772, abs=1e-4)
    assert high == pytest.approx(0.64449 + 0.24772, abs=1e-4)
    assert wilson_interval(0, 20) == pytest.approx((0.0, 0.16113), abs=1e-4)
    assert wilson_interval(20, 20) == pytest.approx((1 - 0.16113, 1.0), abs=1e-4)
    assert rate([True] * 7 + [False] * 3) == pytest.approx(
        {"n": 10, "rate": 0.7, "ci_low": low, "ci_high": high})  # fmt: skip
