"""Policy-gradient surrogate losses, and their gradients with respect to their inputs.

All losses are scalars to be minimized. Per-sample inputs may have any shape (commonly
``[N]`` for a flattened minibatch or ``[T, B, ...]``), as long as the tensors passed to one
function share it; every reduction is a mean over all elements.

Each loss takes torch tensors or NumPy arrays (`shoal.losses.arrays`) and returns the same
kind: the one definition serves autograd and the hand-derived backward pass of the fast path
(`shoal.fast`). Each ``*_grad`` function beside a loss is its derivative with respect to its
first argument (the network output it reads), checked against autograd in
``tests/losses/test_objectives.py``, ties included: where ``min`` and ``max`` meet equal
arguments PyTorch splits the gradient evenly, and so do these formulas.
"""

from __future__ import annotations

from torch import Tensor

from shoal.losses.arrays import Array, as_float, constant, count, module_of

__all__ = [
    "adaptive_kl_coeff",
    "entropy_loss",
    "entropy_loss_grad",
    "kl_penalty_loss",
    "kl_penalty_loss_grad",
    "policy_gradient_loss",
    "policy_gradient_loss_grad",
    "ppo_clip_loss",
    "ppo_clip_loss_grad",
]


def ppo_clip_loss(
    log_prob: Array,
    old_log_prob: Array,
    advantages: Array,
    clip_eps: float,
) -> tuple[Array, dict[str, Array]]:
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
        ``(loss, metrics)``: the scalar loss and a dict of detached scalars:
        ``"clip_fraction"`` (fraction of samples with ``|ratio - 1| > eps``), ``"approx_kl"``
        (the low-variance estimator ``mean((ratio - 1) - log ratio)`` of KL(old || new)) and
        ``"ratio_mean"``.
    """
    xp = module_of(log_prob)
    log_ratio = log_prob - constant(old_log_prob)
    ratio = xp.exp(log_ratio)
    advantages = constant(advantages)
    unclipped = ratio * advantages
    clipped = xp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    loss = -xp.minimum(unclipped, clipped).mean()

    ratio, log_ratio = constant(ratio), constant(log_ratio)
    # (r - 1) - log r is non-negative and unbiased for KL(old || new) under samples from
    # the old policy, unlike the naive -log r (Schulman, "Approximating KL divergence", 2020).
    metrics = {
        "clip_fraction": as_float(abs(ratio - 1.0) > clip_eps, ratio).mean(),
        "approx_kl": ((ratio - 1.0) - log_ratio).mean(),
        "ratio_mean": ratio.mean(),
    }
    return loss, metrics


def ppo_clip_loss_grad(
    log_prob: Array, old_log_prob: Array, advantages: Array, clip_eps: float
) -> Array:
    """Gradient of `ppo_clip_loss` with respect to ``log_prob``.

    With ``r = exp(log_prob - old_log_prob)``: ``-r * A / N`` where the unclipped term is the
    minimum (inside the clip range both terms are equal and both carry the gradient ``r * A``),
    and 0 where the clipped term is strictly smaller (the ratio is past the range, where clamp
    is flat)."""
    xp = module_of(log_prob)
    ratio = xp.exp(log_prob - old_log_prob)
    unclipped = ratio * advantages
    clipped = xp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    return xp.where(unclipped <= clipped, unclipped, 0.0) * (-1.0 / count(unclipped))


def entropy_loss(entropy: Array) -> Array:
    """Entropy bonus as a loss (Williams & Peng 1991; Mnih et al. 2016, arXiv:1602.01783).

    Returns ``-mean(entropy)``, so adding ``coeff * entropy_loss(entropy)`` to a minimized
    total loss pushes the policy's entropy up.

    Args:
        entropy: ``[...]`` per-sample policy entropies.

    Returns:
        Scalar loss.
    """
    return -entropy.mean()


def entropy_loss_grad(entropy: Array) -> Array:
    """Gradient of `entropy_loss` with respect to ``entropy``: ``-1 / N`` everywhere."""
    return module_of(entropy).full_like(entropy, -1.0 / count(entropy))


def kl_penalty_loss(kl: Array, kl_coeff: float | Tensor) -> Array:
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


def kl_penalty_loss_grad(log_prob: Array, kl_coeff: float) -> Array:
    """Gradient of ``kl_penalty_loss(old_log_prob - log_prob, kl_coeff)`` (PPO's sample-based
    KL penalty) with respect to ``log_prob``: ``-kl_coeff / N``."""
    return module_of(log_prob).full_like(log_prob, -kl_coeff / count(log_prob))


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


def policy_gradient_loss(log_prob: Array, advantages: Array) -> Array:
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
    return -(log_prob * constant(advantages)).mean()


def policy_gradient_loss_grad(log_prob: Array, advantages: Array) -> Array:
    """Gradient of `policy_gradient_loss` with respect to ``log_prob``: ``-A / N``."""
    return advantages * (-1.0 / count(log_prob))
