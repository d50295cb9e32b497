"""Tests for the n-step replay helpers of shoal.losses.returns."""

import pytest
import torch
from torch.testing import assert_close

from shoal.losses import bootstrap_discount, n_step_return, q_learning_target

GAMMA = 0.5


def _windows():
    """Four n=3 windows as replay hands them out (rewards zero after the K real steps).

    row 0: full window, the episode goes on        K=3
    row 1: terminated after 2 steps                K=2
    row 2: truncated (time limit) after 1 step     K=1
    row 3: terminated after 1 step                 K=1
    """
    rewards = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 0.0], [4.0, 0.0, 0.0], [-1.0, 0.0, 0.0]])
    steps = torch.tensor([3, 2, 1, 1])
    terminated = torch.tensor([False, True, False, True])
    return rewards, steps, terminated


def test_n_step_return_hand_computed():
    rewards, _, _ = _windows()
    # 1 + 0.5 * 2 + 0.25 * 3 = 2.75;  1 + 0.5 * 2 = 2;  4;  -1
    assert_close(n_step_return(rewards, GAMMA), torch.tensor([2.75, 2.0, 4.0, -1.0]))


def test_bootstrap_discount_terminated_vs_truncated():
    _, steps, terminated = _windows()
    # gamma^K, except at termination; the truncated row still bootstraps.
    assert_close(bootstrap_discount(steps, terminated, GAMMA), torch.tensor([0.125, 0.0, 0.5, 0.0]))


def test_n_step_target_at_episode_ends():
    rewards, steps, terminated = _windows()
    returns = n_step_return(rewards, GAMMA)
    discounts = bootstrap_discount(steps, terminated, GAMMA)
    next_q = torch.tensor([[8.0, 0.0], [100.0, 0.0], [0.0, 2.0], [100.0, 100.0]])
    target = q_learning_target(returns, discounts, next_q)
    # Terminated rows ignore next_q entirely; the truncated row bootstraps after one step.
    assert_close(target, torch.tensor([2.75 + 0.125 * 8.0, 2.0, 4.0 + 0.5 * 2.0, -1.0]))


def test_dtypes():
    rewards, steps, terminated = _windows()
    assert n_step_return(rewards.double(), GAMMA).dtype == torch.float64
    assert bootstrap_discount(steps, terminated, GAMMA).dtype == torch.float32
    out = bootstrap_discount(steps, terminated.float(), GAMMA, dtype=torch.float64)
    assert out.dtype == torch.float64
    assert_close(out, torch.tensor([0.125, 0.0, 0.5, 0.0], dtype=torch.float64))


def _naive(rewards, steps, terminated, gamma):
    returns, discounts = [], []
    for row, k, term in zip(rewards.tolist(), steps.tolist(), terminated.tolist(), strict=True):
        returns.append(sum(gamma**i * row[i] for i in range(k)))
        discounts.append(0.0 if term else gamma**k)
    return torch.tensor(returns, dtype=torch.float64), torch.tensor(discounts, dtype=torch.float64)


@pytest.mark.parametrize("n", [1, 3, 5])
def test_matches_naive_loop(n):
    g = torch.Generator().manual_seed(n)
    size = 64
    steps = torch.randint(1, n + 1, (size,), generator=g)
    terminated = (torch.rand(size, generator=g) < 0.3) & (steps <= n)
    rewards = torch.randn(size, n, generator=g, dtype=torch.float64)
    rewards[torch.arange(n) >= steps.unsqueeze(-1)] = 0.0
    exp_returns, exp_discounts = _naive(rewards, steps, terminated, 0.97)
    assert_close(n_step_return(rewards, 0.97), exp_returns)
    assert_close(bootstrap_discount(steps, terminated, 0.97, dtype=torch.float64), exp_discounts)


def test_shape_errors():
    with pytest.raises(ValueError, match=r"rewards must be \[N, n, ...\]"):
        n_step_return(torch.zeros(3), GAMMA)


def test_per_agent_rewards_keep_their_axis():
    rewards = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])  # [N=1, n=2, agents=2]
    torch.testing.assert_close(
        n_step_return(rewards, GAMMA), torch.tensor([[1 + GAMMA * 3, 2 + GAMMA * 4]])
    )
    with pytest.raises(ValueError, match="same shape"):
        bootstrap_discount(torch.ones(3, dtype=torch.long), torch.zeros(4, dtype=torch.bool), 0.9)
