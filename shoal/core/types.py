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
    action_mask: np.ndarray | None = None
    """``[B, A]`` bool legal actions at ``obs`` when the env reports them (else None)."""
    episode_agents: np.ndarray | None = None
    """Multi-agent envs seen as a batch of agents (`shoal.envs.agents_as_batch`): the agent
    index of each entry of ``episode_returns`` (else None)."""
    episode_info: dict[str, np.ndarray] | None = None
    """Statistics of the env episodes that ended on this step, ``{name: [k]}`` (a traffic
    env's collision and completion rates), logged as ``episode/<name>`` means; None when the
    env has none."""
    episode_info_rows: np.ndarray | None = None
    """``[k]``: a row of ``obs`` that belongs to each env whose episode ``episode_info``
    describes (multi-agent envs seen as a batch of agents; None: the statistics are not tied
    to rows), so that evaluation counts each env's first episode only."""


class ActOutput(NamedTuple):
    """What a policy returns when acting on a batch of observations ``[B, ...]``: tensors, or
    NumPy arrays from a NumPy policy (`shoal.fast.backend`)."""

    actions: Any
    log_probs: Any
    """Log-probability of each action under the acting policy (zeros for value-based ones)."""
    values: Any
    """The critic's value of each observation (Q of the action for value-based ones)."""


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
    action_mask: torch.Tensor | None = None
    """``[T, B, A]`` bool legal actions at each ``obs`` (None when the env gives no mask)."""
    last_obs: torch.Tensor | None = None
    """``[B, ...]`` the observation after the last step, which ``last_values`` values (for
    learners that evaluate it again with later weights, as ACER's replay does)."""
    step_states: torch.Tensor | None = None
    """``[T, B, ...]`` a recurrent policy's state before each step, for models that ask for it
    (``stores_step_states``: R2D2 stores the actor's state at each sequence start)."""

    @property
    def next_values(self) -> torch.Tensor:
        """Value of the true next state of each transition. With next-step autoreset the
        observation after a finished episode is its final observation, so shifting the values
        by one step is exact, including the bootstrap at truncation."""
        return torch.cat([self.values[1:], self.last_values.unsqueeze(0)], dim=0)

    def transitions(
        self,
    ) -> tuple[
        np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None
    ]:
        """NumPy views of what a replay stores, in the order of ``ReplayBuffer.extend``: obs,
        actions, rewards, terminated, truncated, valid, action_mask (None without one)."""
        mask = None if self.action_mask is None else self.action_mask.numpy()
        return (
            self.obs.numpy(),
            self.actions.numpy(),
            self.rewards.numpy(),
            self.terminated.numpy(),
            self.truncated.numpy(),
            self.valid.numpy(),
            mask,
        )


class EpisodeStats(NamedTuple):
    returns: np.ndarray
    lengths: np.ndarray
    agents: np.ndarray | None = None
    """Agent index of each episode when the env's batch rows are agents (else None)."""
    agent_names: tuple[str, ...] | None = None
    info: dict[str, np.ndarray] | None = None
    """The envs' own episode statistics (`StepResult.episode_info`), concatenated."""

    def metrics(self) -> dict[str, float]:
        """``episode/return``, ``episode/length`` (means) and ``episode/count``; empty when no
        episode ended. Multi-agent envs add ``episode/return/<agent>`` for every agent, as
        team means hide an agent that learned nothing (Biswas and Biswas)."""
        if not self.returns.size:
            return {}
        metrics = {
            "episode/return": float(self.returns.mean()),
            "episode/length": float(self.lengths.mean()),
            "episode/count": int(self.returns.size),
        }
        if self.agents is not None and self.agent_names is not None:
            for index, name in enumerate(self.agent_names):
                mine = self.returns[self.agents == index]
                if mine.size:
                    metrics[f"episode/return/{name}"] = float(mine.mean())
        metrics.update(info_metrics(self.info))
        return metrics


def info_metrics(info: dict[str, np.ndarray] | None) -> dict[str, float]:
    """``episode/<name>``: the mean of each env episode statistic (NaNs, e.g. the time to
    complete of episodes where nobody did, left out)."""
    out = {}
    for name, values in (info or {}).items():
        values = np.asarray(values, np.float64)
        if values.size and not np.isnan(values).all():
            out[f"episode/{name}"] = float(np.nanmean(values))
    return out


def merge_info(parts: list[dict[str, np.ndarray] | None]) -> dict[str, np.ndarray] | None:
    """Episode statistics of several steps or runners, concatenated by name."""
    held = [p for p in parts if p]
    if not held:
        return None
    names = {name for p in held for name in p}
    return {n: np.concatenate([np.asarray(p[n], np.float64) for p in held if n in p])
            for n in sorted(names)}  # fmt: skip


class ReplayBatch(NamedTuple):
    """Transitions sampled from a replay buffer, ``[N, ...]`` tensors, with n-step windows.

    A sample starts at a stored step ``t`` of one environment and looks ``n`` steps ahead in
    the same environment, stopping at the end of the episode: ``steps`` (``K``, 1..n) real
    steps were taken, ``rewards`` holds their rewards (zero after ``K``), and ``next_obs`` is
    the observation after those ``K`` steps: the true final observation when the episode
    ended inside the window (so a truncated episode bootstraps from it), else the
    observation ``n`` steps later. ``terminated`` says the episode terminated at step ``K``,
    in which case there is nothing to bootstrap from.
    """

    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    """``[N, n]`` float32 rewards of the window (``[N, n, *reward_shape]`` for per-agent
    rewards), zero after the episode's last step."""
    steps: torch.Tensor
    """``[N]`` int64 number of real steps ``K`` in the window (1..n)."""
    terminated: torch.Tensor
    """``[N]`` bool: the episode terminated within the window (no bootstrap)."""
    next_obs: torch.Tensor
    next_action_mask: torch.Tensor | None
    """``[N, A]`` bool legal actions at ``next_obs`` (None when the env gives no mask)."""
    weights: torch.Tensor
    """``[N]`` float32 importance-sampling weights (ones for uniform replay)."""
    indices: np.ndarray
    """``[N]`` int64 positions in the buffer, for priority updates."""
