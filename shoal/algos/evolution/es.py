"""Evolution strategies (Salimans, Ho, Chen, Sidor and Sutskever 2017, "Evolution Strategies as
a Scalable Alternative to Reinforcement Learning").

Each generation perturbs the policy's parameter vector ``theta`` in antithetic pairs
``theta +- sigma * eps_i`` (``eps_i`` read from the shared noise table by offset), plays every
perturbed policy for whole episodes, replaces the returns by their centered ranks, and moves
``theta`` along the estimated gradient with Adam, with an L2 penalty. A generation plays rounds
of ``episodes_per_batch`` episodes until it has also taken ``train_batch_size`` env steps (the
references' two batch sizes), or until the run's ``run.total_steps`` are spent: a round that
the remaining budget would not hold at the episode length seen so far plays fewer pairs. The
defaults are those of RLlib's ES (2018).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
import torch

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
from shoal.losses.evolution import centered_ranks, es_gradient
from shoal.nn.policy import ActorPolicy

__all__ = ["ES", "ESConfig", "build_model"]

GRADIENT_CHUNK = 512
"""Pairs whose noise rows are read at once for the gradient: a generation of thousands of
pairs of a large network would otherwise hold gigabytes of noise (``[pairs, D]`` floats)."""


@dataclass(frozen=True)
class ESConfig:
    """Evolution-strategies hyperparameters (RLlib's ES defaults, 2018)."""

    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=search_model)
    search: SearchConfig = field(default_factory=SearchConfig)
    noise_stdev: float = 0.02
    """sigma: the standard deviation of the parameter perturbations."""
    stepsize: float = 0.01
    """Adam's step size on the parameter vector."""
    l2_coeff: float = 0.005
    """Weight of the L2 penalty on the parameters, added to the (negated) gradient estimate."""
    episodes_per_batch: int = 1000
    """Episodes per round of perturbations (half of them mirror the other half): a round has
    episodes_per_batch / (2 * search.episodes) pairs."""
    train_batch_size: int = 10_000
    """Fewest env steps a generation takes: rounds are played until it has them."""
    return_proc_mode: Literal["centered_rank", "raw"] = "centered_rank"
    """Fitness shaping: the returns' centered ranks in [-0.5, 0.5], or the raw returns."""

    GATES: ClassVar[dict[str, Gate]] = NETWORK_GATES
    UNUSED: ClassVar[dict[str, str]] = {
        **SEARCH_UNUSED,
    }

    def __post_init__(self) -> None:
        check_positive(self, "noise_stdev", "stepsize", "episodes_per_batch", "train_batch_size")
        check(self, "l2_coeff", self.l2_coeff >= 0, "must be >= 0")
        check(self, "episodes_per_batch", self.pairs >= 1,
              f"must be at least 2 * search.episodes = {2 * self.search.episodes}")  # fmt: skip

    @property
    def pairs(self) -> int:
        """Antithetic pairs per round."""
        return self.episodes_per_batch // (2 * self.search.episodes)


class ES:
    """One ES generation: rounds of antithetic pairs, centered ranks, one Adam step."""

    def __init__(self, config: ESConfig):
        self.config = config
        self.population = Population(config)
        start = torch.as_tensor(self.population.center, dtype=torch.float64)
        self.theta = torch.nn.Parameter(start)
        self.optimizer = torch.optim.Adam([self.theta], lr=config.stepsize, eps=1e-8)
        self.longest = 0
        """The most env steps one perturbation took in the last generation (0: none yet)."""

    env_steps = counter("env_steps")
    iteration = counter("iteration")

    def train_iteration(self) -> dict[str, float]:
        cfg, population = self.config, self.population
        population.start_generation()
        sigma, steps_before = cfg.noise_stdev, population.env_steps
        rounds: list[np.ndarray] = []
        round_returns: list[np.ndarray] = []
        lengths: list[np.ndarray] = []
        budget = cfg.run.total_steps
        while not rounds or (population.env_steps - steps_before < cfg.train_batch_size
                             and population.env_steps < budget):  # fmt: skip
            rounds.append(population.offsets(self._round_pairs()))
            pair_returns, pair_lengths = population.evaluate_pairs(rounds[-1], sigma)
            round_returns.append(pair_returns)  # [pairs, (+, -)]
            lengths.append(pair_lengths)
        offsets, returns = np.concatenate(rounds), np.concatenate(round_returns)
        metrics = population.center_return(returns.size)
        fitness = centered_ranks(returns) if cfg.return_proc_mode == "centered_rank" else returns
        gradient = np.zeros(population.dim)
        for start in range(0, len(offsets), GRADIENT_CHUNK):  # a few rows of noise at a time
            part = slice(start, start + GRADIENT_CHUNK)
            noise = population.noise.rows(offsets[part], population.dim)
            weight = len(noise) / len(offsets)  # es_gradient averages over its own rows
            gradient += weight * es_gradient(fitness[part, 0], fitness[part, 1], noise, sigma)
        # The authors' code steps along sigma * gradient (its sum over pairs divided by the
        # number of returns), and weighs the L2 penalty against that.
        self.optimizer.zero_grad()
        self.theta.grad = torch.as_tensor(-sigma * gradient) + cfg.l2_coeff * self.theta.detach()
        self.optimizer.step()
        population.center = self.theta.detach().numpy().astype(np.float32)
        steps = np.concatenate(lengths)
        self.longest = int(steps.max())  # one perturbation's env steps over its episodes
        metrics.update(population.end_generation(returns, steps))
        metrics["search/gradient_norm"] = float(np.linalg.norm(gradient))
        metrics["search/pairs"] = len(offsets)
        return metrics

    def _round_pairs(self) -> int:
        """The pairs of the next round: the config's, or fewer where the run's remaining
        ``run.total_steps`` would not hold them if each perturbation took as many env steps as
        the longest-playing one of the last generation (one pair at least). A run then ends
        near its budget instead of a whole round of ``episodes_per_batch`` episodes past it,
        which on CartPole can be 500,000 env steps."""
        cfg, population = self.config, self.population
        if self.longest == 0:
            return cfg.pairs
        left = cfg.run.total_steps - population.env_steps
        return int(np.clip(np.ceil(left / (2 * self.longest)), 1, cfg.pairs))

    def policy(self) -> ActorPolicy:
        return self.population.policy()

    def state_dict(self) -> dict[str, Any]:
        return {
            **self.population.state_dict(),
            "theta": self.theta.detach().clone(),  # float64; the center is its float32 copy
            "optimizer": self.optimizer.state_dict(),
            "longest": self.longest,
        }

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        self.population.load_state_dict(state)
        with torch.no_grad():
            self.theta.copy_(state["theta"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.longest = int(state.get("longest", 0))  # 0 in checkpoints from before it was kept
        return True

    def close(self) -> None:
        self.population.close()


SPECS = (
    AlgorithmSpec(
        "es",
        ESConfig,
        ES,
        build_model,
        "Evolution strategies: antithetic noise-table perturbations, centered ranks, Adam",
        "Discrete, Box, MultiDiscrete, MultiBinary",
        runners=True,
        gradients=False,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
