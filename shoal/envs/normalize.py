"""Observation and reward normalization wrappers with checkpointable statistics."""

from __future__ import annotations

from typing import Any

import numpy as np

from shoal.core.types import StepResult
from shoal.envs.agents_as_batch import split_observation
from shoal.envs.base import VectorEnv, VectorEnvWrapper
from shoal.envs.composite import PackedObs, field_view
from shoal.envs.shapes import shape_of


class RunningMeanStd:
    """Running mean and variance over batches (Chan et al. parallel update), in float64."""

    def __init__(self, shape: tuple[int, ...] = (), epsilon: float = 1e-4):
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = epsilon

    def update(self, batch: np.ndarray) -> None:
        if batch.shape[0]:
            self.merge(batch.mean(axis=0), batch.var(axis=0), batch.shape[0])

    def merge(self, batch_mean: np.ndarray, batch_var: np.ndarray, n: float) -> None:
        """Fold in the statistics of other data (``n`` samples with that mean and population
        variance): the result is that of all the data together (workers' statistics merged
        by the learner, say)."""
        if n == 0:
            return
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


class FieldStats:
    """Running statistics of each float field of packed composite observations
    (`shoal.envs.composite`): every vector key (a float Box) is standardized on its own;
    images, discrete and binary parts pass unchanged. The state names each field's offset and
    shape, so a deployed policy needs no space to apply it."""

    def __init__(self, fields: list[tuple[int, tuple[int, ...]]]):
        self.fields = [(int(offset), tuple(shape)) for offset, shape in fields]
        self.stats = [RunningMeanStd(shape) for _, shape in self.fields]

    @classmethod
    def of(cls, space: PackedObs) -> FieldStats:
        return cls([(leaf.offset, leaf.shape) for leaf in space.leaves if leaf.is_float])

    def _view(self, records: np.ndarray, index: int) -> np.ndarray:
        offset, shape = self.fields[index]
        return field_view(records, offset, np.float32, shape)

    def update(self, records: np.ndarray) -> None:
        for index, stats in enumerate(self.stats):
            stats.update(self._view(records, index))

    def normalize(self, records: np.ndarray, clip: float) -> np.ndarray:
        out = np.array(records, np.uint8)
        for index, stats in enumerate(self.stats):
            view = self._view(out, index)
            view[...] = normalize(view, stats, clip)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "fields": [
                {"offset": offset, "shape": list(shape), **stats.state_dict()}
                for (offset, shape), stats in zip(self.fields, self.stats, strict=True)
            ]
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for stats, field in zip(self.stats, state["fields"], strict=True):
            stats.load_state_dict(field)


def load_obs_stats(state: dict[str, Any]) -> RunningMeanStd | FieldStats:
    """The statistics a `NormalizeObservation` state dict holds (flat or per field)."""
    stats: RunningMeanStd | FieldStats
    if "fields" in state:
        stats = FieldStats([(f["offset"], tuple(f["shape"])) for f in state["fields"]])
    else:
        stats = RunningMeanStd()
    stats.load_state_dict(state)
    return stats


def normalize(obs: np.ndarray, stats: RunningMeanStd | FieldStats, clip: float) -> np.ndarray:
    """Standardize with frozen statistics; shared by the wrapper and deployed policies."""
    if isinstance(stats, FieldStats):
        return stats.normalize(obs, clip)
    scaled = (obs - stats.mean) / np.sqrt(stats.var + 1e-8)
    return np.clip(scaled, -clip, clip).astype(np.float32)


class NormalizeObservation(VectorEnvWrapper):
    """Standardizes observations; statistics update only while ``training`` is True."""

    def __init__(self, env: VectorEnv, clip: float = 10.0):
        super().__init__(env)
        space = env.observation_space
        split = split_observation(space)  # actor and critic parts, one row
        self.stats: RunningMeanStd | FieldStats
        if isinstance(space, PackedObs):
            self.stats = FieldStats.of(space)
        else:
            self.stats = RunningMeanStd((sum(split),) if split else shape_of(space))
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
