"""MADDPG's replay of joint steps (Lowe et al. 2017), its layout decided once: how a rollout of
every agent's steps becomes replay rows (`replay_steps`, `JointLayout.steps`) and how a replay
batch is split back by agent, with its n-step returns, for the update (`JointLayout.split`).
CTEDD stores its team's steps the same way (`replay_steps`)."""

from __future__ import annotations

from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch
from torch.nn import functional as F

from shoal.algos.cores.off_policy import make_priorities
from shoal.collect.multi_agent import MultiAgentRollout
from shoal.config import ReplayConfig
from shoal.core.errors import ConfigError
from shoal.core.types import ReplayBatch
from shoal.data.replay import ReplayBuffer
from shoal.losses import bootstrap_discount, n_step_return
from shoal.nn.multi_agent import JointActors


class ReplaySteps(NamedTuple):
    """A rollout as MADDPG's replay stores it, time-major ``[T, B, ...]``: the row the
    critics see, the joint action's replay columns, one reward per agent, terminated (every
    agent), truncated (any agent) and valid (not an autoreset step)."""

    rows: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    valid: np.ndarray


def replay_steps(
    rollout: MultiAgentRollout,
    actions: np.ndarray,
    with_state: bool,
    groups: list[str] | None = None,
) -> ReplaySteps:
    """``rollout``'s steps as replay rows: the observation of every agent of ``groups`` (all
    by default; CTEDD's team), flattened group by group, then the global state when
    ``with_state`` (the critics' input, or CTEDD's); ``actions`` ``[T, B, ...]`` are the
    joint actions as the replay stores them."""
    steps, envs = rollout.num_steps, rollout.num_envs
    groups = groups or list(rollout.obs)
    parts = [rollout.obs[g][:-1].reshape(steps, envs, -1).astype(np.float32) for g in groups]
    if with_state:
        if rollout.state is None:
            raise ConfigError("the replay rows hold the global state, which this env lacks")
        parts.append(rollout.state[:-1].astype(np.float32))
    terminated = np.concatenate([rollout.terminated[g] for g in groups], axis=-1)
    truncated = np.concatenate([rollout.truncated[g] for g in groups], axis=-1)
    return ReplaySteps(
        np.concatenate(parts, axis=-1),
        actions,
        np.concatenate([rollout.rewards[g] for g in groups], axis=-1),
        np.asarray(terminated.all(-1)),
        np.asarray(truncated.any(-1)),
        ~rollout.autoreset,
    )


class JointBatch(NamedTuple):
    """A replay batch of joint steps split by agent group (`JointLayout.split`), on the
    learner's device; ``M`` samples, ``N`` agents of every group."""

    obs: dict[str, torch.Tensor]
    """``{group: [M, N_g, obs_dim_g]}``: what each actor reads."""
    critic_obs: torch.Tensor
    """``[M, C]``: what every critic reads besides the actions (all observations, or the
    state)."""
    next_obs: dict[str, torch.Tensor]
    next_critic_obs: torch.Tensor
    actions: torch.Tensor
    """``[M, D]``: the replayed joint action as the critics read it (one-hot for discrete
    agents), each agent's columns in agent order."""
    returns: torch.Tensor
    """``[M, N]``: each agent's n-step return."""
    discounts: torch.Tensor
    """``[M]``: gamma^K, or 0 where the episode terminated within the window."""
    weights: torch.Tensor
    """``[M]``: importance weights of prioritized replay (ones otherwise)."""


class JointLayout:
    """Where every agent's observation and action lie in MADDPG's replay, decided once, for
    both directions (storing steps, splitting batches):

    * an observation row: every agent's observation flattened, group by group and agents in
      order (`JointActors`' order), then the env's global state when the critics read it;
    * an action row: per agent its action index (discrete) or its values (continuous);
    * the critics' joint action: per agent its one-hot (discrete) or its values, ``D``
      columns (``JointActors.own_columns`` marks each agent's).
    """

    def __init__(self, actors: JointActors, state_dim: int | None, critic_input: str):
        self.groups = [
            (name, a.num_agents, a.obs_dim, a.action_dim, a.discrete)
            for name, a in actors.groups.items()
        ]
        self.with_state = critic_input == "state"
        self.obs_size = actors.obs_size
        if self.with_state and state_dim is None:
            raise ConfigError("critic_input 'state' needs an env with a global state")
        self.row_size = self.obs_size + (
            state_dim if state_dim is not None and self.with_state else 0
        )
        self.stored_size = sum(n * (1 if discrete else d) for _, n, _, d, discrete in self.groups)
        self.num_agents = actors.num_agents

    def stored_actions(self, actions: dict[str, np.ndarray]) -> np.ndarray:
        """Env actions per group ``[..., N_g(, d)]`` -> an action row ``[..., stored_size]``."""
        parts = []
        for name, _, _, _, discrete in self.groups:
            a = np.asarray(actions[name], np.float32)
            lead = a.shape[: a.ndim - (1 if discrete else 2)]
            parts.append(a.reshape(*lead, -1))
        return np.concatenate(parts, axis=-1)

    def steps(self, rollout: MultiAgentRollout) -> ReplaySteps:
        """A rollout's steps as replay rows (`replay_steps`) with their action rows."""
        actions = self.stored_actions(rollout.actions)
        return replay_steps(rollout, actions, self.with_state)

    def split(self, batch: ReplayBatch, gamma: float) -> JointBatch:
        """A replay batch (on any device) split by agent, with its n-step returns."""
        obs, critic_obs = self._observations(batch.obs)
        next_obs, next_critic_obs = self._observations(batch.next_obs)
        return JointBatch(
            obs,
            critic_obs,
            next_obs,
            next_critic_obs,
            self._critic_actions(batch.actions),
            n_step_return(batch.rewards, gamma),
            bootstrap_discount(batch.steps, batch.terminated, gamma),
            batch.weights,
        )

    def _observations(self, rows: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        joint = rows[:, : self.obs_size]
        per_group, start = {}, 0
        for name, n, obs_dim, _, _ in self.groups:
            per_group[name] = joint[:, start : start + n * obs_dim].reshape(-1, n, obs_dim)
            start += n * obs_dim
        return per_group, (rows[:, self.obs_size :] if self.with_state else joint)

    def _critic_actions(self, stored: torch.Tensor) -> torch.Tensor:
        parts, start = [], 0
        for _, n, _, d, discrete in self.groups:
            width = n * (1 if discrete else d)
            part = stored[:, start : start + width]
            if discrete:
                part = F.one_hot(part.long(), d).float()
            parts.append(part.flatten(1))
            start += width
        return torch.cat(parts, 1)


def make_replay(
    replay: ReplayConfig,
    num_envs: int,
    layout: JointLayout,
    seed: int,
    device: torch.device | None = None,
) -> ReplayBuffer:
    """A replay of `JointLayout` rows from ``num_envs`` envs, handing its batches to a
    learner on ``device``."""
    return ReplayBuffer(
        replay.buffer_size,
        num_envs,
        gym.spaces.Box(-np.inf, np.inf, (layout.row_size,), np.float32),
        gym.spaces.Box(-np.inf, np.inf, (layout.stored_size,), np.float32),
        n_step=replay.n_step,
        priorities=make_priorities(replay, num_envs),
        seed=seed,
        reward_shape=(layout.num_agents,),
        device=device,
    )
