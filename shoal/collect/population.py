"""Evaluating populations of policies by whole episodes, in one process or on Ray workers.

A `PopulationEvaluator` holds one vector env of ``individuals x episodes`` envs and plays
every individual's episodes at once: each step is one batched forward of the whole population
(`shoal.nn.population.population_actions`) and one step of the vector env. Individuals travel
as a few numbers, not as parameters: the learner sends a ``base`` vector once per generation
and each individual is ``base + sum_k coeff_k * noise[offset_k]`` (`Individual`), read from the
shared noise table (`shoal.data.noise`); only CMA-ES's small policies travel whole.

A `PopulationPool` splits a population into contiguous parts, one per worker: the in-process
evaluator (``run.runners`` 0) or N Ray actors (a worker that dies is rebuilt from its seed and
its part sent again, `shoal.distributed.ray_workers.WorkerPool`). Episode ``e`` of the
individual at index ``i`` of the population resets its env with seed ``env_seed + i * episodes
+ e`` wherever it runs (pairs share theirs, `episode_seeds`), so a population's returns do not
depend on how it was split. That needs envs seeded one by one, so ``env.vectorization`` auto
means Gymnasium's sync vector env here; a natively vectorized env (``native``, CartPole's)
draws every env's start from one generator, and its returns then depend on the split (as
do those of shoal's built-in multi-agent worlds, whose agents all act with the individual's
policy).

Observations are standardized with the learner's running statistics of the generation
(Salimans et al.'s ``MeanStdFilter``), frozen while it is evaluated; each worker returns the
sums of the raw observations it saw, which the learner merges.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from shoal.config import EnvConfig
from shoal.core.device import resolve_device
from shoal.core.errors import ConfigError
from shoal.core.threads import set_compute_threads
from shoal.data.noise import NoiseTable
from shoal.envs import make_env
from shoal.envs.multi_agent import is_multi_agent_id
from shoal.envs.normalize import RunningMeanStd, normalize
from shoal.nn.population import population_actions


class Individual(NamedTuple):
    """``base + sum_k coeffs[k] * noise[offsets[k] : offsets[k] + D]``: no terms is the base
    itself; an ES perturbation has one term (``+-sigma``); a genetic algorithm's individual
    has one per generation of its ancestry (its seed chain)."""

    offsets: tuple[int, ...] = ()
    coeffs: tuple[float, ...] = ()


def individual_vector(base: np.ndarray, individual: Individual, noise: NoiseTable) -> np.ndarray:
    """``[D]`` float32: ``base`` plus the individual's noise-table slices, added in order (the
    learner and every worker rebuild the same numbers)."""
    out = np.array(base, np.float32)
    for offset, coeff in zip(individual.offsets, individual.coeffs, strict=True):
        out += np.float32(coeff) * noise.get(offset, out.size)
    return out


class PopulationResult(NamedTuple):
    """What evaluating a population gives: per individual and episode, in request order."""

    returns: np.ndarray
    """``[K, episodes]`` undiscounted episode returns."""
    lengths: np.ndarray
    """``[K, episodes]`` episode lengths (env steps)."""
    obs_sums: tuple[np.ndarray, np.ndarray, np.ndarray] | None
    """The raw observations each episode saw: their sums and sums of squares ``[K, episodes,
    D]`` and counts ``[K, episodes]`` (float64; None without a filter). Kept per episode so
    that a population's statistics are reduced in one order however it was split."""

    seconds: float = 0.0
    """How long the playing took where it ran (the slowest worker's, for a split population):
    the rest of a pool's wall clock is communication."""

    def obs_stats(self) -> tuple[np.ndarray, np.ndarray, float] | None:
        """Mean, variance and count of every observation the population saw."""
        if self.obs_sums is None:
            return None
        sums, squares, counts = (x.reshape(-1, *x.shape[2:]).sum(0) for x in self.obs_sums)
        if counts == 0:
            return None
        mean = sums / counts
        return mean, np.maximum(squares / counts - mean**2, 0.0), float(counts)

    @property
    def env_steps(self) -> int:
        return int(self.lengths.sum())


def _join(parts: Sequence[PopulationResult]) -> PopulationResult:
    seen = [p.obs_sums for p in parts if p.obs_sums is not None]  # empty parts have none
    sums = None
    if seen:
        count, total, squares = (np.concatenate([s[i] for s in seen]) for i in range(3))
        sums = (count, total, squares)
    return PopulationResult(
        np.concatenate([p.returns for p in parts]),
        np.concatenate([p.lengths for p in parts]),
        sums,
        max(p.seconds for p in parts),
    )


class PopulationEvaluator:
    """Plays populations' episodes in one vector env per population size (kept for reuse).

    ``model_fn(obs_space, action_space)`` builds the policy network whose parameters the
    vectors fill; ``noise`` is the table (or its seed and size, to build it here);
    ``step_limit`` cuts an episode that has not ended by then (counted as truncated)."""

    def __init__(
        self,
        env_config: EnvConfig,
        model_fn: Callable[[Any, Any], torch.nn.Module],
        noise: NoiseTable | np.ndarray | tuple[int, int],
        device: str = "cpu",
        step_limit: int = 100_000,
        threads: int | None = 1,
    ):
        if threads is not None:
            set_compute_threads(threads)
        self.env_config = env_config
        self.device = resolve_device(device)
        self.step_limit = step_limit
        self._envs: dict[int, Any] = {}
        probe = self._env(1)
        self.observation_space, self.action_space = probe.observation_space, probe.action_space
        self.agents = getattr(probe, "agents_per_env", 1)
        """A multi-agent env's agents all act with the individual's policy (shared weights,
        rows of `shoal.envs.agents_as_batch`)."""
        self.per_env_seeds = not is_multi_agent_id(env_config.id) and (
            self._env_config(1).vectorization in ("sync", "async")
        )
        """Whether each env is reset with its own seed (see the module docstring)."""
        self.model = model_fn(self.observation_space, self.action_space).to(self.device).eval()
        self.dim = sum(p.numel() for p in self.model.parameters())
        if isinstance(noise, tuple):
            noise = NoiseTable(*noise)
        self.noise = noise if isinstance(noise, NoiseTable) else NoiseTable.of(noise)

    def describe(self) -> dict[str, Any]:
        return {
            "observation_space": self.observation_space,
            "action_space": self.action_space,
            "dim": self.dim,
        }

    def _env_config(self, num_envs: int) -> EnvConfig:
        config = dataclasses.replace(self.env_config, num_envs=num_envs)
        if config.vectorization == "auto" and not is_multi_agent_id(config.id):
            config = dataclasses.replace(config, vectorization="sync")  # per-env seeds
        return config

    def _env(self, num_envs: int) -> Any:
        if num_envs not in self._envs:
            self._envs[num_envs] = make_env(self._env_config(num_envs))
        return self._envs[num_envs]

    def vectors(
        self, base: np.ndarray | None, individuals: Sequence[Individual] | np.ndarray
    ) -> np.ndarray:
        """``[K, D]`` float32: the parameters of each individual (an array is taken as is)."""
        if isinstance(individuals, np.ndarray):
            return individuals.astype(np.float32)
        if not individuals:
            return np.zeros((0, self.dim), np.float32)
        if base is None:
            raise ValueError("individuals given by their noise need the base parameter vector")
        return np.stack([individual_vector(base, i, self.noise) for i in individuals])

    @torch.inference_mode()
    def evaluate(
        self,
        base: np.ndarray | None,
        individuals: Sequence[Individual] | np.ndarray,
        episodes: int,
        env_seed: int,
        first_index: int = 0,
        obs_filter: dict[str, Any] | None = None,
        clip_obs: float = 10.0,
        group: int = 1,
    ) -> PopulationResult:
        """Play ``episodes`` episodes of every individual; ``first_index`` is the first one's
        index in the whole population and ``group`` how many consecutive individuals share
        start states (`episode_seeds`). ``obs_filter``: the frozen statistics (a
        `RunningMeanStd` state) to standardize observations with, or None."""
        started = time.perf_counter()
        vectors = torch.as_tensor(self.vectors(base, individuals), device=self.device)
        count = len(vectors)
        if count == 0:
            empty = np.zeros((0, episodes))
            return PopulationResult(empty, empty.astype(np.int64), None)
        env = self._env(count * episodes)
        seeds = episode_seeds(env_seed, first_index, count, episodes, group)
        obs = env.reset(seed=seeds if self.per_env_seeds else seeds[0])
        agents = self.agents  # rows per env: an env's agents share the individual's policy
        stats = None
        if obs_filter is not None:
            stats = RunningMeanStd(obs.shape[1:])
            stats.load_state_dict(obs_filter)
            sums = np.zeros((len(obs), int(np.prod(obs.shape[1:]))))
            squares, counts = np.zeros_like(sums), np.zeros(len(obs))
        active = np.ones(len(obs), bool)
        returns = np.zeros(len(obs))
        lengths = np.zeros(len(obs), np.int64)
        for _ in range(self.step_limit):
            if stats is not None:
                seen = obs.reshape(len(obs), -1) * active[:, None]
                sums += seen
                squares += seen**2
                counts += active
                obs = normalize(obs, stats, clip_obs)
            batch = torch.as_tensor(obs, device=self.device)
            batch = batch.reshape(count, episodes * agents, *obs.shape[1:])
            actions = population_actions(self.model, vectors, batch)
            step = env.step(actions.reshape(len(obs), *actions.shape[2:]).cpu().numpy())
            returns += np.where(active, step.reward, 0.0)
            lengths += active
            active &= ~(step.terminated | step.truncated)
            if not active.any():
                break
            obs = step.obs
        shape = (count, episodes, agents)
        observed = None
        if stats is not None:
            observed = (sums.reshape(*shape, -1).sum(2), squares.reshape(*shape, -1).sum(2),
                        counts.reshape(shape).sum(2))  # fmt: skip
        seconds = time.perf_counter() - started
        # An episode's return is its agents' mean (the per-agent return shoal reports for
        # multi-agent envs); its length, the env's steps.
        returns, lengths = returns.reshape(shape).mean(2), lengths.reshape(shape)[..., 0]
        return PopulationResult(returns, lengths, observed, seconds)

    def close(self) -> None:
        for env in self._envs.values():
            env.close()
        self._envs = {}


def episode_seeds(
    env_seed: int, first_index: int, count: int, episodes: int, group: int = 1
) -> list[int]:
    """The reset seed of each env of ``count`` individuals from ``first_index`` on, ``episodes``
    each: episode ``e`` of individual ``i`` gets ``env_seed + (i // group) * episodes + e``.
    With ``group`` 2 both members of an antithetic pair play from the same start states
    (common random numbers), so that the difference of their returns measures the
    perturbation rather than the luck of the starts."""
    return [
        env_seed + ((first_index + k) // group) * episodes + e
        for k in range(count)
        for e in range(episodes)
    ]


def _parts(count: int, workers: int) -> list[tuple[int, int]]:
    """``[(start, stop)]``: ``count`` individuals in ``workers`` contiguous parts (the first
    ones one larger where it does not divide)."""
    size, extra = divmod(count, workers)
    bounds, start = [], 0
    for i in range(workers):
        stop = start + size + (i < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


class PopulationPool:
    """Evaluates populations in-process (``runners`` 0) or split over ``runners`` Ray actors.

    Counts what it sends: ``bytes_sent`` per worker for the last population (the pickled
    request; the base vector, put in the object store once per generation, counts once for
    each worker that reads it)."""

    def __init__(
        self,
        env_config: EnvConfig,
        model_fn: Callable[[Any, Any], torch.nn.Module],
        noise: NoiseTable,
        runners: int = 0,
        address: str | None = None,
        max_restarts: int = 100,
        device: str = "cpu",
        step_limit: int = 100_000,
    ):
        self.runners = runners
        self.bytes_sent = 0
        self.local: PopulationEvaluator | None = None
        if runners == 0:
            self.local = PopulationEvaluator(
                env_config, model_fn, noise, device, step_limit, threads=None
            )
            spec = self.local.describe()
        else:
            if device not in ("cpu", "auto"):
                raise ConfigError(
                    f"run.device = {device!r} with run.runners > 0: the Ray workers evaluate "
                    "on the CPU; use run.runners 0 to evaluate the population on the device"
                )
            from shoal.distributed import require_ray

            workers = require_ray()
            # A local Ray gets a CPU slot per worker (and the driver), even on fewer cores.
            workers.connect(address, num_cpus=max(os.cpu_count() or 1, runners + 1))
            table = workers.put(noise.table)
            self._workers = workers
            self.pool = workers.WorkerPool(
                PopulationEvaluator,
                lambda i: (env_config, model_fn, table, "cpu", step_limit),
                runners,
                name="evaluator",
                max_restarts=max_restarts,
            )
            spec = self.pool.call_all("describe")[0]
        self.observation_space = spec["observation_space"]
        self.action_space = spec["action_space"]
        self.dim = spec["dim"]

    @property
    def restarts(self) -> int:
        return 0 if self.local is not None else self.pool.restarts

    def evaluate(
        self,
        base: np.ndarray | None,
        individuals: Sequence[Individual] | np.ndarray,
        episodes: int,
        env_seed: int,
        obs_filter: dict[str, Any] | None = None,
        clip_obs: float = 10.0,
        group: int = 1,
    ) -> PopulationResult:
        """`PopulationEvaluator.evaluate` of the whole population, split over the workers."""
        if self.local is not None:
            return self.local.evaluate(
                base, individuals, episodes, env_seed, 0, obs_filter, clip_obs, group
            )
        base_ref = None if base is None else self._workers.put(base)
        parts = _parts(len(individuals), self.runners)
        requests = [
            (
                base_ref,
                individuals[start:stop],
                episodes,
                env_seed,
                start,
                obs_filter,
                clip_obs,
                group,
            )
            for start, stop in parts
        ]
        self.bytes_sent = max(len(pickle.dumps(r[1:])) for r in requests)
        if base is not None:
            self.bytes_sent += np.asarray(base).nbytes
        results = self.pool.call_each("evaluate", lambda i: requests[i])
        return _join(results)

    def close(self) -> None:
        if self.local is not None:
            self.local.close()
        else:
            self.pool.close()
