"""Tests for shoal.losses.q_learning: hand-computed arrays and naive Python loops."""

import math

import pytest
import torch
from torch.testing import assert_close

from shoal.losses import (
    categorical_projection,
    categorical_td_loss,
    combine_heads,
    q_learning_target,
    quantile_huber_loss,
    quantile_midpoints,
    quantile_target,
    random_convex_combination,
    td_loss,
)

# ------------------------------------------------------------------------ q_learning_target

RETURNS = torch.tensor([1.0, 2.0, 0.5])
DISCOUNTS = torch.tensor([0.5, 0.0, 0.9])
NEXT_Q_TARGET = torch.tensor([[1.0, 3.0, 2.0], [5.0, 0.0, 1.0], [4.0, -1.0, 6.0]])


def test_dqn_target_hand_computed():
    target = q_learning_target(RETURNS, DISCOUNTS, NEXT_Q_TARGET)
    # max_a Q_target = [3, 5, 6]; row 1 is terminal (discount 0).
    assert_close(target, torch.tensor([1.0 + 0.5 * 3.0, 2.0, 0.5 + 0.9 * 6.0]))


def test_double_dqn_target_hand_computed():
    # Online argmax [0, 1, 2]: differs from the target argmax [1, 0, 2] in rows 0 and 1.
    next_q_online = torch.tensor([[3.0, 1.0, 0.0], [0.0, 9.0, 1.0], [0.0, 0.0, 1.0]])
    target = q_learning_target(RETURNS, DISCOUNTS, NEXT_Q_TARGET, next_q_online)
    # Evaluated by the target network: Q_target[0, 0] = 1, Q_target[2, 2] = 6.
    assert_close(target, torch.tensor([1.0 + 0.5 * 1.0, 2.0, 0.5 + 0.9 * 6.0]))


def test_masked_max_and_argmax():
    mask = torch.tensor([[True, False, True], [True, True, True], [True, True, False]])
    # The best target action of rows 0 and 2 is illegal: max over the legal ones.
    dqn = q_learning_target(RETURNS, DISCOUNTS, NEXT_Q_TARGET, next_action_mask=mask)
    assert_close(dqn, torch.tensor([1.0 + 0.5 * 2.0, 2.0, 0.5 + 0.9 * 4.0]))
    # Online prefers illegal action 1 in row 0; the legal argmax is action 2 (online 0.5 > 0.1).
    next_q_online = torch.tensor([[0.1, 9.0, 0.5], [0.0, 0.0, 0.0], [0.0, 1.0, 5.0]])
    double = q_learning_target(RETURNS, DISCOUNTS, NEXT_Q_TARGET, next_q_online, mask)
    assert_close(double, torch.tensor([1.0 + 0.5 * 2.0, 2.0, 0.5 + 0.9 * -1.0]))


def test_no_legal_action_bootstraps_zero():
    mask = torch.tensor([[False, False, False], [True, True, True], [False, False, False]])
    next_q = NEXT_Q_TARGET.clone()
    next_q[0] = float("inf")  # a placeholder value at a masked position must not leak
    for online in (None, next_q):
        target = q_learning_target(RETURNS, DISCOUNTS, next_q, online, mask)
        assert_close(target, torch.tensor([1.0, 2.0, 0.5]))


def test_target_is_detached():
    next_q = NEXT_Q_TARGET.clone().requires_grad_()
    online = NEXT_Q_TARGET.clone().requires_grad_()
    assert not q_learning_target(RETURNS, DISCOUNTS, next_q, online).requires_grad


def _naive_q_target(returns, discounts, next_q_target, next_q_online, mask):
    out = []
    for i in range(len(returns)):
        legal = [a for a in range(next_q_target.shape[1]) if mask[i][a]]
        if not legal:
            out.append(returns[i].item())
            continue
        selector = next_q_target if next_q_online is None else next_q_online
        best = max(legal, key=lambda a, i=i, s=selector: s[i][a].item())
        out.append(returns[i].item() + discounts[i].item() * next_q_target[i][best].item())
    return torch.tensor(out)


@pytest.mark.parametrize("double", [False, True])
def test_q_target_matches_naive(double):
    g = torch.Generator().manual_seed(int(double))
    n, a = 40, 5
    returns, discounts = torch.randn(n, generator=g), torch.rand(n, generator=g)
    next_q_target = torch.randn(n, a, generator=g)
    next_q_online = torch.randn(n, a, generator=g) if double else None
    mask = torch.rand(n, a, generator=g) < 0.6
    target = q_learning_target(returns, discounts, next_q_target, next_q_online, mask)
    assert_close(target, _naive_q_target(returns, discounts, next_q_target, next_q_online, mask))


def test_q_target_shape_error():
    with pytest.raises(ValueError, match="next_action_mask must have shape"):
        q_learning_target(RETURNS, DISCOUNTS, NEXT_Q_TARGET, None, torch.ones(3, 2, dtype=bool))


# --------------------------------------------------------------------------------- td_loss

TD_TARGET = torch.tensor([0.5, -2.0, 3.0, 1.0])


def test_td_loss_huber_vs_mse():
    q = torch.zeros(4, requires_grad=True)
    huber, td_errors = td_loss(q, TD_TARGET)
    # errors [0.5, -2, 3, 1]: 0.5 * 0.25, 2 - 0.5, 3 - 0.5, 0.5 * 1
    assert_close(huber, torch.tensor((0.125 + 1.5 + 2.5 + 0.5) / 4))
    assert_close(td_errors, TD_TARGET)
    assert not td_errors.requires_grad
    huber.backward()
    # Gradient clipping effect: the error is clipped to [-1, 1].
    assert_close(q.grad, -torch.tensor([0.5, -1.0, 1.0, 1.0]) / 4)

    q = torch.zeros(4, requires_grad=True)
    mse, _ = td_loss(q, TD_TARGET, kind="mse")
    assert_close(mse, torch.tensor((0.125 + 2.0 + 4.5 + 0.5) / 4))
    mse.backward()
    assert_close(q.grad, -TD_TARGET / 4)


def test_td_loss_huber_delta():
    q = torch.zeros(4, requires_grad=True)
    loss, _ = td_loss(q, TD_TARGET, huber_delta=2.0)
    # 0.5 * 0.25, 0.5 * 4, 2 * (3 - 1), 0.5 * 1
    assert_close(loss, torch.tensor((0.125 + 2.0 + 4.0 + 0.5) / 4))
    loss.backward()
    assert_close(q.grad, -torch.tensor([0.5, -2.0, 2.0, 1.0]) / 4)


def test_td_loss_importance_weights():
    weights = torch.tensor([1.0, 0.5, 0.0, 2.0])
    for kind, per_sample in (("huber", [0.125, 1.5, 2.5, 0.5]), ("mse", [0.125, 2.0, 4.5, 0.5])):
        q = torch.zeros(4, requires_grad=True)
        loss, _ = td_loss(q, TD_TARGET, weights, kind=kind)
        expected = sum(w * p for w, p in zip(weights.tolist(), per_sample, strict=True)) / 4
        assert_close(loss, torch.tensor(expected))
        loss.backward()
        unweighted = torch.zeros(4, requires_grad=True)
        td_loss(unweighted, TD_TARGET, kind=kind)[0].backward()
        assert_close(q.grad, weights * unweighted.grad)


def test_td_loss_target_gets_no_gradient():
    q = torch.zeros(4, requires_grad=True)
    target = TD_TARGET.clone().requires_grad_()
    td_loss(q, target)[0].backward()
    assert target.grad is None


def test_td_loss_bad_kind():
    with pytest.raises(ValueError, match="kind must be"):
        td_loss(torch.zeros(2), torch.zeros(2), kind="l1")


# ----------------------------------------------------------------------------------- C51

SUPPORT = torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0])  # delta_z = 1


def test_categorical_projection_hand_computed():
    next_probs = torch.tensor(
        [
            [0.1, 0.2, 0.3, 0.2, 0.2],
            [0.2, 0.2, 0.2, 0.2, 0.2],
            [0.2, 0.2, 0.2, 0.2, 0.2],
            [0.1, 0.2, 0.3, 0.2, 0.2],
            [0.5, 0.0, 0.0, 0.0, 0.5],
        ]
    )
    returns = torch.tensor([0.5, -1.0, 3.0, -5.0, 1.0])
    discounts = torch.tensor([1.0, 0.5, 0.0, 0.9, 0.0])
    projected = categorical_projection(next_probs, SUPPORT, returns, discounts)
    expected = torch.tensor(
        [
            # Tz = [-1.5, -0.5, 0.5, 1.5, 2.5 -> 2]: halves to the neighbours, the last atom is
            # beyond v_max and clipped onto it.
            [0.05, 0.05 + 0.1, 0.1 + 0.15, 0.15 + 0.1, 0.1 + 0.2],
            # Tz = [-2, -1.5, -1, -0.5, 0]: exact hits on the bottom edge, -1 and 0.
            [0.2 + 0.1, 0.1 + 0.2 + 0.1, 0.1 + 0.2, 0.0, 0.0],
            # Terminal, G = 3 beyond v_max: everything on the top edge.
            [0.0, 0.0, 0.0, 0.0, 1.0],
            # Tz = -5 + 0.9 z <= -3.2: everything clipped onto the bottom edge.
            [1.0, 0.0, 0.0, 0.0, 0.0],
            # Terminal, G = 1 exactly on an interior atom (l == u in Algorithm 1).
            [0.0, 0.0, 0.0, 1.0, 0.0],
        ]
    )
    assert_close(projected, expected)
    assert_close(projected.sum(-1), torch.ones(5))


def test_categorical_projection_three_atoms():
    support = torch.tensor([-1.0, 0.0, 1.0])
    next_probs = torch.tensor([[0.25, 0.5, 0.25]])
    # Tz = 0.25 + 0.5 z = [-0.25, 0.25, 0.75]
    projected = categorical_projection(
        next_probs, support, torch.tensor([0.25]), torch.tensor([0.5])
    )
    assert_close(
        projected,
        torch.tensor(
            [[0.25 * 0.25, 0.25 * 0.75 + 0.5 * 0.75 + 0.25 * 0.25, 0.5 * 0.25 + 0.25 * 0.75]]
        ),
    )


def _naive_projection(next_probs, support, returns, discounts):
    """Algorithm 1 of Bellemare et al. (2017), one sample and one atom at a time, with the
    usual fix for Tz on an atom (l == u), which Algorithm 1 as printed would drop."""
    z = support.tolist()
    v_min, v_max, atoms = z[0], z[-1], len(z)
    dz = (v_max - v_min) / (atoms - 1)
    out = []
    for p, g, d in zip(next_probs.tolist(), returns.tolist(), discounts.tolist(), strict=True):
        m = [0.0] * atoms
        for j in range(atoms):
            tz = min(max(g + d * z[j], v_min), v_max)
            b = (tz - v_min) / dz
            lo, up = math.floor(b), math.ceil(b)
            if lo == up:
                m[lo] += p[j]
            else:
                m[lo] += p[j] * (up - b)
                m[up] += p[j] * (b - lo)
        out.append(m)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("atoms", [2, 5, 51])
def test_categorical_projection_matches_naive(atoms):
    g = torch.Generator().manual_seed(atoms)
    n = 32
    support = torch.linspace(-10.0, 10.0, atoms, dtype=torch.float64)
    next_probs = torch.softmax(torch.randn(n, atoms, generator=g, dtype=torch.float64), -1)
    # Integer returns with discount 0 or 1 land exactly on atoms; others anywhere, some beyond.
    returns = torch.cat([torch.randint(-12, 13, (8,), generator=g), torch.zeros(8)]).double()
    returns = torch.cat([returns, 8 * torch.randn(n - 16, generator=g, dtype=torch.float64)])
    discounts = torch.cat([torch.zeros(8), torch.ones(8), torch.rand(n - 16, generator=g)])
    discounts = discounts.double()
    projected = categorical_projection(next_probs, support, returns, discounts)
    assert_close(projected, _naive_projection(next_probs, support, returns, discounts))
    assert_close(projected.sum(-1), torch.ones(n, dtype=torch.float64))


def test_categorical_projection_is_detached():
    next_probs = torch.full((2, 5), 0.2, requires_grad=True)
    out = categorical_projection(next_probs, SUPPORT, torch.zeros(2), torch.ones(2))
    assert not out.requires_grad


def test_categorical_td_loss_hand_computed():
    logits = torch.log(torch.tensor([[1.0, 1.0, 1.0], [1.0, 2.0, 1.0]])).requires_grad_()
    target = torch.tensor([[0.2, 0.3, 0.5], [0.0, 1.0, 0.0]])
    weights = torch.tensor([1.0, 3.0])
    loss, cross_entropy = categorical_td_loss(logits, target, weights)
    # Row 0: p uniform, so CE = log 3. Row 1: p = [0.25, 0.5, 0.25], CE = -log 0.5.
    assert_close(cross_entropy, torch.tensor([math.log(3.0), math.log(2.0)]))
    assert not cross_entropy.requires_grad
    assert_close(loss, torch.tensor((math.log(3.0) + 3.0 * math.log(2.0)) / 2))
    loss.backward()
    probs = torch.tensor([[1 / 3, 1 / 3, 1 / 3], [0.25, 0.5, 0.25]])
    assert_close(logits.grad, weights.unsqueeze(-1) * (probs - target) / 2)
    unweighted, _ = categorical_td_loss(logits, target)
    assert_close(unweighted, cross_entropy.mean())


# ---------------------------------------------------------------------------------- QR-DQN


def test_quantile_midpoints():
    assert_close(quantile_midpoints(4), torch.tensor([0.125, 0.375, 0.625, 0.875]))
    assert quantile_midpoints(3, dtype=torch.float64).dtype == torch.float64


def test_quantile_target():
    returns = torch.tensor([1.0, 2.0])
    discounts = torch.tensor([0.5, 0.0])
    next_quantiles = torch.tensor([[-2.0, 0.0, 4.0], [7.0, 8.0, 9.0]], requires_grad=True)
    target = quantile_target(returns, discounts, next_quantiles)
    assert_close(target, torch.tensor([[0.0, 1.0, 3.0], [2.0, 2.0, 2.0]]))
    assert not target.requires_grad


def test_quantile_huber_loss_hand_computed():
    pred = torch.zeros(1, 2, requires_grad=True)
    target = torch.tensor([[1.0, -3.0]])
    taus = torch.tensor([0.25, 0.75])
    loss, per_sample = quantile_huber_loss(pred, target, taus)
    # u = target - pred. tau 0.25: 0.25 * 0.5 (u = 1) and 0.75 * 2.5 (u = -3) -> mean 1.0
    #                    tau 0.75: 0.75 * 0.5 and 0.25 * 2.5 -> mean 0.5
    assert_close(per_sample, torch.tensor([1.5]))
    assert_close(loss, torch.tensor(1.5))
    loss.backward()
    # d/dpred_i = -mean_j |tau_i - 1{u<0}| * clip(u_ij, -1, 1)
    assert_close(pred.grad, torch.tensor([[0.25, -0.25]]))


def _naive_quantile_huber(pred, target, taus, kappa, weights):
    per_sample = []
    for p_row, t_row in zip(pred.tolist(), target.tolist(), strict=True):
        total = 0.0
        for i, p in enumerate(p_row):
            row = 0.0
            for t in t_row:
                u = t - p
                huber = 0.5 * u * u if abs(u) <= kappa else kappa * (abs(u) - 0.5 * kappa)
                row += abs(taus[i].item() - (1.0 if u < 0 else 0.0)) * huber
            total += row / len(t_row)
        per_sample.append(total)
    per_sample = torch.tensor(per_sample, dtype=torch.float64)
    return (weights * per_sample).mean(), per_sample


@pytest.mark.parametrize("kappa", [1.0, 0.5, 3.0])
def test_quantile_huber_loss_matches_naive(kappa):
    g = torch.Generator().manual_seed(int(10 * kappa))
    n, q, q_target = 6, 5, 7
    pred = torch.randn(n, q, generator=g, dtype=torch.float64)
    target = 2 * torch.randn(n, q_target, generator=g, dtype=torch.float64)
    weights = torch.rand(n, generator=g, dtype=torch.float64)
    taus = quantile_midpoints(q, dtype=torch.float64)
    loss, per_sample = quantile_huber_loss(pred, target, taus, kappa, weights)
    exp_loss, exp_per_sample = _naive_quantile_huber(pred, target, taus, kappa, weights)
    assert_close(loss, exp_loss)
    assert_close(per_sample, exp_per_sample)


def test_quantile_huber_loss_errors():
    with pytest.raises(ValueError, match="kappa"):
        quantile_huber_loss(torch.zeros(2, 3), torch.zeros(2, 3), quantile_midpoints(3), 0.0)
    with pytest.raises(ValueError, match="taus"):
        quantile_huber_loss(torch.zeros(2, 3), torch.zeros(2, 3), quantile_midpoints(4))


# ------------------------------------------------------------------------------------- REM


def test_random_convex_combination():
    g = torch.Generator().manual_seed(0)
    alphas = random_convex_combination(4, generator=g)
    assert alphas.shape == (4,)
    assert (alphas >= 0).all()
    assert_close(alphas.sum(), torch.tensor(1.0))
    per_sample = random_convex_combination(4, batch=8, generator=g)
    assert per_sample.shape == (8, 4)
    assert_close(per_sample.sum(-1), torch.ones(8))
    again = random_convex_combination(4, generator=torch.Generator().manual_seed(0))
    assert_close(again, alphas)


def test_combine_heads():
    # [N=2, A=2, K=3]
    q_heads = torch.tensor(
        [[[1.0, 2.0, 3.0], [0.0, 0.0, 6.0]], [[4.0, 4.0, 4.0], [1.0, -1.0, 0.0]]]
    )
    alphas = torch.tensor([0.5, 0.25, 0.25])
    assert_close(combine_heads(q_heads, alphas), torch.tensor([[1.75, 1.5], [4.0, 0.25]]))
    per_sample = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.5, 0.5]])
    assert_close(combine_heads(q_heads, per_sample), torch.tensor([[1.0, 0.0], [4.0, -0.5]]))
    with pytest.raises(ValueError, match="alphas must have shape"):
        combine_heads(q_heads, torch.ones(2))


def test_combine_heads_matches_naive():
    g = torch.Generator().manual_seed(1)
    q_heads = torch.randn(5, 3, 4, generator=g)
    alphas = random_convex_combination(4, generator=g)
    expected = torch.tensor(
        [[sum(alphas[k] * q_heads[i, a, k] for k in range(4)) for a in range(3)] for i in range(5)]
    )
    assert_close(combine_heads(q_heads, alphas), expected)
