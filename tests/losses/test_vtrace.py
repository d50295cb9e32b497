"""Tests for shoal.losses.vtrace: a hand-computed case, the paper's sum written as a naive
loop, and the on-policy limit (rho = c = 1), where V-trace is the n-step return."""

import math

import pytest
import torch
from torch.testing import assert_close

from shoal.losses import VTraceReturns, gae, vtrace

F, T = False, True


def _random_case(shape, seed=0):
    """A random rollout with off-policy log-probs; next_values[t] == values[t+1] inside an
    episode, the final observation's (unrelated) value at an episode end."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda: torch.randn(shape, generator=g, dtype=torch.float64)  # noqa: E731
    rewards, values, final_values = rand(), rand(), rand()
    behaviour, target = rand() - 1.0, rand() - 1.0
    terminated = torch.rand(shape, generator=g) < 0.15
    truncated = (torch.rand(shape, generator=g) < 0.1) & ~terminated
    next_values = final_values.clone()
    done = terminated | truncated
    next_values[:-1] = torch.where(done[:-1], final_values[:-1], values[1:])
    return behaviour, target, rewards, values, next_values, terminated, truncated


def _naive_vtrace(behaviour, target, rewards, values, next_values, terminated, truncated,
                  gamma, rho_bar, c_bar, pg_rho_bar, lam):  # fmt: skip
    """Espeholt et al. 2018, eq. 1, as a forward sum per (s, column):
    ``v_s = V(x_s) + sum_{t=s}^{end} gamma^{t-s} (prod_{i=s}^{t-1} c_i) delta_t``, the sum
    ending at the episode's end or the rollout's last step; then the advantages of sec. 4.2."""
    n_steps, n_cols = rewards.shape
    ratio = [[math.exp(target[t, b] - behaviour[t, b]) for b in range(n_cols)]
             for t in range(n_steps)]  # fmt: skip
    vs = [[0.0] * n_cols for _ in range(n_steps)]
    adv = [[0.0] * n_cols for _ in range(n_steps)]
    for b in range(n_cols):
        delta = []
        for t in range(n_steps):
            bootstrap = 0.0 if terminated[t, b] else gamma * float(next_values[t, b])
            rho = min(rho_bar, ratio[t][b])
            delta.append(rho * (float(rewards[t, b]) + bootstrap - float(values[t, b])))
        for s in range(n_steps):
            total, weight = 0.0, 1.0
            for t in range(s, n_steps):
                total += weight * delta[t]
                if terminated[t, b] or truncated[t, b]:
                    break
                weight *= gamma * lam * min(c_bar, ratio[t][b])
            vs[s][b] = float(values[s, b]) + total
        for s in range(n_steps):
            if terminated[s, b]:
                nxt = 0.0
            elif truncated[s, b] or s == n_steps - 1:
                nxt = float(next_values[s, b])
            else:
                nxt = vs[s + 1][b]
            target_s = float(rewards[s, b]) + gamma * nxt
            adv[s][b] = min(pg_rho_bar, ratio[s][b]) * (target_s - float(values[s, b]))
    return torch.tensor(vs, dtype=torch.float64), torch.tensor(adv, dtype=torch.float64)


def test_hand_computed():
    """gamma 0.5. Column 0: ratios 2 then 0.5, no episode end. v_1 = 2 + 0.5 * (2 + 0.5 * 4
    - 2) = 3; v_0 = 1 + min(1, 2) * (1 + 0.5 * 2 - 1) + 0.5 * min(1, 2) * (3 - 2) = 2.5;
    advantages: 1 * (1 + 0.5 * 3 - 1) = 1.5 and 0.5 * (2 + 0.5 * 4 - 2) = 1.
    Column 1: ratio 0.5, terminates at t=0: v_0 = 1 + 0.5 * (1 - 1) = 1, the trace stops;
    v_1 = 1 + 0.5 * (1 + 0.5 * 3 - 1) = 1.75. Column 2: ratio 1, truncated at t=0 with the
    final observation worth 6: v_0 = 1 + (1 + 3 - 1) = 4, its advantage bootstraps from 6 too.
    """
    log = math.log
    behaviour = torch.zeros(2, 3, dtype=torch.float64)
    target = torch.tensor([[log(2.0), log(0.5), 0.0], [log(0.5), log(0.5), 0.0]],
                          dtype=torch.float64)  # fmt: skip
    rewards = torch.tensor([[1.0, 1.0, 1.0], [2.0, 1.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[1.0, 1.0, 1.0], [2.0, 1.0, 1.0]], dtype=torch.float64)
    next_values = torch.tensor([[2.0, 5.0, 6.0], [4.0, 3.0, 3.0]], dtype=torch.float64)
    terminated = torch.tensor([[F, T, F], [F, F, F]])
    truncated = torch.tensor([[F, F, T], [F, F, F]])
    out = vtrace(behaviour, target, rewards, values, next_values, terminated, truncated, 0.5)
    assert isinstance(out, VTraceReturns)
    expected_vs = torch.tensor([[2.5, 1.0, 4.0], [3.0, 1.75, 2.5]], dtype=torch.float64)
    expected_adv = torch.tensor([[1.5, 0.0, 3.0], [1.0, 0.75, 1.5]], dtype=torch.float64)
    assert_close(out.vs, expected_vs)
    assert_close(out.pg_advantages, expected_adv)


@pytest.mark.parametrize(
    ("rho_bar", "c_bar", "pg_rho_bar", "lam"),
    [(1.0, 1.0, 1.0, 1.0), (2.0, 0.5, 1.5, 0.9), (None, None, None, 1.0)],
)
def test_matches_naive_sum(rho_bar, c_bar, pg_rho_bar, lam):
    inputs = _random_case((9, 5), seed=3)
    out = vtrace(*inputs, 0.9, rho_bar, c_bar, pg_rho_bar, lam)
    inf = math.inf
    expected_vs, expected_adv = _naive_vtrace(
        *inputs, 0.9, rho_bar or inf, c_bar or inf, pg_rho_bar or inf, lam
    )
    assert_close(out.vs, expected_vs)
    assert_close(out.pg_advantages, expected_adv)


def test_on_policy_is_n_step_return():
    """target = behaviour (rho = c = 1): the targets are the n-step returns bootstrapped at the
    rollout's end, at truncations (from the final observation) and zero after terminations,
    i.e. ``gae(lam=1)`` returns, and the advantages are those returns minus the baseline."""
    inputs = _random_case((12, 4), seed=7)
    behaviour, _, rewards, values, next_values, terminated, truncated = inputs
    assert terminated.any() and truncated.any()  # both kinds of ends inside the rollout
    out = vtrace(behaviour, behaviour, rewards, values, next_values, terminated, truncated, 0.95)
    advantages, returns = gae(rewards, values, next_values, terminated, truncated, 0.95, 1.0)
    assert_close(out.vs, returns)
    assert_close(out.pg_advantages, advantages)


def test_on_policy_hand_case_with_both_episode_ends():
    """One column, gamma 0.5, rewards 1: truncated at t=0 (final value 8), terminated at
    t=2, bootstrapped from 4 at the end. Returns: 1 + 0.5 * 8 = 5; t=1: 1 + 0.5 * 1 = 1.5;
    t=2: 1; t=3: 1 + 0.5 * 4 = 3."""
    shape = (4, 1)
    zeros = torch.zeros(shape)
    next_values = torch.tensor([[8.0], [3.0], [7.0], [4.0]])
    terminated = torch.tensor([[F], [F], [T], [F]])
    truncated = torch.tensor([[T], [F], [F], [F]])
    values = torch.tensor([[2.0], [3.0], [3.0], [9.0]])
    out = vtrace(zeros, zeros, torch.ones(shape), values, next_values, terminated, truncated, 0.5)
    assert out.vs.flatten().tolist() == [5.0, 1.5, 1.0, 3.0]
    assert out.pg_advantages.flatten().tolist() == [3.0, -1.5, -2.0, -6.0]


def test_trailing_axes_and_no_gradient():
    """An agent axis ``[T, B, N]`` goes through unchanged, and the targets carry no gradient
    even when the values do (they are regression targets)."""
    behaviour, target, rewards, values, next_values, terminated, truncated = _random_case(
        (6, 2, 3), seed=1
    )
    values = values.clone().requires_grad_(True)
    out = vtrace(behaviour, target, rewards, values, next_values, terminated, truncated, 0.9)
    assert out.vs.shape == (6, 2, 3) and not out.vs.requires_grad
    flat = vtrace(
        *(x.flatten(1) for x in (behaviour, target, rewards, values.detach(), next_values)),
        terminated.flatten(1),
        truncated.flatten(1),
        0.9,
    )
    assert_close(out.vs.flatten(1), flat.vs)
    assert_close(out.pg_advantages.flatten(1), flat.pg_advantages)


def test_shape_mismatch_is_an_error():
    x = torch.zeros(3, 2)
    with pytest.raises(ValueError, match="same shape"):
        vtrace(x, x, x, x, torch.zeros(3, 3), x.bool(), x.bool(), 0.9)
