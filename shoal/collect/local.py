"""The in-process sampler: one `EnvRunner`, no copies of the data."""

from __future__ import annotations

from typing import Any

from shoal.collect.env_runner import EnvRunner
from shoal.core.interfaces import Weights
from shoal.core.types import EpisodeStats, Rollout


class LocalSampler:
    num_runners = 1
    restarts = 0
    last_restarted: tuple[int, ...] = ()
    """Runners restarted during the last sample: never, in-process (`RaySampler`)."""

    def __init__(self, runner: EnvRunner):
        self.runner = runner
        self.observation_space = runner.env.observation_space
        self.action_space = runner.env.action_space
        self.agents_per_env = runner.env.agents_per_env
        self.action_masked = runner.storage.action_mask is not None
        """Whether the env reports legal actions (rollouts then carry the masks)."""

    @property
    def num_envs(self) -> int:
        return self.runner.num_envs

    @property
    def envs_per_runner(self) -> int:
        return self.runner.num_envs

    def sample(self) -> tuple[Rollout, EpisodeStats]:
        return self.runner.sample()

    def set_weights(self, weights: Weights) -> None:
        self.runner.set_weights(weights)

    def set_env_attr(self, name: str, value: Any) -> None:
        """Set attribute ``name`` of every training env to ``value`` (a curriculum's knob)."""
        self.runner.set_env_attr(name, value)

    def obs_stats(self) -> dict[str, Any] | None:
        """The observation normalizer's statistics (None without normalization): a deployed
        policy applies them, frozen."""
        return self.runner.obs_stats()

    def get_state(self) -> dict[str, Any]:
        return {"runners": [self.runner.get_state()]}

    def set_state(self, state: dict[str, Any], fallback_seed: int) -> bool:
        return self.runner.set_state(state["runners"][0], fallback_seed)

    def close(self) -> None:
        self.runner.close()
