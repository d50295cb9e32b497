"""A3C: asynchronous advantage actor-critic (Mnih et al. 2016, arXiv:1602.01783).

``run.runners`` gradient workers, each with its own envs (an `EnvRunner`) and a trainable copy
of the actor-critic, sample a short rollout, compute the A2C loss on it (n-step or GAE
advantages from `make_batch`; policy gradient + value loss - entropy bonus), backpropagate,
clip their gradient (``optim.max_grad_norm``, RLlib's per-worker ``grad_clip``) and send it.
The driver holds the shared parameters and the optimizer, applies each gradient the moment it
arrives and sends the new weights back to that worker only: the others keep computing on the
weights they had, so gradients are a few updates stale, as with the paper's lock-free threads.

With ``run.runners`` 0 a single worker runs in the driver's process (the same code path, no
Ray), which is deterministic and resumes exactly. With Ray, arrival order depends on timing,
so runs are not bit-reproducible.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import gymnasium as gym
import torch

from shoal.algos.a2c import make_optimizer
from shoal.algos.on_policy import PPOBatch, make_batch
from shoal.collect import EnvRunner
from shoal.collect.ray import concat_episodes
from shoal.config import (
    EnvConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    check,
    check_choices,
    check_positive,
)
from shoal.distributed import require_ray
from shoal.errors import NaNLossError
from shoal.losses import entropy_loss, policy_gradient_loss, value_loss
from shoal.nn import ActorCritic, build_actor_critic
from shoal.policy import ActorPolicy
from shoal.train.schedules import apply_temperature, scheduled
from shoal.train.seeding import derive_seed
from shoal.types import EpisodeStats


@dataclass(frozen=True)
class A3CConfig:
    """A3C hyperparameters. The defaults are RLlib's A3C (reference 004): 10-step rollouts,
    lambda 1 (n-step returns), Adam 1e-4, gradient clipping 40 per worker, value loss weight
    0.5, entropy bonus 0.01."""

    run: RunConfig = field(default_factory=lambda: RunConfig(runners=2))
    env: EnvConfig = field(default_factory=lambda: EnvConfig(num_envs=1))
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-4, max_grad_norm=40.0))
    model: ModelConfig = field(default_factory=ModelConfig)
    num_steps: int = 10
    """Steps per environment in each worker's rollout: the n of the n-step returns."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 1.0
    """GAE lambda; 1.0 gives the paper's n-step returns bootstrapped from V(s_{t+n})."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.01
    """Weight of the entropy bonus."""
    normalize_advantages: bool = False
    """Standardize the advantages within each worker's rollout."""
    optimizer: Literal["adam", "rmsprop"] = "adam"
    """adam: AdamW, as RLlib; rmsprop: as Mnih et al. 2016 (smoothing rms_alpha; the paper's
    statistics are shared between threads, here they live with the driver's parameters)."""
    rms_alpha: float = 0.99
    """Smoothing constant of RMSProp's squared-gradient average."""
    grads_per_iteration: int | None = None
    """Gradients applied per training iteration (None: one per worker, run.runners or 1).
    It sets only how often metrics are logged and checkpoints can be taken."""

    def __post_init__(self) -> None:
        check_positive(self, "num_steps")
        check_choices(self)
        check(self, "gamma", 0.0 <= self.gamma <= 1.0, "must be in [0, 1]")
        check(self, "gae_lambda", 0.0 <= self.gae_lambda <= 1.0, "must be in [0, 1]")
        check(self, "vf_coef", self.vf_coef >= 0, "must be >= 0")
        check(self, "ent_coef", self.ent_coef >= 0, "must be >= 0")
        check(self, "rms_alpha", 0.0 < self.rms_alpha < 1.0, "must be in (0, 1)")
        if self.grads_per_iteration is not None:
            check_positive(self, "grads_per_iteration")
        check(self, "model", self.model.lstm_hidden is None, "A3C has no recurrent models yet")
        check(
            self,
            "env",
            self.env.action_mask == "none",
            "A3C does not use action masks yet; set env.action_mask to none",
        )
        normalizes = self.env.normalize_obs or self.env.normalize_reward
        check(
            self,
            "env",
            not normalizes or self.run.runners <= 1,
            "normalize_obs / normalize_reward would keep separate statistics per worker with "
            "run.runners > 1; turn normalization off or use one worker",
        )

    @property
    def workers(self) -> int:
        """Gradient workers: run.runners Ray actors, or one in-process worker."""
        return max(1, self.run.runners)


def build_model(config: A3CConfig, obs_space: gym.Space, action_space: gym.Space) -> ActorCritic:
    return build_actor_critic(obs_space, action_space, config.model)


def a3c_losses(
    model: ActorCritic, batch: PPOBatch, vf_coef: float, ent_coef: float, normalize: bool
) -> dict[str, torch.Tensor]:
    """The A2C loss terms of one rollout batch, ``total`` last (Mnih et al. 2016, Algorithm
    S3): ``-mean(log pi(a|s) A) + vf_coef * 0.5 mean((V - R)^2) - ent_coef * mean(H)``."""
    dist, values = model(batch.obs)
    advantages = batch.advantages
    if normalize and advantages.numel() > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    losses = {
        "policy": policy_gradient_loss(dist.log_prob(batch.actions), advantages),
        "value": value_loss(values, batch.returns),
        "entropy": entropy_loss(dist.entropy()),
    }
    losses["total"] = losses["policy"] + vf_coef * losses["value"] + ent_coef * losses["entropy"]
    return losses


class Gradients(NamedTuple):
    """What a worker sends the driver for one rollout."""

    grads: list[torch.Tensor] | None
    """Clipped gradient per parameter (zeros where unused); None when a loss was not finite."""
    losses: dict[str, float]
    grad_norm: float
    """Norm of the gradient before clipping."""
    env_steps: int
    episodes: EpisodeStats


class A3CWorker:
    """One gradient worker: its own envs and a trainable model copy; constructed from plain
    values so that it runs as a Ray actor or in the driver's process alike."""

    def __init__(self, config: A3CConfig, seed: int, torch_seed: int | None = None):
        self.config = config
        # Reward normalization scales by the std of returns discounted with the algorithm's gamma.
        env_config = dataclasses.replace(config.env, gamma=config.gamma)
        model_fn = functools.partial(build_model, config)
        self.runner = EnvRunner(env_config, model_fn, config.num_steps, seed, torch_seed)
        self.model = model_fn(self.runner.env.observation_space, self.runner.env.action_space)
        self.parameters = list(self.model.parameters())

    def describe(self) -> dict[str, Any]:
        return self.runner.describe()

    def compute_gradients(self, weights: dict[str, torch.Tensor]) -> Gradients:
        """Sample a rollout with ``weights`` and return the clipped gradient of its loss."""
        cfg = self.config
        self.model.load_state_dict(weights)
        self.runner.set_weights(weights)
        rollout, episodes = self.runner.sample()
        batch = make_batch(rollout, cfg.gamma, cfg.gae_lambda)
        losses = a3c_losses(self.model, batch, cfg.vf_coef, cfg.ent_coef, cfg.normalize_advantages)
        values = dict(zip(losses, torch.stack(list(losses.values())).tolist(), strict=True))
        steps = rollout.rewards.numel() // self.runner.env.agents_per_env
        if not torch.isfinite(losses["total"]):
            # The driver raises NaNLossError; raising here would make Ray restart the worker.
            return Gradients(None, values, float("nan"), steps, episodes)
        self.model.zero_grad(set_to_none=True)
        losses["total"].backward()
        norm = float("nan")
        if cfg.optim.max_grad_norm is not None:
            norm = float(torch.nn.utils.clip_grad_norm_(self.parameters, cfg.optim.max_grad_norm))
        grads = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in self.parameters]
        return Gradients(grads, values, norm, steps, episodes)

    def obs_stats(self) -> dict[str, Any] | None:
        return self.runner.obs_stats()

    def get_state(self) -> dict[str, Any]:
        return self.runner.get_state()

    def set_state(self, state: dict[str, Any], fallback_seed: int) -> bool:
        return self.runner.set_state(state, fallback_seed)

    def close(self) -> None:
        self.runner.close()


class InProcessPool:
    """One worker in the driver's process behind the calls A3C makes on a Ray `WorkerPool`,
    so that ``run.runners`` 0 runs the same code without Ray."""

    restarts = 0

    def __init__(self, worker: Any):
        self.workers = [worker]

    def __len__(self) -> int:
        return 1

    def call_one(self, i: int, method: str, *args: Any) -> Any:
        return getattr(self.workers[i], method)(*args)

    def call_all(self, method: str, *args: Any) -> list[Any]:
        return [self.call_one(0, method, *args)]

    def stream(
        self, method: str, args: Callable[[int], tuple], in_flight: int = 1
    ) -> Iterator[tuple[int, Any]]:
        # ``args`` is read when the next result is asked for, after the previous one was used.
        while True:
            yield 0, self.call_one(0, method, *args(0))

    def close(self) -> None:
        self.workers[0].close()


def make_pool(config: A3CConfig) -> Any:
    """The gradient workers: Ray actors seeded per worker, or one in-process worker."""
    run = config.run
    if run.runners == 0:
        return InProcessPool(A3CWorker(config, derive_seed(run.seed, "env", 0)))
    rw = require_ray()
    rw.connect(run.ray_address, num_cpus=max(os.cpu_count() or 1, run.runners + 1))
    return rw.WorkerPool(
        A3CWorker,
        lambda i: (config, derive_seed(run.seed, "env", i), derive_seed(run.seed, "a3c-torch", i)),
        run.runners,
        name="a3c worker",
        max_restarts=run.max_worker_restarts,
    )


class A3C:
    """The driver: shared parameters and optimizer, fed by the workers' gradient stream."""

    def __init__(self, config: A3CConfig):
        self.config = config
        self.pool = make_pool(config)
        spec = self.pool.call_one(0, "describe")
        self.agents_per_env = spec["agents_per_env"]
        self.model = build_model(config, spec["observation_space"], spec["action_space"])
        self.parameters = list(self.model.parameters())
        self.optimizer = make_optimizer(config, self.parameters)
        self.env_steps = self.episodes = self.iteration = self.updates = 0
        self._sent = [0] * config.workers
        """The update count of the weights each worker last received (for staleness)."""
        self._weights: tuple[int, Any] | None = None
        self._stream: Iterator[tuple[int, Gradients]] | None = None
        self.temperature = apply_temperature(self.model, config.model, 0, 0)

    def _weights_for(self, i: int) -> tuple[Any]:
        """Arguments of worker ``i``'s next request: the latest weights, stored once per
        update in Ray's object store when several workers may read them."""
        self._sent[i] = self.updates
        if self._weights is None or self._weights[0] != self.updates:
            weights = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
            if self.config.run.runners > 0:
                weights = require_ray().put(weights)
            self._weights = (self.updates, weights)
        return (self._weights[1],)

    def progress(self) -> float:
        optim = self.config.optim
        return self.env_steps / (optim.anneal_steps or self.config.run.total_steps)

    def train_iteration(self) -> dict[str, float]:
        cfg = self.config
        lr = scheduled(cfg.optim.lr_schedule, cfg.optim.lr, self.progress())
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self._stream is None:
            self._stream = self.pool.stream("compute_gradients", self._weights_for)
        results, staleness = [], []
        for _ in range(cfg.grads_per_iteration or cfg.workers):
            i, result = next(self._stream)
            staleness.append(self.updates - self._sent[i])
            self._apply(i, result)
            results.append(result)
        self.iteration += 1
        names = [f"loss/{k}" for k in results[0].losses]
        table = torch.tensor([list(r.losses.values()) for r in results])
        metrics = dict(zip(names, table.mean(0).tolist(), strict=True))
        metrics["train/lr"] = lr
        metrics["train/grad_norm"] = sum(r.grad_norm for r in results) / len(results)
        metrics["train/staleness"] = sum(staleness) / len(staleness)
        if self.temperature is not None:
            metrics["train/temperature"] = self.temperature
        if self.pool.restarts:
            metrics["perf/worker_restarts"] = self.pool.restarts
        metrics.update(concat_episodes([r.episodes for r in results]).metrics())
        return metrics

    def _apply(self, worker: int, result: Gradients) -> None:
        """One optimizer step on a worker's gradient, as soon as it arrives."""
        if result.grads is None:
            bad = next(k for k, v in result.losses.items() if not torch.isfinite(torch.tensor(v)))
            raise NaNLossError(
                f"loss/{bad} became {result.losses[bad]} (worker {worker}); weights left unchanged"
            )
        for parameter, grad in zip(self.parameters, result.grads, strict=True):
            parameter.grad = grad
        self.optimizer.step()
        self.updates += 1
        self.env_steps += result.env_steps
        self.episodes += result.episodes.returns.size // self.agents_per_env
        # The temperature is a buffer of the weights: the next request carries it.
        self.temperature = apply_temperature(
            self.model, self.config.model, self.env_steps, self.episodes
        )

    def policy(self) -> ActorPolicy:
        obs_stats = self.pool.call_one(0, "obs_stats")
        return ActorPolicy(copy.deepcopy(self.model), obs_stats, self.config.env.clip_obs)

    def state_dict(self) -> dict[str, Any]:
        # Workers answer after the rollout they are computing: its gradient stays queued.
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "workers": self.pool.call_all("get_state"),
            "policy": {
                "model": self.model.state_dict(),
                "obs_stats": self.pool.call_one(0, "obs_stats"),
            },
            "counters": {
                "env_steps": self.env_steps,
                "episodes": self.episodes,
                "iteration": self.iteration,
                "updates": self.updates,
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore; returns False when some worker's envs had to restart their episodes (a
        checkpoint from another number of workers, or envs that cannot be saved)."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        counters = state["counters"]
        self.env_steps, self.episodes = counters["env_steps"], counters["episodes"]
        self.iteration, self.updates = counters["iteration"], counters["updates"]
        self.temperature = apply_temperature(
            self.model, self.config.model, self.env_steps, self.episodes
        )
        saved, restored = state["workers"], True
        fallback = derive_seed(self.config.run.seed, "env-restart", self.iteration)
        for i in range(len(self.pool)):
            worker_state = saved[i] if len(saved) == len(self.pool) else {"env": None}
            restored &= self.pool.call_one(i, "set_state", worker_state, fallback + i)
        return restored

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
        self.pool.close()
