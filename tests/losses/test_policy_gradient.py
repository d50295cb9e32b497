"""Tests for shoal.losses.policy_gradient against hand-computed values."""

import math

import pytest
import torch
from torch.testing import assert_close

from shoal.losses import (
    adaptive_kl_coeff,
    entropy_loss,
    kl_penalty_loss,
    policy_gradient_loss,
    ppo_clip_loss,
)

EPS = 0.2


def _ppo_case():
    # Sample: ratio, advantage -> min(r * A, clip(r) * A)
    #   0: 1.5, +2 -> min(3.0, 1.2 * 2 = 2.4)    = 2.4   clipped above (positive A)
    #   1: 0.5, -1 -> min(-0.5, 0.8 * -1 = -0.8) = -0.8  clipped below (negative A)
    #   2: 1.5, -1 -> min(-1.5, 1.2 * -1 = -1.2) = -1.5  outside range, unclipped (pessimistic)
    #   3: 0.5, +2 -> min(1.0, 0.8 * 2 = 1.6)    = 1.0   outside range, unclipped (pessimistic)
    #   4: 1.1, +1 -> min(1.1, 1.1)              = 1.1   inside range
    ratios = [1.5, 0.5, 1.5, 0.5, 1.1]
    old_log_prob = torch.tensor([-1.0, -2.0, -0.5, -0.1, -3.0], dtype=torch.float64)
    log_prob = old_log_prob + torch.tensor([math.log(r) for r in ratios], dtype=torch.float64)
    advantages = torch.tensor([2.0, -1.0, -1.0, 2.0, 1.0], dtype=torch.float64)
    return log_prob.requires_grad_(), old_log_prob, advantages


def test_ppo_clip_loss_hand_computed():
    log_prob, old_log_prob, advantages = _ppo_case()
    loss, _ = ppo_clip_loss(log_prob, old_log_prob, advantages, EPS)
    expected = -(2.4 - 0.8 - 1.5 + 1.0 + 1.1) / 5  # -0.44
    assert_close(loss, torch.tensor(expected, dtype=torch.float64))
    assert_close(loss, torch.tensor(-0.44, dtype=torch.float64))


def test_ppo_clip_loss_metrics():
    log_prob, old_log_prob, advantages = _ppo_case()
    _, metrics = ppo_clip_loss(log_prob, old_log_prob, advantages, EPS)
    assert set(metrics) == {"clip_fraction", "approx_kl", "ratio_mean"}
    for value in metrics.values():
        assert value.ndim == 0
        assert not value.requires_grad
    # |r - 1| > 0.2 for the first four samples only.
    assert_close(metrics["clip_fraction"], torch.tensor(0.8, dtype=torch.float64))
    assert_close(metrics["ratio_mean"], torch.tensor((1.5 + 0.5 + 1.5 + 0.5 + 1.1) / 5).double())
    # (r - 1) - log r per sample.
    kl = (
        2 * (0.5 - math.log(1.5))  # 0.0945349 each
        + 2 * (-0.5 - math.log(0.5))  # 0.1931472 each
        + (0.1 - math.log(1.1))  # 0.0046898
    ) / 5
    assert_close(metrics["approx_kl"], torch.tensor(kl, dtype=torch.float64))
    assert kl == pytest.approx(0.1160108, abs=1e-7)


def test_ppo_clip_loss_gradients():
    log_prob, old_log_prob, advantages = _ppo_case()
    old_log_prob.requires_grad_()
    advantages.requires_grad_()
    loss, _ = ppo_clip_loss(log_prob, old_log_prob, advantages, EPS)
    loss.backward()
    # Clipped samples (0, 1) get zero gradient. Elsewhere d(-r * A / 5) / d log_prob = -r * A / 5.
    expected = torch.tensor(
        [0.0, 0.0, -(1.5 * -1.0) / 5, -(0.5 * 2.0) / 5, -(1.1 * 1.0) / 5], dtype=torch.float64
    )
    assert_close(log_prob.grad, expected)  # [0, 0, 0.3, -0.2, -0.22]
    # The behaviour policy and the advantages are constants of the objective.
    assert old_log_prob.grad is None
    assert advantages.grad is None


def test_ppo_clip_loss_equal_policies_is_policy_gradient():
    # At ratio 1 nothing is clipped and the loss is -mean(A); its gradient is REINFORCE's.
    g = torch.Generator().manual_seed(0)
    old = torch.randn(8, 4, generator=g)
    adv = torch.randn(8, 4, generator=g)
    new = old.clone().requires_grad_()
    loss, metrics = ppo_clip_loss(new, old, adv, EPS)
    assert_close(loss, -adv.mean())
    assert_close(metrics["clip_fraction"], torch.tensor(0.0))
    assert_close(metrics["approx_kl"], torch.tensor(0.0))
    assert_close(metrics["ratio_mean"], torch.tensor(1.0))
    loss.backward()
    pg_new = old.clone().requires_grad_()
    policy_gradient_loss(pg_new, adv).backward()
    assert_close(new.grad, pg_new.grad)


def test_entropy_loss():
    entropy = torch.tensor([0.5, 1.0, 1.5])
    assert_close(entropy_loss(entropy), torch.tensor(-1.0))


def test_kl_penalty_loss():
    kl = torch.tensor([0.01, 0.03])
    assert_close(kl_penalty_loss(kl, 0.5), torch.tensor(0.5 * 0.02))


@pytest.mark.parametrize(
    ("kl", "expected"),
    [
        (0.03, 0.2 * 1.5),  # kl > 2 * target: increase
        (0.004, 0.2 * 0.5),  # kl < 0.5 * target: decrease
        (0.01, 0.2),  # within band: unchanged
        (0.02, 0.2),  # exactly 2 * target is not above it
        (0.005, 0.2),  # exactly 0.5 * target is not below it
    ],
)
def test_adaptive_kl_coeff(kl, expected):
    out = adaptive_kl_coeff(0.2, kl, 0.01)
    assert type(out) is float
    assert out == pytest.approx(expected)


def test_policy_gradient_loss():
    log_prob = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    advantages = torch.tensor([2.0, -1.0, 4.0], requires_grad=True)
    loss = policy_gradient_loss(log_prob, advantages)
    # -mean([-2, 2, -2]) = 2 / 3
    assert_close(loss, torch.tensor(2.0 / 3.0))
    loss.backward()
    assert_close(log_prob.grad, torch.tensor([-2.0, 1.0, -4.0]) / 3)
    assert advantages.grad is None
