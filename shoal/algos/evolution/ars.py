"""Augmented random search (Mania, Guy and Recht 2018, "Simple random search provides a
competitive approach to reinforcement learning").

Each generation plays ``num_rollouts`` antithetic pairs ``M +- sigma * delta_i`` of a linear
policy (or of any shoal network, ``search.policy network``), keeps the ``rollouts_used``
directions whose better return is highest, and steps along them scaled by the standard
deviation of the returns used (`shoal.losses.evolution.ars_step`). With the observation filter
(``search.obs_filter``, on by default) this is ARS V2-t; without it, V1-t. The defaults are
those of RLlib's ARS (2018): noise 0.02, 32 directions, all used, step 0.01.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from shoal.algos.cores.population import (
    NETWORK_GATES,
    SEARCH_UNUSED,
    Population,
    SearchConfig,
    build_model,
    counter,
    search_model,
)
from shoal.algos.spec import AlgorithmSpec
from shoal.config import EnvConfig, ModelConfig, RunConfig, check, check_positive
from shoal.config.usage import Gate
from shoal.losses.evolution import ars_step
from shoal.nn.policy import ActorPolicy

__all__ = ["ARS", "ARSConfig", "build_model"]


@dataclass(frozen=True)
class ARSConfig:
    """Augmented-random-search hyperparameters (RLlib's ARS defaults, 2018)."""

    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=search_model)
    """The network of ``search.policy network`` (unused by the linear policy)."""
    search: SearchConfig = field(
        default_factory=lambda: SearchConfig(policy="linear", eval_prob=0.03)
    )
    noise_stdev: float = 0.02
    """nu: the standard deviation of the perturbations."""
    num_rollouts: int = 32
    """N: directions tried per generation (each played both ways)."""
    rollouts_used: int = 32
    """b: the best directions the step is taken along (b = N: all of them)."""
    sgd_stepsize: float = 0.01
    """alpha: the step size."""

    GATES: ClassVar[dict[str, Gate]] = NETWORK_GATES
    UNUSED: ClassVar[dict[str, str]] = {
        **SEARCH_UNUSED,
    }

    def __post_init__(self) -> None:
        check_positive(self, "noise_stdev", "num_rollouts", "rollouts_used", "sgd_stepsize")
        check(self, "rollouts_used", self.rollouts_used <= self.num_rollouts,
              f"must be at most num_rollouts = {self.num_rollouts}")  # fmt: skip


class ARS:
    """One ARS generation: N antithetic pairs, the b best, one scaled step."""

    def __init__(self, config: ARSConfig):
        self.config = config
        self.population = Population(config)

    env_steps = counter("env_steps")
    iteration = counter("iteration")

    def train_iteration(self) -> dict[str, float]:
        cfg, population = self.config, self.population
        population.start_generation()
        offsets = population.offsets(cfg.num_rollouts)
        returns, lengths = population.evaluate_pairs(offsets, cfg.noise_stdev)  # [N, (+, -)]
        metrics = population.center_return(returns.size)
        noise = population.noise.rows(offsets, population.dim)
        step = ars_step(returns[:, 0], returns[:, 1], noise, cfg.sgd_stepsize, cfg.rollouts_used)
        population.center = (population.center + step).astype(np.float32)
        metrics.update(population.end_generation(returns, lengths))
        metrics["search/step_norm"] = float(np.linalg.norm(step))
        return metrics

    def policy(self) -> ActorPolicy:
        return self.population.policy()

    def state_dict(self) -> dict[str, Any]:
        return self.population.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        self.population.load_state_dict(state)
        return True

    def close(self) -> None:
        self.population.close()


SPECS = (
    AlgorithmSpec(
        "ars",
        ARSConfig,
        ARS,
        build_model,
        "Augmented random search: linear policies, top-b directions, return-std step",
        "Discrete, Box",
        runners=True,
        gradients=False,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
