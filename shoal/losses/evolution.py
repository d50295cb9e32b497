"""Search directions of the derivative-free learners: fitness shaping, the evolution-strategies
gradient estimate, augmented random search's step and the genetic algorithm's selection.

Every function is pure: arrays in, arrays out. ``returns`` are the fitnesses to maximize.
Perturbations are antithetic (mirrored) pairs: direction ``i`` of ``noise [n, D]`` is
evaluated at ``theta + sigma * noise[i]`` (``positive[i]``) and ``theta - sigma * noise[i]``
(``negative[i]``).
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "ars_step",
    "centered_ranks",
    "es_gradient",
    "top_directions",
    "truncation_selection",
]


def centered_ranks(returns: np.ndarray) -> np.ndarray:
    """Fitness shaping of Salimans et al. 2017 ("Evolution Strategies as a Scalable
    Alternative to Reinforcement Learning"), sec. 2.1: every return replaced by its rank over
    the whole array, scaled to ``[-0.5, 0.5]`` (the lowest -0.5, the highest 0.5, evenly
    spaced). Ties get distinct ranks in the order they appear, as the authors' code does.
    Any shape; the ranks are taken over all elements together."""
    flat = np.asarray(returns, np.float64).reshape(-1)
    if flat.size == 1:
        return np.zeros_like(np.asarray(returns, np.float64))
    ranks = np.empty(flat.size, np.float64)
    ranks[np.argsort(flat, kind="stable")] = np.arange(flat.size)
    return (ranks / (flat.size - 1) - 0.5).reshape(np.shape(returns))


def es_gradient(
    positive: np.ndarray, negative: np.ndarray, noise: np.ndarray, sigma: float
) -> np.ndarray:
    """The antithetic evolution-strategies estimate of the gradient of the smoothed objective
    ``E_eps[F(theta + sigma * eps)]`` (Salimans et al. 2017, eq. 2 with mirrored sampling):

        g = 1 / (2 n sigma) * sum_i (F(theta + sigma eps_i) - F(theta - sigma eps_i)) eps_i

    ``positive``, ``negative`` ``[n]``: the (possibly shaped) fitnesses of each pair;
    ``noise`` ``[n, D]``: the directions ``eps_i``. Returns ``[D]`` (float64)."""
    positive, negative = np.asarray(positive, np.float64), np.asarray(negative, np.float64)
    noise = np.asarray(noise)
    if positive.shape != negative.shape or positive.shape != noise.shape[:1]:
        raise ValueError(
            f"expected positive and negative [n] and noise [n, D], got {positive.shape}, "
            f"{negative.shape} and {noise.shape}"
        )
    return (positive - negative) @ noise.astype(np.float64) / (2 * len(positive) * sigma)


def top_directions(positive: np.ndarray, negative: np.ndarray, used: int) -> np.ndarray:
    """Indices of the ``used`` directions whose better return, ``max(r+, r-)``, is highest
    (Mania et al. 2018, "Simple random search provides a competitive approach to
    reinforcement learning", Algorithm 2 step 6), best first; ties keep their order."""
    if not 1 <= used <= len(positive):
        raise ValueError(f"used must be in [1, {len(positive)}], got {used}")
    best = np.maximum(np.asarray(positive), np.asarray(negative))
    return np.argsort(-best, kind="stable")[:used]


def ars_step(
    positive: np.ndarray, negative: np.ndarray, noise: np.ndarray, step_size: float, used: int
) -> np.ndarray:
    """Augmented random search's update (Mania et al. 2018, Algorithm 2 step 7): over the
    ``used`` best directions ``k``,

        delta = step_size / (used * sigma_R) * sum_k (r+_k - r-_k) eps_k

    where ``sigma_R`` is the standard deviation of the ``2 * used`` returns used (the step is
    not taken, zeros, when they are all equal). ``noise`` ``[n, D]``; returns ``[D]``."""
    top = top_directions(positive, negative, used)
    plus, minus = np.asarray(positive, np.float64)[top], np.asarray(negative, np.float64)[top]
    spread = np.concatenate([plus, minus]).std()
    if spread == 0.0:
        return np.zeros(np.shape(noise)[1])
    return step_size / (used * spread) * ((plus - minus) @ np.asarray(noise, np.float64)[top])


def truncation_selection(returns: np.ndarray, parents: int) -> np.ndarray:
    """The genetic algorithm's parents (Such et al. 2017, "Deep Neuroevolution: Genetic
    Algorithms Are a Competitive Alternative for Training Deep Neural Networks for
    Reinforcement Learning", Algorithm 1): indices of the ``parents`` highest returns, best
    first; ties keep their order."""
    if not 1 <= parents <= len(returns):
        raise ValueError(f"parents must be in [1, {len(returns)}], got {parents}")
    return np.argsort(-np.asarray(returns), kind="stable")[:parents]
