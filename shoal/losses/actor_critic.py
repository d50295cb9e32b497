"""Targets and losses of the off-policy actor-critics: DDPG, TD3, SAC (and its discrete-action
variant) and D4PG.

Inputs are sample-major, ``[N, ...]``, as replay hands them out. Actions are in the unit box
``[-1, 1]^d`` that the actors work in (`shoal.nn.action_scaling`). Critic ensembles are
stacked on a leading member axis: ``[M, N]`` Q-values for ``M`` critics (two for TD3 and SAC).
The bootstrap is ``returns + discounts * next_value``, with ``returns`` and ``discounts`` from
`shoal.losses.returns` (n-step sums, zero discount at termination), as in
`shoal.losses.q_learning`.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from shoal.losses.q_learning import td_loss

__all__ = [
    "deterministic_actor_loss",
    "discrete_sac_actor_loss",
    "discrete_soft_value",
    "ensemble_td_loss",
    "entropy_temperature_loss",
    "sac_actor_loss",
    "smoothed_target_actions",
    "soft_q_target",
    "squashed_gaussian_log_prob",
    "tanh_log_det_jacobian",
    "twin_min_target",
]

LOG_2 = math.log(2.0)
LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def tanh_log_det_jacobian(pre_tanh: Tensor) -> Tensor:
    """``sum_i log(1 - tanh(u_i)^2)`` over the last axis, the log-determinant of the Jacobian
    of ``a = tanh(u)``.

    Computed as ``2 (log 2 - u - softplus(-2u))``, which is the same quantity rewritten so that
    it stays finite for large ``|u|``, where ``1 - tanh(u)^2`` rounds to zero in float32 (the
    form the SAC paper's appendix C motivates; see also Haarnoja et al. 2018, arXiv:1812.05905).
    """
    return (2.0 * (LOG_2 - pre_tanh - F.softplus(-2.0 * pre_tanh))).sum(dim=-1)


def squashed_gaussian_log_prob(mean: Tensor, log_std: Tensor, pre_tanh: Tensor) -> Tensor:
    """Log-density of ``a = tanh(u)``, ``u ~ N(mean, exp(log_std)^2)`` per dimension, at the
    pre-squash sample ``u`` (Haarnoja et al. 2018, arXiv:1801.01290, appendix C, eq. 21):
    ``log pi(a|s) = log N(u; mean, std) - sum_i log(1 - tanh(u_i)^2)``.

    Args:
        mean, log_std, pre_tanh: ``[..., d]`` tensors.

    Returns:
        ``[...]`` log-probabilities of the squashed actions (summed over the ``d`` dims).
    """
    z = (pre_tanh - mean) * torch.exp(-log_std)
    gaussian = (-0.5 * z.square() - log_std - LOG_SQRT_2PI).sum(dim=-1)
    return gaussian - tanh_log_det_jacobian(pre_tanh)


def smoothed_target_actions(actions: Tensor, noise_std: float, noise_clip: float) -> Tensor:
    """TD3's target policy smoothing (Fujimoto et al. 2018, arXiv:1802.09477, eq. 15):
    ``clip(a' + clip(eps, -c, c), -1, 1)`` with ``eps ~ N(0, noise_std^2)``, in the unit box."""
    noise = (torch.randn_like(actions) * noise_std).clamp(-noise_clip, noise_clip)
    return (actions + noise).clamp(-1.0, 1.0)


def twin_min_target(returns: Tensor, discounts: Tensor, next_q: Tensor) -> Tensor:
    """Clipped double-Q target of TD3 (Fujimoto et al. 2018, eq. 10): ``y = G + d * min_m
    Q_m(s', a')`` over the ``M`` target critics of ``next_q`` ``[M, N]`` (``M = 1``: DDPG's
    plain target). Returns a detached ``[N]`` target."""
    return soft_q_target(returns, discounts, next_q, None, 0.0)


def soft_q_target(
    returns: Tensor,
    discounts: Tensor,
    next_q: Tensor,
    next_log_prob: Tensor | None,
    alpha: float | Tensor,
) -> Tensor:
    """SAC's soft Bellman target (Haarnoja et al. 2018, arXiv:1812.05905, eqs. 3 and 6, with
    clipped double-Q): ``y = G + d * (min_m Q_m(s', a') - alpha * log pi(a'|s'))`` with
    ``a' ~ pi(.|s')``.

    Args:
        returns: ``[N]`` discounted n-step reward sums.
        discounts: ``[N]`` bootstrap discounts (0 when terminated).
        next_q: ``[M, N]`` target critics at ``(s', a')``.
        next_log_prob: ``[N]`` ``log pi(a'|s')``, or None for no entropy term.
        alpha: the entropy temperature (detached here).

    Returns:
        ``[N]`` detached targets.
    """
    with torch.no_grad():
        next_value = next_q.min(dim=0).values
        if next_log_prob is not None:
            next_value = next_value - _detached(alpha) * next_log_prob
        return returns.to(next_value.dtype) + discounts.to(next_value.dtype) * next_value


def discrete_soft_value(next_probs: Tensor, next_q: Tensor, alpha: float | Tensor) -> Tensor:
    """Soft state value of discrete SAC (Christodoulou 2019, arXiv:1910.07207, eq. 10), with
    the expectation over actions computed exactly: ``V(s') = sum_a pi(a|s') (min_m Q_m(s', a)
    - alpha * log pi(a|s'))``.

    Args:
        next_probs: ``[N, A]`` policy probabilities at ``s'``.
        next_q: ``[M, N, A]`` target critics at ``s'``.
        alpha: the entropy temperature.

    Returns:
        ``[N]`` detached values.
    """
    with torch.no_grad():
        log_probs = next_probs.clamp_min(1e-8).log()
        soft = next_q.min(dim=0).values - _detached(alpha) * log_probs
        return (next_probs * soft).sum(dim=-1)


def ensemble_td_loss(
    q: Tensor, target: Tensor, weights: Tensor | None = None, kind: Literal["huber", "mse"] = "mse"
) -> tuple[Tensor, Tensor]:
    """TD regression of every critic of an ensemble toward one target.

    Args:
        q: ``[M, N]`` Q-values of the taken actions by each of ``M`` critics.
        target: ``[N]`` targets (detached).
        weights: ``[N]`` importance-sampling weights, or None.
        kind: ``"mse"`` (``0.5 e^2``) or ``"huber"`` per sample, as `td_loss`.

    Returns:
        ``(loss, priorities)``: the sum over critics of each critic's weighted mean loss (as
        TD3 and SAC sum their two critic losses), and the detached ``[N]`` mean absolute TD
        error over critics, for prioritized replay.
    """
    members = q.shape[0]
    flat_weights = None if weights is None else weights.repeat(members)
    loss, errors = td_loss(q.reshape(-1), target.repeat(members), flat_weights, kind)
    return loss * members, errors.view(members, -1).abs().mean(dim=0)


def deterministic_actor_loss(q: Tensor) -> Tensor:
    """DDPG's actor loss (Lillicrap et al. 2015, arXiv:1509.02971): ``-mean Q(s, mu(s))``,
    whose gradient is the deterministic policy gradient. ``q``: ``[N]``."""
    return -q.mean()


def sac_actor_loss(q: Tensor, log_prob: Tensor, alpha: float | Tensor) -> Tensor:
    """SAC's policy loss (Haarnoja et al. 2018, arXiv:1812.05905, eq. 7 with the
    reparameterization of eq. 11): ``mean(alpha * log pi(a|s) - min_m Q_m(s, a))`` with
    ``a`` sampled from the policy by reparameterization.

    Args:
        q: ``[M, N]`` critics at the policy's own actions (``M = 1`` allowed).
        log_prob: ``[N]`` log-probabilities of those actions.
        alpha: the entropy temperature (detached here).
    """
    return (_detached(alpha) * log_prob - q.min(dim=0).values).mean()


def discrete_sac_actor_loss(probs: Tensor, q: Tensor, alpha: float | Tensor) -> Tensor:
    """Discrete SAC's policy loss (Christodoulou 2019, eq. 12): ``mean_s sum_a pi(a|s)
    (alpha * log pi(a|s) - min_m Q_m(s, a))``. ``probs``: ``[N, A]``; ``q``: ``[M, N, A]``
    (treated as constants)."""
    log_probs = probs.clamp_min(1e-8).log()
    soft = _detached(alpha) * log_probs - q.detach().min(dim=0).values
    return (probs * soft).sum(dim=-1).mean()


def entropy_temperature_loss(log_alpha: Tensor, log_prob: Tensor, target_entropy: float) -> Tensor:
    """Automatic entropy tuning (Haarnoja et al. 2018, arXiv:1812.05905, eq. 18), written for
    ``log alpha`` as the trained variable: ``-mean(log_alpha * (log pi + target_entropy))``.

    When the policy's entropy ``-log pi`` is below the target, ``log pi + target`` is positive
    and the gradient raises alpha (more entropy bonus); above the target it lowers alpha.

    Args:
        log_alpha: scalar parameter.
        log_prob: ``[N]`` log-probabilities of sampled actions, or for discrete SAC the
            expected ``sum_a pi log pi`` per state (detached here).
        target_entropy: the entropy to aim for (``-dim(A)`` for continuous actions).
    """
    return -(log_alpha * (log_prob.detach() + target_entropy)).mean()


def _detached(value: float | Tensor) -> float | Tensor:
    return value.detach() if isinstance(value, Tensor) else value
