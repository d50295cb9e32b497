"""Losses of learning from a fixed dataset: behaviour cloning, CQL's conservative penalty,
IQL's expectile regression and advantage-weighted policy extraction, TD3+BC's actor.

Inputs are sample-major, ``[N, ...]``, as replay hands them out; continuous actions are in
the unit box ``[-1, 1]^d`` the actors work in (`shoal.nn.action_scaling`), and critic
ensembles stack their members first (``[M, N]``), as in `shoal.losses.actor_critic`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "advantage_weights",
    "behaviour_cloning_loss",
    "cql_logsumexp",
    "cql_penalty",
    "expectile_loss",
    "lagrange_loss",
    "td3_bc_actor_loss",
    "weighted_log_likelihood_loss",
]


def behaviour_cloning_loss(prediction: Tensor, actions: Tensor, discrete: bool) -> Tensor:
    """Behaviour cloning (Pomerleau 1991, "Efficient training of artificial neural networks
    for autonomous navigation"): maximum likelihood of the dataset's actions.

    Args:
        prediction: ``[N, A]`` logits (discrete) or ``[N, d]`` unit-box actions of a
            deterministic policy (continuous).
        actions: ``[N]`` integer actions, or ``[N, d]`` unit-box actions.
        discrete: which of the two.

    Returns:
        The mean cross-entropy, or the mean over samples of the squared error summed over
        action dimensions (the log-likelihood of a fixed-variance Gaussian, up to constants).
    """
    if discrete:
        return F.cross_entropy(prediction, actions.long())
    return (prediction - actions).square().sum(dim=-1).mean()


def expectile_loss(diff: Tensor, expectile: float) -> Tensor:
    """The asymmetric squared loss ``|tau - 1(u < 0)| u^2`` averaged over ``diff``
    (Kostrikov et al. 2021, "Offline reinforcement learning with implicit Q-learning", eq. 5).
    With ``diff = Q(s, a) - V(s)``, minimizing it over ``V`` makes ``V(s)`` the ``tau``
    expectile of ``Q`` over the dataset's actions: the mean at 0.5, the maximum as tau -> 1.

    Args:
        diff: ``[...]`` residuals ``target - prediction``.
        expectile: ``tau`` in (0, 1).
    """
    weight = torch.where(diff < 0, 1.0 - expectile, expectile)
    return (weight * diff.square()).mean()


def advantage_weights(advantages: Tensor, temperature: float, max_weight: float) -> Tensor:
    """``min(exp(beta * A), max_weight)``: the weights of advantage-weighted regression
    (Peng et al. 2019, "Advantage-weighted regression"), as IQL extracts its policy
    (Kostrikov et al. 2021, eq. 7), with the weights capped for stability. Detached.

    Args:
        advantages: ``[N]`` ``Q(s, a) - V(s)`` at the dataset's actions.
        temperature: ``beta`` (0: behaviour cloning; large: greedy on the advantage).
        max_weight: the cap (IQL: 100).
    """
    return torch.exp(temperature * advantages.detach()).clamp(max=max_weight)


def weighted_log_likelihood_loss(log_prob: Tensor, weights: Tensor) -> Tensor:
    """``-mean(w * log pi(a | s))``: weighted behaviour cloning of the dataset's actions.

    Args:
        log_prob: ``[N]`` log-probabilities of the dataset's actions.
        weights: ``[N]`` per-sample weights (`advantage_weights`), no gradient.
    """
    return -(weights * log_prob).mean()


def cql_logsumexp(q: Tensor, log_density: Tensor | None = None) -> Tensor:
    """The soft maximum ``log sum_a exp Q(s, a)`` that CQL(H) pushes down (Kumar et al.
    2020, "Conservative Q-learning for offline reinforcement learning", eq. 4).

    Discrete actions: exact, over the last axis (``log_density`` None). Continuous actions:
    estimated by importance sampling from ``K`` actions drawn per state (uniform ones and the
    policy's, appendix F): ``log (1/K) sum_k exp(Q(s, a_k) - log mu(a_k | s))``.

    Args:
        q: ``[..., A]`` Q-values of every action, or ``[..., K]`` of sampled actions.
        log_density: ``[..., K]`` log-densities of the samples under their proposal.

    Returns:
        ``[...]`` soft maxima.
    """
    if log_density is None:
        return torch.logsumexp(q, dim=-1)
    return torch.logsumexp(q - log_density, dim=-1) - math.log(q.shape[-1])


def cql_penalty(soft_max: Tensor, data_q: Tensor) -> Tensor:
    """CQL's regularizer ``E_s[log sum_a exp Q(s, a)] - E_(s,a)~D[Q(s, a)]`` (Kumar et al.
    2020, eq. 4): Q-values off the data are pushed down, those of the dataset's actions up.

    Args:
        soft_max: ``[M, N]`` (or ``[N]``) `cql_logsumexp` per critic and state.
        data_q: ``[M, N]`` (or ``[N]``) Q-values of the dataset's actions.

    Returns:
        The penalty summed over critics and averaged over states.
    """
    gap = soft_max - data_q
    return gap.mean(dim=-1).sum() if gap.dim() > 1 else gap.mean()


def lagrange_loss(log_weight: Tensor, penalty: Tensor, threshold: float) -> Tensor:
    """CQL's dual step on its penalty's weight ``alpha' = exp(log_weight)`` (Kumar et al.
    2020, appendix F, "CQL-Lagrange"): ``-alpha' (penalty - threshold)``, so that ``alpha'``
    grows while the penalty exceeds ``threshold`` and shrinks once it is below.

    Args:
        log_weight: the learned scalar ``log alpha'``.
        penalty: `cql_penalty`'s value (detached here).
        threshold: ``tau``, the allowed gap.
    """
    return -log_weight.exp() * (penalty.detach() - threshold)


def td3_bc_actor_loss(
    q: Tensor,
    policy_actions: Tensor,
    data_actions: Tensor,
    alpha: float,
    mean_abs_q: Tensor | None = None,
) -> Tensor:
    """TD3+BC's actor loss (Fujimoto and Gu 2021, "A minimalist approach to offline
    reinforcement learning", eq. 3): ``-lambda mean Q(s, pi(s)) + mean ||pi(s) - a||^2``
    with ``lambda = alpha / mean |Q(s, pi(s))|`` (no gradient through ``lambda``), which
    makes the trade-off independent of the reward's scale.

    Args:
        q: ``[N]`` the first critic at the policy's actions.
        policy_actions, data_actions: ``[N, d]`` unit-box actions.
        alpha: the paper's ``alpha`` (2.5).
        mean_abs_q: the batch's ``mean |Q|`` when ``q`` holds only some of its rows (a
            learner group's rank; default: ``q``'s own).
    """
    if mean_abs_q is None:
        mean_abs_q = q.abs().mean()
    scale = alpha / mean_abs_q.detach().clamp_min(1e-6)
    return -scale * q.mean() + (policy_actions - data_actions).square().mean()
