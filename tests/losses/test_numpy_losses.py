"""`shoal.losses.numpy_losses` against hand-computed values, the torch losses and autograd."""

import numpy as np
import pytest
import torch

from shoal.losses import entropy_loss, policy_gradient_loss, value_loss
from shoal.losses.numpy_losses import (
    entropy_loss_and_grad,
    policy_gradient_loss_and_grad,
    value_loss_and_grad,
)


def test_by_hand():
    log_prob = np.array([-0.5, -1.0, -2.0, -0.25], np.float32)
    adv = np.array([2.0, -1.0, 0.5, 4.0], np.float32)
    loss, grad = policy_gradient_loss_and_grad(log_prob, adv)
    # -mean(lp * A) = -(-1 + 1 - 1 - 1) / 4 = 0.5
    assert loss == pytest.approx(0.5)
    np.testing.assert_allclose(grad, [-0.5, 0.25, -0.125, -1.0])

    values = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    returns = np.array([1.0, 0.0, 5.0, 3.0], np.float32)
    loss, grad = value_loss_and_grad(values, returns)
    # errors 0, 2, -2, 1: 0.5 * mean(0, 4, 4, 1) = 1.125
    assert loss == pytest.approx(1.125)
    np.testing.assert_allclose(grad, [0.0, 0.5, -0.5, 0.25])

    loss, grad = entropy_loss_and_grad(np.array([0.5, 0.7, 0.1, 0.3], np.float32))
    assert loss == pytest.approx(-0.4)
    np.testing.assert_allclose(grad, [-0.25] * 4)
    assert grad.dtype == np.float32


def autograd_of(loss_fn, x, *args):
    x = torch.from_numpy(x).clone().requires_grad_()
    loss = loss_fn(x, *(torch.from_numpy(a) for a in args))
    (grad,) = torch.autograd.grad(loss, x)
    return loss.item(), grad.numpy()


@pytest.mark.parametrize("seed", range(3))
def test_equal_to_the_torch_losses_and_their_autograd(seed):
    rng = np.random.default_rng(seed)
    log_prob, adv, values, returns = (rng.normal(size=128).astype(np.float32) for _ in range(4))
    entropy = rng.uniform(0.0, 0.7, size=128).astype(np.float32)
    cases = [
        (policy_gradient_loss_and_grad, policy_gradient_loss, log_prob, adv),
        (value_loss_and_grad, value_loss, values, returns),
        (entropy_loss_and_grad, entropy_loss, entropy),
    ]
    for numpy_fn, torch_fn, x, *args in cases:
        loss, grad = numpy_fn(x, *args)
        expected_loss, expected_grad = autograd_of(torch_fn, x, *args)
        assert loss == pytest.approx(expected_loss, rel=1e-5, abs=1e-7)
        np.testing.assert_allclose(grad, expected_grad, rtol=1e-6, atol=1e-9)
        assert grad.dtype == np.float32 and grad.shape == x.shape
