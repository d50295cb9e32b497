"""Ape-X's configs: the distributed settings both variants share (`ApexConfig`), the nested
learner block of each variant (DQN, DDPG, R2D2), and `variant`, which picks the learner,
network, actor and shard classes a config trains with. The driver is `shoal.algos.value.apex`.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import gymnasium as gym

from shoal.algos.continuous import ddpg
from shoal.algos.continuous.ddpg import DDPGConfig
from shoal.algos.value import dqn, r2d2
from shoal.algos.value.apex_actor import SequenceActor, Variant
from shoal.algos.value.dqn import DQNConfig
from shoal.algos.value.r2d2 import R2D2Config
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
from shoal.core.errors import ConfigError
from shoal.data.segments import SequenceShard


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
    UNUSED: ClassVar[dict[str, str]] = {
        "dqn.optim.anneal_steps": "Ape-X keeps its learning rate and priority_beta fixed",
        "dqn.replay.prioritized": "Ape-X's replay is always prioritized (proportional)",
        "dqn.replay.gradient_steps": "training_intensity paces Ape-X's learner",
        "dqn.replay.max_lag": "Ape-X's actors always sample asynchronously",
        "dqn.replay.save": "the replay shards live in Ray actors and are not checkpointed",
        "dqn.rollout_steps": "the actors' batches are Ape-X's rollout_steps long",
        "dqn.frame_replay": "the replay shards store whole observations",
        **{f"dqn.{name}": "each actor explores with its own epsilon (exploration_epsilon, "
           "exploration_alpha)" for name in ("epsilon_end", "exploration_steps")},
    }  # fmt: skip


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
    UNUSED: ClassVar[dict[str, str]] = {
        "ddpg.optim.anneal_steps": "Ape-X keeps its learning rate and priority_beta fixed",
        "ddpg.replay.prioritized": "Ape-X's replay is always prioritized (proportional)",
        "ddpg.replay.gradient_steps": "training_intensity paces Ape-X's learner",
        "ddpg.replay.max_lag": "Ape-X's actors always sample asynchronously",
        "ddpg.replay.save": "the replay shards live in Ray actors and are not checkpointed",
        "ddpg.rollout_steps": "the actors' batches are Ape-X's rollout_steps long",
    }


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
    UNUSED: ClassVar[dict[str, str]] = {
        "run.compile": "its sequence actors act with uncompiled network copies",
        "r2d2.replay.gradient_steps": "training_intensity paces Ape-X's learner",
        "r2d2.replay.save": "the replay shards live in Ray actors and are not checkpointed",
        "r2d2.num_steps": "the actors' batches are Ape-X's rollout_steps long",
        **{f"r2d2.{name}": "each actor explores with its own epsilon (exploration_epsilon, "
           "exploration_alpha)" for name in ("epsilon_start", "epsilon_end",
                                             "exploration_steps")},
    }  # fmt: skip


def variant(config: ApexConfig) -> Variant:
    inner = config.learner_config()
    if isinstance(config, ApexDDPGConfig):
        critic = functools.partial(ddpg.deterministic_critic, out_dim=1, members=1)
        return Variant(inner, ddpg.DDPGLearner, ddpg.build_model, critic_fn=critic)
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
