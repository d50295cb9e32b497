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

import dataclasses
import functools
import os
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import gymnasium as gym
import torch

from shoal.algos.cores.checks import check_no_masks
from shoal.algos.cores.rollout_batch import make_batch
from shoal.algos.policy_gradient.a2c import A2CConfig, make_optimizer
from shoal.algos.spec import AlgorithmSpec
from shoal.collect import EnvRunner
from shoal.collect.ray import concat_episodes
from shoal.config import (
    EnvConfig,
    OptimConfig,
    Renamed,
    RunConfig,
    check,
    check_block,
    check_positive,
    nested_block,
    unnest,
)
from shoal.config.usage import OWN_GAMMA
from shoal.core.device import resolve_device
from shoal.core.errors import NaNLossError
from shoal.core.seeding import derive_seed
from shoal.core.types import EpisodeStats
from shoal.distributed import require_ray
from shoal.distributed.in_process import InProcessPool
from shoal.fast.backend import place, uncompiled_copy
from shoal.losses.objectives import PolicyOutputs, a2c_objective
from shoal.nn import ActorCritic, RecurrentActorCritic, build_actor_critic
from shoal.nn.heads import apply_temperature
from shoal.nn.policy import ActorPolicy
from shoal.optim import apply_gradients, gradients
from shoal.optim.schedules import scheduled

# A2C's settings of A3C's workers (`shoal.config.nested_block`).
if TYPE_CHECKING:  # for the type checker, a block is its config class
    A2CBlock = A2CConfig
else:
    A2CBlock = nested_block(A2CConfig)

A2C_FIELDS = (
    "optim",
    "model",
    "num_steps",
    "gamma",
    "gae_lambda",
    "vf_coef",
    "ent_coef",
    "normalize_advantages",
    "optimizer",
    "rms_alpha",
)
"""A2C's settings that shoal 0.1's A3C config held at its top level."""


@dataclass(frozen=True)
class A3CConfig:
    """A3C: ``run`` and ``env`` as every algorithm, the A2C hyperparameters each worker's
    gradient follows in the ``a2c`` block, and how gradients are grouped into iterations.
    The defaults are RLlib's A3C (RLlib's 2018 algorithm documentation): 10-step rollouts,
    lambda 1 (n-step returns), Adam 1e-4, gradient clipping 40 per worker, value loss weight
    0.5, entropy bonus 0.01."""

    run: RunConfig = field(default_factory=lambda: RunConfig(runners=2))
    """run.runners is the number of gradient workers (Ray actors; 0: one in-process)."""
    env: EnvConfig = field(default_factory=lambda: EnvConfig(num_envs=1))
    """Each worker steps env.num_envs envs of its own."""
    a2c: A2CBlock = field(
        default_factory=lambda: A2CBlock(
            optim=OptimConfig(lr=1e-4, max_grad_norm=40.0),
            num_steps=10,
            ent_coef=0.01,
            optimizer="adam",
        )
    )
    """The A2C loss, rollout, network and optimizer (`A2CConfig`); its own run and env blocks
    are not used: set the ones above. rmsprop's statistics live with the driver's parameters
    (the paper shares them between threads); adam is AdamW, as RLlib."""
    grads_per_iteration: int | None = None
    """Gradients applied per training iteration (None: one per worker, run.runners or 1).
    It sets only how often metrics are logged and checkpoints can be taken."""
    results_in_turn: bool = False
    """Apply gradients in turn (worker 0, 1, ..., 0, ...) instead of as they arrive. Workers
    still compute at once from the weights of their call's moment, but which gradient is
    applied next is counted, not timed: two runs of one seed are then identical (the
    learning test uses this)."""

    RENAMED: ClassVar[dict[str, Renamed]] = {name: Renamed(f"a2c.{name}") for name in A2C_FIELDS}

    UNUSED: ClassVar[dict[str, str]] = OWN_GAMMA

    def __post_init__(self) -> None:
        if self.grads_per_iteration is not None:
            check_positive(self, "grads_per_iteration")
        a2c = check_block(self, "a2c")  # A2C's own checks, with the real env and run
        check_no_masks(self, "A3C")
        check(a2c, "model", a2c.model.lstm_hidden is None, "A3C has no recurrent models yet")
        check(
            a2c.model,
            "backend",
            a2c.model.backend != "numpy",
            "A3C's workers send autograd gradients; use auto (acting through NumPy) or torch",
        )
        normalizes = self.env.normalize_obs or self.env.normalize_reward
        check(
            self,
            "env",
            not normalizes or self.run.runners <= 1,
            "normalize_obs / normalize_reward would keep separate statistics per worker with "
            "run.runners > 1; turn normalization off or use one worker",
        )

    def learner_config(self) -> A2CConfig:
        """The `A2CConfig` of the workers and the driver: ``a2c`` with ``run`` and ``env``."""
        return unnest(self.a2c, run=self.run, env=self.env)

    @property
    def workers(self) -> int:
        """Gradient workers: run.runners Ray actors, or one in-process worker."""
        return max(1, self.run.runners)


def build_model(
    config: A3CConfig, obs_space: gym.Space, action_space: gym.Space
) -> ActorCritic | RecurrentActorCritic:
    return build_actor_critic(obs_space, action_space, config.a2c.model)


class Gradients(NamedTuple):
    """What a worker sends the driver for one rollout."""

    grads: list[torch.Tensor] | None
    """Clipped gradient per parameter (zeros where unused); None when a loss was not finite."""
    losses: dict[str, float]
    grad_norm: float
    """Norm of the gradient before clipping."""
    env_steps: int
    episodes: EpisodeStats
    error: str | None = None
    """Why the gradient is missing: a non-finite loss, named."""


class A3CWorker:
    """One gradient worker: its own envs and a trainable model copy; constructed from plain
    values so that it runs as a Ray actor or in the driver's process alike."""

    def __init__(self, config: A3CConfig, seed: int, torch_seed: int | None = None):
        self.config = config
        a2c = config.learner_config()
        # Reward normalization scales by the std of returns discounted with the algorithm's gamma.
        env_config = dataclasses.replace(config.env, gamma=a2c.gamma)
        model_fn = functools.partial(build_model, config)
        self.runner = EnvRunner(
            env_config,
            model_fn,
            a2c.num_steps,
            seed,
            torch_seed,
            acting=a2c.model.backend,
            compiled=config.run.compile,
        )
        # The worker's copy computes gradients on the CPU, as the samplers act there.
        self.model = model_fn(self.runner.env.observation_space, self.runner.env.action_space)
        self.parameters: list[torch.Tensor] = list(self.model.parameters())
        self.objective = a2c_objective(a2c.vf_coef, a2c.ent_coef, a2c.normalize_advantages)

    def describe(self) -> dict[str, Any]:
        return self.runner.describe()

    def compute_gradients(self, weights: dict[str, torch.Tensor]) -> Gradients:
        """Sample a rollout with ``weights`` and return the clipped gradient of its loss (the
        first half of `shoal.optim.minimize`; the driver applies it)."""
        a2c = self.config.a2c
        self.model.load_state_dict(weights)
        self.runner.set_weights(weights)
        rollout, episodes = self.runner.sample()
        batch = make_batch(rollout, a2c.gamma, a2c.gae_lambda)
        dist, values = self.model(batch.obs)
        out = PolicyOutputs(dist.log_prob(batch.actions), dist.entropy(), values)
        losses, _ = self.objective.losses(out, self.objective.targets(batch))
        values = dict(zip(losses, torch.stack(list(losses.values())).tolist(), strict=True))
        steps = rollout.rewards.numel() // self.runner.env.agents_per_env
        try:
            norm = gradients(losses, self.parameters, a2c.optim.max_grad_norm)
        except NaNLossError as exc:
            # The driver raises; raising here would make Ray restart the worker.
            return Gradients(None, values, float("nan"), steps, episodes, str(exc))
        grads = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in self.parameters]
        return Gradients(
            grads, values, float("nan") if norm is None else float(norm), steps, episodes
        )

    def obs_stats(self) -> dict[str, Any] | None:
        return self.runner.obs_stats()

    def get_state(self) -> dict[str, Any]:
        return self.runner.get_state()

    def set_state(self, state: dict[str, Any], fallback_seed: int) -> bool:
        return self.runner.set_state(state, fallback_seed)

    def close(self) -> None:
        self.runner.close()


def make_pool(config: A3CConfig) -> Any:
    """The gradient workers: Ray actors seeded per worker, or one in-process worker."""
    run = config.run
    if run.runners == 0:
        return InProcessPool([A3CWorker(config, derive_seed(run.seed, "env", 0))])
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
        self.a2c = a2c = config.learner_config()
        self.device = resolve_device(config.run.device)
        self.pool = make_pool(config)
        spec = self.pool.call_one(0, "describe")
        self.agents_per_env = spec["agents_per_env"]
        model = build_model(config, spec["observation_space"], spec["action_space"])
        # The shared parameters and optimizer state live on the run's device; the workers
        # compute their gradients on the CPU.
        self.model = place(model, self.device)
        self.parameters: list[torch.Tensor] = list(self.model.parameters())
        self.optimizer = make_optimizer(a2c, self.parameters)
        self.env_steps = self.episodes = self.iteration = self.updates = 0
        self._sent = [0] * config.workers
        """The update count of the weights each worker last received (for staleness)."""
        self._weights: tuple[int, Any] | None = None
        self._stream: Generator[tuple[int, Gradients], None, None] | None = None
        self.temperature = apply_temperature(self.model, a2c.model, 0, 0)

    def _weights_for(self, i: int) -> tuple[Any]:
        """Arguments of worker ``i``'s next request: the latest weights, stored once per
        update in Ray's object store when several workers may read them."""
        self._sent[i] = self.updates
        if self._weights is None or self._weights[0] != self.updates:
            weights = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
            if self.config.run.runners > 0:
                weights = require_ray().put(weights)
            self._weights = (self.updates, weights)
        return (self._weights[1],)

    def progress(self) -> float:
        optim = self.a2c.optim
        return self.env_steps / (optim.anneal_steps or self.config.run.total_steps)

    def train_iteration(self) -> dict[str, float]:
        cfg = self.config
        lr = scheduled(self.a2c.optim.lr_schedule, self.a2c.optim.lr, self.progress())
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self._stream is None:
            in_turn = self.config.results_in_turn
            self._stream = self.pool.stream("compute_gradients", self._weights_for, in_turn=in_turn)
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
            raise NaNLossError(f"{result.error} (worker {worker})")
        for parameter, grad in zip(self.parameters, result.grads, strict=True):
            parameter.grad = grad.to(self.device)
        apply_gradients(self.optimizer)
        self.updates += 1
        self.env_steps += result.env_steps
        self.episodes += result.episodes.returns.size // self.agents_per_env
        # The temperature is a buffer of the weights: the next request carries it.
        self.temperature = apply_temperature(
            self.model, self.a2c.model, self.env_steps, self.episodes
        )

    def policy(self) -> ActorPolicy:
        obs_stats = self.pool.call_one(0, "obs_stats")
        return ActorPolicy(uncompiled_copy(self.model), obs_stats, self.config.env.clip_obs)

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
            self.model, self.a2c.model, self.env_steps, self.episodes
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


SPECS = (
    AlgorithmSpec(
        "a3c",
        A3CConfig,
        A3C,
        build_model,
        "A3C: asynchronous advantage actor-critic, gradients from Ray workers applied on arrival",
        "Discrete, Box, MultiDiscrete, MultiBinary, Tuple, Dict",
        runners=True,
        one_learner="applies its runners' gradients one by one as they arrive (asynchronous by "
        "design); for data-parallel learners train a2c or ppo",
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
