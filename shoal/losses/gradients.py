"""Closed-form gradients of the on-policy losses with respect to their per-sample inputs.

Each function returns ``d loss / d input`` for the loss of the same name in
`shoal.losses.policy_gradient` or `shoal.losses.value`, as a tensor shaped like the input. They
feed the hand-derived backward pass of small MLP actor-critics (`shoal.nn.direct_grad`), which
skips autograd because recording and replaying its graph costs more than the arithmetic on
such networks. Every function is checked against ``torch.autograd.grad`` of its loss
(``tests/losses/test_gradients.py``), ties included: where PyTorch's ``min``/``max`` meet
equal arguments they split the gradient evenly, which the formulas below reproduce.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "clipped_value_loss_grad",
    "entropy_loss_grad",
    "kl_penalty_loss_grad",
    "policy_gradient_loss_grad",
    "ppo_clip_loss_grad",
    "value_loss_grad",
]


def ppo_clip_loss_grad(
    log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, clip_eps: float
) -> Tensor:
    """Gradient of `ppo_clip_loss` with respect to ``log_prob``.

    With ``r = exp(log_prob - old_log_prob)``: ``-r * A / N`` where the unclipped term is the
    minimum (inside the clip range both terms are equal and both carry the gradient ``r * A``),
    and 0 where the clipped term is strictly smaller (the ratio is past the range, where clamp
    is flat)."""
    ratio = torch.exp(log_prob - old_log_prob)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    return torch.where(unclipped <= clipped, unclipped, 0.0) * (-1.0 / log_prob.numel())


def policy_gradient_loss_grad(log_prob: Tensor, advantages: Tensor) -> Tensor:
    """Gradient of `policy_gradient_loss` with respect to ``log_prob``: ``-A / N``."""
    return advantages * (-1.0 / log_prob.numel())


def entropy_loss_grad(entropy: Tensor) -> Tensor:
    """Gradient of `entropy_loss` with respect to ``entropy``: ``-1 / N`` everywhere."""
    return torch.full_like(entropy, -1.0 / entropy.numel())


def kl_penalty_loss_grad(log_prob: Tensor, kl_coeff: float) -> Tensor:
    """Gradient of ``kl_penalty_loss(old_log_prob - log_prob, kl_coeff)`` (PPO's sample-based
    KL penalty) with respect to ``log_prob``: ``-kl_coeff / N``."""
    return torch.full_like(log_prob, -kl_coeff / log_prob.numel())


def value_loss_grad(values: Tensor, returns: Tensor) -> Tensor:
    """Gradient of `value_loss` with respect to ``values``: ``(values - returns) / N``."""
    return (values - returns) * (1.0 / values.numel())


def clipped_value_loss_grad(
    values: Tensor, old_values: Tensor, returns: Tensor, clip: float
) -> Tensor:
    """Gradient of `clipped_value_loss` with respect to ``values``.

    The loss is ``0.5 * mean(max(e^2, e_c^2))`` with ``e = values - returns`` and ``e_c`` the
    error of the clipped prediction, whose derivative is 1 inside the clip range and 0 past
    it. The larger square carries the gradient; on a tie each square carries half."""
    delta = values - old_values
    inside = (delta.abs() <= clip).to(values.dtype)
    error = values - returns
    clipped_error = old_values + torch.clamp(delta, -clip, clip) - returns
    unclipped_sq, clipped_sq = error.square(), clipped_error.square()
    unclipped_share = (unclipped_sq > clipped_sq) + 0.5 * (unclipped_sq == clipped_sq)
    grad = error * unclipped_share + clipped_error * inside * (1.0 - unclipped_share)
    return grad * (1.0 / values.numel())
