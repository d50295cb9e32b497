"""CTEDD's two new losses (Chen 2019, "A New Framework for Multi-Agent Reinforcement
Learning"): the maximum-entropy policy gradient of the
exploration scale and the policy-distillation regression.

Shapes: ``B`` samples, ``N`` agents, ``d`` action dimensions.
"""

from __future__ import annotations

import math

import torch


def gaussian_log_prob(
    actions: torch.Tensor, mean: torch.Tensor, scale: torch.Tensor
) -> torch.Tensor:
    """``log N(actions; mean, diag(scale^2))`` summed over the last axis: ``[..., d]`` ->
    ``[...]``."""
    z = (actions - mean) / scale
    return (-0.5 * z.square() - scale.log() - 0.5 * math.log(2 * math.pi)).sum(-1)


def gaussian_entropy(scale: torch.Tensor) -> torch.Tensor:
    """Entropy of ``N(., diag(scale^2))`` summed over the last axis: ``[..., d]`` -> ``[...]``."""
    return (scale.log() + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)


def exploration_scale_loss(
    actions: torch.Tensor,
    mean: torch.Tensor,
    scale: torch.Tensor,
    advantages: torch.Tensor,
    alpha: float | torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss whose gradient descent follows Chen's Eq. (5) for the stochastic part
    ``sigma_{omega_i}`` of the global policies ``pi~_i(s) = pi_{theta_i}(s) + eps * sigma_i(s)``:

        Delta omega_i ~ 1/|B| sum_B grad log pi~_i(s_t, a_i^t) A_t + alpha grad H(pi~_i(s_t, .))

    with the advantage (section 4.1) ``A_t = Q(s_t, {a_j^t}) - Q(s_t, {pi_{theta_j}(s_t)})``:
    sampled joint actions against the deterministic ones. The loss is

        L = -1/|B| sum_B sum_i [ log pi~_i(s_t, a_i^t) A_{t,i} + alpha H(pi~_i(s_t, .)) ]

    Only ``scale`` should carry gradients (the paper trains omega alone with Eq. (5);
    ``mean`` and ``advantages`` are constants here and are detached).

    Per sample, ``d log pi / d sigma = (eps^2 - 1) / sigma`` with ``eps = (a - mu) / sigma``:
    a positive advantage widens the scale when the sample lay outside one scale of the mean
    (the exploration beyond the usual paid off) and narrows it when the sample was inside.

    Args:
        actions: ``[B, N, d]`` sampled (pre-clipping) actions ``a_i^t``.
        mean: ``[B, N, d]`` deterministic actions ``pi_{theta_i}(s_t)``.
        scale: ``[B, N, d]`` positive exploration scales ``sigma_{omega_i}(s_t)``.
        advantages: ``[B, N]`` (agent ``i``'s critic) or ``[B]`` (one team critic).
        alpha: entropy regularization factor.

    Returns:
        ``(loss, metrics)``; metrics: ``entropy`` (mean over samples and agents), ``advantage``.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand(actions.shape[:2])
    log_prob = gaussian_log_prob(actions.detach(), mean.detach(), scale)  # [B, N]
    entropy = gaussian_entropy(scale)  # [B, N]
    per_sample = log_prob * advantages.detach() + alpha * entropy
    loss = -per_sample.sum(-1).mean()
    return loss, {"entropy": entropy.detach().mean(), "advantage": advantages.detach().mean()}


def distillation_loss(teacher_actions: torch.Tensor, student_actions: torch.Tensor) -> torch.Tensor:
    """Chen's Eq. (6), the policy-distillation loss of the local policies:

        L_D = 1/|B| sum_B sum_i || pi_{theta_i}(s_t) - pi^_{theta'_i}(o_i(s_t), {m_j}_{j!=i}) ||^2

    Args:
        teacher_actions: ``[B, N, d]`` the global policies' deterministic actions (constants,
            detached).
        student_actions: ``[B, N, d]`` the local policies' actions.

    Returns:
        The scalar loss: squared distances summed over agents and action dimensions,
        averaged over samples.
    """
    diff = teacher_actions.detach() - student_actions
    return diff.square().flatten(1).sum(-1).mean()
