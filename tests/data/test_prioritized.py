"""SumTree and the proportional and rank-based priorities (Schaul et al. 2016)."""

import numpy as np
import pytest

from shoal.data import ProportionalPriorities, RankBasedPriorities, SumTree, linear_beta


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def draw_counts(priorities, capacity, draws=50_000, batch=500, seed=0):
    rng = np.random.default_rng(seed)
    counts = np.zeros(capacity)
    for _ in range(draws // batch):
        indices, _ = priorities.sample(batch, rng, beta=1.0)
        np.add.at(counts, indices, 1)
    return counts


@pytest.mark.parametrize(("capacity", "scan_size"), [(1, 8192), (37, 4), (1000, 16), (1000, 8192)])
def test_sum_tree_matches_brute_force_cumsum(capacity, scan_size):
    rng = np.random.default_rng(capacity)
    values = rng.random(capacity)
    values[rng.random(capacity) < 0.3] = 0.0  # zero leaves must never be found
    values[0] = max(values[0], 0.1)
    tree = SumTree(capacity, scan_size=scan_size)
    tree.update(np.arange(capacity), values)
    cumsum = np.cumsum(values)
    assert tree.total() == pytest.approx(cumsum[-1], rel=1e-12)
    queries = rng.random(2000) * cumsum[-1]
    np.testing.assert_array_equal(tree.find(queries), np.searchsorted(cumsum, queries, "right"))
    np.testing.assert_array_equal(tree.get(np.arange(capacity)), values)


def test_sum_tree_skips_zero_leaves_at_exact_boundaries():
    tree = SumTree(8, scan_size=2)
    tree.update(np.arange(8), [1.0, 0.0, 0.0, 2.0, 0.0, 1.0, 0.0, 0.0])
    # q equal to a cumulative sum belongs to the next leaf with mass; q >= total to the last.
    found = tree.find(np.array([0.0, 0.999, 1.0, 2.5, 3.0, 3.999, 4.0, 10.0]))
    np.testing.assert_array_equal(found, [0, 0, 3, 3, 5, 5, 5, 5])


def test_sum_tree_rounding_fallback_picks_last_leaf_with_mass():
    tree = SumTree(8, scan_size=2)
    tree.update(np.arange(8), [0.0, 2.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    # What find does when rounding lands a query on an empty leaf past its subtree's mass.
    np.testing.assert_array_equal(tree._nearest_with_mass(np.array([7, 3, 0])), [4, 1, 1])


def test_sum_tree_update_duplicates_last_write_wins():
    tree = SumTree(10, scan_size=2)
    tree.update(np.array([3, 7, 3, 3]), np.array([1.0, 2.0, 5.0, 4.0]))
    assert tree.get(np.array([3]))[0] == 4.0
    assert tree.total() == 6.0
    tree.update(np.array([7]), 0.5)  # a scalar value broadcasts
    assert tree.total() == 4.5


def test_sum_tree_set_all_equals_updates():
    values = np.random.default_rng(1).random(100)
    a, b = SumTree(100, scan_size=4), SumTree(100, scan_size=4)
    a.update(np.arange(100), values)
    b.set_all(values)
    queries = np.linspace(0, values.sum(), 50, endpoint=False)
    np.testing.assert_array_equal(a.find(queries), b.find(queries))
    assert a.total() == pytest.approx(b.total(), rel=1e-14)


def test_sum_tree_rejects_out_of_range_indices():
    with pytest.raises(IndexError):
        SumTree(4).update(np.array([4]), np.array([1.0]))


def test_proportional_sampling_follows_priorities():
    prios = ProportionalPriorities(8, alpha=0.6)
    prios.activate(np.arange(8))
    td = np.array([0.1, 0.5, 1.0, 2.0, 3.0, 0.2, 4.0, 1.5])
    prios.update(np.arange(8), td)
    expected = (td + 1e-6) ** 0.6
    counts = draw_counts(prios, 8)
    # 99.9% quantile of chi-square with 7 degrees of freedom: 24.3.
    assert chi_square(counts, expected / expected.sum()) < 24.3


def test_rank_based_sampling_follows_inverse_rank():
    prios = RankBasedPriorities(8, alpha=0.7, sort_every=1)
    prios.activate(np.arange(8))
    td = np.array([0.1, 0.5, 1.0, 2.0, 3.0, 0.2, 4.0, 1.5])
    prios.update(np.arange(8), td)  # sort_every=1: sorted right away
    ranks = np.array([8, 6, 5, 3, 2, 7, 1, 4])  # by |td| descending
    expected = (1.0 / ranks) ** 0.7
    np.testing.assert_allclose(prios.tree.values / prios.tree.total(), expected / expected.sum())
    assert chi_square(draw_counts(prios, 8), expected / expected.sum()) < 24.3


@pytest.mark.parametrize("cls", [ProportionalPriorities, RankBasedPriorities])
def test_deactivated_never_sampled_and_updates_do_not_revive(cls):
    prios = cls(10)
    prios.activate(np.arange(10))
    prios.deactivate(np.array([3, 5]))
    prios.update(np.array([3, 4]), np.array([100.0, 1.0]))  # 3 was overwritten meanwhile
    if isinstance(prios, RankBasedPriorities):
        prios.sort()
    assert prios.num_active == 8
    counts = draw_counts(prios, 10, draws=5000)
    assert counts[3] == 0 and counts[5] == 0
    assert (np.delete(counts, [3, 5]) > 0).all()


def test_proportional_updates_and_duplicates_are_reflected():
    prios = ProportionalPriorities(4, alpha=1.0, eps=0.0 + 1e-6)
    prios.activate(np.arange(4))
    prios.update(np.array([0, 1, 1, 2, 3]), np.array([1.0, 9.0, 2.0, -3.0, 4.0]))
    np.testing.assert_allclose(prios.tree.values, np.array([1.0, 2.0, 3.0, 4.0]) + 1e-6)


def test_proportional_importance_weights_by_hand():
    prios = ProportionalPriorities(4, alpha=1.0, eps=1e-6)
    prios.activate(np.arange(4))
    prios.update(np.arange(4), np.array([1.0, 1.0, 2.0, 4.0]) - 1e-6)  # p = 1, 1, 2, 4
    # Stratified draws over total 8 in segments of 2: [0,2) -> leaves 0/1, [2,4) -> 2,
    # [4,6) and [6,8) -> 3. P = 1/8, 1/8, 2/8, 4/8; N = 4; (N P)^-0.5 = sqrt2, sqrt2, 1, 1/sqrt2.
    indices, weights = prios.sample(4, np.random.default_rng(0), beta=0.5)
    assert indices[1:].tolist() == [2, 3, 3] and indices[0] in (0, 1)
    np.testing.assert_allclose(weights, [1.0, 1 / np.sqrt(2), 0.5, 0.5], rtol=1e-5)
    assert weights.dtype == np.float32


def test_rank_based_importance_weights_by_hand():
    prios = RankBasedPriorities(4, alpha=1.0, sort_every=1)
    prios.activate(np.arange(4))
    prios.update(np.arange(4), np.array([4.0, 1.0, 2.0, 3.0]))  # ranks 1, 4, 3, 2
    # P = (1, 1/4, 1/3, 1/2) / (25/12) = (12, 3, 4, 6) / 25; N = 4, beta = 1:
    # w = 1 / (N P) = (25/48, 25/12, 25/16, 25/24), divided by the batch's largest.
    probs = np.array([12.0, 3.0, 4.0, 6.0]) / 25
    np.testing.assert_allclose(prios.tree.values / prios.tree.total(), probs)
    indices, weights = prios.sample(64, np.random.default_rng(0), beta=1.0)
    raw = 1.0 / (4 * probs[indices])
    np.testing.assert_allclose(weights, raw / raw.max(), rtol=1e-6)


def test_new_transitions_get_max_priority():
    prios = ProportionalPriorities(6, alpha=0.5)
    prios.activate(np.arange(3))
    np.testing.assert_allclose(prios.tree.values[:3], 1.0)  # p_max starts at 1
    prios.update(np.array([0, 1]), np.array([8.0, 0.5]))
    prios.activate(np.array([4]))
    assert prios.tree.values[4] == pytest.approx((8.0 + 1e-6) ** 0.5)

    rank = RankBasedPriorities(6, alpha=1.0, sort_every=1)
    rank.activate(np.arange(3))
    rank.update(np.arange(3), np.array([1.0, 5.0, 2.0]))  # sorted: ranks 3, 1, 2
    rank.activate(np.array([4]))  # placed on top until the next sort: rank 1
    assert rank.priorities[4] == pytest.approx(5.0 + 1e-6)
    np.testing.assert_allclose(rank.tree.values, [1 / 3, 1.0, 1 / 2, 0.0, 1.0, 0.0])
    rank.update(np.array([4]), np.array([3.0]))  # re-sort: 1 > 4 > 2 > 0
    np.testing.assert_allclose(rank.tree.values, [1 / 4, 1.0, 1 / 3, 0.0, 1 / 2, 0.0])


def test_rank_based_keeps_ranks_until_the_next_sort():
    rank = RankBasedPriorities(4, alpha=1.0, sort_every=2)
    rank.activate(np.arange(4))  # fresh ranks in arrival order: 1, 2, 3, 4
    rank.update(np.arange(4), np.array([1.0, 2.0, 3.0, 4.0]))
    np.testing.assert_allclose(rank.tree.values, [1, 1 / 2, 1 / 3, 1 / 4])
    rank.update(np.array([0]), np.array([0.5]))  # second update: sort
    np.testing.assert_allclose(rank.tree.values, [1 / 4, 1 / 3, 1 / 2, 1])


@pytest.mark.parametrize("cls", [ProportionalPriorities, RankBasedPriorities])
def test_state_dict_round_trip(cls):
    a = cls(16, sort_every=3) if cls is RankBasedPriorities else cls(16)
    a.activate(np.arange(12))
    a.update(np.arange(0, 12, 2), np.arange(6.0))
    b = cls(16, sort_every=3) if cls is RankBasedPriorities else cls(16)
    b.load_state_dict(a.state_dict())
    for prios in (a, b):
        prios.update(np.array([1]), np.array([7.0]))
        prios.activate(np.array([13]))
    ia, wa = a.sample(32, np.random.default_rng(3), 0.4)
    ib, wb = b.sample(32, np.random.default_rng(3), 0.4)
    np.testing.assert_array_equal(ia, ib)
    np.testing.assert_array_equal(wa, wb)


def test_errors_speak():
    prios = ProportionalPriorities(4)
    with pytest.raises(ValueError, match="no transition"):
        prios.sample(2, np.random.default_rng(0), 1.0)
    prios.activate(np.arange(2))
    with pytest.raises(ValueError, match="NaN"):
        prios.update(np.arange(2), np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="load_state_dict|positions"):
        ProportionalPriorities(5).load_state_dict(prios.state_dict())


def test_linear_beta():
    assert linear_beta(0.4, 0.0) == 0.4
    assert linear_beta(0.4, 0.5) == pytest.approx(0.7)
    assert linear_beta(0.4, 2.0) == 1.0
