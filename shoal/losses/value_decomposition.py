"""Pure losses of value-decomposition learners (QMIX, VDN, IQL) over padded episode batches.

Shapes are time-major: ``T`` steps, ``B`` episodes, optional trailing axes (IQL keeps one TD
error per agent, ``[T, B, N]``; the mixers have one per team, ``[T, B]``).
"""

from __future__ import annotations

import torch

from shoal.losses.q_learning import masked_argmax


def double_q_next_values(
    q_next_online: torch.Tensor,
    q_next_target: torch.Tensor,
    mask: torch.Tensor | None = None,
    double_q: bool = True,
) -> torch.Tensor:
    """Per-agent bootstrap values ``[..., N]`` from next-step Q-values ``[..., N, A]``.

    Double Q-learning (van Hasselt et al. 2016), as QMIX's pymarl implementation uses it:
    the online network picks ``argmax_a Q_online(o', a)`` (among legal actions), the target
    network evaluates it; without ``double_q`` it is ``max_a Q_target(o', a)``.
    """
    chooser = q_next_online if double_q else q_next_target
    best = masked_argmax(chooser.detach(), mask)
    return q_next_target.gather(-1, best.unsqueeze(-1)).squeeze(-1)


def td_targets(
    rewards: torch.Tensor, terminated: torch.Tensor, next_values: torch.Tensor, gamma: float
) -> torch.Tensor:
    """One-step targets ``r_t + gamma * (1 - terminated_t) * Q_tot_target(s_{t+1}, a*)``, no
    gradient. All ``[T, B, ...]``; ``terminated`` broadcasts over trailing axes."""
    not_done = (~terminated.bool()).to(rewards.dtype)
    while not_done.dim() < rewards.dim():
        not_done = not_done.unsqueeze(-1)
    return (rewards + gamma * not_done * next_values).detach()


def masked_td_loss(
    q_taken: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Mean squared TD error over the real steps of padded episodes (Rashid et al. 2018, eq. 6;
    pymarl's ``masked_td_error ** 2 / mask.sum()``).

    Args:
        q_taken: ``[T, B, ...]`` Q-values of the taken (joint) actions, with gradient.
        targets: ``[T, B, ...]`` TD targets (no gradient).
        valid: ``[T, B, ...]`` bool (or broadcastable): real transitions; padding adds nothing.

    Returns:
        ``(loss, {"loss/td", "train/td_error_abs"})``.
    """
    valid = valid.to(q_taken.dtype).expand_as(q_taken)
    count = valid.sum().clamp_min(1.0)
    error = (q_taken - targets.detach()) * valid
    loss = error.pow(2).sum() / count
    metrics = {"loss/td": loss.detach(), "train/td_error_abs": error.detach().abs().sum() / count}
    return loss, metrics


__all__ = ["double_q_next_values", "masked_td_loss", "td_targets"]
