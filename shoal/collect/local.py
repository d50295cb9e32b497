"""The in-process sampler: one `EnvRunner`, no copies of the data."""

from __future__ import annotations

from typing import Any

from shoal.collect.env_runner import EnvRunner
from shoal.envs.base import find_wrapper
from shoal.envs.normalize import NormalizeObservation
from shoal.interfaces import Weights
from shoal.types import EpisodeStats, Rollout


class LocalSampler:
    def __init__(self, runner: EnvRunner):
        self.runner = runner

    @property
    def num_envs(self) -> int:
        return self.runner.num_envs

    def sample(self) -> tuple[Rollout, EpisodeStats]:
        return self.runner.sample()

    def set_weights(self, weights: Weights) -> None:
        self.runner.set_weights(weights)

    def obs_stats(self) -> dict[str, Any] | None:
        """The observation normalizer's statistics (None without normalization): a deployed
        policy applies them, frozen."""
        wrapper = find_wrapper(self.runner.env, NormalizeObservation)
        return wrapper.stats.state_dict() if wrapper is not None else None

    def get_state(self) -> dict[str, Any]:
        return {"runners": [self.runner.get_state()]}

    def set_state(self, state: dict[str, Any], fallback_seed: int) -> bool:
        return self.runner.set_state(state["runners"][0], fallback_seed)

    def close(self) -> None:
        self.runner.close()
