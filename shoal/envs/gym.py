"""Adapter from any Gymnasium environment id to shoal's `VectorEnv`."""

from __future__ import annotations

import os
import sys
from typing import Any

import gymnasium as gym
import numpy as np

from shoal.config import EnvConfig
from shoal.core.errors import ConfigError, UnknownEnvError
from shoal.core.types import StepResult
from shoal.envs.catalog import unusable_reason
from shoal.envs.composite import PackedActions, PackedObs, is_composite
from shoal.envs.ids import env_spec
from shoal.envs.snapshot import capture_env_state, restore_env_state
from shoal.envs.wrappers import vector_wrapper_fns, wrapper_fns


class GymVectorEnv:
    """Wraps a Gymnasium vector env: records episode statistics, marks autoreset steps and
    clips continuous actions to the action bounds (the one place where that happens)."""

    agents_per_env = 1
    agent_names = None

    def __init__(
        self, env: gym.vector.VectorEnv, action_mask: str = "none", episode_info: bool = False
    ):
        mode = env.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
        if mode != gym.vector.AutoresetMode.NEXT_STEP:
            raise ConfigError(f"shoal expects next-step autoreset, the env uses {mode}")
        self.env = env
        self.num_envs = env.num_envs
        self.observation_space = env.single_observation_space
        self.action_space = env.single_action_space
        self._mask_source = action_mask
        self._episode_info = episode_info
        """Log the episodes the env reports in info["episode"] / info["_episode"] (Gymnasium's
        RecordEpisodeStatistics layout) instead of reward sums: Atari's true game scores, when
        training sees clipped rewards and an episode per life (`shoal.envs.atari`)."""
        if action_mask == "obs":
            space = self.observation_space
            if not (
                isinstance(space, gym.spaces.Dict)
                and {"observation", "action_mask"} <= set(space.keys())
            ):
                raise ConfigError(
                    "EnvConfig.action_mask = 'obs' needs a Dict observation space with keys "
                    f"'observation' and 'action_mask'; the env has {space}"
                )
            self.observation_space = space["observation"]
        self._packed = (
            PackedObs(self.observation_space) if is_composite(self.observation_space) else None
        )
        """Dict and Tuple observations are packed into byte records (`shoal.envs.composite`)."""
        if self._packed is not None:
            self.observation_space = self._packed
        self.action_mask: np.ndarray | None = None
        """``[B, A]`` legal actions at the latest observation (None without a mask source)."""
        self._episode_return = np.zeros(self.num_envs, np.float64)
        self._episode_length = np.zeros(self.num_envs, np.int64)
        self._autoreset = np.zeros(self.num_envs, bool)
        self._packed_actions: PackedActions | None = None
        """Tuple and Dict actions come from learners as packed float rows
        (`shoal.envs.composite.PackedActions`)."""
        if is_composite(self.action_space):
            self._packed_actions = PackedActions(self.action_space)
            self.action_space = self._packed_actions
        box = self.action_space if isinstance(self.action_space, gym.spaces.Box) else None
        self._action_low = box.low if box is not None else None
        self._action_high = box.high if box is not None else None

    def reset(self, seed: int | None = None) -> np.ndarray:
        obs, info = self.env.reset(seed=seed)
        obs = self._split_mask(obs, info)
        self._episode_return[:] = 0.0
        self._episode_length[:] = 0
        self._autoreset[:] = False
        return obs

    def step(self, actions: np.ndarray) -> StepResult:
        if self._action_low is not None:
            actions = np.clip(actions, self._action_low, self._action_high)
        elif self._packed_actions is not None and isinstance(actions, np.ndarray):
            actions = self._packed_actions.unpack(actions)
        obs, reward, terminated, truncated, info = self.env.step(actions)
        obs = self._split_mask(obs, info)
        autoreset = self._autoreset
        # An autoreset step starts a new episode: its reward (0) and step do not count.
        self._episode_return = np.where(autoreset, 0.0, self._episode_return + reward)
        self._episode_length = np.where(autoreset, 0, self._episode_length + 1)
        done = np.logical_or(terminated, truncated)
        self._autoreset = done
        returns, lengths = self._episode_return[done], self._episode_length[done]
        if self._episode_info:
            ended = np.asarray(info["_episode"], bool)
            returns = np.asarray(info["episode"]["r"], np.float64)[ended]
            lengths = np.asarray(info["episode"]["l"], np.int64)[ended]
        return StepResult(
            obs=obs,
            reward=np.asarray(reward, np.float32),
            terminated=np.asarray(terminated, bool),
            truncated=np.asarray(truncated, bool),
            autoreset=autoreset,
            episode_returns=returns,
            episode_lengths=lengths,
            action_mask=self.action_mask,
        )

    def _split_mask(self, obs: Any, info: dict[str, Any]) -> np.ndarray:
        """Take the legal-action mask out of the observation or info; return the observation
        (packed when composite)."""
        if self._mask_source == "obs":
            self.action_mask = np.asarray(obs["action_mask"], bool)
            obs = obs["observation"]
        elif self._mask_source == "info":
            if "action_mask" not in info:
                raise ConfigError(
                    "EnvConfig.action_mask = 'info' but the env's info has no 'action_mask'"
                )
            self.action_mask = np.asarray(info["action_mask"], bool)
        return obs if self._packed is None else self._packed.pack(obs)

    def get_state(self) -> dict[str, Any]:
        return {
            "gym": capture_env_state(self.env),
            "episode_return": self._episode_return.copy(),
            "episode_length": self._episode_length.copy(),
            "autoreset": self._autoreset.copy(),
            "action_mask": None if self.action_mask is None else self.action_mask.copy(),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        restore_env_state(self.env, state["gym"])
        self._episode_return = np.asarray(state["episode_return"], np.float64).copy()
        self._episode_length = np.asarray(state["episode_length"], np.int64).copy()
        self._autoreset = np.asarray(state["autoreset"], bool).copy()
        if state.get("action_mask") is not None:
            self.action_mask = np.asarray(state["action_mask"], bool).copy()

    def render(self) -> np.ndarray | None:
        frames = self.env.render()
        if frames is None:
            return None
        # Vector envs render a tuple/array of frames; keep the first environment's view.
        return np.asarray(frames[0] if isinstance(frames, (tuple, list)) else frames)

    def close(self) -> None:
        self.env.close()


def make_gym_vector_env(config: EnvConfig, render_mode: str | None = None) -> gym.vector.VectorEnv:
    if config.atari != "none":
        from shoal.envs.atari import make_atari_vector_env  # ale-py only when asked for

        env = make_atari_vector_env(config, config.atari_training, render_mode)
        return _wrap_vector(env, vector_wrapper_fns(config))
    spec = env_spec(config.id)
    wrappers = wrapper_fns(config)  # resolved and checked before any env is built
    vector_wrappers = vector_wrapper_fns(config)
    mode = config.vectorization
    if mode == "auto":
        native = spec.vector_entry_point is not None and not wrappers
        mode = "native" if native else "sync"
    if mode == "native" and spec.vector_entry_point is None:
        raise ConfigError(
            f"EnvConfig.vectorization = 'native' is invalid: {config.id} has no native vector "
            "implementation; use 'sync' or 'async'"
        )
    if mode == "native" and wrappers:
        raise ConfigError(
            "EnvConfig.vectorization = 'native' is invalid with env.wrappers or "
            "env.frame_stack: wrappers apply to single envs; use 'sync' or 'async'"
        )
    kwargs: dict[str, Any] = dict(config.kwargs)
    if config.max_episode_steps is not None:
        kwargs["max_episode_steps"] = config.max_episode_steps
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
        if render_mode != "human" and sys.platform.startswith("linux"):
            # MuJoCo renders off-screen through MUJOCO_GL; unset, it tries a GLFW window and
            # fails without a display, so default to headless EGL (what a user sets still wins).
            os.environ.setdefault("MUJOCO_GL", "egl")
    vectorization = "vector_entry_point" if mode == "native" else mode
    try:
        env = gym.make_vec(
            config.id,
            config.num_envs,
            vectorization_mode=vectorization,
            wrappers=wrappers or None,  # type: ignore[arg-type]  # any gym.Env -> gym.Env
            **kwargs,
        )
    except (ImportError, gym.error.DependencyNotInstalled) as exc:
        raise UnknownEnvError(
            f"environment {config.id!r} cannot be made here: {unusable_reason(config.id, exc)} "
            "(`shoal list --envs` shows the ids that work)"
        ) from exc
    return _wrap_vector(env, vector_wrappers)


def _wrap_vector(env: gym.vector.VectorEnv, wrappers: list[Any]) -> gym.vector.VectorEnv:
    """``env`` inside ``wrappers`` (`shoal.envs.wrappers.vector_wrapper_fns`), in order;
    closed if one of them cannot wrap it."""
    try:
        for wrap in wrappers:
            env = wrap(env)
    except BaseException:
        env.close()
        raise
    return env
