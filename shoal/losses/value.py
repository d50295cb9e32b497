"""Value-function regression losses.

All losses are scalars to be minimized; inputs of any (shared) shape are reduced by a mean
over all elements. `value_loss` and `clipped_value_loss` take torch tensors or NumPy arrays
(`shoal.losses.arrays`) and have their gradients beside them, as the policy losses do
(`shoal.losses.policy_gradient`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from shoal.losses.arrays import Array, as_float, constant, count, module_of

__all__ = [
    "clipped_value_loss",
    "clipped_value_loss_grad",
    "huber_loss",
    "inverse_value_transform",
    "value_loss",
    "value_loss_grad",
    "value_transform",
]


def value_loss(values: Array, returns: Array) -> Array:
    """Squared-error critic loss (e.g. Mnih et al. 2016, arXiv:1602.01783).

    Returns ``0.5 * mean((values - returns)^2)``; the 0.5 makes the gradient the plain error.
    ``returns`` is a regression target and is detached.

    Args:
        values: ``[...]`` predicted values.
        returns: ``[...]`` value targets, same shape.

    Returns:
        Scalar loss.
    """
    error = values - constant(returns)
    return 0.5 * (error * error).mean()


def value_loss_grad(values: Array, returns: Array) -> Array:
    """Gradient of `value_loss` with respect to ``values``: ``(values - returns) / N``."""
    return (values - returns) * (1.0 / count(values))


def clipped_value_loss(values: Array, old_values: Array, returns: Array, clip: float) -> Array:
    """Clipped critic loss from OpenAI Baselines' PPO2 (Dhariwal et al. 2017; studied in
    Engstrom et al. 2020, arXiv:2005.12729).

    ``v_clipped = old_values + clamp(values - old_values, -clip, clip)`` and
    ``loss = 0.5 * mean(max((values - returns)^2, (v_clipped - returns)^2))``. Like the PPO
    policy objective, the max is pessimistic: moving the value more than ``clip`` away from its
    old prediction earns no further reduction of the loss.

    Args:
        values: ``[...]`` predicted values from the current critic.
        old_values: ``[...]`` predictions of the critic that collected the data (constants).
        returns: ``[...]`` value targets (constants).
        clip: maximum change of the value prediction that is rewarded.

    Returns:
        Scalar loss.
    """
    xp = module_of(values)
    old_values, returns = constant(old_values), constant(returns)
    v_clipped = old_values + xp.clip(values - old_values, -clip, clip)
    unclipped_err, clipped_err = values - returns, v_clipped - returns
    return 0.5 * xp.maximum(unclipped_err * unclipped_err, clipped_err * clipped_err).mean()


def clipped_value_loss_grad(values: Array, old_values: Array, returns: Array, clip: float) -> Array:
    """Gradient of `clipped_value_loss` with respect to ``values``.

    The loss is ``0.5 * mean(max(e^2, e_c^2))`` with ``e = values - returns`` and ``e_c`` the
    error of the clipped prediction, whose derivative is 1 inside the clip range and 0 past
    it. The larger square carries the gradient; on a tie each square carries half."""
    xp = module_of(values)
    delta = values - old_values
    inside = as_float(abs(delta) <= clip, values)
    error = values - returns
    clipped_error = old_values + xp.clip(delta, -clip, clip) - returns
    unclipped_sq, clipped_sq = error * error, clipped_error * clipped_error
    unclipped_share = as_float(unclipped_sq > clipped_sq, values) + 0.5 * as_float(
        unclipped_sq == clipped_sq, values
    )
    grad = error * unclipped_share + clipped_error * inside * (1.0 - unclipped_share)
    return grad * (1.0 / count(values))


def huber_loss(pred: Tensor, target: Tensor, delta: float = 1.0) -> Tensor:
    """Mean Huber loss (Huber 1964, Ann. Math. Statist. 35(1)), as used for DQN's TD error
    (Mnih et al. 2015, Nature 518).

    Quadratic ``0.5 * e^2`` for ``|e| <= delta`` and linear ``delta * (|e| - 0.5 * delta)``
    beyond, so large errors give gradients of bounded size ``delta``.

    Args:
        pred: ``[...]`` predictions.
        target: ``[...]`` targets, same shape. Not detached: this is a generic loss, so a
            TD target should be computed without gradient by the caller.
        delta: the error size at which the loss turns from quadratic to linear.

    Returns:
        Scalar loss.
    """
    abs_err = (pred - target).abs()
    # Split |e| into the part inside the quadratic zone and the excess beyond it: the sum
    # 0.5 * q^2 + delta * (|e| - q) equals both branches without a data-dependent select.
    quadratic = torch.clamp(abs_err, max=delta)
    linear = abs_err - quadratic
    return (0.5 * quadratic.pow(2) + delta * linear).mean()


def value_transform(x: Tensor, eps: float = 0.001) -> Tensor:
    """``h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x``: squashes returns of any scale (Pohlen et
    al. 2018, "Observe and look further: achieving consistent performance on Atari",
    arXiv:1805.11593; R2D2's and MuZero's value rescaling)."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1.0) - 1.0) + eps * x


def inverse_value_transform(y: Tensor, eps: float = 0.001) -> Tensor:
    """``h^-1(y) = sign(y) (((sqrt(1 + 4 eps (|y| + 1 + eps)) - 1) / (2 eps))^2 - 1)``."""
    root = (torch.sqrt(1.0 + 4.0 * eps * (y.abs() + 1.0 + eps)) - 1.0) / (2.0 * eps)
    return torch.sign(y) * (root.pow(2) - 1.0)
