"""Ape-X: distributed prioritized experience replay (Horgan et al. 2018, arXiv:1803.00933),
with DQN and DDPG (Ape-X DPG) learners, and R2D2's distributed form (Kapturowski et al.
2019): recurrent actors sending sequences to sequence shards.

``run.runners`` actors (Ray actors) each step their own vector env with a copy of the policy
and their own exploration rate, cut their steps into n-step transitions, score them with their
own network copy (the initial priorities) and send them to ``replay_shards`` prioritized
replay shards (`shoal.data.replay_shard`). The learner, in the driver process, trains on
batches from whichever shard answers first while further requests stay queued (so the next
batches are on their way while it trains), sends the new priorities back to the batch's
shard, and pushes its weights to the actors every ``weight_sync_every`` steps. The learners,
networks, losses and exploration noise are DQN's and DDPG's own (`shoal.algos.value.dqn`,
`shoal.algos.continuous.ddpg`). ``training_intensity`` (not in the paper, whose learner had a GPU to
itself) holds the ratio of replayed transitions to env steps where actors and learner share
a few cores.

Ray is reached only through `shoal.distributed`. A killed actor restarts with its seeds and
gets the latest weights; a killed shard restarts empty. The seed fixes every actor's env and
torch seeds, but how actors and learner interleave depends on timing: two runs of one seed
are alike, not bit-identical, unless ``results_in_turn`` takes results in request order.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import gymnasium as gym
import numpy as np
import torch

from shoal.algos.continuous import ddpg
from shoal.algos.continuous.ddpg import DDPGConfig
from shoal.algos.value import dqn, r2d2
from shoal.algos.value.apex_actor import (
    ApexActor,
    SequenceActor,
    Variant,
    ddpg_priorities,
    dqn_priorities,
    exploration_scales,
    per_worker_epsilons,
)
from shoal.algos.value.dqn import DQNConfig
from shoal.algos.value.r2d2 import R2D2Config
from shoal.backend import uncompiled_copy
from shoal.collect.ray import concat_episodes
from shoal.config import (
    EnvConfig,
    ModelConfig,
    NoiseConfig,
    OptimConfig,
    Renamed,
    ReplayConfig,
    RunConfig,
    check,
    check_block,
    check_choices,
    check_positive,
    nested_block,
    unnest,
)
from shoal.data.replay_shard import ReplayShard
from shoal.data.segments import SequenceShard
from shoal.device import to_host
from shoal.distributed import require_ray
from shoal.envs import make_env
from shoal.envs.shapes import as_discrete
from shoal.errors import ConfigError
from shoal.optim import check_finite_metrics
from shoal.policy import ActorPolicy
from shoal.seeding import derive_seed
from shoal.types import ReplayBatch

__all__ = [
    "Apex",
    "ApexActor",
    "ApexConfig",
    "ApexDDPGConfig",
    "ApexDQNConfig",
    "ApexR2D2Config",
    "Variant",
    "build_model",
    "ddpg_priorities",
    "dqn_priorities",
    "exploration_scales",
    "per_worker_epsilons",
    "variant",
]


@dataclass(frozen=True)
class ApexConfig:
    """What both Ape-X variants share: ``run`` and ``env``, and the distributed settings. The
    learner's settings are the nested DQN or DDPG config of each variant. Defaults suit
    CartPole / Pendulum on a laptop; the paper's Atari values are in each field's docstring,
    with the RLlib key (RLlib's 2018 algorithm documentation)."""

    run: RunConfig = field(default_factory=lambda: RunConfig(runners=2))
    """run.runners is the number of actors (RLlib's num_workers; paper: 360)."""
    env: EnvConfig = field(default_factory=lambda: EnvConfig(num_envs=4))
    """Each actor steps env.num_envs envs of its own."""
    replay_shards: int = 1
    """Replay shard actors (RLlib's num_replay_buffer_shards, RLlib default 4). Actor
    batches go to the shards in turn; the learner trains on whichever answers first. The
    learner's replay block sizes them: replay.buffer_size over all shards (RLlib's
    buffer_size; paper: 2,000,000), replay.batch_size per learner step (RLlib's
    train_batch_size; paper: 512), replay.n_step (paper: 3), replay.priority_alpha (paper:
    0.6), replay.priority_beta, fixed as in the paper, and replay.learning_starts, the
    transitions stored before the learner starts (paper: 50,000), also the env steps of
    uniformly random actions of DDPG's actors."""
    rollout_steps: int = 16
    """Vector-env steps per actor batch, so a batch holds rollout_steps * env.num_envs steps
    (RLlib's sample_batch_size, default 50)."""
    steps_per_iteration: int = 1_000
    """Env steps arriving from actors per training iteration (RLlib's
    timesteps_per_iteration, default 25,000)."""
    weight_sync_every: int = 100
    """Learner steps between weight pushes to the actors (RLlib's max_weight_sync_delay,
    default 400; the paper's actors fetch weights every 400 env steps)."""
    per_worker_exploration: bool = True
    """Actor i of N explores with epsilon_i = exploration_epsilon ** (1 + i / (N - 1) *
    exploration_alpha) (RLlib's per_worker_exploration; paper section 4.1). DQN uses it as
    epsilon; DDPG scales noise.scale by epsilon_i / exploration_epsilon. False: every actor
    uses exploration_epsilon (DQN) or noise.scale (DDPG)."""
    exploration_epsilon: float = 0.4
    """Base of the per-actor exploration ladder (paper: 0.4)."""
    exploration_alpha: float = 7.0
    """Exponent spread of the ladder (paper: 7)."""
    worker_side_prioritization: bool = True
    """Actors compute their transitions' initial priorities |TD error| with their own network
    copy (RLlib's worker_side_prioritization; the paper's choice). False: new transitions get
    the largest priority seen so far, as in single-process prioritized replay."""
    training_intensity: float | None = 16.0
    """Replayed transitions per env step to keep to: actors wait while batch_size * learner
    steps < training_intensity * (env steps - learning_starts) (RLlib's training_intensity).
    None lets actors run freely, as in the paper, which needs a learner much faster than the
    actors together; where they share a few cores, free actors fill replay while the learner
    hardly trains."""
    results_in_turn: bool = False
    """Take actor batches and replay batches in the order they were requested instead of as
    they arrive. Actors, shards and learner still run at once, but what the learner does next
    (store a batch, train, push weights, ask for more) is counted, not timed: two runs of one
    seed are then identical (the learning tests use this)."""

    LEARNER: ClassVar[str] = ""
    """The name of the nested learner config field (dqn or ddpg)."""

    def __post_init__(self) -> None:
        check_choices(self)
        if self.run.runners < 1:
            raise ConfigError(
                f"{type(self).__name__}.run.runners = {self.run.runners} is invalid: Ape-X "
                "samples with Ray actors; set run.runners >= 1 (2 or more for per-worker "
                "exploration)"
            )
        if self.env.normalize_obs or self.env.normalize_reward:
            raise ConfigError(
                f"{type(self).__name__}.env.normalize_obs / normalize_reward are not supported: "
                "each actor would normalize with its own statistics; turn them off"
            )
        check_positive(self, "replay_shards", "rollout_steps")
        check_positive(self, "steps_per_iteration", "weight_sync_every")
        check(self, "exploration_epsilon", 0 < self.exploration_epsilon <= 1, "must be in (0, 1]")
        check(self, "exploration_alpha", self.exploration_alpha >= 0, "must be >= 0")
        if self.training_intensity is not None:
            check_positive(self, "training_intensity")
        learner = check_block(self, self.LEARNER)  # its own checks, with the real env and run
        replay = learner.replay
        check(
            replay,
            "prioritized",
            getattr(replay, "prioritized", "proportional") == "proportional",
            "Ape-X's replay shards are proportional prioritized replay: use 'proportional'",
        )
        check(
            replay,
            "buffer_size",
            replay.buffer_size >= self.replay_shards,
            f"must be >= replay_shards = {self.replay_shards}",
        )
        check(
            replay,
            "learning_starts",
            replay.learning_starts <= replay.buffer_size,
            f"must be <= replay.buffer_size = {replay.buffer_size}",
        )

    def learner_config(self) -> Any:
        """The nested DQN or DDPG config with ``run`` and ``env`` (validated)."""
        return unnest(getattr(self, self.LEARNER), run=self.run, env=self.env)


# Ape-X DQN's learner settings (`shoal.config.nested_block`).
if TYPE_CHECKING:  # for the type checker, a block is its config class
    DQNBlock = DQNConfig
else:
    DQNBlock = nested_block(DQNConfig)
# Ape-X DPG's learner settings (`shoal.config.nested_block`).
if TYPE_CHECKING:  # for the type checker, a block is its config class
    DDPGBlock = DDPGConfig
else:
    DDPGBlock = nested_block(DDPGConfig)
# Distributed R2D2's learner settings (`shoal.config.nested_block`).
if TYPE_CHECKING:  # for the type checker, a block is its config class
    R2D2Block = R2D2Config
else:
    R2D2Block = nested_block(R2D2Config)


def _apex_replay(batch_size: int, n_step: int = 3) -> ReplayConfig:
    return ReplayConfig(
        buffer_size=50_000,
        batch_size=batch_size,
        n_step=n_step,
        prioritized="proportional",
        learning_starts=1_000,
    )


def _learner_renames(block: str, fields: tuple[str, ...]) -> dict[str, Renamed]:
    """shoal 0.1's flat Ape-X fields: the learner's own in its block, the replay fields in
    its replay block."""
    renamed = {name: Renamed(f"{block}.{name}") for name in fields}
    for name in ("buffer_size", "batch_size", "n_step", "priority_alpha", "priority_beta"):
        renamed[name] = Renamed(f"{block}.replay.{name}")
    renamed["learning_starts"] = Renamed(f"{block}.replay.learning_starts")
    return renamed


@dataclass(frozen=True)
class ApexDQNConfig(ApexConfig):
    """Ape-X DQN: a dueling double DQN learner (the paper's) on n-step prioritized replay."""

    dqn: DQNBlock = field(
        default_factory=lambda: DQNBlock(
            optim=OptimConfig(lr=5e-4, max_grad_norm=40.0),
            model=ModelConfig(hidden=(64, 64), activation="relu"),
            dueling=True,
            replay=_apex_replay(batch_size=64),
        )
    )
    """The learner (`DQNConfig`): AdamW (the paper clips gradient norms to 40 and uses
    RMSProp, lr 0.00025 / 4), the Q-network, double_q, dueling (the paper's network), the
    loss, target_update_every (hard copies every this many learner steps; RLlib's
    target_network_update_freq counts env steps, default 500,000; paper: every 2,500 learner
    steps), gamma, and the replay sizes. Its exploration fields are unused: each actor has its
    own epsilon (exploration_epsilon, exploration_alpha)."""

    LEARNER: ClassVar[str] = "dqn"
    RENAMED: ClassVar[dict[str, Renamed]] = _learner_renames(
        "dqn", ("optim", "model", "double_q", "dueling", "loss", "target_update_every", "gamma")
    )


@dataclass(frozen=True)
class ApexDDPGConfig(ApexConfig):
    """Ape-X DPG: a DDPG learner (Polyak-averaged targets) on n-step prioritized replay."""

    env: EnvConfig = field(default_factory=lambda: EnvConfig(id="Pendulum-v1", num_envs=1))
    """Each actor steps env.num_envs envs of its own."""
    ddpg: DDPGBlock = field(
        default_factory=lambda: DDPGBlock(
            noise=NoiseConfig(kind="gaussian", scale=0.3),
            replay=_apex_replay(batch_size=256),
        )
    )
    """The learner (`DDPGConfig`): Adam for both networks, actor and critic sizes, actor_lr,
    tau, the critic loss and L2, gamma, the replay sizes (paper: batches of 256), and the
    exploration noise of actor 0 (the others scale it down, per_worker_exploration)."""
    training_intensity: float | None = 256.0
    """Replayed transitions per env step (see `ApexConfig`): one learner step per env step."""
    exploration_alpha: float = 3.0
    """Exponent spread of the ladder; smaller than DQN's 7, which would leave the last
    actors with 0.4^7 = 0.2% of the noise."""

    LEARNER: ClassVar[str] = "ddpg"
    RENAMED: ClassVar[dict[str, Renamed]] = _learner_renames(
        "ddpg",
        ("optim", "model", "noise", "actor_lr", "tau", "critic_loss", "critic_l2", "gamma"),
    )


@dataclass(frozen=True)
class ApexR2D2Config(ApexConfig):
    """R2D2 on Ape-X's machinery: recurrent actors (`SequenceActor`) with the epsilon ladder
    cut their episodes into sequences, score them with their network copy and send them to
    sequence shards (`shoal.data.segments.SequenceShard`); the learner is R2D2's. Sizes
    count sequences: replay.buffer_size, replay.batch_size and replay.learning_starts of the
    r2d2 block, and training_intensity (replayed sequences per env step)."""

    r2d2: R2D2Block = field(default_factory=R2D2Block)
    """The learner (`R2D2Config`): the recurrent Q-network, the sequence layout (burn_in,
    length, period), n_step, gamma, the value rescaling, target_update_every and the
    sequence replay's sizes and priority exponents. Its exploration fields are unused: each
    actor has its own epsilon (exploration_epsilon, exploration_alpha)."""
    training_intensity: float | None = 2.0
    """Replayed sequences per env step (the local tuned examples replay 1-4)."""

    LEARNER: ClassVar[str] = "r2d2"


def variant(config: ApexConfig) -> Variant:
    inner = config.learner_config()
    if isinstance(config, ApexDDPGConfig):
        return Variant(inner, ddpg.DDPGLearner, ddpg.build_model)
    if isinstance(config, ApexR2D2Config):
        eps = config.exploration_epsilon
        inner = dataclasses.replace(inner, epsilon_start=eps, epsilon_end=eps)
        return Variant(inner, r2d2.R2D2Learner, r2d2.build_model, SequenceActor, SequenceShard)
    # The Q-network's epsilon travels with its weights: the ladder's base, not DQN's schedule
    # (each actor then sets its own; a deployed policy sampling actions uses this one).
    eps = config.exploration_epsilon
    inner = dataclasses.replace(inner, epsilon_start=eps, epsilon_end=eps)
    return Variant(inner, dqn.DQNLearner, dqn.build_model)


def build_model(config: ApexConfig, obs_space: gym.Space, action_space: gym.Space) -> Any:
    """The acting (and deployed) network: DQN's Q-network or DDPG's deterministic actor."""
    parts = variant(config)
    return parts.model_fn(parts.inner, obs_space, action_space)


PREFETCH = 2
"""Sample requests kept queued per shard: the next batches are on their way while the
learner trains on some."""
BATCHES_PER_REQUEST = 4
"""Learner batches per shard request: one round trip (and one priority update) per four
learner steps, so that the learner does not wait on Ray's latency."""


class Apex:
    """Ape-X's learner process: actors and shards as Ray actors, the learner here. An
    iteration handles actor batches and learner steps as they come, until
    ``steps_per_iteration`` new env steps arrived.

    Checkpoints hold the learner (networks, targets, optimizer), the counters and the deployed
    policy; not the shards' contents nor the actors' envs, so a resumed run refills replay
    (learning restarts once it holds learning_starts transitions) and restarts episodes."""

    def __init__(self, config: ApexConfig):
        self.config = config
        self.parts = variant(config)
        self.replay = self.parts.inner.replay
        run = config.run
        # One env here first: an unknown env id or an unsupported action space fails now,
        # with its own message, not as actors failing and restarting in a loop.
        probe = make_env(dataclasses.replace(config.env, num_envs=1))
        self._spaces = (probe.observation_space, probe.action_space)
        mask = probe.action_mask
        self._mask_dim = None if mask is None else int(as_discrete(probe.action_space).n)
        probe.close()
        self.learner = self.parts.learner_fn(self.parts.inner, *self._spaces)
        self._rw = rw = require_ray()
        rw.connect(
            run.ray_address,
            num_cpus=max(os.cpu_count() or 1, run.runners + config.replay_shards + 1),
        )
        self._weights_ref: Any = None
        self.actors = rw.WorkerPool(
            self.parts.actor_cls or ApexActor,
            lambda i: (config, i, self.parts),
            run.runners,
            name="Ape-X actor",
            max_restarts=run.max_worker_restarts,
            on_restart=self._restore_actor,
        )
        self.shards = rw.WorkerPool(
            self.parts.shard_cls or ReplayShard,
            self._shard_args,
            config.replay_shards,
            name="replay shard",
            max_restarts=run.max_worker_restarts,
        )
        self.scales = exploration_scales(config, self.parts)
        self.env_steps = 0
        self.iteration = 0
        self._pending: dict[Any, tuple[str, int]] = {}
        self._idle_actors = list(range(run.runners))
        self._queued = [0] * config.replay_shards
        self._sizes = [0] * config.replay_shards
        self._next_shard = 0
        self._push_weights()

    def _shard_args(self, j: int) -> tuple:
        cfg, replay = self.config, self.replay
        capacity = -(-replay.buffer_size // cfg.replay_shards)
        seed = derive_seed(cfg.run.seed, "replay", j)
        if self.parts.shard_cls is SequenceShard:
            return capacity, replay.priority_alpha, seed
        return (
            capacity,
            *self._spaces,
            replay.n_step,
            replay.priority_alpha,
            seed,
            self._mask_dim,
        )

    def train_iteration(self) -> dict[str, float]:
        goal = self.env_steps + self.config.steps_per_iteration
        stats: list[dict[str, torch.Tensor]] = []
        episodes = []
        self._start_actors()
        while self.env_steps < goal:
            if self.config.results_in_turn:
                ref = next(iter(self._pending))  # the oldest request; `_result` waits for it
            else:
                ref = self._rw.wait_first(list(self._pending))
            kind, i = self._pending.pop(ref)
            result = self._result(kind, i, ref)
            if kind == "sample":
                self._idle_actors.append(i)
                if result is not None:
                    episodes.append(self._store(*result))
            else:
                self._queued[i] -= 1
                if result is not None:
                    stats.extend(self._learn(i, result))
            self._request_replay()
            self._start_actors()
        self.iteration += 1
        return self._metrics(stats, episodes)

    def _result(self, kind: str, i: int, ref: Any) -> Any:
        """The result of a request, or None when its actor failed and was restarted."""
        try:
            return self._rw.get(ref)
        except self._rw.WORKER_FAILURES as exc:
            for other in [r for r, key in self._pending.items() if key == (kind, i)]:
                del self._pending[other]  # queued on the dead actor: died with it
            if kind == "replay":
                self._queued[i], self._sizes[i] = 0, 0  # restarts empty
            (self.actors if kind == "sample" else self.shards).restart(i, exc)
            return None

    def _store(self, batch: Any, priorities: Any, episodes: Any, steps: int):
        """Count an actor batch's env steps and send its transitions (or sequences) to the
        next shard."""
        self.env_steps += steps
        if batch is not None:
            j = self._next_shard
            self._next_shard = (j + 1) % len(self._sizes)
            self.shards.submit(j, "add", batch, priorities)  # ordered before later samples
            capacity = -(-self.replay.buffer_size // self.config.replay_shards)
            count = len(batch.steps) if isinstance(batch, ReplayBatch) else len(batch["valid"])
            self._sizes[j] = min(capacity, self._sizes[j] + count)
        return episodes

    def _request_replay(self) -> None:
        """Keep PREFETCH requests queued per shard once replay holds learning_starts
        transitions, unless the learner is a prefetch window ahead of training_intensity."""
        cfg = self.config
        replay = self.replay
        if sum(self._sizes) < max(replay.learning_starts, 1):
            return
        window = PREFETCH * BATCHES_PER_REQUEST * replay.batch_size
        for j, size in enumerate(self._sizes):
            while size > 0 and self._queued[j] < PREFETCH:
                in_flight = sum(self._queued) * BATCHES_PER_REQUEST * replay.batch_size
                if cfg.training_intensity is not None and self._backlog() + window <= in_flight:
                    return
                ref = self.shards.submit(
                    j, "sample_many", BATCHES_PER_REQUEST, replay.batch_size, replay.priority_beta
                )
                self._pending[ref] = ("replay", j)
                self._queued[j] += 1

    def _learn(self, j: int, batches: list[ReplayBatch]) -> list[dict]:
        """Learner steps on shard ``j``'s batches; their new priorities go back to ``j``."""
        if not batches:  # empty (restarted): no more requests until actors refill it
            self._sizes[j] = 0
            return []
        stats, indices, priorities = [], [], []
        for batch in batches:
            metrics, new_priorities = self.learner.update(batch)
            stats.append(metrics)
            indices.append(batch.indices)
            priorities.append(new_priorities.detach().cpu().numpy())
            if self.learner.grad_steps % self.config.weight_sync_every == 0:
                self._push_weights()
        self.shards.submit(
            j, "update_priorities", np.concatenate(indices), np.concatenate(priorities)
        )
        return stats

    def _backlog(self) -> float:
        """Replayed transitions the learner owes the env steps so far at training_intensity
        (negative: it is ahead)."""
        cfg = self.config
        owed = (cfg.training_intensity or 0.0) * (self.env_steps - self.replay.learning_starts)
        return owed - self.learner.grad_steps * self.replay.batch_size

    def _throttled(self) -> bool:
        """Actors wait for the learner (training_intensity) while it has batches coming.
        Together with `_request_replay` this holds the replay ratio whatever the speeds of
        actors and learner, so that learning per env step does not depend on the machine."""
        if self.config.training_intensity is None or not any(self._queued):
            return False
        return self._backlog() > 0

    def _start_actors(self) -> None:
        while self._idle_actors and not self._throttled():
            i = self._idle_actors.pop(0)
            random = self.env_steps < self.replay.learning_starts
            self._pending[self.actors.submit(i, "sample", random)] = ("sample", i)

    def _acting_weights(self) -> dict[str, Any]:
        """Host copies of the acting network (and DDPG's critic, for its priorities)."""
        if isinstance(self.config, ApexDDPGConfig):
            core = self.learner.core
            return {
                "model": to_host(core.actor.state_dict()),
                "critic": to_host(core.critic.state_dict()),
            }
        return {"model": to_host(self.learner.policy_network.state_dict())}

    def _push_weights(self) -> None:
        """To the object store once; each actor applies it before its next batch."""
        self._weights_ref = self._rw.put(self._acting_weights())
        self.actors.tell_all("set_weights", self._weights_ref)

    def _restore_actor(self, i: int) -> None:
        if self._weights_ref is not None:
            self.actors.call_one(i, "set_weights", self._weights_ref)

    def _metrics(self, stats: list[dict], episodes: list) -> dict[str, float]:
        metrics: dict[str, float] = {}
        if stats:
            means = torch.stack([torch.stack(list(s.values())) for s in stats]).mean(0)
            metrics.update(zip(stats[0], means.tolist(), strict=True))
            check_finite_metrics(metrics)  # a GPU learner's NaN check
        ddpg_variant = isinstance(self.config, ApexDDPGConfig)
        metrics["train/noise_scale_mean" if ddpg_variant else "train/epsilon_mean"] = float(
            np.mean(self.scales)
        )
        metrics["train/grad_steps"] = self.learner.grad_steps
        metrics["train/learner_steps_per_iteration"] = len(stats)
        metrics["train/replay_size"] = sum(self._sizes)
        metrics["train/actor_restarts"] = self.actors.restarts
        metrics["train/shard_restarts"] = self.shards.restarts
        if episodes:
            metrics.update(concat_episodes(episodes).metrics())
        return metrics

    def policy(self) -> ActorPolicy:
        network = uncompiled_copy(self.learner.policy_network)
        return ActorPolicy(network, None, self.config.env.clip_obs)

    def state_dict(self) -> dict[str, Any]:
        return {
            "learner": self.learner.state_dict(),
            "policy": {"model": self.learner.policy_network.state_dict(), "obs_stats": None},
            "counters": {"env_steps": self.env_steps, "iteration": self.iteration},
        }

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore the learner and counters; returns False: replay and episodes restart."""
        self.learner.load_state_dict(state["learner"])
        self.env_steps = int(state["counters"]["env_steps"])
        self.iteration = int(state["counters"]["iteration"])
        self._push_weights()
        return False

    def close(self) -> None:
        self._pending.clear()
        self.actors.close()
        self.shards.close()
