"""Policy-gradient surrogate losses.

All losses are scalars to be minimized. Per-sample inputs may have any shape (commonly
``[N]`` for a flattened minibatch or ``[T, B, ...]``), as long as the tensors passed to one
function share it; every reduction is a mean over all elements.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "adaptive_kl_coeff",
    "entropy_loss",
    "kl_penalty_loss",
    "policy_gradient_loss",
    "ppo_clip_loss",
]


def ppo_clip_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    clip_eps: float,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate objective (Schulman et al. 2017, arXiv:1707.06347, eq. 7).

    ``ratio = exp(log_prob - old_log_prob)`` and
    ``loss = -mean(min(ratio * A, clamp(ratio, 1 - eps, 1 + eps) * A))``.
    Taking the minimum makes the objective a pessimistic bound: once the ratio has moved past
    the clip range in the direction the advantage favours, the gradient is zero.

    Args:
        log_prob: ``[...]`` log-probabilities of the taken actions under the current policy.
        old_log_prob: ``[...]`` log-probabilities under the behaviour policy (treated as
            constants).
        advantages: ``[...]`` advantage estimates (treated as constants).
        clip_eps: clip range epsilon, e.g. 0.2.

    Returns:
        ``(loss, metrics)``: the scalar loss and a dict of detached scalar tensors:
        ``"clip_fraction"`` (fraction of samples with ``|ratio - 1| > eps``), ``"approx_kl"``
        (the low-variance estimator ``mean((ratio - 1) - log ratio)`` of KL(old || new)) and
        ``"ratio_mean"``.
    """
    log_ratio = log_prob - old_log_prob.detach()
    ratio = torch.exp(log_ratio)
    advantages = advantages.detach()
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    loss = -torch.min(unclipped, clipped).mean()

    with torch.no_grad():
        # (r - 1) - log r is non-negative and unbiased for KL(old || new) under samples from
        # the old policy, unlike the naive -log r (Schulman, "Approximating KL divergence", 2020).
        metrics = {
            "clip_fraction": ((ratio - 1.0).abs() > clip_eps).to(ratio.dtype).mean(),
            "approx_kl": ((ratio - 1.0) - log_ratio).mean(),
            "ratio_mean": ratio.mean(),
        }
    return loss, metrics


def entropy_loss(entropy: Tensor) -> Tensor:
    """Entropy bonus as a loss (Williams & Peng 1991; Mnih et al. 2016, arXiv:1602.01783).

    Returns ``-mean(entropy)``, so adding ``coeff * entropy_loss(entropy)`` to a minimized
    total loss pushes the policy's entropy up.

    Args:
        entropy: ``[...]`` per-sample policy entropies.

    Returns:
        Scalar loss.
    """
    return -entropy.mean()


def kl_penalty_loss(kl: Tensor, kl_coeff: float | Tensor) -> Tensor:
    """KL penalty term of PPO's adaptive-penalty variant (Schulman et al. 2017, arXiv:1707.06347,
    eq. 8).

    Returns ``kl_coeff * mean(kl)``.

    Args:
        kl: ``[...]`` per-sample KL divergences between the behaviour and current policy.
        kl_coeff: penalty coefficient beta.

    Returns:
        Scalar loss.
    """
    return kl_coeff * kl.mean()


def adaptive_kl_coeff(kl_coeff: float, kl: float, kl_target: float) -> float:
    """Adapts the KL penalty coefficient (Schulman et al. 2017, arXiv:1707.06347, sec. 4).

    Uses RLlib's constants: multiply by 1.5 when ``kl > 2 * kl_target``, by 0.5 when
    ``kl < 0.5 * kl_target``, otherwise keep the coefficient. The paper's rule uses
    ``kl_target * 1.5`` thresholds and a factor of 2; RLlib's narrower steps change the
    coefficient more gently.

    Args:
        kl_coeff: current coefficient beta.
        kl: measured mean KL of the last update (a plain float).
        kl_target: desired KL per update.

    Returns:
        The new coefficient, a plain float.
    """
    if kl > 2.0 * kl_target:
        return kl_coeff * 1.5
    if kl < 0.5 * kl_target:
        return kl_coeff * 0.5
    return kl_coeff


def policy_gradient_loss(log_prob: Tensor, advantages: Tensor) -> Tensor:
    """REINFORCE / vanilla policy-gradient loss (Williams 1992, Machine Learning 8:229-256).

    Returns ``-mean(log_prob * advantages)``; its gradient is the score-function estimator of
    the policy gradient. Advantages (or returns) are detached: they weight the score and must
    not be differentiated through, even if they came from a critic.

    Args:
        log_prob: ``[...]`` log-probabilities of the taken actions.
        advantages: ``[...]`` advantages or returns, same shape.

    Returns:
        Scalar loss.
    """
    return -(log_prob * advantages.detach()).mean()
