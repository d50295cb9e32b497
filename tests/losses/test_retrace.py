"""Tests for shoal.losses.retrace: a hand-computed case, Munos et al.'s forward sum written as
a naive loop, the on-policy limit (n-step SARSA returns) and lambda = 0 (one-step targets)."""

import math

import pytest
import torch
from torch.testing import assert_close

from shoal.losses import discounted_returns, retrace

F, T = False, True


def _random_case(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    rand = lambda: torch.randn(shape, generator=g, dtype=torch.float64)  # noqa: E731
    q_taken, next_values, rewards, log_rhos = rand(), rand(), rand(), rand()
    terminated = torch.rand(shape, generator=g) < 0.15
    truncated = (torch.rand(shape, generator=g) < 0.1) & ~terminated
    return q_taken, next_values, rewards, terminated, truncated, log_rhos


def _naive_retrace(q, v_next, r, terminated, truncated, log_rhos, gamma, lam, c_bar):
    """Munos et al. 2016, eq. 3, as a forward sum per (s, column):
    ``Q_ret(s) = Q(x_s, a_s) + sum_{t>=s} gamma^{t-s} (prod_{i=s+1}^{t} c_i) delta_t`` with
    ``delta_t = r_t + gamma * E_pi Q(x_{t+1}) - Q(x_t, a_t)`` (no bootstrap after a
    termination), the sum ending at the episode's end or the rollout's last step."""
    n_steps, n_cols = r.shape
    out = [[0.0] * n_cols for _ in range(n_steps)]
    for b in range(n_cols):
        for s in range(n_steps):
            total, weight = float(q[s, b]), 1.0
            for t in range(s, n_steps):
                if t > s:
                    c = lam * min(c_bar, math.exp(float(log_rhos[t, b])))
                    weight *= gamma * c
                boot = 0.0 if terminated[t, b] else gamma * float(v_next[t, b])
                total += weight * (float(r[t, b]) + boot - float(q[t, b]))
                if terminated[t, b] or truncated[t, b]:
                    break
            out[s][b] = total
    return torch.tensor(out, dtype=torch.float64)


def test_hand_computed():
    # One column, three steps, no episode end; gamma 0.5, c = min(1, rho).
    q = torch.tensor([[1.0], [2.0], [3.0]])
    v_next = torch.tensor([[1.5], [2.5], [4.0]])
    r = torch.tensor([[1.0], [0.0], [2.0]])
    log_rhos = torch.log(torch.tensor([[0.3], [0.5], [2.0]]))
    flags = torch.zeros(3, 1, dtype=torch.bool)
    out = retrace(q, v_next, r, flags, flags, log_rhos, gamma=0.5)
    # G2 = 2 + 0.5 * 4 = 4; G1 = 0 + 0.5 * (2.5 + 1 * (4 - 3)) = 1.75;
    # G0 = 1 + 0.5 * (1.5 + 0.5 * (1.75 - 2)) = 1.6875
    assert_close(out, torch.tensor([[1.6875], [1.75], [4.0]]))


def test_episode_ends_stop_the_trace():
    q = torch.tensor([[1.0], [2.0], [3.0]])
    v_next = torch.tensor([[1.5], [9.0], [4.0]])
    r = torch.tensor([[1.0], [0.0], [2.0]])
    log_rhos = torch.zeros(3, 1)
    terminated = torch.tensor([[F], [T], [F]])
    out = retrace(q, v_next, r, terminated, torch.zeros_like(terminated), log_rhos, gamma=0.5)
    # t=1 terminates: G1 = 0; G0 = 1 + 0.5 * (1.5 + (0 - 2)) = 0.75; G2 = 2 + 2 = 4.
    assert_close(out, torch.tensor([[0.75], [0.0], [4.0]]))
    truncated = torch.tensor([[F], [T], [F]])
    out = retrace(q, v_next, r, torch.zeros_like(truncated), truncated, log_rhos, gamma=0.5)
    # t=1 truncates: G1 = 0 + 0.5 * 9 = 4.5 (bootstrap from the final observation).
    assert_close(out, torch.tensor([[1.0 + 0.5 * (1.5 + 4.5 - 2.0)], [4.5], [4.0]]))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("lam,c_bar", [(1.0, 1.0), (0.9, 1.0), (0.95, 2.0)])
def test_matches_naive_forward_sum(seed, lam, c_bar):
    case = _random_case((7, 3), seed)
    out = retrace(*case, gamma=0.9, lam=lam, clip_c_threshold=c_bar)
    assert_close(out, _naive_retrace(*case, gamma=0.9, lam=lam, c_bar=c_bar))


def test_on_policy_limit_is_n_step_sarsa():
    # pi = mu, lambda = 1 and a sampled next action whose Q is the bootstrap: Retrace's
    # corrections cancel and what remains is the n-step SARSA return.
    q, _, r, terminated, truncated, _ = _random_case((9, 4), seed=3)
    final = torch.randn(9, 4, dtype=torch.float64)
    done = terminated | truncated
    v_next = final.clone()
    v_next[:-1] = torch.where(done[:-1], final[:-1], q[1:])
    out = retrace(q, v_next, r, terminated, truncated, torch.zeros_like(q), gamma=0.95)
    assert_close(out, discounted_returns(r, v_next, terminated, truncated, 0.95))


def test_lambda_zero_is_one_step_expected_sarsa():
    q, v_next, r, terminated, truncated, log_rhos = _random_case((6, 2), seed=1)
    out = retrace(q, v_next, r, terminated, truncated, log_rhos, gamma=0.9, lam=0.0)
    assert_close(out, r + torch.where(terminated, 0.0, 0.9 * v_next))


def test_clipping_bounds_the_trace():
    # A huge ratio is clipped to c_bar = 1; unclipped it multiplies the correction.
    q = torch.zeros(2, 1)
    v_next = torch.zeros(2, 1)
    r = torch.tensor([[0.0], [1.0]])
    log_rhos = torch.log(torch.tensor([[1.0], [100.0]]))
    flags = torch.zeros(2, 1, dtype=torch.bool)
    clipped = retrace(q, v_next, r, flags, flags, log_rhos, gamma=1.0)
    unclipped = retrace(q, v_next, r, flags, flags, log_rhos, gamma=1.0, clip_c_threshold=None)
    assert_close(clipped[0], torch.tensor([1.0]))
    assert_close(unclipped[0], torch.tensor([100.0]))


def test_no_gradient_and_shape_check():
    q = torch.zeros(3, 2, requires_grad=True)
    flags = torch.zeros(3, 2, dtype=torch.bool)
    out = retrace(q, torch.zeros(3, 2), torch.ones(3, 2), flags, flags, torch.zeros(3, 2), 0.9)
    assert not out.requires_grad
    with pytest.raises(ValueError, match="same shape"):
        retrace(q, torch.zeros(3, 1), torch.ones(3, 2), flags, flags, torch.zeros(3, 2), 0.9)
