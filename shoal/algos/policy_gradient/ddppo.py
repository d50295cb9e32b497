"""DD-PPO: decentralized distributed PPO (Wijmans et al. 2020, arXiv:1911.00357).

Synchronous data-parallel PPO with no parameter server. ``num_learners`` learner processes
(Ray actors, so they can sit on any node of a cluster) each own their envs (seeded per rank),
an `EnvRunner` and a `PPOLearner`; they are joined by ``torch.distributed`` (gloo on the CPU
and where ranks share a GPU, NCCL where each has a GPU of its own: `DDPPOLearner.join`). Each
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

import dataclasses
import functools
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import gymnasium as gym
import torch

from shoal.algos.cores.checks import check_no_masks
from shoal.algos.cores.rollout_batch import RolloutBatch, make_batch
from shoal.algos.policy_gradient import ppo as ppo_module
from shoal.algos.policy_gradient.ppo import PPOConfig, PPOLearner
from shoal.algos.spec import AlgorithmSpec
from shoal.collect import EnvRunner
from shoal.collect.ray import concat_episodes
from shoal.config import (
    EnvConfig,
    Renamed,
    RunConfig,
    check,
    check_block,
    check_positive,
    nested_block,
    unnest,
)
from shoal.config.usage import OWN_GAMMA, Gate
from shoal.core.device import to_device
from shoal.core.errors import DistributedError, NaNLossError
from shoal.core.seeding import derive_seed
from shoal.core.types import EpisodeStats
from shoal.distributed import require_ray
from shoal.distributed.collective import agree_finite, average_gradients, free_port, join, smallest
from shoal.fast.backend import TorchStep, uncompiled_copy
from shoal.nn.policy import ActorPolicy
from shoal.optim.schedules import scheduled

# PPO's settings of one DD-PPO learner (`shoal.config.nested_block`).
if TYPE_CHECKING:  # for the type checker, a block is its config class
    PPOBlock = PPOConfig
else:
    PPOBlock = nested_block(PPOConfig)

PPO_FIELDS = (
    "optim",
    "model",
    "num_steps",
    "num_epochs",
    "minibatch_size",
    "gamma",
    "gae_lambda",
    "clip_eps",
    "clip_schedule",
    "value_clip",
    "vf_coef",
    "ent_coef",
    "normalize_advantages",
)
"""PPO's settings that shoal 0.1's DD-PPO config held at its top level."""


@dataclass(frozen=True)
class DDPPOConfig:
    """DD-PPO: ``run`` and ``env`` as every algorithm, PPO's hyperparameters in the ``ppo``
    block, which apply per learner (each rank samples ppo.num_steps * env.num_envs steps per
    iteration and splits them into minibatches of ppo.minibatch_size), and the learner count."""

    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    ppo: PPOBlock = field(default_factory=lambda: PPOBlock(num_steps=128, num_epochs=4))
    """PPO's settings per learner (`PPOConfig`); its own run and env blocks are not used: set
    the ones above. The KL penalty and early stop are off (ranks that stopped at different
    epochs would wait for each other forever)."""
    num_learners: int = 2
    """Learner processes (Ray actors), each sampling its own envs; the batch per iteration is
    num_learners * ppo.num_steps * env.num_envs."""

    RENAMED: ClassVar[dict[str, Renamed]] = {name: Renamed(f"ppo.{name}") for name in PPO_FIELDS}

    GATES: ClassVar[dict[str, Gate | None]] = {"run.ray_address": None}  # its learners are Ray's
    UNUSED: ClassVar[dict[str, str]] = {
        **OWN_GAMMA,
        "ppo.kl_coeff": "DD-PPO's update has no KL penalty",
        "ppo.self_play.snapshot_every": "DD-PPO trains one policy, without self-play",
    }

    def __post_init__(self) -> None:
        check_positive(self, "num_learners")
        check(
            self,
            "run",
            self.run.runners == 0,
            "DD-PPO learners sample their own envs; set num_learners instead of run.runners",
        )
        ppo = check_block(self, "ppo")  # PPO's own checks, with the real env and run
        check_no_masks(self, "DD-PPO")
        model = ppo.model
        check(ppo, "model", model.lstm_hidden is None, "DD-PPO has no recurrent models yet")
        check(
            ppo,
            "model",
            model.temperature_min is None,
            "DD-PPO does not anneal the temperature yet; set temperature_min to None",
        )
        check(
            model,
            "backend",
            model.backend != "numpy",
            "DD-PPO averages gradients through autograd; use auto (acting through NumPy) or torch",
        )
        check(ppo, "kl_coeff", ppo.kl_coeff == 0, "DD-PPO runs without the KL penalty: use 0")
        check(ppo, "target_kl", ppo.target_kl is None, "DD-PPO runs every epoch: use None")
        normalizes = self.env.normalize_obs or self.env.normalize_reward
        check(
            self,
            "env",
            not normalizes or self.num_learners == 1,
            "normalize_obs / normalize_reward would keep separate statistics per learner; "
            "turn normalization off or use one learner",
        )

    def learner_config(self) -> PPOConfig:
        """The `PPOConfig` of one learner: ``ppo`` with ``run`` and ``env`` (validated)."""
        return unnest(self.ppo, run=self.run, env=self.env)


def build_model(config: DDPPOConfig, obs_space: gym.Space, action_space: gym.Space) -> Any:
    """The deployable actor-critic: PPO's, for one learner's settings."""
    return ppo_module.build_model(config.learner_config(), obs_space, action_space)


class RankResult(NamedTuple):
    metrics: dict[str, float]
    env_steps: int
    episodes: EpisodeStats


def synchronize(learner: PPOLearner, world_size: int) -> None:
    """Make ``learner``'s gradient steps DD-PPO's: through autograd, the ranks first agree
    that every loss is finite, then average their gradients before clipping."""
    learner.step = TorchStep(
        learner.model,
        learner.scaler,
        before_minimize=lambda losses: agree_finite(losses, "a DD-PPO learner"),
        before_clip=lambda: average_gradients(learner.parameters, 1.0 / world_size),
    )


def equal_size(batch: RolloutBatch) -> RolloutBatch:
    """A random subset of ``batch`` as large as the smallest batch of all ranks. Rollouts hold
    as many samples less as they had autoreset steps; unequal sizes would give ranks unequal
    minibatch counts, and their all-reduces would no longer pair up."""
    size = smallest(batch.obs.shape[0])
    if size == batch.obs.shape[0]:
        return batch
    keep = torch.randperm(batch.obs.shape[0])[:size].sort().values
    return batch.map(lambda x: x[keep])


class DDPPOLearner:
    """One rank: its own envs and PPO learner. Built from plain values (a Ray actor)."""

    def __init__(self, config: DDPPOConfig, rank: int):
        self.config, self.rank = config, rank
        self.ppo = ppo = config.learner_config()
        seed = config.run.seed
        env_config = dataclasses.replace(config.env, gamma=ppo.gamma)
        self.runner = EnvRunner(
            env_config,
            functools.partial(ppo_module.build_model, ppo),
            ppo.num_steps,
            seed=derive_seed(seed, "env", rank),
            torch_seed=derive_seed(seed, "ddppo-torch", rank),
            acting=ppo.model.backend,
            compiled=config.run.compile,
        )
        env = self.runner.env
        # PPO's learner, stepping in lockstep with the other ranks through autograd.
        torch_model = dataclasses.replace(ppo.model, backend="torch")
        learner_config = dataclasses.replace(ppo, model=torch_model)
        self.learner = PPOLearner(learner_config, env.observation_space, env.action_space)
        synchronize(self.learner, config.num_learners)

    def describe(self) -> dict[str, Any]:
        return self.runner.describe()

    def address(self) -> tuple[str, int]:
        """Rank 0: this node's IP and a free port for the others to rendezvous at."""
        return require_ray().node_ip(), free_port()

    def join(self, address: tuple[str, int], world_size: int, own_gpu: bool) -> None:
        """Join the process group (`shoal.distributed.collective.join`)."""
        join(address, self.rank, world_size, self.learner.device, own_gpu)

    def train(self, lr: float, clip_eps: float) -> RankResult | str:
        """Sample, update in lockstep with the other ranks; a NaN loss comes back as its
        message (raised here, Ray would restart the learner)."""
        ppo = self.ppo
        rollout, episodes = self.runner.sample()
        batch = equal_size(make_batch(rollout, ppo.gamma, ppo.gae_lambda))
        try:
            metrics = self.learner.update(batch, lr, clip_eps, kl_coeff=0.0)
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
        """Host copies: the state travels to the driver, which may have no GPU."""
        return to_device(self.learner.state_dict(), torch.device("cpu"))

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
        # Each learner takes a GPU (or a share) when the run's device asks for one; inside an
        # actor Ray's CUDA_VISIBLE_DEVICES makes it "cuda".
        gpus = rw.gpu_share(config.run.device, n)
        run = dataclasses.replace(config.run, device="cuda" if gpus else "cpu")
        rank_config = dataclasses.replace(config, run=run)
        # A restarted rank could not rejoin the process group of the others: fail instead.
        self.pool = rw.WorkerPool(
            DDPPOLearner,
            lambda r: (rank_config, r),
            n,
            name="learner",
            max_restarts=0,
            num_gpus=gpus,
        )
        spec = self.pool.call_one(0, "describe")
        self.agents_per_env = spec["agents_per_env"]
        self._rw = rw
        self._lockstep("join", self.pool.call_one(0, "address"), n, gpus >= 1.0)
        # Identical replicas from the start: the weights the training loop's seed initialized.
        spaces = spec["observation_space"], spec["action_space"]
        self.model = build_model(config, *spaces)
        self.pool.call_all("set_weights", rw.put(self.model.state_dict()))
        self.env_steps = self.episodes = self.iteration = 0

    def progress(self) -> float:
        optim = self.config.ppo.optim
        return self.env_steps / (optim.anneal_steps or self.config.run.total_steps)

    def train_iteration(self) -> dict[str, float]:
        cfg = self.config.ppo
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
        fails (`WorkerPool.lockstep`)."""
        try:
            return self.pool.lockstep(method, *args)
        except DistributedError as exc:
            raise DistributedError(
                f"DD-PPO {exc}; the learners train in lockstep and cannot go on without it. "
                "Resume the run from its last checkpoint"
            ) from exc

    def policy(self) -> ActorPolicy:
        self.model.load_state_dict(self.pool.call_one(0, "get_weights"))
        obs_stats = self.pool.call_one(0, "obs_stats")
        return ActorPolicy(uncompiled_copy(self.model), obs_stats, self.config.env.clip_obs)

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


SPECS = (
    AlgorithmSpec(
        "ddppo",
        DDPPOConfig,
        DDPPO,
        build_model,
        "DD-PPO: decentralized data-parallel PPO, gradients all-reduced over Ray learner processes",
        "Discrete, Box, MultiDiscrete, MultiBinary, Tuple, Dict",
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
