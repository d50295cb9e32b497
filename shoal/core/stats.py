"""Statistics of returns: summaries with bootstrap confidence intervals, for evaluations and
for comparing runs over seeds.

The aggregate scores follow Agarwal, Schwarzer, Castro, Courville and Bellemare 2021 ("Deep
Reinforcement Learning at the Edge of the Statistical Precipice"): the interquartile mean
(`iqm`, the mean of the middle 50% of scores) beside the mean and median, with
percentile-bootstrap 95% confidence intervals (`bootstrap_ci`; their stratified bootstrap
resamples runs within each task: `stratified_bootstrap_ci`). Computed with NumPy, the same
computation as the ``rliable`` package's percentile intervals, without its dependencies.
For a handful of seeds the benchmarks also give the mean's Student-t interval
(`t_interval`), which a bootstrap of three values cannot.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

Statistic = Callable[[np.ndarray], float]


def iqm(values: Sequence[float] | np.ndarray) -> float:
    """Interquartile mean: the mean after cutting ``floor(n / 4)`` of the ``n`` values from
    each end of the sorted sample (``scipy.stats.trim_mean(values, 0.25)``, as rliable
    computes it)."""
    x = np.sort(np.asarray(values, np.float64).ravel())
    if len(x) == 0:
        return float("nan")
    cut = len(x) // 4
    return float(x[cut : len(x) - cut].mean())


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    statistic: Statistic = np.mean,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic``: resample the values with replacement
    ``resamples`` times and take the ``(1 - confidence) / 2`` and ``(1 + confidence) / 2``
    quantiles of the statistic. One value gives a zero-width interval at it."""
    x = np.asarray(values, np.float64).ravel()
    if len(x) == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    index = rng.integers(len(x), size=(resamples, len(x)))
    stats = np.array([statistic(x[row]) for row in index])
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(stats, [tail, 1.0 - tail])
    return float(low), float(high)


def stratified_bootstrap_ci(
    scores: np.ndarray,
    statistic: Statistic = iqm,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic`` over ``scores [runs, tasks]``: each
    resample draws runs with replacement within every task (column) separately, then applies
    ``statistic`` to all the drawn scores."""
    x = np.asarray(scores, np.float64)
    if x.ndim == 1:
        x = x[:, None]
    runs, tasks = x.shape
    rng = np.random.default_rng(seed)
    stats = np.empty(resamples)
    columns = np.arange(tasks)[None, :]
    for r in range(resamples):
        rows = rng.integers(runs, size=(runs, tasks))
        stats[r] = statistic(x[rows, columns])
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(stats, [tail, 1.0 - tail])
    return float(low), float(high)


def summary(values: Sequence[float] | np.ndarray, seed: int = 0) -> dict[str, float]:
    """``n``, ``mean``, ``std``, ``median``, ``min``, ``max``, ``iqm`` and the mean's 95%
    percentile-bootstrap interval (``ci_low``, ``ci_high``) of a sample."""
    x = np.asarray(values, np.float64).ravel()
    if len(x) == 0:
        names = ("mean", "std", "median", "min", "max", "iqm", "ci_low", "ci_high")
        return {"n": 0, **dict.fromkeys(names, float("nan"))}
    low, high = bootstrap_ci(x, seed=seed)
    return {
        "n": int(len(x)), "mean": float(x.mean()), "std": float(x.std()),
        "median": float(np.median(x)), "min": float(x.min()), "max": float(x.max()),
        "iqm": iqm(x), "ci_low": low, "ci_high": high,
    }  # fmt: skip


# Two-sided 95% quantiles of Student's t by degrees of freedom, for when SciPy is absent.
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 15: 2.131, 20: 2.086, 30: 2.042}  # fmt: skip


def t_quantile(dof: int, confidence: float = 0.95) -> float:
    """The two-sided ``confidence`` quantile of Student's t with ``dof`` degrees of freedom
    (SciPy's; without SciPy, 95% only, from a table rounded down to the nearest listed
    ``dof``, so the interval errs wide, and the normal 1.96 past 30)."""
    try:
        from scipy import stats
    except ImportError:
        if confidence != 0.95:
            raise ValueError("t_quantile without SciPy knows 95% only") from None
        if dof > 30:
            return 1.96
        return _T95[max(d for d in _T95 if d <= dof)]
    return float(stats.t.ppf((1.0 + confidence) / 2.0, dof))


def t_interval(
    values: Sequence[float] | np.ndarray, confidence: float = 0.95
) -> tuple[float, float]:
    """The mean of ``values`` and the half-width of its Student-t confidence interval, the
    usual interval over a few seeds (nan half-width for fewer than two values)."""
    x = np.asarray(values, np.float64).ravel()
    if len(x) == 0:
        return float("nan"), float("nan")
    if len(x) < 2:
        return float(x.mean()), float("nan")
    half = t_quantile(len(x) - 1, confidence) * float(x.std(ddof=1)) / math.sqrt(len(x))
    return float(x.mean()), half


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion (Wilson, "Probable inference, the law of
    succession, and statistical inference", 1927): ``successes`` of ``n`` trials, 95% by
    default. Unlike the normal approximation it stays inside [0, 1] and is not empty at 0 or
    ``n`` successes (the case of a policy that wins every evaluation game)."""
    if n <= 0:
        return float("nan"), float("nan")
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return float(max(0.0, centre - half)), float(min(1.0, centre + half))


def rate(indicator: Sequence[bool] | np.ndarray) -> dict[str, float]:
    """``n``, the share of True (``rate``) and its 95% Wilson interval (``ci_low``,
    ``ci_high``)."""
    x = np.asarray(indicator, bool).ravel()
    low, high = wilson_interval(int(x.sum()), len(x))
    return {"n": int(len(x)), "rate": float(x.mean()) if len(x) else float("nan"),
            "ci_low": low, "ci_high": high}  # fmt: skip
