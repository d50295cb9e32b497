"""A2C's loss terms and their gradients on NumPy arrays, for the direct path.

A learner on the direct path (`shoal.nn.direct_grad`) needs each loss term's value (to log it
and to check it is finite) and its gradient with respect to the per-sample quantity it reads
(to start the hand-written backward pass). On a rollout of a hundred samples the torch
versions (`shoal.losses`, `shoal.losses.gradients`) spend most of their time dispatching a
dozen tiny ops; these are the same formulas as a few NumPy calls. Each returns
``(loss, gradient)``: the loss as a Python float, the gradient shaped like the input.

All three losses are means over samples of a term linear or quadratic in the input, so each
loss is a dot product of the input with its own gradient. Each pair is checked against the
torch loss and ``torch.autograd.grad`` (``tests/losses/test_numpy_losses.py``).
"""

from __future__ import annotations

import numpy as np


def policy_gradient_loss_and_grad(
    log_prob: np.ndarray, advantages: np.ndarray
) -> tuple[float, np.ndarray]:
    """`shoal.losses.policy_gradient_loss`, ``-mean(log_prob * A)``, and its gradient with
    respect to ``log_prob``, ``-A / N``."""
    grad = advantages * np.float32(-1.0 / advantages.size)
    return float(np.vdot(log_prob, grad)), grad.astype(log_prob.dtype, copy=False)


def value_loss_and_grad(values: np.ndarray, returns: np.ndarray) -> tuple[float, np.ndarray]:
    """`shoal.losses.value_loss`, ``0.5 * mean((values - returns)^2)``, and its gradient with
    respect to ``values``, ``(values - returns) / N``."""
    error = values - returns
    grad = error * np.float32(1.0 / error.size)
    return 0.5 * float(np.vdot(error, grad)), grad


def entropy_loss_and_grad(entropy: np.ndarray) -> tuple[float, np.ndarray]:
    """`shoal.losses.entropy_loss`, ``-mean(entropy)``, and its gradient with respect to
    ``entropy``, ``-1 / N`` everywhere."""
    grad = np.full_like(entropy, -1.0 / entropy.size)
    return float(np.vdot(entropy, grad)), grad
