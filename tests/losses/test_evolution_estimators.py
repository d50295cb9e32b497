"""The derivative-free learners' estimators against hand-computed values: centered ranks, the
antithetic ES gradient (unbiased on a quadratic), ARS's top-b step and truncation selection."""

import numpy as np
import pytest

from shoal.losses.evolution import (
    ars_step,
    centered_ranks,
    es_gradient,
    top_directions,
    truncation_selection,
)


def test_centered_ranks_by_hand():
    np.testing.assert_allclose(centered_ranks(np.array([3.0, 1.0, 2.0, 10.0])),
                               [1 / 6, -0.5, -1 / 6, 0.5])  # fmt: skip
    # Over every element of a [pairs, 2] array at once, shape kept; ties in order.
    ranks = centered_ranks(np.array([[5.0, 5.0], [0.0, 7.0]]))
    np.testing.assert_allclose(ranks, [[-1 / 6, 1 / 6], [-0.5, 0.5]])
    assert centered_ranks(np.array([4.0])).tolist() == [0.0]


def test_es_gradient_by_hand():
    noise = np.array([[1.0, 0.0], [0.0, 2.0]])
    # (F+ - F-) eps / (2 n sigma): ((3 - 1) [1, 0] + (0 - 4) [0, 2]) / (2 * 2 * 0.5)
    np.testing.assert_allclose(es_gradient([3.0, 0.0], [1.0, 4.0], noise, 0.5), [1.0, -4.0])
    with pytest.raises(ValueError, match="noise"):
        es_gradient([1.0], [1.0, 2.0], noise, 0.1)


def test_es_gradient_is_unbiased_on_a_quadratic():
    """F(x) = -|x - x*|^2: the smoothed objective's gradient is -2 (theta - x*); the mean of
    the estimate over many antithetic pairs matches it, and with centered ranks the
    estimate still points to the optimum."""
    rng = np.random.default_rng(0)
    theta, optimum, sigma = np.array([1.0, -2.0, 0.5]), np.array([0.0, 1.0, 0.0]), 0.1
    noise = rng.standard_normal((200_000, 3))

    def fitness(x):
        return -((x - optimum) ** 2).sum(-1)

    positive, negative = fitness(theta + sigma * noise), fitness(theta - sigma * noise)
    true = -2 * (theta - optimum)
    np.testing.assert_allclose(es_gradient(positive, negative, noise, sigma), true, rtol=0.02)
    ranks = centered_ranks(np.stack([positive[:500], negative[:500]], 1))
    shaped = es_gradient(ranks[:, 0], ranks[:, 1], noise[:500], sigma)
    cosine = shaped @ true / np.linalg.norm(shaped) / np.linalg.norm(true)
    assert cosine > 0.95, cosine


def test_ars_top_directions_and_step_by_hand():
    positive, negative = np.array([1.0, 5.0, 2.0, 0.0]), np.array([3.0, 0.0, 2.0, 6.0])
    # best of each pair: 3, 5, 2, 6 -> order 3, 1, 0, 2
    assert top_directions(positive, negative, 2).tolist() == [3, 1]
    noise = np.eye(4)
    # used: directions 3 and 1; returns used (0, 5, 6, 0) have std 2.9155; step
    # 0.1 / (2 * 2.9155) * ((0 - 6) e3 + (5 - 0) e1)
    spread = np.std([0.0, 5.0, 6.0, 0.0])
    want = 0.1 / (2 * spread) * np.array([0.0, 5.0, 0.0, -6.0])
    np.testing.assert_allclose(ars_step(positive, negative, noise, 0.1, 2), want)
    assert not ars_step(np.ones(3), np.ones(3), np.eye(3), 0.1, 3).any()  # equal returns
    with pytest.raises(ValueError, match="used"):
        top_directions(positive, negative, 5)


def test_truncation_selection():
    assert truncation_selection(np.array([1.0, 9.0, 3.0, 9.0]), 3).tolist() == [1, 3, 2]
    with pytest.raises(ValueError, match="parents"):
        truncation_selection(np.array([1.0]), 2)
