"""DD-PPO: decentralized distributed PPO (Wijmans et al. 2020, arXiv:1911.00357).

Synchronous data-parallel PPO with no parameter server. ``num_learners`` learner processes
(Ray actors, so they can sit on any node of a cluster) each own their envs (seeded per rank),
an `EnvRunner` and a `PPOLearner`; they are joined by ``torch.distributed`` (gloo, CPU). Each
rank samples its own rollout and runs PPO's epochs on it; after every backward pass the
gradients are averaged over the ranks (one all-reduce of the flattened gradient), then
clipped and applied, so the replicas start equal and stay equal. Advantages are normalized
per rank and minibatch, as in the paper. The driver only tells the ranks to run an iteration
and aggregates their metrics; rank 0's weights give the policy and the checkpoints.

Left out: the paper's preemption threshold (ranks stop sampling once 60% of them finished).
Every rank samples ``num_steps`` per env; on equal machines the stragglers it cuts are rare.
A learner that fails ends the run with a `DistributedError` (the other ranks cannot go on
without it); resume from the last checkpoint.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import socket
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, NamedTuple

import torch
import torch.distributed as dist

from shoal.algos.on_policy import PPOBatch, make_batch
from shoal.algos.ppo import PPOConfig, PPOLearner, build_model
from shoal.collect import EnvRunner
from shoal.collect.ray import concat_episodes
from shoal.config import EnvConfig, ModelConfig, OptimConfig, RunConfig, check, check_positive
from shoal.distributed import DistributedError, require_ray
from shoal.errors import ConfigError, NaNLossError
from shoal.policy import ActorPolicy
from shoal.train.schedules import scheduled
from shoal.train.seeding import derive_seed
from shoal.types import EpisodeStats

COLLECTIVE_TIMEOUT = timedelta(minutes=5)
"""How long a rank waits in a collective for the others before failing (gloo's default of
30 minutes would hang a run whose learner died for that long)."""


@dataclass(frozen=True)
class DDPPOConfig:
    """DD-PPO hyperparameters: the learner count, then PPO's own fields (see `PPOConfig`),
    which apply per learner: each rank samples num_steps * env.num_envs steps per iteration
    and splits them into minibatches of minibatch_size."""

    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    num_learners: int = 2
    """Learner processes (Ray actors), each sampling its own envs; the batch per iteration is
    num_learners * num_steps * env.num_envs."""
    num_steps: int = 128
    """Steps per environment in each learner's rollout."""
    num_epochs: int = 4
    """Passes of minibatch SGD over each rollout."""
    minibatch_size: int = 256
    """Samples per gradient step on each learner (the effective minibatch is num_learners
    times larger, since gradients are averaged)."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda: 0 is one-step TD, 1 is Monte-Carlo."""
    clip_eps: float = 0.2
    """Clip range of the probability ratio."""
    clip_schedule: Literal["constant", "linear"] = "constant"
    """linear: decay clip_eps to zero over optim.anneal_steps."""
    value_clip: float | None = None
    """Use the clipped value loss with this range (None: the plain squared error)."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus."""
    normalize_advantages: bool = True
    """Standardize advantages within each learner's minibatch (locally, as the paper)."""

    def __post_init__(self) -> None:
        check_positive(self, "num_learners")
        check(
            self,
            "run",
            self.run.runners == 0,
            "DD-PPO learners sample their own envs; set num_learners instead of run.runners",
        )
        check(self, "model", self.model.lstm_hidden is None, "DD-PPO has no recurrent models yet")
        check(
            self,
            "model",
            self.model.temperature_min is None,
            "DD-PPO does not anneal the temperature yet; set temperature_min to None",
        )
        normalizes = self.env.normalize_obs or self.env.normalize_reward
        check(
            self,
            "env",
            not normalizes or self.num_learners == 1,
            "normalize_obs / normalize_reward would keep separate statistics per learner; "
            "turn normalization off or use one learner",
        )
        try:
            self.ppo_config()
        except ConfigError as exc:
            raise ConfigError(str(exc).replace("PPOConfig.", "DDPPOConfig.", 1)) from None

    def ppo_config(self) -> PPOConfig:
        """The `PPOConfig` of one learner (validated; KL penalty and early stop off, since
        ranks that stopped at different epochs would wait for each other forever)."""
        names = {f.name for f in dataclasses.fields(PPOConfig)}
        mine = (f.name for f in dataclasses.fields(self))
        return PPOConfig(**{name: getattr(self, name) for name in mine if name in names})


class RankResult(NamedTuple):
    metrics: dict[str, float]
    env_steps: int
    episodes: EpisodeStats


def average_gradients(parameters: list[torch.Tensor], world_size: int) -> None:
    """Replace every ``.grad`` by its mean over the ranks: one all-reduce of the flattened
    gradients (parameters without a gradient are left out; all ranks run the same graph, so
    they leave out the same ones)."""
    with_grad = [p for p in parameters if p.grad is not None]
    flat = torch.cat([p.grad.reshape(-1) for p in with_grad])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= world_size
    offset = 0
    for p in with_grad:
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()


def synchronized_step(
    losses: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
    parameters: list[torch.Tensor],
    max_grad_norm: float | None,
    world_size: int,
) -> None:
    """PPO's gradient step with the gradient averaged over the ranks before clipping. The
    ranks first agree that every loss is finite, so that a NaN on one rank stops all of them
    (instead of leaving the others waiting in the all-reduce)."""
    finite = torch.isfinite(torch.stack([v.detach() for v in losses.values()])).all()
    agreed = finite.to(torch.float32).reshape(1)
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    if agreed.item() < 1:
        bad = [k for k, v in losses.items() if not torch.isfinite(v)]
        where = f"loss/{bad[0]} became {losses[bad[0]].item()}" if bad else "a loss"
        raise NaNLossError(f"{where} on a DD-PPO learner; weights left unchanged")
    optimizer.zero_grad(set_to_none=True)
    losses["total"].backward()
    average_gradients(parameters, world_size)
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm, foreach=True)
    optimizer.step()


def distributed_update(
    learner: PPOLearner, batch: PPOBatch, lr: float, clip_eps: float, world_size: int
) -> dict[str, float]:
    """`PPOLearner.update` (feed-forward, no KL terms) with `synchronized_step`. Every rank
    must take the same number of steps: callers give all ranks batches of one size."""
    for group in learner.optimizer.param_groups:
        group["lr"] = lr
    history = []
    for _ in range(learner.config.num_epochs):
        for minibatch, outputs in learner._epoch(batch):
            losses, stats = learner._minibatch_losses(minibatch, clip_eps, 0.0, outputs)
            max_norm = learner.config.optim.max_grad_norm
            synchronized_step(losses, learner.optimizer, learner.parameters, max_norm, world_size)
            history.append(torch.stack([*losses.values(), *stats.values()]).detach())
    names = [f"loss/{k}" for k in losses] + [f"train/{k}" for k in stats]
    metrics = dict(zip(names, torch.stack(history).mean(0).tolist(), strict=True))
    metrics["train/lr"] = lr
    return metrics


def equal_size(batch: PPOBatch) -> PPOBatch:
    """A random subset of ``batch`` as large as the smallest batch of all ranks. Rollouts hold
    as many samples less as they had autoreset steps; unequal sizes would give ranks unequal
    minibatch counts, and their all-reduces would no longer pair up."""
    size = torch.tensor([batch.obs.shape[0]])
    dist.all_reduce(size, op=dist.ReduceOp.MIN)
    if int(size) == batch.obs.shape[0]:
        return batch
    keep = torch.randperm(batch.obs.shape[0])[: int(size)].sort().values
    return PPOBatch(*(x[keep] for x in batch))


class DDPPOLearner:
    """One rank: its own envs and PPO learner. Built from plain values (a Ray actor)."""

    def __init__(self, config: DDPPOConfig, rank: int):
        self.config, self.rank = config, rank
        self.ppo = config.ppo_config()
        seed = config.run.seed
        env_config = dataclasses.replace(config.env, gamma=config.gamma)
        self.runner = EnvRunner(
            env_config,
            functools.partial(build_model, self.ppo),
            config.num_steps,
            seed=derive_seed(seed, "env", rank),
            torch_seed=derive_seed(seed, "ddppo-torch", rank),
        )
        env = self.runner.env
        self.learner = PPOLearner(self.ppo, env.observation_space, env.action_space)

    def describe(self) -> dict[str, Any]:
        return self.runner.describe()

    def address(self) -> tuple[str, int]:
        """Rank 0: this node's IP and a free port for the others to rendezvous at."""
        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return require_ray().node_ip(), port

    def join(self, address: tuple[str, int], world_size: int) -> None:
        host, port = address
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{host}:{port}",
            rank=self.rank,
            world_size=world_size,
            timeout=COLLECTIVE_TIMEOUT,
        )

    def train(self, lr: float, clip_eps: float) -> RankResult | str:
        """Sample, update in lockstep with the other ranks; a NaN loss comes back as its
        message (raised here, Ray would restart the learner)."""
        cfg = self.config
        rollout, episodes = self.runner.sample()
        batch = equal_size(make_batch(rollout, cfg.gamma, cfg.gae_lambda))
        try:
            metrics = distributed_update(self.learner, batch, lr, clip_eps, cfg.num_learners)
        except NaNLossError as exc:
            return str(exc)
        self.runner.set_weights(self.learner.get_weights())
        steps = rollout.rewards.numel() // self.runner.env.agents_per_env
        return RankResult(metrics, steps, episodes)

    def get_weights(self) -> dict[str, torch.Tensor]:
        return self.learner.get_weights()

    def set_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self.learner.set_weights(weights)
        self.runner.set_weights(weights)

    def learner_state(self) -> dict[str, Any]:
        return self.learner.state_dict()

    def load_learner_state(self, state: dict[str, Any]) -> None:
        """Model and optimizer state (the same on every rank), then the sampler's weights."""
        self.learner.load_state_dict(state)
        self.runner.set_weights(self.learner.get_weights())

    def obs_stats(self) -> dict[str, Any] | None:
        return self.runner.obs_stats()

    def get_state(self) -> dict[str, Any]:
        """This rank's envs and its torch generator (minibatch shuffles, action samples)."""
        return {"runner": self.runner.get_state(), "torch_rng": torch.get_rng_state()}

    def set_state(self, state: dict[str, Any] | None, fallback_seed: int) -> bool:
        if state is None:
            return self.runner.set_state({"env": None}, fallback_seed)
        torch.set_rng_state(state["torch_rng"])
        return self.runner.set_state(state["runner"], fallback_seed)


class DDPPO:
    """The driver: starts the ranks, joins them, and runs one iteration on all of them."""

    def __init__(self, config: DDPPOConfig):
        self.config = config
        n = config.num_learners
        rw = require_ray()
        rw.connect(config.run.ray_address, num_cpus=max(os.cpu_count() or 1, n + 1))
        # A restarted rank could not rejoin the process group of the others: fail instead.
        self.pool = rw.WorkerPool(
            DDPPOLearner, lambda r: (config, r), n, name="ddppo learner", max_restarts=0
        )
        spec = self.pool.call_one(0, "describe")
        self.agents_per_env = spec["agents_per_env"]
        self._rw = rw
        self._lockstep("join", self.pool.call_one(0, "address"), n)
        # Identical replicas from the start: the weights the training loop's seed initialized.
        spaces = spec["observation_space"], spec["action_space"]
        self.model = build_model(config.ppo_config(), *spaces)
        self.pool.call_all("set_weights", rw.put(self.model.state_dict()))
        self.env_steps = self.episodes = self.iteration = 0

    def progress(self) -> float:
        optim = self.config.optim
        return self.env_steps / (optim.anneal_steps or self.config.run.total_steps)

    def train_iteration(self) -> dict[str, float]:
        cfg = self.config
        progress = self.progress()
        lr = scheduled(cfg.optim.lr_schedule, cfg.optim.lr, progress)
        clip_eps = scheduled(cfg.clip_schedule, cfg.clip_eps, progress)
        results = self._lockstep("train", lr, clip_eps)
        errors = [r for r in results if isinstance(r, str)]
        if errors:
            raise NaNLossError(next((e for e in errors if "loss/" in e), errors[0]))
        self.iteration += 1
        self.env_steps += sum(r.env_steps for r in results)
        episodes = concat_episodes([r.episodes for r in results])
        self.episodes += episodes.returns.size // self.agents_per_env
        metrics = {k: sum(r.metrics[k] for r in results) / len(results) for k in results[0].metrics}
        metrics.update(episodes.metrics())
        return metrics

    def _lockstep(self, method: str, *args: Any) -> list[Any]:
        """``method`` on every rank, results in rank order, failing at the first rank that
        fails: the others then wait in a collective for it (`WorkerPool.call_all` would wait
        for them first, up to COLLECTIVE_TIMEOUT)."""
        rw = self._rw
        pending = {self.pool.submit(r, method, *args): r for r in range(len(self.pool))}
        results: list[Any] = [None] * len(pending)
        while pending:
            ref = rw.wait_first(pending)
            rank = pending.pop(ref)
            try:
                results[rank] = rw.get(ref)
            except rw.WORKER_FAILURES as exc:
                raise DistributedError(
                    f"DD-PPO learner {rank} failed during {method} ({type(exc).__name__}); the "
                    "learners train in lockstep and cannot go on without it. Resume the run "
                    "from its last checkpoint"
                ) from exc
        return results

    def policy(self) -> ActorPolicy:
        self.model.load_state_dict(self.pool.call_one(0, "get_weights"))
        obs_stats = self.pool.call_one(0, "obs_stats")
        return ActorPolicy(copy.deepcopy(self.model), obs_stats, self.config.env.clip_obs)

    def state_dict(self) -> dict[str, Any]:
        learner = self.pool.call_one(0, "learner_state")
        return {
            "learner": learner,
            "ranks": self.pool.call_all("get_state"),
            "policy": {"model": learner["model"], "obs_stats": self.pool.call_one(0, "obs_stats")},
            "counters": {
                "env_steps": self.env_steps,
                "episodes": self.episodes,
                "iteration": self.iteration,
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore; returns False when some rank's envs restarted their episodes (another
        number of learners, or envs that cannot be saved)."""
        counters = state["counters"]
        self.env_steps, self.episodes = counters["env_steps"], counters["episodes"]
        self.iteration = counters["iteration"]
        self.pool.call_all("load_learner_state", require_ray().put(state["learner"]))
        saved, n = state["ranks"], len(self.pool)
        fallback = derive_seed(self.config.run.seed, "env-restart", self.iteration)
        restored = True
        for r in range(n):
            rank_state = saved[r] if len(saved) == n else None
            restored &= self.pool.call_one(r, "set_state", rank_state, fallback + r)
        return restored

    def close(self) -> None:
        self.pool.close()
