"""Tests for shoal.losses.returns: hand-computed cases and naive references."""

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from shoal.losses import discounted_returns, gae

GAMMA = 0.9
LAM = 0.8


def _hand_case():
    """T=3, B=2. Column 0 is truncated after t=1; column 1 terminates at t=1.

    Both columns bootstrap at the end of the rollout (t=2).
    """
    rewards = torch.tensor([[1.0, 1.0], [2.0, 1.0], [3.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[4.0, 2.0], [8.0, 3.0], [12.0, 4.0]], dtype=torch.float64)
    next_values = torch.tensor([[10.0, 5.0], [20.0, 6.0], [30.0, 7.0]], dtype=torch.float64)
    terminated = torch.tensor([[False, False], [False, True], [False, False]])
    truncated = torch.tensor([[False, False], [True, False], [False, False]])
    return rewards, values, next_values, terminated, truncated


def _random_rollout(shape, seed=0, dtype=torch.float64):
    """Random rollout where next_values[t] == values[t+1] inside an episode, as in real data."""
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(shape, generator=g, dtype=dtype)
    values = torch.randn(shape, generator=g, dtype=dtype)
    terminated = torch.rand(shape, generator=g) < 0.15
    truncated = torch.rand(shape, generator=g) < 0.1
    # At episode ends next_values is the value of the final observation, unrelated to values.
    final_obs_values = torch.randn(shape, generator=g, dtype=dtype)
    next_values = final_obs_values.clone()
    done = terminated | truncated
    next_values[:-1] = torch.where(done[:-1], final_obs_values[:-1], values[1:])
    return rewards, values, next_values, terminated, truncated


def _naive_returns(rewards, next_values, terminated, truncated, gamma):
    """Forward-sum definition of the returns, one (t, column) at a time."""
    r, nv = rewards.tolist(), next_values.tolist()
    term, trunc = terminated.tolist(), truncated.tolist()
    n_steps, n_cols = len(r), len(r[0])
    out = [[0.0] * n_cols for _ in range(n_steps)]
    for b in range(n_cols):
        for t in range(n_steps):
            total, discount = 0.0, 1.0
            for k in range(t, n_steps):
                total += discount * r[k][b]
                discount *= gamma
                if term[k][b]:
                    break
                if trunc[k][b] or k == n_steps - 1:
                    total += discount * nv[k][b]
                    break
            out[t][b] = total
    return torch.tensor(out, dtype=torch.float64)


def _naive_gae(rewards, values, next_values, terminated, truncated, gamma, lam):
    """Forward-sum definition A_t = sum_l (gamma * lam)^l delta_{t+l} within the episode."""
    r, v, nv = rewards.tolist(), values.tolist(), next_values.tolist()
    term, trunc = terminated.tolist(), truncated.tolist()
    n_steps, n_cols = len(r), len(r[0])
    adv = [[0.0] * n_cols for _ in range(n_steps)]
    for b in range(n_cols):
        deltas = [
            r[t][b] + gamma * (0.0 if term[t][b] else 1.0) * nv[t][b] - v[t][b]
            for t in range(n_steps)
        ]
        for t in range(n_steps):
            total, weight = 0.0, 1.0
            for k in range(t, n_steps):
                total += weight * deltas[k]
                if term[k][b] or trunc[k][b]:
                    break
                weight *= gamma * lam
            adv[t][b] = total
    adv = torch.tensor(adv, dtype=torch.float64)
    return adv, adv + values.to(torch.float64)


# ----------------------------------------------------------------------------- hand-computed


def test_discounted_returns_hand_computed():
    rewards, _, next_values, terminated, truncated = _hand_case()
    out = discounted_returns(rewards, next_values, terminated, truncated, GAMMA)
    expected = torch.tensor(
        [
            # col 0: t=0 continues into G_1; col 1: t=0 continues into G_1 = 1 (terminal).
            [1.0 + 0.9 * 20.0, 1.0 + 0.9 * 1.0],  # 19.0, 1.9
            # col 0 truncated: bootstrap next_values; col 1 terminated: no bootstrap.
            [2.0 + 0.9 * 20.0, 1.0],  # 20.0, 1.0
            # end of rollout: bootstrap from next_values in both columns.
            [3.0 + 0.9 * 30.0, 1.0 + 0.9 * 7.0],  # 30.0, 7.3
        ],
        dtype=torch.float64,
    )
    assert_close(out, expected)
    assert_close(out, torch.tensor([[19.0, 1.9], [20.0, 1.0], [30.0, 7.3]], dtype=torch.float64))


def test_gae_hand_computed():
    rewards, values, next_values, terminated, truncated = _hand_case()
    adv, ret = gae(rewards, values, next_values, terminated, truncated, GAMMA, LAM)
    # TD errors delta = r + 0.9 * (1 - term) * nv - v
    #   col 0: [1 + 9 - 4, 2 + 18 - 8, 3 + 27 - 12] = [6, 12, 18]
    #   col 1: [1 + 4.5 - 2, 1 + 0 - 3, 1 + 6.3 - 4] = [3.5, -2, 3.3]
    # gamma * lam = 0.72; the trace is cut after col 0 t=1 (truncated) and col 1 t=1 (terminated).
    expected_adv = torch.tensor(
        [
            [6.0 + 0.72 * 12.0, 3.5 + 0.72 * -2.0],  # 14.64, 2.06
            [12.0, -2.0],
            [18.0, 3.3],
        ],
        dtype=torch.float64,
    )
    assert_close(adv, expected_adv)
    assert_close(adv, torch.tensor([[14.64, 2.06], [12.0, -2.0], [18.0, 3.3]], dtype=torch.float64))
    assert_close(ret, torch.tensor([[18.64, 4.06], [20.0, 1.0], [30.0, 7.3]], dtype=torch.float64))


def test_terminated_wins_over_truncated():
    # Both flags set on the same step: the state is terminal, so nothing is bootstrapped.
    rewards = torch.tensor([[1.0], [2.0]], dtype=torch.float64)
    values = torch.tensor([[0.5], [0.25]], dtype=torch.float64)
    next_values = torch.tensor([[100.0], [4.0]], dtype=torch.float64)
    terminated = torch.tensor([[True], [False]])
    truncated = torch.tensor([[True], [False]])
    out = discounted_returns(rewards, next_values, terminated, truncated, GAMMA)
    assert_close(out, torch.tensor([[1.0], [2.0 + 0.9 * 4.0]], dtype=torch.float64))
    adv, _ = gae(rewards, values, next_values, terminated, truncated, GAMMA, LAM)
    # t=1: 2 + 3.6 - 0.25 = 5.35; t=0: 1 - 0.5 = 0.5, trace cut.
    assert_close(adv, torch.tensor([[0.5], [5.35]], dtype=torch.float64))


def test_single_step_rollout():
    rewards = torch.tensor([[1.0, 2.0]])
    next_values = torch.tensor([[10.0, 10.0]])
    terminated = torch.tensor([[False, True]])
    truncated = torch.tensor([[False, False]])
    out = discounted_returns(rewards, next_values, terminated, truncated, GAMMA)
    assert_close(out, torch.tensor([[10.0, 2.0]]))


# ---------------------------------------------------------------------- naive references


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_discounted_returns_matches_naive(seed):
    rewards, _, next_values, terminated, truncated = _random_rollout((17, 5), seed)
    out = discounted_returns(rewards, next_values, terminated, truncated, 0.97)
    expected = _naive_returns(rewards, next_values, terminated, truncated, 0.97)
    assert_close(out, expected)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_matches_naive(seed):
    rewards, values, next_values, terminated, truncated = _random_rollout((17, 5), seed)
    adv, ret = gae(rewards, values, next_values, terminated, truncated, 0.97, 0.9)
    exp_adv, exp_ret = _naive_gae(rewards, values, next_values, terminated, truncated, 0.97, 0.9)
    assert_close(adv, exp_adv)
    assert_close(ret, exp_ret)


def test_trailing_agent_axis():
    t, b, n = 17, 5, 3
    rewards, values, next_values, terminated, truncated = _random_rollout((t, b, n), seed=3)

    ret = discounted_returns(rewards, next_values, terminated, truncated, 0.97)
    adv, lam_ret = gae(rewards, values, next_values, terminated, truncated, 0.97, 0.9)
    assert ret.shape == adv.shape == lam_ret.shape == (t, b, n)

    def flat(x):
        return x.reshape(t, b * n)

    exp_ret = _naive_returns(
        flat(rewards), flat(next_values), flat(terminated), flat(truncated), 0.97
    )
    exp_adv, exp_lam_ret = _naive_gae(
        flat(rewards),
        flat(values),
        flat(next_values),
        flat(terminated),
        flat(truncated),
        0.97,
        0.9,
    )
    assert_close(ret, exp_ret.reshape(t, b, n))
    assert_close(adv, exp_adv.reshape(t, b, n))
    assert_close(lam_ret, exp_lam_ret.reshape(t, b, n))


# ------------------------------------------------------------------------ limiting cases


def test_gae_lambda_one_is_returns_minus_values():
    rewards, values, next_values, terminated, truncated = _random_rollout((17, 5), seed=4)
    adv, ret = gae(rewards, values, next_values, terminated, truncated, 0.97, 1.0)
    mc = discounted_returns(rewards, next_values, terminated, truncated, 0.97)
    assert_close(adv, mc - values)
    assert_close(ret, mc)


def test_gae_lambda_zero_is_td_error():
    rewards, values, next_values, terminated, truncated = _random_rollout((17, 5), seed=5)
    adv, ret = gae(rewards, values, next_values, terminated, truncated, 0.97, 0.0)
    td = rewards + 0.97 * (~terminated).to(rewards.dtype) * next_values - values
    assert_close(adv, td)
    assert_close(ret, td + values)


# --------------------------------------------------------------------- dtypes and inputs


def test_float_flags_match_bool_flags():
    rewards, values, next_values, terminated, truncated = _random_rollout((17, 5), seed=6)
    as_bool = gae(rewards, values, next_values, terminated, truncated, 0.97, 0.9)
    as_float = gae(rewards, values, next_values, terminated.double(), truncated.float(), 0.97, 0.9)
    assert_close(as_bool, as_float)
    assert_close(
        discounted_returns(rewards, next_values, terminated, truncated, 0.97),
        discounted_returns(rewards, next_values, terminated.float(), truncated.float(), 0.97),
    )


def test_computes_in_rewards_dtype():
    rewards, values, next_values, terminated, truncated = _random_rollout((17, 5), seed=7)
    rewards32 = rewards.float()
    adv, ret = gae(rewards32, values, next_values, terminated, truncated, 0.97, 0.9)
    assert adv.dtype == ret.dtype == torch.float32
    out = discounted_returns(rewards32, next_values, terminated, truncated, 0.97)
    assert out.dtype == torch.float32
    exp_adv, _ = _naive_gae(rewards32, values, next_values, terminated, truncated, 0.97, 0.9)
    assert_close(adv, exp_adv.float(), rtol=1e-5, atol=1e-5)


def test_masked_next_values_do_not_leak():
    # The value after a terminal step is never used, so a non-finite placeholder is harmless.
    rewards, values, next_values, terminated, truncated = _hand_case()
    poisoned = next_values.clone()
    poisoned[1, 1] = float("inf")
    assert_close(
        discounted_returns(rewards, poisoned, terminated, truncated, GAMMA),
        discounted_returns(rewards, next_values, terminated, truncated, GAMMA),
    )
    assert_close(
        gae(rewards, values, poisoned, terminated, truncated, GAMMA, LAM),
        gae(rewards, values, next_values, terminated, truncated, GAMMA, LAM),
    )


def test_shape_mismatch_raises():
    rewards = torch.zeros(3, 2)
    flags = torch.zeros(3, 2, dtype=torch.bool)
    with pytest.raises(ValueError):
        discounted_returns(rewards, torch.zeros(3, 1), flags, flags, GAMMA)
    with pytest.raises(ValueError):
        gae(rewards, rewards, rewards, flags, flags[:2], GAMMA, LAM)
    with pytest.raises(ValueError):
        discounted_returns(torch.zeros(3), torch.zeros(3), flags[:, 0], flags[:, 0], GAMMA)


# ------------------------------------------------------------- NumPy and torch computations


@pytest.mark.parametrize("shape", [(17, 5), (9, 4)])
def test_gae_numpy_arrays_and_the_torch_path_agree(shape):
    """CPU tensors without a graph and NumPy arrays go through NumPy; tensors with a graph
    through torch (keeping the graph). All three give the same numbers."""
    rewards, values, next_values, terminated, truncated = _random_rollout(shape, seed=8)
    on_numpy = gae(rewards, values, next_values, terminated, truncated, 0.97, 0.9)
    arrays = gae(
        *(x.numpy() for x in (rewards, values, next_values, terminated, truncated)), 0.97, 0.9
    )
    assert all(isinstance(a, np.ndarray) for a in arrays)
    graph_values = values.clone().requires_grad_(True)
    on_torch = gae(rewards, graph_values, next_values, terminated, truncated, 0.97, 0.9)
    assert on_torch[1].requires_grad
    expected = _naive_gae(rewards, values, next_values, terminated, truncated, 0.97, 0.9)
    for result in (on_numpy, tuple(torch.from_numpy(a) for a in arrays), on_torch):
        assert_close(result[0].detach(), expected[0])
        assert_close(result[1].detach(), expected[1])
