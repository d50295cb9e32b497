"""A genetic algorithm over policy parameters (Such, Madhavan, Conti, Lehman, Stanley and Clune
2017, "Deep Neuroevolution: Genetic Algorithms Are a Competitive Alternative for Training Deep
Neural Networks for Reinforcement Learning", Algorithm 1).

Each generation: the ``truncation`` best of the last generation are the parents; every child is
a uniformly drawn parent plus Gaussian noise (mutation, no crossover); the elite, the best of
the last generation's ``elite_candidates`` best (and of the previous elite) re-evaluated on
``elite_episodes`` more episodes, passes unchanged. The deployed policy is the elite.

Individuals are their seed chains, the paper's compact encoding: the offsets of the noise-table
slices added to the first generation's base vector, one per generation of ancestry
(`shoal.collect.population.Individual`), so workers are sent a few integers per individual and
rebuild the parameters themselves. Unlike the paper, the first generation mutates one
initialization (the run's seed) rather than drawing one per individual, so that the chains hold
noise-table offsets only.
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
from shoal.collect.population import Individual, individual_vector
from shoal.config import EnvConfig, ModelConfig, RunConfig, check, check_positive
from shoal.config.usage import Gate
from shoal.losses.evolution import truncation_selection
from shoal.nn.policy import ActorPolicy

__all__ = ["GA", "GAConfig", "build_model"]


@dataclass(frozen=True)
class GAConfig:
    """Genetic-algorithm hyperparameters (population and truncation scaled down from the
    paper's 1,000 and 20 to a laptop's)."""

    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=search_model)
    search: SearchConfig = field(default_factory=lambda: SearchConfig(eval_prob=0.0))
    population: int = 64
    """N: individuals per generation (the elite among them)."""
    truncation: int = 10
    """T: the best individuals of a generation that parent the next."""
    mutation_stdev: float = 0.02
    """sigma: the standard deviation of a mutation."""
    elite_candidates: int = 10
    """The best individuals re-evaluated to pick the elite (with the previous elite)."""
    elite_episodes: int = 10
    """Episodes of each elite candidate's re-evaluation (the paper's 30)."""

    GATES: ClassVar[dict[str, Gate]] = NETWORK_GATES
    UNUSED: ClassVar[dict[str, str]] = {
        **SEARCH_UNUSED,
        "search.eval_prob": "its elite is re-evaluated instead (elite_episodes)",
    }

    def __post_init__(self) -> None:
        check_positive(self, "population", "truncation", "mutation_stdev", "elite_candidates",
                       "elite_episodes")  # fmt: skip
        check(self, "population", self.population >= 2, "must be at least 2")
        check(self, "truncation", self.truncation <= self.population,
              f"must be at most population = {self.population}")  # fmt: skip
        check(self, "elite_candidates", self.elite_candidates <= self.population,
              f"must be at most population = {self.population}")  # fmt: skip


def chain(individual: Individual, offset: int, sigma: float) -> Individual:
    """``individual`` mutated once more: its chain with one more slice."""
    return Individual((*individual.offsets, int(offset)), (*individual.coeffs, float(sigma)))


class GA:
    """One generation: mutate parents, keep the elite, evaluate, select, re-evaluate."""

    def __init__(self, config: GAConfig):
        self.config = config
        self.population = Population(config)
        self.base = self.population.center.copy()
        """The first generation's parameters, which every chain starts from."""
        self.parents: list[Individual] = []
        self.elite: Individual | None = None

    env_steps = counter("env_steps")
    iteration = counter("iteration")

    def train_iteration(self) -> dict[str, float]:
        cfg, population = self.config, self.population
        population.start_generation()
        sigma = cfg.mutation_stdev
        children = cfg.population - (self.elite is not None)
        offsets = population.offsets(children)
        if self.parents:
            picks = population.rng.integers(len(self.parents), size=children)
            pairs = zip(picks, offsets, strict=True)
            mutants = [chain(self.parents[p], o, sigma) for p, o in pairs]
        else:
            mutants = [chain(Individual(), o, sigma) for o in offsets]
        individuals = ([self.elite] if self.elite is not None else []) + mutants
        result = population.evaluate(individuals, base=self.base)
        returns = result.returns.mean(1)
        order = truncation_selection(returns, cfg.truncation)
        self.parents = [individuals[i] for i in order]
        candidates = [individuals[i] for i in truncation_selection(returns, cfg.elite_candidates)]
        if self.elite is not None and self.elite not in candidates:
            candidates.append(self.elite)
        rechecked = population.evaluate(candidates, episodes=cfg.elite_episodes, base=self.base)
        scores = rechecked.returns.mean(1)
        best = int(np.argmax(scores))
        self.elite = candidates[best]
        population.center = individual_vector(self.base, self.elite, population.noise)
        metrics = population.end_generation(returns, result.lengths.sum(1))
        metrics["search/elite_return"] = float(scores[best])
        metrics["search/elite_generations"] = len(self.elite.offsets)
        return metrics

    def policy(self) -> ActorPolicy:
        return self.population.policy()

    def state_dict(self) -> dict[str, Any]:
        return {
            **self.population.state_dict(),
            "base": self.base.copy(),
            "parents": [_encode(p) for p in self.parents],
            "elite": None if self.elite is None else _encode(self.elite),
        }

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        self.population.load_state_dict(state)
        self.base = np.asarray(state["base"], np.float32).copy()
        self.parents = [_decode(p) for p in state["parents"]]
        self.elite = None if state["elite"] is None else _decode(state["elite"])
        return True

    def close(self) -> None:
        self.population.close()


def _encode(individual: Individual) -> dict[str, list]:
    return {"offsets": list(individual.offsets), "coeffs": list(individual.coeffs)}


def _decode(data: dict[str, list]) -> Individual:
    offsets, coeffs = data["offsets"], data["coeffs"]
    return Individual(tuple(int(o) for o in offsets), tuple(float(c) for c in coeffs))


SPECS = (
    AlgorithmSpec(
        "ga",
        GAConfig,
        GA,
        build_model,
        "Genetic algorithm: truncation selection, Gaussian mutation, elite, seed-chain individuals",
        "Discrete, Box, MultiDiscrete, MultiBinary",
        runners=True,
        gradients=False,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
