"""Observation and reward normalization wrappers with checkpointable statistics."""

from __future__ import annotations

from typing import Any

import numpy as np

from shoal.envs.agents_as_batch import split_observation
from shoal.envs.base import VectorEnv, VectorEnvWrapper
from shoal.types import StepResult


class RunningMeanStd:
    """Running mean and variance over batches (Chan et al. parallel update), in float64."""

    def __init__(self, shape: tuple[int, ...] = (), epsilon: float = 1e-4):
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = epsilon

    def update(self, batch: np.ndarray) -> None:
        batch_mean = batch.mean(axis=0)
        batch_var = batch.var(axis=0)
        n = batch.shape[0]
        delta = batch_mean - self.mean
        total = self.count + n
        self.mean = self.mean + delta * n / total
        m2 = self.var * self.count + batch_var * n + delta**2 * self.count * n / total
        self.var = m2 / total
        self.count = total

    def state_dict(self) -> dict[str, Any]:
        # np.array, not .copy(): with shape () the update arithmetic turns mean and var into
        # numpy scalars, which a weights_only checkpoint cannot hold; these are always arrays.
        return {
            "mean": np.array(self.mean, np.float64),
            "var": np.array(self.var, np.float64),
            "count": float(self.count),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mean = np.asarray(state["mean"], np.float64).copy()
        self.var = np.asarray(state["var"], np.float64).copy()
        self.count = float(state["count"])


def normalize(obs: np.ndarray, stats: RunningMeanStd, clip: float) -> np.ndarray:
    """Standardize with frozen statistics; shared by the wrapper and deployed policies."""
    scaled = (obs - stats.mean) / np.sqrt(stats.var + 1e-8)
    return np.clip(scaled, -clip, clip).astype(np.float32)


class NormalizeObservation(VectorEnvWrapper):
    """Standardizes observations; statistics update only while ``training`` is True."""

    def __init__(self, env: VectorEnv, clip: float = 10.0):
        super().__init__(env)
        split = split_observation(env.observation_space)  # actor and critic parts, one row
        self.stats = RunningMeanStd((sum(split),) if split else env.observation_space.shape)
        self.clip = clip
        self.training = True

    def _process(self, obs: np.ndarray) -> np.ndarray:
        if self.training:
            self.stats.update(obs)
        return normalize(obs, self.stats, self.clip)

    def reset(self, seed: int | None = None) -> np.ndarray:
        return self._process(self.env.reset(seed=seed))

    def step(self, actions: np.ndarray) -> StepResult:
        result = self.env.step(actions)
        return result._replace(obs=self._process(result.obs))

    def get_state(self) -> dict[str, Any]:
        return {"inner": self.env.get_state(), "stats": self.stats.state_dict()}

    def set_state(self, state: dict[str, Any]) -> None:
        self.env.set_state(state["inner"])
        self.stats.load_state_dict(state["stats"])


class NormalizeReward(VectorEnvWrapper):
    """Divides rewards by the running std of the discounted return (as in PPO's reference
    implementation); the raw episode returns in `StepResult` are left untouched."""

    def __init__(self, env: VectorEnv, gamma: float = 0.99, clip: float = 10.0):
        super().__init__(env)
        self.stats = RunningMeanStd(())
        self.gamma = gamma
        self.clip = clip
        self.discounted = np.zeros(env.num_envs, np.float64)
        self.training = True

    def reset(self, seed: int | None = None) -> np.ndarray:
        self.discounted[:] = 0.0
        return self.env.reset(seed=seed)

    def step(self, actions: np.ndarray) -> StepResult:
        result = self.env.step(actions)
        self.discounted = self.discounted * self.gamma + result.reward
        if self.training:
            self.stats.update(self.discounted)
        self.discounted[result.terminated | result.truncated] = 0.0
        scaled = result.reward / np.sqrt(self.stats.var + 1e-8)
        return result._replace(reward=np.clip(scaled, -self.clip, self.clip).astype(np.float32))

    def get_state(self) -> dict[str, Any]:
        return {
            "inner": self.env.get_state(),
            "stats": self.stats.state_dict(),
            "discounted": self.discounted.copy(),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self.env.set_state(state["inner"])
        self.stats.load_state_dict(state["stats"])
        self.discounted = np.asarray(state["discounted"], np.float64).copy()
