"""R2D2's targets and priorities on replayed sequences (Kapturowski, Ostrovski, Quan, Munos and
Dabney 2019, "Recurrent experience replay in distributed reinforcement learning", ICLR).

Sequences are time-major: ``[L, N]`` transitions and ``[L + 1, N]`` observations (the last
one bootstraps the sequence's end). A sequence never runs past its episode's end: after the
last real transition (``valid`` False from there on) the next observation is the episode's
final one, which a time-limit truncation bootstraps from and a termination does not.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["sequence_n_step_targets", "sequence_priorities"]


def sequence_n_step_targets(
    rewards: Tensor,
    terminated: Tensor,
    valid: Tensor,
    bootstrap: Tensor,
    gamma: float,
    n: int,
) -> Tensor:
    """n-step returns inside sequences: ``G_t = sum_{k<K} gamma^k r_{t+k} + gamma^K
    bootstrap[t + K]`` (no bootstrap when the episode terminated within the window), where
    ``K <= n`` counts the real transitions from ``t`` on, stopping at a termination, at the end
    of the episode and at the end of the sequence (Sutton and Barto 2018, ch. 7; R2D2's
    targets before the value rescaling, which the caller applies).

    Args:
        rewards: ``[L, N]`` rewards.
        terminated: ``[L, N]`` bool: the transition ended the episode in a terminal state.
        valid: ``[L, N]`` bool: a real transition (False on padding before the episode's
            start and after its end).
        bootstrap: ``[L + 1, N]`` the value of each observation (e.g. the target network's Q
            at the online network's greedy action), already in the rewards' scale.
        gamma: discount factor.
        n: the largest number of steps of a window.

    Returns:
        ``[L, N]`` targets (meaningful where ``valid``).
    """
    length = rewards.shape[0]
    if bootstrap.shape[0] != length + 1 or bootstrap.shape[1:] != rewards.shape[1:]:
        raise ValueError(
            f"bootstrap must be [L + 1, N] = [{length + 1}, ...], got {tuple(bootstrap.shape)}"
        )
    if n < 1:
        raise ValueError(f"n = {n} is invalid: must be >= 1")
    terminated, valid = terminated.bool(), valid.bool()
    times = torch.arange(length, device=rewards.device).view(-1, *([1] * (rewards.dim() - 1)))
    returns = torch.zeros_like(rewards)
    discount = torch.ones_like(rewards)
    boot_index = times.expand_as(rewards).clone()
    alive = valid.clone()  # the window still runs at step t + k
    ended = torch.zeros_like(valid)  # it stopped at a termination
    for k in range(n):
        index = (times + k).clamp(max=length - 1).expand_as(rewards)
        inside = (times + k < length).expand_as(valid)
        step = alive & inside & valid.gather(0, index)
        returns = returns + torch.where(step, discount * rewards.gather(0, index), 0.0)
        discount = torch.where(step, discount * gamma, discount)
        boot_index = torch.where(step, index + 1, boot_index)
        stop = step & terminated.gather(0, index)
        ended = ended | stop
        alive = step & ~stop
    value = bootstrap.gather(0, boot_index)
    return returns + torch.where(ended, 0.0, discount * value)


def sequence_priorities(td_abs: Tensor, mask: Tensor, eta: float = 0.9) -> Tensor:
    """R2D2's sequence priority ``eta * max_t |delta_t| + (1 - eta) * mean_t |delta_t|`` over
    the sequence's learned steps (``mask`` ``[L, N]``: real, past the burn-in). ``td_abs``
    ``[L, N]``; returns ``[N]`` (0 for a sequence with no learned step)."""
    mask = mask.bool()
    masked = torch.where(mask, td_abs, 0.0)
    count = mask.sum(0)
    mean = masked.sum(0) / count.clamp(min=1)
    return torch.where(count > 0, eta * masked.max(0).values + (1.0 - eta) * mean, 0.0)
