"""The closed-form loss gradients of `shoal.losses` against autograd of the losses,
on hand-made inputs that visit every branch (inside and past the clip ranges, ties) and on
random ones."""

import pytest
import torch

from shoal.losses import (
    clipped_value_loss,
    clipped_value_loss_grad,
    entropy_loss,
    entropy_loss_grad,
    kl_penalty_loss,
    kl_penalty_loss_grad,
    policy_gradient_loss,
    policy_gradient_loss_grad,
    ppo_clip_loss,
    ppo_clip_loss_grad,
    value_loss,
    value_loss_grad,
)


def autograd_of(loss_fn, x, *args):
    x = x.detach().clone().requires_grad_()
    (grad,) = torch.autograd.grad(loss_fn(x, *args), x)
    return grad


def test_ppo_clip_gradient_by_hand():
    """ratio e^0 = 1 (inside), e^0.5 (past 1.2) with A > 0 (flat: clipped), e^0.5 with A < 0
    (unclipped is the min: gradient r * A), e^-0.5 with A < 0 (flat), with A > 0 (unclipped)."""
    old = torch.zeros(5)
    log_prob = torch.tensor([0.0, 0.5, 0.5, -0.5, -0.5])
    adv = torch.tensor([2.0, 1.0, -1.0, -1.0, 1.0])
    r = log_prob.exp()
    expected = -torch.tensor([2.0 * r[0], 0.0, -1.0 * r[2], 0.0, 1.0 * r[4]]) / 5
    got = ppo_clip_loss_grad(log_prob, old, adv, 0.2)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(
        got, autograd_of(lambda lp: ppo_clip_loss(lp, old, adv, 0.2)[0], log_prob)
    )


@pytest.mark.parametrize("seed", range(5))
def test_ppo_clip_gradient_matches_autograd(seed):
    g = torch.Generator().manual_seed(seed)
    log_prob, old, adv = (torch.randn(64, generator=g) * 0.3 for _ in range(3))
    expected = autograd_of(lambda lp: ppo_clip_loss(lp, old, adv, 0.1)[0], log_prob)
    torch.testing.assert_close(ppo_clip_loss_grad(log_prob, old, adv, 0.1), expected)


def test_policy_gradient_entropy_and_kl_gradients():
    log_prob = torch.tensor([-0.1, -2.0, -0.7, -1.2])
    adv = torch.tensor([1.0, -3.0, 0.5, 0.0])
    torch.testing.assert_close(policy_gradient_loss_grad(log_prob, adv), -adv / 4)
    torch.testing.assert_close(
        policy_gradient_loss_grad(log_prob, adv), autograd_of(policy_gradient_loss, log_prob, adv)
    )
    entropy = torch.tensor([0.6, 0.2, 0.1])
    torch.testing.assert_close(entropy_loss_grad(entropy), torch.full((3,), -1 / 3))
    torch.testing.assert_close(entropy_loss_grad(entropy), autograd_of(entropy_loss, entropy))
    old = torch.tensor([-0.3, -1.0, -0.2, -0.9])
    expected = autograd_of(lambda lp: kl_penalty_loss(old - lp, 0.4), log_prob)
    torch.testing.assert_close(kl_penalty_loss_grad(log_prob, 0.4), expected)
    torch.testing.assert_close(expected, torch.full((4,), -0.1))


def test_value_gradient_by_hand():
    values, returns = torch.tensor([1.0, -2.0, 0.5]), torch.tensor([0.0, 1.0, 0.5])
    torch.testing.assert_close(value_loss_grad(values, returns), torch.tensor([1.0, -3.0, 0.0]) / 3)
    torch.testing.assert_close(
        value_loss_grad(values, returns), autograd_of(value_loss, values, returns)
    )


def test_clipped_value_gradient_by_hand():
    """Old prediction 0, clip 0.5, return 1: v = 0.3 (inside: e = -0.7 both ways, a tie),
    v = 2 (past the range, unclipped error 1 > clipped 0.5: gradient 1), v = -1 (past the
    range, unclipped error 2 > 1.5: gradient -2), v = 0.8 with return -1 (inside, tie)."""
    values = torch.tensor([0.3, 2.0, -1.0, 0.8])
    old = torch.zeros(4)
    returns = torch.tensor([1.0, 1.0, 1.0, -1.0])
    expected = torch.tensor([-0.7, 1.0, -2.0, 1.8]) / 4
    got = clipped_value_loss_grad(values, old, returns, 0.5)
    torch.testing.assert_close(got, expected)
    auto = autograd_of(lambda v: clipped_value_loss(v, old, returns, 0.5), values)
    torch.testing.assert_close(got, auto)


def test_clipped_value_gradient_when_the_clipped_error_is_larger():
    """v = 2 past old 0 + clip 0.5 with return 3: clipped error -2.5 beats -1, but the clipped
    prediction does not move with v, so the gradient is 0. A tie past the range (v = 1.5, old
    0, clip 0.5, return 1: errors 0.5 and -0.5) splits: half of the unclipped gradient."""
    values, old = torch.tensor([2.0, 1.5]), torch.zeros(2)
    returns = torch.tensor([3.0, 1.0])
    got = clipped_value_loss_grad(values, old, returns, 0.5)
    torch.testing.assert_close(got, torch.tensor([0.0, 0.25 / 2]))
    auto = autograd_of(lambda v: clipped_value_loss(v, old, returns, 0.5), values)
    torch.testing.assert_close(got, auto)


@pytest.mark.parametrize("seed", range(5))
def test_clipped_value_gradient_matches_autograd(seed):
    g = torch.Generator().manual_seed(seed)
    values, old, returns = (torch.randn(64, generator=g) for _ in range(3))
    expected = autograd_of(lambda v: clipped_value_loss(v, old, returns, 0.3), values)
    torch.testing.assert_close(clipped_value_loss_grad(values, old, returns, 0.3), expected)
