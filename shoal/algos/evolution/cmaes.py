"""CMA-ES (Hansen and Ostermeier 2001, "Completely Derandomized Self-Adaptation in Evolution
Strategies"; Hansen 2016, "The CMA Evolution Strategy: A Tutorial") over a small policy's
parameters, through the `cma` package (Hansen's own implementation): shoal asks it for a
population, plays it on the same evaluator pool as the other derivative-free learners, and
tells it the returns.

Candidates travel whole (a small policy's vector), not as noise-table offsets: CMA-ES samples
from its own adapted covariance. The search's normal draws come from a generator seeded by the
run, never NumPy's global one; a checkpoint holds the returns told so far, and a resume
rebuilds the search by asking and telling them again in order (the same draws give the same
candidates, so the state is exactly the one saved), which costs little for the small policies
CMA-ES is for (its covariance is ``D x D``).

The candidates of a generation play from common start states (the same env seeds: common
random numbers), so that CMA-ES, which uses only their ranking, ranks policies rather than
luckier starts. On Pendulum-v1 with 3 episodes a candidate and starts of their own, 2 of 3
seeds reached -200 within 3M env steps, and which two depended on the CPU; with common starts
and 5 episodes all three did, in 1.1M-1.7M steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

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
from shoal.core.errors import ConfigError
from shoal.core.seeding import derive_seed
from shoal.nn.policy import ActorPolicy

__all__ = ["CMAES", "CMAESConfig", "build_model"]

MAX_PARAMETERS = 10_000
"""Largest policy CMA-ES is allowed (its covariance matrix is D x D floats)."""


@dataclass(frozen=True)
class CMAESConfig:
    """CMA-ES settings; `cma`'s defaults where a field is None."""

    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=lambda: search_model((16,)))
    search: SearchConfig = field(default_factory=lambda: SearchConfig(eval_prob=0.0))
    """search.noise_size is unused: candidates travel whole, no noise table is made."""
    sigma0: float = 0.5
    """The initial step size (standard deviation of the first population)."""
    popsize: int | None = None
    """Candidates per generation; None: cma's default, 4 + floor(3 ln D)."""

    GATES: ClassVar[dict[str, Gate]] = NETWORK_GATES
    UNUSED: ClassVar[dict[str, str]] = {
        **SEARCH_UNUSED,
        "search.noise_size": "CMA-ES samples its own candidates (no noise table)",
        "search.eval_prob": "CMA-ES logs its mean's return from its own evaluations",
    }

    def __post_init__(self) -> None:
        check_positive(self, "sigma0")
        check(self, "popsize", self.popsize is None or self.popsize >= 2, "must be >= 2 or None")


def _require_cma() -> Any:
    try:
        import cma
    except ImportError as exc:
        raise ConfigError("cmaes needs the cma package: pip install 'shoal[cma]'") from exc
    return cma


class CMAES:
    """One generation: ask, play, tell (returns negated: cma minimizes)."""

    def __init__(self, config: CMAESConfig):
        cma = _require_cma()  # before any env or worker is made
        self.config = config
        self.population = Population(config, noise=False)
        if self.population.dim > MAX_PARAMETERS:
            raise ConfigError(
                f"cmaes adapts a {self.population.dim:,} x {self.population.dim:,} covariance: "
                f"its policy may have at most {MAX_PARAMETERS:,} parameters; use a smaller "
                "model.hidden, search.policy linear, or es / ars"
            )
        self._cma = cma
        self.start = self.population.center.astype(np.float64)
        """The first mean: the policy's initialization (the same on a resume: same seed)."""
        self.told: list[np.ndarray] = []
        self.search = self._new_search()

    def _new_search(self) -> Any:
        cfg = self.config
        self.draws = np.random.default_rng(derive_seed(cfg.run.seed, "cma"))
        options = {
            "randn": lambda *shape: self.draws.standard_normal(shape),
            "verbose": -9,
            "seed": np.nan,  # no global seeding: draws come from `randn`
        }
        if cfg.popsize is not None:
            options["popsize"] = cfg.popsize
        return self._cma.CMAEvolutionStrategy(self.start, cfg.sigma0, options)

    env_steps = counter("env_steps")
    iteration = counter("iteration")

    def train_iteration(self) -> dict[str, float]:
        population = self.population
        population.start_generation()
        candidates = self.search.ask()
        result = population.evaluate(  # one set of start states for the whole generation
            np.asarray(candidates, np.float32), group=len(candidates)
        )
        returns = result.returns.mean(1)
        self.search.tell(candidates, (-returns).tolist())
        self.told.append(returns.astype(np.float64))
        population.center = np.asarray(self.search.result.xfavorite, np.float32)
        metrics = population.end_generation(returns, result.lengths.sum(1))
        metrics["search/sigma"] = float(self.search.sigma)
        return metrics

    def policy(self) -> ActorPolicy:
        return self.population.policy()

    def state_dict(self) -> dict[str, Any]:
        told = torch.as_tensor(np.stack(self.told)) if self.told else None
        return {**self.population.state_dict(), "told": told}

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        self.population.load_state_dict(state)
        self.told, self.search = [], self._new_search()
        for returns in [] if state["told"] is None else state["told"].numpy():
            self.search.tell(self.search.ask(), (-returns).tolist())
            self.told.append(returns)
        return True

    def close(self) -> None:
        self.population.close()


SPECS = (
    AlgorithmSpec(
        "cmaes",
        CMAESConfig,
        CMAES,
        build_model,
        "CMA-ES (the cma package) over a small policy's parameters",
        "Discrete, Box, MultiDiscrete, MultiBinary",
        runners=True,
        gradients=False,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
