"""Losses of learners that plan with search: AlphaZero's policy-value loss, and MuZero's value
transform and categorical supports.

* AlphaZero (Silver et al. 2018, "A general reinforcement learning algorithm that masters
  chess, shogi, and Go through self-play", eq. 1):
  ``l = (z - v)^2 - pi^T log p + c ||theta||^2``, with ``pi`` the search's visit
  distribution and ``z`` the game's outcome from the mover's side.
* MuZero (Schrittwieser et al. 2020, "Mastering Atari, Go, Chess and Shogi by Planning with a
  Learned Model", appendix F) predicts values and rewards as categorical distributions over
  the integers ``-S..S`` of the transformed scalar ``h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x``
  (Pohlen et al. 2018, "Observe and Look Further: Achieving Consistent Performance on Atari",
  whose proposition A.2 gives the inverse), each scalar spread over its two nearest integers.
"""

from __future__ import annotations

import torch
from torch import Tensor


def policy_cross_entropy(logits: Tensor, target: Tensor, legal: Tensor | None = None) -> Tensor:
    """``-sum_a target[a] log softmax(logits)[a]`` per row: ``logits``, ``target`` ``[B, A]``
    (target rows sum to 1, zero on illegal actions); ``legal`` ``[B, A]`` bool leaves illegal
    actions out of the softmax. Returns ``[B]``."""
    if legal is not None:
        logits = logits.masked_fill(~legal, torch.finfo(logits.dtype).min)
    log_probs = torch.log_softmax(logits, dim=-1)
    return -(target * log_probs).sum(-1)


def alphazero_loss(
    logits: Tensor,
    value: Tensor,
    target_policy: Tensor,
    target_value: Tensor,
    legal: Tensor | None = None,
    value_coef: float = 1.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """AlphaZero's loss without the L2 term (weight decay in the optimizer): the mean of
    ``value_coef (z - v)^2 + CE(pi, p)``. ``logits`` ``[B, A]``, ``value`` ``[B]`` (the
    network's); ``target_policy`` ``[B, A]``, ``target_value`` ``[B]`` (the search's visits
    and the outcome). Returns the loss and its parts (detached)."""
    policy = policy_cross_entropy(logits, target_policy, legal).mean()
    value_loss = (target_value - value).pow(2).mean()
    loss = value_coef * value_loss + policy
    return loss, {"loss/policy": policy.detach(), "loss/value": value_loss.detach()}


def scalar_to_support(x: Tensor, support_size: int) -> Tensor:
    """``[...]`` scalars (already transformed) -> ``[..., 2S + 1]`` probabilities over the
    integers ``-S..S``: ``x`` between ``k`` and ``k + 1`` puts ``k + 1 - x`` on ``k`` and
    ``x - k`` on ``k + 1``; values beyond ``+-S`` are clipped to it."""
    x = x.clamp(-support_size, support_size)
    low = x.floor()
    upper_weight = x - low
    index = (low + support_size).long()
    out = torch.zeros(*x.shape, 2 * support_size + 1, dtype=x.dtype, device=x.device)
    out.scatter_(-1, index.unsqueeze(-1), (1.0 - upper_weight).unsqueeze(-1))
    upper = (index + 1).clamp(max=2 * support_size).unsqueeze(-1)
    out.scatter_add_(-1, upper, torch.where(index.unsqueeze(-1) + 1 > 2 * support_size,
                                            0.0, upper_weight.unsqueeze(-1)))  # fmt: skip
    return out


def support_to_scalar(logits: Tensor) -> Tensor:
    """``[..., 2S + 1]`` logits over ``-S..S`` -> ``[...]`` expected (transformed) scalars."""
    size = (logits.shape[-1] - 1) // 2
    atoms = torch.arange(-size, size + 1, dtype=logits.dtype, device=logits.device)
    return (torch.softmax(logits, dim=-1) * atoms).sum(-1)


def support_cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    """``[..., 2S + 1]`` logits and target probabilities -> ``[...]`` cross-entropies."""
    return -(target * torch.log_softmax(logits, dim=-1)).sum(-1)


def episode_value_targets(
    rewards: Tensor,
    values: Tensor,
    terminated: bool,
    final_value: float,
    n_step: int,
    gamma: float,
) -> Tensor:
    """MuZero's n-step value targets of one episode (appendix G):
    ``z_t = sum_{j<n} gamma^j r_{t+j} + gamma^n v_{t+n}``, the sum stopping at the episode's
    end, ``T``: there the bootstrap is 0 after a terminal step, and ``final_value`` (the
    network's value of the final observation) after a truncation, discounted by
    ``gamma^(T - t)``.

    Args:
        rewards: ``[T]``, ``rewards[t]`` the reward of the action taken at step ``t``.
        values: ``[T]`` the search's root values at each step.
        terminated: whether the episode ended in a terminal state (else it was truncated).
        final_value: the value of the observation after the last step (used if truncated).
    Returns ``[T]``.
    """
    length = rewards.shape[0]
    steps = torch.arange(length, device=rewards.device)
    targets = torch.zeros_like(rewards)
    for j in range(n_step):
        inside = steps + j < length
        targets = targets + (gamma**j) * torch.where(
            inside, rewards[(steps + j).clamp(max=length - 1)], 0.0
        )
    end = (steps + n_step).clamp(max=length)
    tail = torch.full_like(rewards, 0.0 if terminated else float(final_value))
    bootstrap = torch.where(end < length, values[end.clamp(max=length - 1)], tail)
    return targets + gamma ** (end - steps).to(rewards.dtype) * bootstrap


def muzero_loss(
    policy_logits: Tensor,
    value_logits: Tensor,
    reward_logits: Tensor,
    target_policy: Tensor,
    target_value: Tensor,
    target_reward: Tensor,
    policy_mask: Tensor,
    value_mask: Tensor,
    reward_mask: Tensor,
    weights: Tensor | None = None,
    value_coef: float = 0.25,
) -> tuple[Tensor, dict[str, Tensor]]:
    """MuZero's loss over an unroll of ``K`` steps (appendix G; value weight 0.25 as in its
    reanalyse runs): for each of ``k = 0..K`` the policy's cross-entropy with the search's
    visits and the value's with the two-hot target, and for ``k = 1..K`` the reward's; the
    unrolled steps' terms are scaled by ``1 / K``, each sample's sum weighted by its
    importance weight. Shapes: ``policy_logits`` ``[K + 1, B, A]``; ``value_logits``
    ``[K + 1, B, 2S + 1]``; ``reward_logits`` ``[K, B, 2S + 1]``; targets likewise (already
    two-hot); masks ``[K + 1, B]`` / ``[K, B]`` bool (False past an episode's end where
    nothing is known). Returns the loss and its parts (detached)."""
    unroll = reward_logits.shape[0]
    step_scale = torch.ones(unroll + 1, 1, device=policy_logits.device)
    if unroll:
        step_scale[1:] = 1.0 / unroll
    policy = policy_cross_entropy(policy_logits, target_policy) * policy_mask * step_scale
    value = support_cross_entropy(value_logits, target_value) * value_mask * step_scale
    reward = support_cross_entropy(reward_logits, target_reward) * reward_mask * step_scale[1:]
    per_sample = policy.sum(0) + value_coef * value.sum(0) + reward.sum(0)
    if weights is not None:
        per_sample = per_sample * weights
    parts = {
        "loss/policy": policy.sum(0).mean().detach(),
        "loss/value": value.sum(0).mean().detach(),
        "loss/reward": reward.sum(0).mean().detach(),
    }
    return per_sample.mean(), parts
