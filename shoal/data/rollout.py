"""Preallocated, time-major storage for on-policy rollouts."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from shoal.core.errors import UnsupportedSpaceError
from shoal.core.types import ActOutput, Rollout, StepResult
from shoal.envs.agents_as_batch import split_observation
from shoal.envs.composite import PackedActions, PackedObs


def space_layout(space: gym.Space) -> tuple[tuple[int, ...], torch.dtype]:
    """Per-step shape and storage dtype of one element of ``space``.

    Image observations keep their uint8 dtype: converting frames to float in storage would use
    four times the memory for no gain.
    """
    if isinstance(space, gym.spaces.Discrete):
        return (), torch.int64
    if isinstance(space, gym.spaces.Box):
        dtype = torch.uint8 if space.dtype == np.uint8 else torch.float32
        return tuple(space.shape or ()), dtype
    if isinstance(space, PackedObs):  # Dict/Tuple observations: byte records, one per step
        return tuple(space.shape or ()), torch.uint8
    if isinstance(space, (gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
        return tuple(space.shape or ()), torch.int64
    if isinstance(space, PackedActions):  # Tuple/Dict actions: float rows
        return tuple(space.shape or ()), torch.float32
    split = split_observation(space)
    if split is not None:  # actor and critic parts, stored as one flat row
        return (sum(split),), torch.float32
    raise UnsupportedSpaceError(
        f"space {space} cannot be stored; supported: Box, Discrete, and Dict or Tuple observations"
    )


def mask_width(space: gym.Space) -> int:
    """Columns of a legal-action mask: one per action of a Discrete space, one per value of
    each sub-action of a MultiDiscrete space (concatenated in order)."""
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(np.asarray(space.nvec).sum())
    raise UnsupportedSpaceError(
        f"action masks apply to Discrete and MultiDiscrete actions, not to {space}"
    )


class RolloutStorage:
    """``[T, B, ...]`` tensors filled one vector step at a time, then read as a `Rollout`.

    Every tensor has a numpy view sharing its memory, so per-step writes are cheap numpy
    assignments instead of torch ops; observations are written before the policy reads them, so
    the policy acts directly on the stored row.
    """

    def __init__(
        self,
        num_steps: int,
        num_envs: int,
        obs_space: gym.Space,
        action_space: gym.Space,
        action_mask: bool = False,
    ):
        obs_shape, obs_dtype = space_layout(obs_space)
        action_shape, action_dtype = space_layout(action_space)
        size = (num_steps, num_envs)
        self.obs = torch.zeros(size + obs_shape, dtype=obs_dtype)
        self.actions = torch.zeros(size + action_shape, dtype=action_dtype)
        self.log_probs = torch.zeros(size)
        self.values = torch.zeros(size)
        self.rewards = torch.zeros(size)
        self.terminated = torch.zeros(size, dtype=torch.bool)
        self.truncated = torch.zeros(size, dtype=torch.bool)
        self.valid = torch.zeros(size, dtype=torch.bool)
        self.action_mask: torch.Tensor | None = None
        if action_mask:
            num_actions = mask_width(action_space)
            self.action_mask = torch.zeros(size + (num_actions,), dtype=torch.bool)
        self._np = {
            name: getattr(self, name).numpy()
            for name in ("obs", "actions", "log_probs", "values", "rewards")
        }
        self._np.update(
            terminated=self.terminated.numpy(),
            truncated=self.truncated.numpy(),
            valid=self.valid.numpy(),
        )
        if self.action_mask is not None:
            self._np["action_mask"] = self.action_mask.numpy()
        self.num_steps = num_steps
        self.obs_dtype = self._np["obs"].dtype

    def write_obs(self, t: int, obs: np.ndarray) -> torch.Tensor:
        """Store the observation of step ``t`` and return the stored row for the policy."""
        self._np["obs"][t] = obs
        return self.obs[t]

    def write_obs_array(self, t: int, obs: np.ndarray) -> np.ndarray:
        """`write_obs` for a policy that acts on NumPy arrays: the stored row as an array."""
        row = self._np["obs"][t]
        row[...] = obs
        return row

    def write_action_mask(self, t: int, mask: np.ndarray) -> torch.Tensor:
        """Store the legal actions at step ``t``'s observation and return the stored row."""
        self._np["action_mask"][t] = mask
        assert self.action_mask is not None, "a rollout of masked actions stores the masks"
        return self.action_mask[t]

    def write_step(self, t: int, out: ActOutput, result: StepResult) -> None:
        """Store what the policy did at step ``t`` (``out`` of tensors or NumPy arrays) and
        what the env answered."""
        views = self._np
        views["actions"][t] = _array(out.actions)
        views["log_probs"][t] = _array(out.log_probs)
        views["values"][t] = _array(out.values)
        views["rewards"][t] = result.reward
        views["terminated"][t] = result.terminated
        views["truncated"][t] = result.truncated
        views["valid"][t] = ~result.autoreset

    def rollout(
        self,
        last_values: torch.Tensor,
        policy_state: object = None,
        last_obs: torch.Tensor | None = None,
    ) -> Rollout:
        """The stored data; valid until the next rollout overwrites the buffers."""
        return Rollout(
            obs=self.obs,
            actions=self.actions,
            log_probs=self.log_probs,
            values=self.values,
            rewards=self.rewards,
            terminated=self.terminated,
            truncated=self.truncated,
            valid=self.valid,
            last_values=last_values,
            policy_state=policy_state,
            action_mask=self.action_mask,
            last_obs=last_obs,
        )


def _array(x: torch.Tensor | np.ndarray) -> np.ndarray:
    """A NumPy view of a CPU tensor; arrays pass as they are."""
    return x.numpy() if isinstance(x, torch.Tensor) else x


def episode_starts(valid: torch.Tensor) -> torch.Tensor:
    """``[T, B]`` bool: step ``t`` is the first step of an episode inside the rollout.

    With next-step autoreset (see `shoal.core.types.StepResult`) the step after an autoreset step
    is an episode's first, and autoreset steps are exactly the invalid ones, so the flags are
    ``valid`` shifted by one and need no storage of their own. Step 0 is never flagged: the
    rollout's initial state (`Rollout.policy_state`) already had any reset applied.
    """
    starts = torch.zeros_like(valid)
    starts[1:] = ~valid[:-1]
    return starts


def to_chunks(x: torch.Tensor, chunk: int) -> torch.Tensor:
    """Cut time-major ``[T, B, ...]`` into ``T // chunk`` pieces per env: ``[chunk, N, ...]``
    with ``N = (T // chunk) * B``, piece ``k`` of env ``b`` at column ``k * B + b``."""
    return x.unflatten(0, (x.shape[0] // chunk, chunk)).transpose(0, 1).flatten(1, 2)
