"""What the offline learners (BC, CQL, IQL, TD3+BC) share: their settings, and the iteration
that learns from a dataset without stepping an env, then, when asked, online.

Offline, an iteration is ``replay.gradient_steps`` updates on batches of the dataset (laid
out as a `ReplayBuffer` by `shoal.data.offline`), and the run's progress (``env_steps``,
what ``run.total_steps`` and the evaluation cadence count) is the number of gradient updates,
as d3rlpy and CORL count offline training. The env is built for evaluation only.

Online (``online``, usually ``shoal train --resume RUN --online --run.total-steps N``): the
learner continues from its offline weights; each iteration acts for ``rollout_steps``
vector steps, adds them to the replay that holds the whole dataset, and learns, as
`shoal.algos.cores.off_policy.ReplayAlgorithm` does, in-process or on ``run.runners`` Ray
runners (each stepping ``env.num_envs`` envs; ``replay.gradient_steps`` per runner's rollout);
progress then adds env steps.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
from torch import nn

from shoal.algos.cores.actor_critic_replay import ActorCriticReplayConfig
from shoal.algos.cores.learner_group import ReplayLearnerGroup
from shoal.algos.cores.off_policy import RandomStartLearner, learn_from_replay
from shoal.collect import make_sampler
from shoal.config import (
    EnvConfig,
    OptimConfig,
    ReplayConfig,
    RunConfig,
    check,
    from_dict,
    to_dict,
)
from shoal.config.usage import IN_STEP, Gate
from shoal.core.errors import ConfigError, DatasetError
from shoal.core.seeding import derive_seed
from shoal.data.offline import OfflineDataset, dataset_env, read_dataset
from shoal.envs import make_env
from shoal.fast.backend import uncompiled_copy
from shoal.nn.policy import ActorPolicy

FROM_DATASET = "dataset"
"""``env.id`` of an offline learner that evaluates on the env its dataset records."""


@dataclass(frozen=True)
class OfflineConfig(ActorCriticReplayConfig):
    """Settings shared by the offline learners; the replay, network and optimizer settings
    are `ActorCriticReplayConfig`'s. Progress (``run.total_steps`` and the evaluation and
    checkpoint cadences) counts gradient updates while offline, and adds env steps once
    online."""

    UNUSED: ClassVar[dict[str, str]] = {**ActorCriticReplayConfig.UNUSED, **IN_STEP}

    run: RunConfig = field(
        default_factory=lambda: RunConfig(
            total_steps=100_000, eval_every_steps=5_000, checkpoint_every_steps=0
        )
    )
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=3e-4, eps=1e-8, max_grad_norm=None)
    )
    """Adam for every network (3e-4: IQL's, TD3+BC's and CQL's critic's)."""
    env: EnvConfig = field(default_factory=lambda: EnvConfig(id=FROM_DATASET, num_envs=1))
    """The env to evaluate on (and to act in online); "dataset": the one the dataset
    records."""
    replay: ReplayConfig = field(
        default_factory=lambda: ReplayConfig(
            buffer_size=1_000_000, batch_size=256, learning_starts=0
        )
    )
    """Batch size and updates per iteration; buffer_size is the room for online steps
    beside the dataset."""
    dataset: str = ""
    """A Minari dataset: its directory (as `shoal collect` writes it) or a local Minari id."""
    normalize_obs: bool = True
    """Standardize vector observations with the dataset's per-feature mean and std (frozen;
    the deployed policy applies them too)."""
    online: bool = False
    """Continue online: act in the env, add the steps to the dataset's replay, learn."""

    ONLINE: ClassVar[bool] = True
    """Whether the learner can continue online (behaviour cloning cannot)."""

    GATES: ClassVar[dict[str, Gate | None]] = {
        name: Gate("online", bool, "online (--online)")
        for name in ("replay.buffer_size", "replay.save", "replay.learning_starts",
                     "rollout_steps", "run.runners")
    }  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self, "replay", self.replay.prioritized == "none",
              "offline learners sample uniformly: set replay.prioritized to none")  # fmt: skip
        if self.online and not self.ONLINE:
            raise ConfigError(
                f"online: {type(self).__name__[:-6]} learns from the dataset only and cannot "
                "continue online; IQL and CQL can (--online)"
            )


def prepare(config: OfflineConfig) -> OfflineConfig:
    """Fill ``env`` from the dataset's records when it is "dataset" (before anything is
    built): the id, and the options the data was collected with."""
    if not config.dataset:
        raise ConfigError(
            f"{type(config).__name__}.dataset is empty: name a dataset with --dataset DIR "
            "(write one with shoal collect)"
        )
    if config.env.id != FROM_DATASET:
        return config
    env = dataset_env(config.dataset)
    if not env.get("id"):
        if needs_env(config):
            raise DatasetError(
                f"the dataset {config.dataset} records no env: name one with --env ID, or "
                "set --run.eval-every-steps 0 to learn without evaluating"
            )
        return config
    fields = {f.name for f in dataclasses.fields(EnvConfig)}
    settings = {k: v for k, v in env.items() if k in fields}
    env_config = from_dict(EnvConfig, {**to_dict(config.env), **settings})
    return dataclasses.replace(config, env=env_config)


def counts(config: OfflineConfig) -> str:
    """What an offline learner's progress counts, in words (`shoal.registry`'s ``counts``):
    updates, or, online, updates and then env steps."""
    return "step" if config.online else "update"


def needs_env(config: OfflineConfig) -> bool:
    """Whether the run builds its env: to evaluate, or to act online."""
    run = config.run
    return config.online or bool(run.eval_every_steps) or run.target_return is not None


def check_spaces(dataset: OfflineDataset, env_config: EnvConfig) -> None:
    """Refuse an env whose spaces differ from the dataset's, before training."""
    env = make_env(dataclasses.replace(env_config, num_envs=1, vectorization="sync",
                                       normalize_obs=False))  # fmt: skip
    try:
        pairs = (("observation", env.observation_space, dataset.observation_space),
                 ("action", env.action_space, dataset.action_space))  # fmt: skip
        for what, ours, theirs in pairs:
            if not _same_space(ours, theirs):
                raise DatasetError(
                    f"the dataset's {what} space {theirs} does not match {env_config.id}'s "
                    f"{ours}: evaluate on the env the data came from"
                )
    finally:
        env.close()


def _same_space(a: gym.Space, b: gym.Space) -> bool:
    if isinstance(a, gym.spaces.Box) and isinstance(b, gym.spaces.Box):
        return a.shape == b.shape  # bounds may be written with other precision
    return a == b


class OfflineAlgorithm:
    """Learn from ``config.dataset``; online too when ``config.online``.

    Args:
        config: an `OfflineConfig`.
        learner_fn: ``learner_fn(config, obs_space, action_space)`` builds a `ReplayLearner`.
        model_fn: ``model_fn(config, obs_space, action_space)`` builds its acting network.
    """

    def __init__(
        self,
        config: OfflineConfig,
        learner_fn: Callable[[Any, gym.Space, gym.Space], RandomStartLearner],
        model_fn: Callable[[Any, gym.Space, gym.Space], nn.Module],
    ):
        learners, batch = config.run.learners, config.replay.batch_size
        split = f"must be <= replay.batch_size ({batch}): each batch is split among the learners"
        check(config.run, "learners", learners <= batch, split)
        self.config = config
        self.dataset = dataset = read_dataset(config.dataset)
        if config.env.id != FROM_DATASET and needs_env(config):
            check_spaces(dataset, config.env)
        self.deploy_spaces = (dataset.observation_space, dataset.action_space)
        self.obs_stats = None
        if config.normalize_obs and dataset.normalizes():
            self.obs_stats = dataset.obs_stats()
        # run.learners > 1: data-parallel copies on Ray, each batch split among them.
        make = learner_fn if learners == 1 else functools.partial(ReplayLearnerGroup, learner_fn)
        self.learner = make(config, *self.deploy_spaces)
        self.learner.set_random_actions(False)
        self.model_fn = model_fn
        self.sampler: Any = None
        """Online: the in-process sampler, or a `shoal.collect.ray.RaySampler`."""
        # Online, each of run.runners Ray runners (or the in-process one) steps env.num_envs envs
        num_envs = config.env.num_envs * max(1, config.run.runners) if config.online else 1
        self.replay = dataset.to_replay(
            num_envs,
            extra_capacity=config.replay.buffer_size if config.online else 0,
            n_step=config.replay.n_step,
            seed=derive_seed(config.run.seed, "replay", 0),
            obs_stats=self.obs_stats,
            clip_obs=config.env.clip_obs,
            device=self.learner.device,
        )
        self.env_steps = 0
        self.iteration = 0

    # --- iterate --------------------------------------------------------------------------

    def train_iteration(self) -> dict[str, float]:
        if self.config.online:
            return self._online_iteration()
        metrics = self._learn()
        self.env_steps += self.config.replay.gradient_steps
        self.iteration += 1
        return metrics

    def _learn(self, rollouts: int = 1) -> dict[str, float]:
        """``rollouts x replay.gradient_steps`` updates (online: one rollout per runner)."""
        config, learner = self.config, self.learner
        metrics = learn_from_replay(config, self.replay, learner, self.env_steps, rollouts)
        if isinstance(self.learner, ReplayLearnerGroup) and self.learner.restarts:
            metrics["perf/learner_restarts"] = self.learner.restarts
        return metrics

    def _online_iteration(self) -> dict[str, float]:
        sampler = self.sampler
        if sampler is None:
            sampler = self._go_online()
        sampler.set_weights(self.learner.get_weights())
        rollout, episodes = sampler.sample()
        if sampler.last_restarted:  # their old actors' last steps were lost: cut those episodes
            per_runner = sampler.envs_per_runner
            self.replay.cut_episodes([i * per_runner + e for i in sampler.last_restarted
                                      for e in range(per_runner)])  # fmt: skip
        self.replay.extend(*rollout.transitions())
        self.env_steps += rollout.rewards.numel()
        self.iteration += 1
        metrics = self._learn(sampler.num_runners)
        metrics.update(episodes.metrics())
        return metrics

    def _go_online(self) -> Any:
        """Build the sampler, in-process or on ``run.runners`` Ray runners: its envs
        standardize observations with the dataset's frozen statistics, as the learner saw
        them."""
        config = self.config
        env_config = dataclasses.replace(config.env, normalize_obs=self.obs_stats is not None)
        self.sampler = make_sampler(
            env_config,
            functools.partial(self.model_fn, config),
            config.rollout_steps,
            config.run,
            acting=config.model.backend,
            obs_stats=self.obs_stats,
        )
        return self.sampler

    # --- deploy and checkpoint ------------------------------------------------------------

    def eval_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """The evaluation's return as a normalized score (0: random, 100: the dataset's
        expert), when the dataset records reference scores."""
        score = self.dataset.normalized_score(metrics["eval/return"])
        return {} if score is None else {"eval/normalized_score": score}

    def policy(self) -> ActorPolicy:
        return ActorPolicy(
            uncompiled_copy(self.learner.policy_network), self.obs_stats, self.config.env.clip_obs
        )

    def state_dict(self) -> dict[str, Any]:
        """Offline, the dataset is the data: the learner, counters and the replay's sampling
        generator are the state. Online adds the envs and, with ``replay.save``, the replay
        (the loop reports a resume without it)."""
        state = {
            "learner": self.learner.state_dict(),
            "replay_rng": self.replay.rng_state(),
            "sampler": None,
            "policy": {
                "model": self.learner.policy_network.state_dict(),
                "obs_stats": self.obs_stats,
            },
            "counters": {"env_steps": self.env_steps, "iteration": self.iteration},
        }
        if self.sampler is not None:
            state["sampler"] = self.sampler.get_state()
            state["replay"] = self.replay.state_dict() if self.config.replay.save else None
        return state

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore; an offline checkpoint resumed with ``online`` goes online from it (its
        replay: the whole dataset). Returns whether the envs continued mid-episode (an
        offline run has none to restart)."""
        self.learner.load_state_dict(state["learner"])
        self.learner.set_random_actions(False)
        counters = state["counters"]
        self.env_steps, self.iteration = counters["env_steps"], counters["iteration"]
        if state.get("sampler") is None:
            self.replay.set_rng_state(state["replay_rng"])
            if self.config.online:
                print(f"note: going online after {self.env_steps:,} updates; progress now adds "
                      "env steps (raise --run.total-steps beyond it to act)")  # fmt: skip
            return True
        if not self.config.online:
            raise ConfigError(
                "this run had gone online; resume it with --online (or train offline anew "
                "from its dataset)"
            )
        if state["replay"] is not None:
            self.replay.load_state_dict(state["replay"])
        else:
            self.replay.set_rng_state(state["replay_rng"])
        fallback = derive_seed(self.config.run.seed, "env-restart", self.iteration)
        sampler = self._go_online()
        sampler.set_weights(self.learner.get_weights())
        return sampler.set_state(state["sampler"], fallback)

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.close()
        if isinstance(self.learner, ReplayLearnerGroup):  # its Ray actors and placement group
            self.learner.close()
