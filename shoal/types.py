"""Typed batches passed between sampler, storage and learner.

Everything is time-major: ``[T, B, ...]`` with ``T`` steps of ``B`` parallel environments.
Multi-agent groups add an agent axis after ``B`` (``[T, B, N, ...]``); the return estimators in
``shoal.losses`` accept any trailing axes, so a group's data goes through the same code.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch


class StepResult(NamedTuple):
    """What a `VectorEnv.step` returns, one entry per environment ``[B, ...]``.

    shoal follows Gymnasium's *next-step* autoreset: when an episode ends at step ``t`` the
    returned observation is the true final observation (so truncated episodes bootstrap from
    it), and the following ``step`` call resets that environment, ignores its action and sets
    ``autoreset`` for it. Such transitions are not real and are masked out of learning.
    """

    obs: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    autoreset: np.ndarray
    episode_returns: np.ndarray
    """Undiscounted returns of the episodes that ended on this step (any length, often 0)."""
    episode_lengths: np.ndarray


class Rollout(NamedTuple):
    """A time-major on-policy batch collected by an `EnvRunner`, all ``[T, B, ...]`` tensors."""

    obs: torch.Tensor
    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor
    rewards: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    valid: torch.Tensor
    """False for autoreset transitions (see `StepResult`); learners ignore those samples."""
    last_values: torch.Tensor
    """``[B]`` value of the observation after the last step, to bootstrap the rollout's end."""
    policy_state: Any = None
    """Recurrent state at the start of the rollout (None for feed-forward policies)."""

    @property
    def next_values(self) -> torch.Tensor:
        """Value of the true next state of each transition. With next-step autoreset the
        observation after a finished episode is its final observation, so shifting the values
        by one step is exact, including the bootstrap at truncation."""
        return torch.cat([self.values[1:], self.last_values.unsqueeze(0)], dim=0)


class EpisodeStats(NamedTuple):
    returns: np.ndarray
    lengths: np.ndarray
