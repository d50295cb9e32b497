"""EnvRunner: steps a vector env with its own copy of the policy and fills rollouts.

The runner owns everything a sampling process needs (env, policy copy, storage) and is
constructed from plain config values, so the same class can run in-process (`LocalSampler`) or
as a remote actor (the Ray sampler of a later issue).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch

from shoal.config import EnvConfig
from shoal.data.rollout import RolloutStorage
from shoal.envs import make_env
from shoal.envs.snapshot import EnvStateUnsupported
from shoal.interfaces import Weights
from shoal.nn.actor_critic import ActOutput
from shoal.types import EpisodeStats, Rollout


class ActingModel(Protocol):
    """What a runner needs from a policy network (`ActorCritic`, DQN's `QNetwork`, ...).
    ``act`` receives ``action_mask`` only when the env reports legal actions."""

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> ActOutput: ...

    def value(self, obs: torch.Tensor) -> torch.Tensor: ...

    def load_state_dict(self, state: Weights) -> Any: ...

    def requires_grad_(self, requires_grad: bool) -> Any: ...


class EnvRunner:
    def __init__(
        self,
        env_config: EnvConfig,
        model_fn: Callable[[Any, Any], ActingModel],
        num_steps: int,
        seed: int,
    ):
        self.env = make_env(env_config)
        self.model = model_fn(self.env.observation_space, self.env.action_space)
        self.model.requires_grad_(False)
        self.obs = self.env.reset(seed=seed)
        self.storage = RolloutStorage(
            num_steps,
            self.env.num_envs,
            self.env.observation_space,
            self.env.action_space,
            action_mask=self.env.action_mask is not None,
        )
        self.num_steps = num_steps

    @property
    def num_envs(self) -> int:
        return self.env.num_envs

    def set_weights(self, weights: Weights) -> None:
        self.model.load_state_dict(weights)

    @torch.inference_mode()
    def sample(self) -> tuple[Rollout, EpisodeStats]:
        """Step all envs ``num_steps`` times; returns the rollout and finished episodes."""
        storage, env, model = self.storage, self.env, self.model
        returns, lengths = [], []
        masked = storage.action_mask is not None
        for t in range(self.num_steps):
            obs = storage.write_obs(t, self.obs)
            if masked:
                out = model.act(obs, action_mask=storage.write_action_mask(t, env.action_mask))
            else:
                out = model.act(obs)
            result = env.step(out.actions.numpy())
            storage.write_step(t, out, result)
            self.obs = result.obs
            if result.episode_returns.size:
                returns.append(result.episode_returns)
                lengths.append(result.episode_lengths)
        last_obs = torch.as_tensor(self.obs, dtype=storage.obs.dtype)
        rollout = storage.rollout(last_values=model.value(last_obs))
        return rollout, EpisodeStats(_concat(returns), _concat(lengths, np.int64))

    def get_state(self) -> dict[str, Any]:
        """Env state and the pending observation; ``env`` is None when it cannot be saved."""
        try:
            env_state = self.env.get_state()
        except EnvStateUnsupported:
            env_state = None
        return {"env": env_state, "obs": np.array(self.obs)}

    def set_state(self, state: dict[str, Any], fallback_seed: int) -> bool:
        """Restore mid-episode state; returns False when episodes had to restart instead."""
        if state.get("env") is None:
            self.obs = self.env.reset(seed=fallback_seed)
            return False
        self.env.set_state(state["env"])
        self.obs = np.asarray(state["obs"]).copy()
        return True

    def close(self) -> None:
        self.env.close()


def _concat(parts: list[np.ndarray], dtype: type = np.float64) -> np.ndarray:
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)
