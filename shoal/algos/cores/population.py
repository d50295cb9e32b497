"""What the derivative-free learners (ES, ARS, the genetic algorithm, CMA-ES) share: the
policy they search over as one flat vector, the evaluator pool, the shared noise table, the
observation filter, counters and the checkpoint layout. Each learner holds a `Population`
(composition) and writes its own generation: which individuals to evaluate and how their
returns move the search.

A generation's progress counter is the env steps its episodes took (``Algorithm.env_steps``),
so ``run.total_steps``, evaluation and checkpoints count what the population played.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import time
from dataclasses import dataclass
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch

from shoal.collect.population import Individual, PopulationPool, PopulationResult
from shoal.config import ModelConfig, check, check_positive
from shoal.config.usage import NO_COMPILE, Gate
from shoal.core.errors import ConfigError
from shoal.core.seeding import derive_seed
from shoal.data.noise import NoiseTable, check_noise_size
from shoal.envs import make_env
from shoal.envs.normalize import RunningMeanStd
from shoal.envs.shapes import shape_of
from shoal.nn.policy import ActorPolicy
from shoal.nn.population import LinearPolicy, PolicyNetwork, parameter_vector, set_parameter_vector


@dataclass(frozen=True)
class SearchConfig:
    """How a derivative-free learner plays its population (``--search.<field>``)."""

    policy: Literal["network", "linear"] = "network"
    """network: the MLP (or image encoder) of ``model`` with the action space's head, acting
    by its mode; linear: ``a = M s`` (Mania et al. 2018), zero at the start."""
    episodes: int = 1
    """Episodes each individual plays per evaluation (its fitness is their mean return)."""
    obs_filter: bool = True
    """Standardize observations with running statistics of every observation the population
    saw (Salimans et al.'s MeanStdFilter; ARS V2). Off: raw observations (ARS V1)."""
    noise_size: int = 250_000_000
    """Standard normal numbers in the shared noise table (float32: 4 bytes each), of which
    each perturbation reads one slice; the references' 250,000,000 is 1 GB."""
    eval_prob: float = 0.003
    """Chance, per perturbation, that the unperturbed policy also plays one episode; their
    mean is logged as ``train/center_return`` (the references' eval_prob)."""
    step_limit: int = 100_000
    """Longest episode played: one that has not ended by then is cut (for envs without a time
    limit of their own)."""

    def __post_init__(self) -> None:
        check_positive(self, "episodes", "noise_size", "step_limit")
        check(self, "eval_prob", 0.0 <= self.eval_prob <= 1.0, "must be in [0, 1]")


NETWORK_GATES = {
    f"model.{name}": Gate("search.policy", lambda p: p == "network", "with search.policy network")
    for name in ("hidden", "activation", "encoder", "temperature", "temperature_min")
}
"""The ``model`` fields a linear policy (``search.policy linear``) does not read."""
SEARCH_UNUSED = {
    **NO_COMPILE,
    "model.shared_trunk": "each individual is one network",
}
"""What no derivative-free learner reads."""


def check_search(config: Any) -> None:
    """What every derivative-free learner refuses before anything runs."""
    env, model = config.env, config.model
    check(model, "lstm_hidden", model.lstm_hidden is None,
          "the derivative-free learners search over feed-forward policies")  # fmt: skip
    for name in ("normalize_obs", "normalize_reward"):
        check(env, name, not getattr(env, name),
              "the derivative-free learners filter observations themselves "
              "(search.obs_filter) and rank returns; turn it off")  # fmt: skip
    if config.run.runners > 0:
        from shoal.distributed import require_ray

        require_ray()  # a clear error now, not after the noise table was made


def counter(name: str) -> property:
    """A learner's progress counter (``env_steps``, ``iteration``), read from its
    ``population``: the `Algorithm` protocol asks the learner for them."""
    return property(lambda self: getattr(self.population, name))


def build_model(config: Any, obs_space: gym.Space, action_space: gym.Space) -> torch.nn.Module:
    """The policy a learner's vector fills (also what `shoal.load` rebuilds)."""
    if config.search.policy == "linear":
        return LinearPolicy(obs_space, action_space)
    return PolicyNetwork(obs_space, action_space, config.model)


def _model_fn(config: Any, obs_space: gym.Space, action_space: gym.Space) -> torch.nn.Module:
    # Built in every worker from the same torch seed, so all start from one initialization.
    torch.manual_seed(derive_seed(config.run.seed, "init"))
    return build_model(config, obs_space, action_space)


class Population:
    """The parts of a derivative-free run; ``evaluate`` plays individuals and counts.

    ``center`` is the search's current parameter vector ``[D]`` (float32 numpy): the policy
    deployed, evaluated and checkpointed is that of ``center``."""

    def __init__(self, config: Any, noise: bool = True):
        """``noise`` False: the learner sends whole vectors (CMA-ES), so no table is made."""
        check_search(config)
        self.config = config
        run, search = config.run, config.search
        self.rng = np.random.default_rng(derive_seed(run.seed, "search"))
        model_fn = functools.partial(_model_fn, config)
        probe_space = _spaces(config)
        self.model = model_fn(*probe_space)
        self.center = parameter_vector(self.model).numpy()
        self.dim = self.center.size
        if noise:
            check_noise_size(search.noise_size, self.dim)
        size = search.noise_size if noise else 0
        self.noise = NoiseTable(derive_seed(run.seed, "noise"), size)
        self.pool = PopulationPool(
            config.env,
            model_fn,
            self.noise,
            run.runners,
            run.ray_address,
            run.max_worker_restarts,
            run.device,
            search.step_limit,
        )
        if search.obs_filter and not isinstance(probe_space[0], gym.spaces.Box):
            raise ConfigError(
                f"search.obs_filter standardizes Box observations, not {probe_space[0]}; "
                "turn it off"
            )
        self.obs_filter = RunningMeanStd(shape_of(probe_space[0])) if search.obs_filter else None
        self.env_steps = self.episodes = self.iteration = 0
        self.start_generation()

    # --- playing --------------------------------------------------------------------------

    def evaluate(
        self,
        individuals: list[Individual] | np.ndarray,
        episodes: int | None = None,
        base: np.ndarray | None = None,
        group: int = 1,
    ) -> PopulationResult:
        """Play the individuals (``base`` defaults to ``center``) with the generation's frozen
        observation filter; counts their env steps and episodes. The filter takes in what they
        saw only at `end_generation`, so every individual of a generation sees the same one.
        ``group``: consecutive individuals that share start states (2: antithetic pairs)."""
        episodes = episodes or self.config.search.episodes
        started = time.perf_counter()
        result = self.pool.evaluate(
            self.center if base is None else base,
            individuals,
            episodes,
            env_seed=int(self.rng.integers(2**30)),
            obs_filter=None if self.obs_filter is None else self.obs_filter.state_dict(),
            clip_obs=self.config.env.clip_obs,
            group=group,
        )
        wall = time.perf_counter() - started
        self.timing["evaluate"] = self.timing.get("evaluate", 0.0) + result.seconds
        self.timing["communicate"] = self.timing.get("communicate", 0.0) + wall - result.seconds
        self._seen.append(result)
        self.env_steps += result.env_steps
        self.episodes += result.returns.size
        return result

    def start_generation(self) -> None:
        self._started = time.perf_counter()
        self.timing: dict[str, float] = {}
        self._seen: list[Any] = []

    def center_return(self, perturbations: int) -> dict[str, float]:
        """With probability ``eval_prob`` per perturbation, one episode of the center."""
        count = int(self.rng.binomial(perturbations, self.config.search.eval_prob))
        if count == 0:
            return {}
        result = self.evaluate([Individual()] * count, episodes=1)
        return {"train/center_return": float(result.returns.mean())}

    def end_generation(self, returns: np.ndarray, lengths: np.ndarray) -> dict[str, float]:
        """Merge the observations seen into the filter; the generation's metrics."""
        for result in self._seen:
            seen = result.obs_stats()
            if seen is not None and self.obs_filter is not None:
                self.obs_filter.merge(*seen)
        self.iteration += 1
        total = time.perf_counter() - self._started
        evaluate = self.timing.get("evaluate", 0.0)
        communicate = self.timing.get("communicate", 0.0)
        metrics = {
            "episode/return": float(np.mean(returns)),
            "episode/return_max": float(np.max(returns)),
            "episode/length": float(np.mean(lengths)),
            "episode/count": int(np.size(returns)),
            "perf/generation_s": total,
            "perf/evaluate_s": evaluate,
            "perf/communicate_s": communicate,
            "perf/update_s": total - evaluate - communicate,
            "perf/episodes_per_s": float(np.size(returns)) / max(evaluate, 1e-9),
            "perf/env_steps_per_s": float(np.sum(lengths)) / max(evaluate, 1e-9),
            "search/parameter_norm": float(np.linalg.norm(self.center)),
        }
        if self.pool.runners:
            metrics["perf/bytes_per_worker"] = float(self.pool.bytes_sent)
            metrics["perf/worker_restarts"] = float(self.pool.restarts)
        return metrics

    def offsets(self, count: int) -> np.ndarray:
        return self.noise.sample_offsets(self.rng, self.dim, count)

    def evaluate_pairs(self, offsets: np.ndarray, sigma: float) -> tuple[np.ndarray, np.ndarray]:
        """Play ``center +- sigma * noise[offset]`` for each offset, a pair from the same
        starts: their mean returns ``[n, 2]`` (+, -) and the env steps of each ``[n, 2]``."""
        pairs = [Individual((int(o),), (sign * sigma,)) for o in offsets for sign in (1.0, -1.0)]
        result = self.evaluate(pairs, group=2)
        return result.returns.mean(1).reshape(-1, 2), result.lengths.sum(1).reshape(-1, 2)

    # --- the policy and its state ---------------------------------------------------------

    def policy(self) -> ActorPolicy:
        """The center's policy, with the observation filter of the moment."""
        set_parameter_vector(self.model, torch.as_tensor(self.center))
        stats = None if self.obs_filter is None else self.obs_filter.state_dict()
        return ActorPolicy(
            copy.deepcopy(self.model), stats, self.config.env.clip_obs,
            observation_space=self.pool.observation_space, action_space=self.pool.action_space,
        )  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        set_parameter_vector(self.model, torch.as_tensor(self.center))
        return {
            "policy": {
                "model": self.model.state_dict(),
                "obs_stats": None if self.obs_filter is None else self.obs_filter.state_dict(),
            },
            "center": torch.as_tensor(self.center).clone(),
            "rng": self.rng.bit_generator.state,
            "counters": {
                "env_steps": self.env_steps,
                "episodes": self.episodes,
                "iteration": self.iteration,
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        center = np.asarray(state["center"], np.float32)
        if center.shape != self.center.shape:
            raise ConfigError(
                f"the checkpoint's policy has {center.size} parameters, this config's "
                f"{self.center.size}: resume with the config the run was started with"
            )
        self.center = center.copy()
        self.rng.bit_generator.state = state["rng"]
        if self.obs_filter is not None and state["policy"]["obs_stats"] is not None:
            self.obs_filter.load_state_dict(state["policy"]["obs_stats"])
        counters = state["counters"]
        self.env_steps, self.episodes = counters["env_steps"], counters["episodes"]
        self.iteration = counters["iteration"]

    def close(self) -> None:
        self.pool.close()


def _spaces(config: Any) -> tuple[gym.Space, gym.Space]:
    """The env's observation and action spaces, from one env."""
    env = make_env(dataclasses.replace(config.env, num_envs=1, vectorization="sync"))
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def search_model(hidden: tuple[int, ...] = (64, 64)) -> Any:
    """The default network of the derivative-free learners: a tanh MLP."""
    return ModelConfig(hidden=hidden, activation="tanh")
