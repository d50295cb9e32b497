"""Tests for shoal.losses.actor_critic: the squashed Gaussian density against the change of
variables formula and a Monte-Carlo histogram, and hand-computed targets and losses of DDPG,
TD3, SAC and discrete SAC."""

import math

import pytest
import torch
from torch.distributions import Normal
from torch.testing import assert_close

from shoal.losses.actor_critic import (
    deterministic_actor_loss,
    discrete_sac_actor_loss,
    discrete_soft_value,
    ensemble_td_loss,
    entropy_temperature_loss,
    sac_actor_loss,
    smoothed_target_actions,
    soft_q_target,
    squashed_gaussian_log_prob,
    tanh_log_det_jacobian,
    twin_min_target,
)

LN2 = math.log(2.0)


# ------------------------------------------------------------------ squashed Gaussian density


def _reference_log_prob(mean, std, u):
    """Change of variables in float64: log N(u; mean, std) - sum log(1 - tanh(u)^2)."""
    mean, std, u = mean.double(), std.double(), u.double()
    return Normal(mean, std).log_prob(u).sum(-1) - torch.log(1 - torch.tanh(u) ** 2).sum(-1)


def test_log_prob_matches_change_of_variables_float64():
    gen = torch.Generator().manual_seed(0)
    mean = torch.randn(4, 5, 3, generator=gen, dtype=torch.float64)
    log_std = 0.5 * torch.randn(4, 5, 3, generator=gen, dtype=torch.float64)
    u = mean + log_std.exp() * torch.randn(4, 5, 3, generator=gen, dtype=torch.float64)
    u = u.clamp(-4.0, 4.0)  # moderate: the naive formula is accurate here
    got = squashed_gaussian_log_prob(mean, log_std, u)
    assert got.shape == (4, 5)
    assert_close(got, _reference_log_prob(mean, log_std.exp(), u), rtol=1e-10, atol=1e-10)


def test_log_prob_float32_close_to_float64_reference():
    gen = torch.Generator().manual_seed(1)
    mean = torch.randn(64, 2, generator=gen)
    log_std = 0.3 * torch.randn(64, 2, generator=gen)
    u = (mean + log_std.exp() * torch.randn(64, 2, generator=gen)).clamp(-3.0, 3.0)
    got = squashed_gaussian_log_prob(mean, log_std, u)
    assert got.dtype == torch.float32
    assert_close(got.double(), _reference_log_prob(mean, log_std.exp(), u), rtol=1e-4, atol=1e-4)


def test_log_prob_hand_computed_at_zero():
    # u = mean = 0, std = 1, d = 2: log N = 2 * (-0.5 log(2 pi)) = -1.8378771;
    # tanh(0) = 0 so the Jacobian term is log(1) = 0.
    got = squashed_gaussian_log_prob(torch.zeros(2), torch.zeros(2), torch.zeros(2))
    assert_close(got, torch.tensor(-math.log(2 * math.pi)))
    assert_close(tanh_log_det_jacobian(torch.zeros(1, 3)), torch.zeros(1))


def test_log_det_jacobian_hand_computed_moderate():
    # log(1 - tanh(u)^2) = -2 log cosh(u): cosh(0.5) = 1.12762597, log = 0.12011450;
    # cosh(-1) = 1.54308063, log = 0.43378083. Sum over the last axis:
    # -2 (0.12011450 + 0.43378083) = -1.10779066.
    got = tanh_log_det_jacobian(torch.tensor([[0.5, -1.0]], dtype=torch.float64))
    assert_close(got, torch.tensor([-1.10779066], dtype=torch.float64), rtol=0, atol=1e-7)


@pytest.mark.parametrize("u", [15.0, -15.0, 40.0, -60.0])
def test_log_det_jacobian_finite_for_large_u(u):
    # 1 - tanh(15)^2 rounds to 0 in float32 (the naive log is -inf), but
    # log(1 - tanh(u)^2) = -2 log cosh(u) = 2 log 2 - 2|u| - 2 log(1 + e^{-2|u|}),
    # and e^{-30} ~ 1e-13 is negligible: at u = 15, 2 * 0.6931472 - 30 = -28.6137056.
    x = torch.tensor([[u]], requires_grad=True)
    naive = torch.log(1 - torch.tanh(x.detach()) ** 2)
    assert torch.isinf(naive).all()  # the failure mode the rewrite avoids
    got = tanh_log_det_jacobian(x)
    assert torch.isfinite(got).all()
    assert_close(got, torch.tensor([2 * LN2 - 2 * abs(u)]), rtol=1e-6, atol=1e-5)
    # d/du log(1 - tanh(u)^2) = -2 tanh(u) = -+2 here, also finite.
    got.sum().backward()
    assert_close(x.grad, torch.tensor([[-2.0 * math.copysign(1.0, u)]]))


def test_log_prob_finite_and_asymptotic_for_large_u():
    # mean 14, std 1, u = 15 (d = 1): log N = -0.5 - 0.9189385 = -1.4189385; minus the
    # Jacobian term (2 log 2 - 30 = -28.6137056) gives 27.1947671.
    got = squashed_gaussian_log_prob(torch.tensor([14.0]), torch.zeros(1), torch.tensor([15.0]))
    assert torch.isfinite(got)
    assert_close(got, torch.tensor(27.1947671), rtol=1e-6, atol=1e-4)


def _density(a, mean, std):
    """exp(log pi(a)) at squashed actions a (float64, 1-D), through u = atanh(a)."""
    u = torch.atanh(a).unsqueeze(-1)
    m = torch.full_like(u, mean)
    log_std = torch.full_like(u, math.log(std))
    return squashed_gaussian_log_prob(m, log_std, u).exp()


def _bin_integral(lo, hi, mean, std, points=4001):
    eps = 1e-12  # atanh(+-1) is infinite; the density is ~0 there anyway
    grid = torch.linspace(max(lo, -1 + eps), min(hi, 1 - eps), points, dtype=torch.float64)
    return torch.trapezoid(_density(grid, mean, std), grid).item()


@pytest.mark.parametrize(("mean", "std"), [(0.3, 0.8), (-0.5, 0.5)])
def test_density_integrates_to_one(mean, std):
    assert _bin_integral(-1.0, 1.0, mean, std, points=200_001) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize(("mean", "std"), [(0.3, 0.8), (-0.5, 0.5)])
def test_density_matches_monte_carlo_histogram(mean, std):
    n = 200_000
    gen = torch.Generator().manual_seed(1234)
    a = torch.tanh(mean + std * torch.randn(n, generator=gen, dtype=torch.float64))
    edges = [-1.0, -0.6, -0.2, 0.2, 0.6, 0.9, 1.0]
    normal = Normal(torch.tensor(mean, dtype=torch.float64), std)
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        empirical = ((a >= lo) & (a < hi)).double().mean().item()
        integral = _bin_integral(lo, hi, mean, std)
        # Binomial standard error <= 0.5 / sqrt(2e5) = 0.0011; 0.005 is ~4.5 of them.
        assert integral == pytest.approx(empirical, abs=0.005), (lo, hi)
        # The exact bin mass, P(atanh(lo) <= u < atanh(hi)) by the Normal CDF.
        exact = (
            normal.cdf(torch.atanh(torch.tensor(min(hi, 1 - 1e-15), dtype=torch.float64)))
            - normal.cdf(torch.atanh(torch.tensor(max(lo, -1 + 1e-15), dtype=torch.float64)))
        ).item()
        assert integral == pytest.approx(exact, abs=1e-5), (lo, hi)


# ------------------------------------------------------------------- smoothed_target_actions


def test_smoothing_zero_noise_is_identity_inside_box():
    actions = torch.tensor([[-0.9, 0.0, 0.5], [0.99, -0.3, -1.0]])
    assert torch.equal(smoothed_target_actions(actions, 0.0, 0.5), actions)


def test_smoothing_huge_noise_is_clipped_to_noise_clip_and_box():
    torch.manual_seed(0)
    clip = 0.5
    base = torch.tensor([-0.2, 0.0, 0.3, 0.9, -0.95])
    actions = base.repeat(2000, 1)
    out = smoothed_target_actions(actions, 100.0, clip)
    assert out.shape == actions.shape
    lower = (actions - clip).clamp(-1.0, 1.0)
    upper = (actions + clip).clamp(-1.0, 1.0)
    assert (out >= lower).all() and (out <= upper).all()
    assert (out >= -1.0).all() and (out <= 1.0).all()
    # With std 100 almost every draw exceeds the clip: outputs sit exactly on the bounds,
    # a - c and a + c, with both signs hit in every column.
    for col in range(base.numel()):
        assert (out[:, col] == lower[0, col]).any()
        assert (out[:, col] == upper[0, col]).any()
    # Near the edges the box clips: 0.9 + 0.5 -> 1.0, -0.95 - 0.5 -> -1.0.
    assert (out[:, 3] == 1.0).any() and (out[:, 4] == -1.0).any()
    assert out[:, 3].max() == 1.0 and out[:, 4].min() == -1.0


def test_smoothing_small_noise_varies_and_stays_near():
    torch.manual_seed(1)
    actions = torch.zeros(5000, 1)
    out = smoothed_target_actions(actions, 0.2, 0.5)
    # Clipped N(0, 0.2^2) at 2.5 std: the std barely shrinks, mean ~0.
    assert out.std().item() == pytest.approx(0.2, abs=0.01)
    assert abs(out.mean().item()) < 0.015
    assert out.abs().max() <= 0.5


# ------------------------------------------------------------------ twin_min / soft targets


def test_twin_min_target_hand_computed():
    returns = torch.tensor([1.0, 2.0])
    discounts = torch.tensor([0.99, 0.0])
    next_q = torch.tensor([[3.0, 5.0], [4.0, 1.0]])
    # Column-wise min [3, 1]; the second transition is terminal.
    assert_close(twin_min_target(returns, discounts, next_q), torch.tensor([1 + 0.99 * 3, 2.0]))


def test_twin_min_single_critic_is_plain_ddpg_target():
    next_q = torch.tensor([[2.0, -1.0, 4.0]])
    got = twin_min_target(torch.tensor([0.5, 0.0, 1.0]), torch.tensor([0.9, 0.5, 0.0]), next_q)
    # 0.5 + 0.9 * 2 = 2.3; 0 + 0.5 * -1 = -0.5; 1 + 0 = 1.
    assert_close(got, torch.tensor([2.3, -0.5, 1.0]))


def test_soft_q_target_hand_computed():
    returns = torch.tensor([1.0, 2.0])
    discounts = torch.tensor([0.99, 0.5])
    next_q = torch.tensor([[3.0, 5.0], [4.0, 1.0]])
    next_log_prob = torch.tensor([-1.0, 0.5])
    # min Q = [3, 1]; minus 0.2 * log pi = [3 + 0.2, 1 - 0.1] = [3.2, 0.9];
    # y = [1 + 0.99 * 3.2, 2 + 0.5 * 0.9] = [4.168, 2.45].
    got = soft_q_target(returns, discounts, next_q, next_log_prob, 0.2)
    assert_close(got, torch.tensor([4.168, 2.45]))
    # A tensor alpha gives the same; no log-prob is the twin-min target.
    alpha = torch.tensor(0.2)
    assert_close(soft_q_target(returns, discounts, next_q, next_log_prob, alpha), got)
    assert_close(soft_q_target(returns, discounts, next_q, None, alpha), torch.tensor([3.97, 2.5]))


def test_targets_are_detached():
    returns = torch.tensor([1.0, 2.0], requires_grad=True)
    discounts = torch.tensor([0.99, 0.5])
    next_q = torch.tensor([[3.0, 5.0], [4.0, 1.0]], requires_grad=True)
    log_prob = torch.tensor([-1.0, 0.5], requires_grad=True)
    alpha = torch.tensor(0.2, requires_grad=True)
    soft = soft_q_target(returns, discounts, next_q, log_prob, alpha)
    twin = twin_min_target(returns, discounts, next_q)
    assert not soft.requires_grad and soft.grad_fn is None
    assert not twin.requires_grad and twin.grad_fn is None
    probs = torch.tensor([[0.5, 0.5]], requires_grad=True)
    value = discrete_soft_value(probs, next_q[:, :1].unsqueeze(-1).expand(2, 1, 2), alpha)
    assert not value.requires_grad


# ---------------------------------------------------------------------- ensemble_td_loss

# Two critics, three samples: TD errors target - q are [1, -2, 3] and [-1, 0, 2].
Q = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 1.0]])
TARGET = torch.tensor([2.0, 0.0, 3.0])
WEIGHTS = torch.tensor([1.0, 0.5, 0.0])


@pytest.mark.parametrize(
    ("kind", "weights", "want"),
    [
        # 0.5 e^2: [0.5, 2, 4.5] mean 7/3 and [0.5, 0, 2] mean 5/6; sum 19/6.
        ("mse", None, 19 / 6),
        # Weighted: (0.5 + 1 + 0) / 3 = 1/2 and (0.5 + 0 + 0) / 3 = 1/6; sum 2/3.
        ("mse", WEIGHTS, 2 / 3),
        # Huber (delta 1): |e| = 1, 2, 3 -> 0.5, 1.5, 2.5 mean 3/2; |e| = 1, 0, 2 ->
        # 0.5, 0, 1.5 mean 2/3; sum 13/6.
        ("huber", None, 13 / 6),
        # Weighted: (0.5 + 0.75 + 0) / 3 = 5/12 and 0.5 / 3 = 2/12; sum 7/12.
        ("huber", WEIGHTS, 7 / 12),
    ],
)
def test_ensemble_td_loss_hand_computed(kind, weights, want):
    q = Q.clone().requires_grad_(True)
    loss, priorities = ensemble_td_loss(q, TARGET, weights, kind)
    assert_close(loss, torch.tensor(want))
    # Mean |TD error| over critics: [(1 + 1) / 2, (2 + 0) / 2, (3 + 2) / 2].
    assert_close(priorities, torch.tensor([1.0, 1.0, 2.5]))
    assert not priorities.requires_grad
    loss.backward()
    # Each critic's own mean: d/dq of w * 0.5 (q - y)^2 / N is -w * e / 3 (error clipped to
    # [-1, 1] for huber), no factor of 1/M.
    errors = TARGET - Q
    if kind == "huber":
        errors = errors.clamp(-1.0, 1.0)
    w = torch.ones(3) if weights is None else weights
    assert_close(q.grad, -w * errors / 3)


def test_ensemble_td_loss_single_critic_is_td_loss():
    loss, priorities = ensemble_td_loss(Q[:1], TARGET, None, "mse")
    assert_close(loss, torch.tensor(7 / 3))
    assert_close(priorities, torch.tensor([1.0, 2.0, 3.0]))


# ------------------------------------------------------------------------------ actor losses


def test_deterministic_actor_loss():
    q = torch.tensor([1.0, 2.0, 6.0], requires_grad=True)
    loss = deterministic_actor_loss(q)
    assert_close(loss, torch.tensor(-3.0))
    loss.backward()
    assert_close(q.grad, torch.full((3,), -1 / 3))


def test_sac_actor_loss_hand_computed():
    q = torch.tensor([[1.0, 4.0], [2.0, 3.0]], requires_grad=True)
    log_prob = torch.tensor([-1.0, 0.5], requires_grad=True)
    alpha = torch.tensor(0.5, requires_grad=True)
    # min over critics [1, 3]; 0.5 * [-1, 0.5] - [1, 3] = [-1.5, -2.75]; mean -2.125.
    loss = sac_actor_loss(q, log_prob, alpha)
    assert_close(loss, torch.tensor(-2.125))
    assert_close(sac_actor_loss(q, log_prob, 0.5), loss)
    loss.backward()
    assert alpha.grad is None  # alpha is detached
    assert_close(log_prob.grad, torch.tensor([0.25, 0.25]))
    # Only the minimum critic of each sample gets gradient -1/N.
    assert_close(q.grad, torch.tensor([[-0.5, 0.0], [0.0, -0.5]]))


# Two critics, two states, two actions; min over critics [[1, 0], [3, 1]].
NEXT_Q = torch.tensor([[[1.0, 2.0], [3.0, 4.0]], [[2.0, 0.0], [5.0, 1.0]]])
PROBS = torch.tensor([[0.5, 0.5], [1.0, 0.0]])


def test_discrete_soft_value_hand_computed():
    # State 0: 0.5 (1 - 0.1 ln 0.5) + 0.5 (0 - 0.1 ln 0.5) = 0.5 + 0.1 ln 2 = 0.5693147.
    # State 1: all mass on action 0: 3 (the zero-probability action adds 0, not nan).
    got = discrete_soft_value(PROBS, NEXT_Q, 0.1)
    assert_close(got, torch.tensor([0.5 + 0.1 * LN2, 3.0]))
    # alpha = 0: the expected min-Q.
    assert_close(discrete_soft_value(PROBS, NEXT_Q, 0.0), torch.tensor([0.5, 3.0]))


def test_discrete_sac_actor_loss_hand_computed():
    probs = PROBS.clone().requires_grad_(True)
    q = NEXT_Q.clone().requires_grad_(True)
    alpha = torch.tensor(0.1, requires_grad=True)
    # State 0: 0.5 (0.1 ln 0.5 - 1) + 0.5 (0.1 ln 0.5 - 0) = -0.1 ln 2 - 0.5 = -0.5693147.
    # State 1: 1 * (0 - 3) = -3. Mean -1.7846574.
    loss = discrete_sac_actor_loss(probs, q, alpha)
    assert_close(loss, torch.tensor((-0.5 - 0.1 * LN2 - 3.0) / 2))
    loss.backward()
    assert q.grad is None and alpha.grad is None
    # d/dp_a of p_a (alpha log p_a - Q_a), over N = 2: (0.1 ln 0.5 + 0.1 - Q_a) / 2.
    assert_close(
        probs.grad[0], torch.tensor([(-0.1 * LN2 + 0.1 - 1.0) / 2, (-0.1 * LN2 + 0.1) / 2])
    )


# --------------------------------------------------------------------- entropy temperature


@pytest.mark.parametrize(
    ("target_entropy", "alpha_goes"),
    [
        # Entropy estimate -mean(log pi) = 1 < target 2: raise alpha.
        (2.0, "up"),
        # Entropy 1 > target 0: lower alpha.
        (0.0, "down"),
    ],
)
def test_entropy_temperature_direction(target_entropy, alpha_goes):
    log_alpha = torch.tensor(0.0, requires_grad=True)
    log_prob = torch.tensor([-0.5, -1.5], requires_grad=True)
    loss = entropy_temperature_loss(log_alpha, log_prob, target_entropy)
    loss.backward()
    # d loss / d log_alpha = -mean(log pi + target) = -(target - 1).
    assert_close(log_alpha.grad, torch.tensor(-(target_entropy - 1.0)))
    assert log_prob.grad is None
    optimizer = torch.optim.SGD([log_alpha], lr=0.1)
    before = log_alpha.exp().item()
    optimizer.step()
    after = log_alpha.exp().item()
    assert (after > before) if alpha_goes == "up" else (after < before)


def test_entropy_temperature_loss_value():
    # -mean(0.5 * ([-0.5, -1.5] + 2)) = -0.5 * mean([1.5, 0.5]) = -0.5.
    got = entropy_temperature_loss(torch.tensor(0.5), torch.tensor([-0.5, -1.5]), 2.0)
    assert_close(got, torch.tensor(-0.5))
