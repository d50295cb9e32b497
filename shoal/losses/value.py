"""Value-function regression losses.

All losses are scalars to be minimized; inputs of any (shared) shape are reduced by a mean
over all elements.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["clipped_value_loss", "huber_loss", "value_loss"]


def value_loss(values: Tensor, returns: Tensor) -> Tensor:
    """Squared-error critic loss (e.g. Mnih et al. 2016, arXiv:1602.01783).

    Returns ``0.5 * mean((values - returns)^2)``; the 0.5 makes the gradient the plain error.
    ``returns`` is a regression target and is detached.

    Args:
        values: ``[...]`` predicted values.
        returns: ``[...]`` value targets, same shape.

    Returns:
        Scalar loss.
    """
    return 0.5 * (values - returns.detach()).pow(2).mean()


def clipped_value_loss(values: Tensor, old_values: Tensor, returns: Tensor, clip: float) -> Tensor:
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
    old_values = old_values.detach()
    returns = returns.detach()
    v_clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    unclipped_err = (values - returns).pow(2)
    clipped_err = (v_clipped - returns).pow(2)
    return 0.5 * torch.max(unclipped_err, clipped_err).mean()


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
