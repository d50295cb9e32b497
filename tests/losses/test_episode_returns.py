"""Monte-Carlo returns of complete episodes: hand-computed arrays and a naive loop."""

import pytest
import torch

from shoal.losses import episode_returns


def test_hand_computed():
    # env 0: episode of 2 steps terminates at t=1, next one truncates at t=3 (no bootstrap).
    # env 1: no episode ends: every step is incomplete and only sums the rewards seen.
    rewards = torch.tensor([[1.0, 1.0], [2.0, 1.0], [1.0, 1.0], [4.0, 1.0]])
    terminated = torch.tensor([[False, False], [True, False], [False, False], [False, False]])
    truncated = torch.tensor([[False, False], [False, False], [False, False], [True, False]])
    returns, complete = episode_returns(rewards, terminated, truncated, gamma=0.5)
    expected_env0 = [1.0 + 0.5 * 2.0, 2.0, 1.0 + 0.5 * 4.0, 4.0]
    assert torch.allclose(returns[:, 0], torch.tensor(expected_env0))
    assert torch.allclose(returns[:, 1], torch.tensor([1.875, 1.75, 1.5, 1.0]))
    assert complete[:, 0].all() and not complete[:, 1].any()


def test_incomplete_suffix():
    rewards = torch.ones(4, 1)
    terminated = torch.tensor([[False], [True], [False], [False]])
    returns, complete = episode_returns(rewards, terminated, torch.zeros_like(terminated), 1.0)
    assert complete.flatten().tolist() == [True, True, False, False]
    assert returns.flatten().tolist() == [2.0, 1.0, 2.0, 1.0]


def test_matches_naive_loop_with_trailing_axes():
    torch.manual_seed(0)
    t_, b_, n_ = 7, 3, 2
    rewards = torch.randn(t_, b_, n_, dtype=torch.float64)
    terminated = torch.rand(t_, b_, n_) < 0.2
    truncated = (torch.rand(t_, b_, n_) < 0.2) & ~terminated
    returns, complete = episode_returns(rewards, terminated, truncated, gamma=0.9)
    for b in range(b_):
        for n in range(n_):
            g, ended = 0.0, False
            for t in reversed(range(t_)):
                done = bool(terminated[t, b, n] or truncated[t, b, n])
                g = rewards[t, b, n].item() + (0.0 if done else 0.9 * g)
                ended = ended or done
                assert returns[t, b, n].item() == pytest.approx(g)
                assert bool(complete[t, b, n]) == ended
    assert returns.dtype == torch.float64 and complete.dtype == torch.bool


def test_shape_errors():
    with pytest.raises(ValueError, match="same shape"):
        episode_returns(torch.zeros(3, 2), torch.zeros(3, 1), torch.zeros(3, 2), 0.9)
