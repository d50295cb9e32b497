"""Deployable policies: numpy observations in, numpy actions out."""

from __future__ import annotations

import inspect
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from shoal.envs.composite import PackedActions, PackedObs, map_leaves
from shoal.envs.normalize import FieldStats, RunningMeanStd, load_obs_stats, normalize
from shoal.errors import ShoalError


class ActorPolicy:
    """A trained actor plus the observation statistics it was trained with (frozen).

    ``model`` must provide ``distribution(obs)`` returning an action distribution with
    ``mode()`` and ``sample()`` (every shoal policy network does). Used by evaluation,
    ``shoal eval`` and ``shoal.load``.
    """

    def __init__(
        self,
        model: nn.Module,
        obs_stats: dict[str, Any] | None = None,
        clip_obs: float = 10.0,
        config: Any = None,
        observation_space: gym.Space | None = None,
        action_space: gym.Space | None = None,
    ):
        self.model = model.cpu().eval()
        self.config = config
        """The training config, when loaded from a run (``shoal.load``)."""
        self.observation_space = observation_space
        """What one observation looks like, when known (``shoal.load``): `act` then also
        takes a single observation, and names the expected shape when given another."""
        self.action_space = action_space
        self.obs_stats: RunningMeanStd | FieldStats | None = None
        if obs_stats is not None:
            self.obs_stats = load_obs_stats(obs_stats)
        self.clip_obs = clip_obs
        parameters = inspect.signature(self.model.distribution).parameters
        self._takes_mask = "action_mask" in parameters
        """Whether the model restricts its policy to legal actions (others ignore masks)."""

    @torch.inference_mode()
    def act(
        self,
        obs: np.ndarray,
        deterministic: bool = True,
        episode_start: np.ndarray | None = None,
        action_mask: np.ndarray | None = None,
    ) -> np.ndarray:
        """Actions for a batch of observations ``[B, ...]``, or the action for a single
        observation (when the policy knows its observation space, as ``shoal.load``'s does).
        Dict and Tuple observations come as the env gives them: a (nested) dict or tuple of
        one observation's parts, or of arrays ``[B, ...]`` for a batch.

        ``episode_start`` ``[B]`` (bool): True where ``obs`` is the first observation of a
        new episode. A recurrent policy (LSTM actor-critic, QMIX's GRU agents) starts those
        rows from a zero state; without it, its state runs on from the previous call (zero at
        the first call and when ``B`` changes). Feed-forward policies ignore it.

        ``action_mask`` ``[B, A]`` (bool; one row for a single observation): the legal
        actions, for Discrete and MultiDiscrete policies (one column per value of each
        sub-action) and DQN's Q-networks; the policy acts only among them."""
        space = self.observation_space
        if isinstance(space, PackedObs) and isinstance(obs, (dict, tuple)):
            single = space.is_single(obs)  # a Dict/Tuple observation: pack it as stored
            obs = space.pack_one(obs)[None] if single else space.pack(obs)
        else:
            single = self._is_single(obs)
            if single:
                obs = np.asarray(obs)[None]
        if single and episode_start is not None:
            episode_start = np.asarray(episode_start).reshape(1)
        if episode_start is not None and hasattr(self.model, "reset_state"):
            self.model.reset_state(torch.as_tensor(np.asarray(episode_start), dtype=torch.bool))
        if self.obs_stats is not None:
            obs = normalize(obs, self.obs_stats, self.clip_obs)
        if action_mask is None or not self._takes_mask:
            dist = self.model.distribution(torch.as_tensor(obs))
        else:
            mask = torch.as_tensor(np.asarray(action_mask, bool)).reshape(len(obs), -1)
            dist = self.model.distribution(torch.as_tensor(obs), mask)
        actions = (dist.mode() if deterministic else dist.sample()).numpy()
        if isinstance(self.action_space, PackedActions):  # the env's Tuple/Dict actions
            nested = self.action_space.unpack(actions)
            return map_leaves(nested, lambda value: value[0]) if single else nested
        return actions[0] if single else actions

    def _is_single(self, obs: Any) -> bool:
        """Whether ``obs`` is one observation rather than a batch; refuses anything else with
        the shapes it expected."""
        space = self.observation_space
        if space is None or not isinstance(space, (gym.spaces.Box, gym.spaces.Discrete,
                                                   gym.spaces.MultiBinary,
                                                   gym.spaces.MultiDiscrete)):  # fmt: skip
            return False
        shape = np.shape(obs)
        if shape == space.shape:
            return True
        if shape[1:] == space.shape and len(shape) == len(space.shape) + 1:
            return False
        batch = "(B" + "".join(f", {size}" for size in space.shape) + ")"
        raise ShoalError(
            f"policy.act expects one observation of shape {space.shape} or a batch of shape "
            f"{batch}, got an array of shape {shape}"
        )
