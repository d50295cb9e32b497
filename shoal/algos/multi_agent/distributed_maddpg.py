"""Distributed MADDPG: the setup of Biswas and Biswas, "Autonomous driving using Multi-Agent RL"
(UC San Diego, undated, section G), one node collecting experience and two training
asynchronously, as a configuration of MADDPG (`shoal.algos.multi_agent.maddpg`) on Ray.

* **Collectors** (``run.runners`` Ray actors, Biswas and Biswas: one) each step their own
  multi-agent vector env (seeded per collector) with a copy of the decentralized actors and
  MADDPG's exploration, ``rollout_steps`` vector steps per call, with the master weights sent
  along with the call. They return MADDPG's replay rows (the joint-observation row, joint
  actions, per-agent rewards, terminated, truncated, valid) and the finished episodes.
* **Learners** (``num_learners`` Ray actors, Biswas and Biswas: two) each hold a whole
  `MADDPGLearner` (actors, centralized critics, targets, Adam) and a prioritized replay of
  their own. Every collected batch goes to every learner (stored once in Ray's object
  store). A learner call loads the master networks of that moment, takes ``sync_every``
  gradient steps (`learn_from_replay`, MADDPG's own update and priorities) and returns its
  networks; its Adam moments stay with it.
* **The driver is the parameter server.** It holds the master networks and applies each
  learner's result the moment it arrives: the master becomes that learner's networks (last
  writer wins) and the learner starts its next call from them, while the other learner is
  still training from an older master. Work of a learner overtaken in between is
  overwritten, as with A3C's stale gradients: Biswas and Biswas credit these asynchronous
  updates with exploration in parameter space and a better result than single-node MADDPG.

Each iteration sends one collection request to every collector and, while they collect,
takes learner results until the learners have done their share for the batches before:
``gradient_steps`` updates per ``rollout_steps * num_envs`` env steps collected, for each
learner (the ratio of single-process MADDPG, per learner). Collectors act with the master of
the start of the iteration; ``train/collector_lag`` counts the master writes since, and
``train/learner_lag`` the writes between a learner's start and its own write.

A killed collector restarts with its seeds and gets the weights with its next call; a killed
learner restarts with an empty replay and trains again once it holds ``learning_starts``
transitions. Checkpoints hold the master networks, learner 0's optimizer and the counters,
not the replays nor the collectors' envs: a resumed run refills replay (every learner starts
from the saved learner state) and restarts episodes, so it goes on, not exactly. Arrival
order depends on timing: two runs of one seed are alike, not bit-identical, unless
``results_in_turn`` fixes the order.

Collection is MADDPG's own: a `shoal.collect.multi_agent.MultiAgentRunner` with MADDPG's
acting side in each collector, its rollouts turned into MADDPG's replay rows there.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import gymnasium as gym
import numpy as np
import torch

from shoal.algos.cores.off_policy import learn_from_replay
from shoal.algos.multi_agent import maddpg
from shoal.algos.multi_agent.joint_replay import JointLayout, ReplaySteps, make_replay
from shoal.algos.multi_agent.maddpg import (
    MADDPGConfig,
    MADDPGLearner,
    build_runner,
    deployable,
    deployed_policy,
    maddpg_groups,
    state_dim,
)
from shoal.algos.spec import AlgorithmSpec
from shoal.collect.multi_agent import MultiAgentEpisodes
from shoal.config import (
    EnvConfig,
    RunConfig,
    check,
    check_block,
    check_positive,
    nested_block,
    unnest,
)
from shoal.core.device import to_device
from shoal.core.errors import ConfigError, NaNLossError
from shoal.core.seeding import derive_seed
from shoal.distributed import require_ray
from shoal.envs.make import make_multi_agent_env
from shoal.envs.multi_agent import AgentGroup
from shoal.nn.policy import ActorPolicy, JointPolicy
from shoal.nn.target import frozen_copy

# MADDPG's settings of distributed MADDPG's learners (`shoal.config.nested_block`).
if TYPE_CHECKING:  # for the type checker, a block is its config class
    MADDPGBlock = MADDPGConfig
else:
    MADDPGBlock = nested_block(MADDPGConfig)

NETWORKS = ("actor", "critic", "target_actor", "target_critic")
"""What the parameter server holds and learners exchange (each learner keeps its optimizer)."""


@dataclass(frozen=True)
class DistributedMADDPGConfig:
    """Distributed MADDPG: ``run`` and ``env`` as every algorithm, MADDPG's hyperparameters
    in the ``maddpg`` block, and how the work is spread."""

    run: RunConfig = field(default_factory=lambda: RunConfig(runners=1))
    """run.runners is the number of experience-collecting Ray actors (Biswas and Biswas: one)."""
    env: EnvConfig = field(default_factory=lambda: EnvConfig(id="shoal/spread-v0", num_envs=8))
    """Each collector steps env.num_envs environments of its own."""
    maddpg: MADDPGBlock = field(default_factory=MADDPGBlock)
    """MADDPG's settings (networks, replay, noise, learning rates, batch size, ...);
    replay.gradient_steps is per learner. Its own run and env blocks are not used: set the
    ones above."""
    num_learners: int = 2
    """Learner actors, each with a full MADDPG learner and replay (Biswas and Biswas: two)."""
    sync_every: int = 4
    """Gradient steps a learner takes from the master networks before sending its own."""
    results_in_turn: bool = False
    """Apply learner results in turn (learner 0, 1, ..., 0, ...) instead of as they arrive.
    Learners still train at once from the master of their call's moment, so results are
    as stale as with learners of equal speed, but which one is applied next is counted,
    not timed: two runs of one seed are then identical (the learning test uses this)."""

    UNUSED: ClassVar[dict[str, str]] = {
        "maddpg.replay.save": "its learners' replays live in Ray actors and are not checkpointed",
        "maddpg.replay.max_lag": "its collectors sample asynchronously, paced by sync_every",
    }

    def __post_init__(self) -> None:
        check_positive(self, "num_learners", "sync_every")
        check(self, "run", self.run.runners >= 1, "run.runners (collectors) must be >= 1")
        check_block(self, "maddpg")  # MADDPG's own checks, with the real env (buffer_size, ...)

    def learner_config(self) -> MADDPGConfig:
        """The `MADDPGConfig` of collectors and learners: ``maddpg`` with ``run`` and ``env``,
        with ``run.runners`` 0: each collector is a Ray actor and samples in its own process."""
        return unnest(self.maddpg, run=dataclasses.replace(self.run, runners=0), env=self.env)


def build_model(config: DistributedMADDPGConfig, obs_space: gym.Space, action_space: gym.Space):
    """The deployable actors (MADDPG's)."""
    return maddpg.build_model(config.learner_config(), obs_space, action_space)


class Collected(NamedTuple):
    """A collector's steps as MADDPG's replay stores them
    (`shoal.algos.multi_agent.joint_replay.ReplaySteps`, time-major ``[T, B, ...]``), its finished
    episodes and its env steps."""

    steps: ReplaySteps
    episodes: MultiAgentEpisodes | None
    env_steps: int


class Collector:
    """One experience collector: MADDPG's `MultiAgentRunner` over its own env, with a copy
    of the actors."""

    def __init__(self, config: MADDPGConfig, index: int, torch_seed: int | None = None):
        if torch_seed is not None:  # exploration noise draws from the process's generator
            torch.manual_seed(torch_seed)
        self.config = config
        self.runner = build_runner(config, index)
        self.acting = self.runner.acting.actors
        self.layout = JointLayout(self.acting, state_dim(self.runner.env), config.critic_input)

    def collect(self, weights: dict[str, torch.Tensor]) -> Collected:
        """``rollout_steps`` vector steps with ``weights`` (random actions when they say so)."""
        self.runner.set_weights(weights)
        rollout = self.runner.sample()
        steps = self.layout.steps(rollout)
        return Collected(steps, rollout.episodes, rollout.num_steps * rollout.num_envs)

    def close(self) -> None:
        self.runner.close()


def probe_groups(config: MADDPGConfig) -> tuple[list[AgentGroup], int | None]:
    """The env's agent groups and global-state size, from a one-env probe (refuses what
    MADDPG refuses)."""
    probe = make_multi_agent_env(dataclasses.replace(config.env, num_envs=1))
    try:
        groups = maddpg_groups(probe)
        dim = state_dim(probe)
    finally:
        probe.close()
    if config.critic_input == "state" and dim is None:
        raise ConfigError("critic_input is 'state' but this env provides no global state")
    return groups, dim


def network_state(learner: MADDPGLearner) -> dict[str, dict[str, torch.Tensor]]:
    core = learner.core
    modules = (core.actor, core.critic, core.target_policy, core.target_critic)
    # Host copies: they travel through Ray's object store to processes without a GPU.
    return {
        name: {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
        for name, module in zip(NETWORKS, modules, strict=True)
    }


def load_networks(learner: MADDPGLearner, state: dict[str, dict[str, torch.Tensor]]) -> None:
    core = learner.core
    modules = (core.actor, core.critic, core.target_policy, core.target_critic)
    for name, module in zip(NETWORKS, modules, strict=True):
        module.load_state_dict(state[name])


class Trained(NamedTuple):
    """A learner's answer to one call."""

    networks: dict[str, dict[str, torch.Tensor]] | None
    """Its networks after the updates; None when it took none (replay not ready, or NaN)."""
    metrics: dict[str, float]
    updates: int
    version: int
    """The master version it started from."""
    error: str | None = None
    """A `NaNLossError`'s message (raised by the driver: a restart would not help)."""


class LearnerWorker:
    """One learner: MADDPG's learner and replay; trains from the master networks it is given."""

    def __init__(self, config: MADDPGConfig, index: int, sync_every: int, torch_seed=None):
        if torch_seed is not None:  # Gumbel-softmax samples draw from the process's generator
            torch.manual_seed(torch_seed)
        self.config = config
        replay = dataclasses.replace(config.replay, gradient_steps=sync_every)
        self.sync = dataclasses.replace(config, replay=replay)
        groups, dim = probe_groups(config)
        self.learner = MADDPGLearner(config, groups, dim)
        seed = derive_seed(config.run.seed, "replay", index)  # learner 0: MADDPG's seed
        self.replay = make_replay(
            config.replay, config.env.num_envs, self.learner.layout, seed, self.learner.device
        )

    def add(self, batch: Collected) -> None:
        self.replay.extend(*batch.steps)

    def ready(self) -> bool:
        enough = len(self.replay) >= self.config.replay.learning_starts
        return enough and self.replay.num_sampleable() > 0

    def train(self, master: dict[str, Any], version: int, env_steps: int) -> Trained:
        """``sync_every`` updates starting from the ``master`` networks."""
        if not self.ready():
            return Trained(None, {}, 0, version)
        load_networks(self.learner, master)
        try:
            metrics = learn_from_replay(self.sync, self.replay, self.learner, env_steps)
        except NaNLossError as exc:
            return Trained(None, {}, 0, version, str(exc))
        updates = self.sync.replay.gradient_steps
        return Trained(network_state(self.learner), metrics, updates, version)

    def state_dict(self) -> dict[str, Any]:
        """Host copies: the state travels to the driver, which may have no GPU."""
        return to_device(self.learner.state_dict(), torch.device("cpu"))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.learner.load_state_dict(state)


class DistributedMADDPG:
    """The driver and parameter server; collectors and learners are Ray actors."""

    def __init__(self, config: DistributedMADDPGConfig):
        self.config = config
        self.inner = inner = config.learner_config()
        run = config.run
        # The env is checked here first: a bad env id or critic_input fails now, with its own
        # message, not as actors failing and restarting in a loop.
        groups, dim = probe_groups(inner)
        # The initial weights, from run.seed, built here on the CPU: the driver only keeps
        # the master networks and acts with nothing.
        on_cpu = dataclasses.replace(inner, run=dataclasses.replace(run, device="cpu"))
        master = MADDPGLearner(on_cpu, groups, dim)
        self.joint = len(groups) > 1
        """Several groups: evaluation and deployment act on every group at once."""
        self.master = network_state(master)
        self.actor = frozen_copy(master.core.actor)
        self._rw = rw = require_ray()
        rw.connect(
            run.ray_address,
            num_cpus=max(os.cpu_count() or 1, run.runners + config.num_learners + 1),
        )
        # Learner actors take a GPU (or a share) when the run's device asks for one; inside
        # an actor Ray's CUDA_VISIBLE_DEVICES makes it "cuda".
        gpus = rw.gpu_share(run.device, config.num_learners)
        learner_run = dataclasses.replace(run, device="cuda" if gpus else "cpu")
        learner_config = dataclasses.replace(inner, run=learner_run)
        seed = run.seed
        self.collectors = rw.WorkerPool(
            Collector,
            lambda i: (inner, i, derive_seed(seed, "collector-torch", i)),
            run.runners,
            name="MADDPG collector",
            max_restarts=run.max_worker_restarts,
        )
        self.learners = rw.WorkerPool(
            LearnerWorker,
            lambda j: (learner_config, j, config.sync_every, derive_seed(seed, "learner-torch", j)),
            config.num_learners,
            name="MADDPG learner",
            max_restarts=run.max_worker_restarts,
            num_gpus=gpus,
        )
        self.env_steps = self.iteration = 0
        self.version = 0
        """Master writes so far."""
        self.updates = 0
        """Gradient steps of the learner results applied to the master."""
        self.owed = 0
        """Learner gradient steps due for the data collected so far."""
        self._refs: dict[str, tuple[tuple[int, bool], Any]] = {}
        self._stream: Generator[tuple[int, Trained], None, None] | None = None

    def _shared(self, name: str, value: Any) -> Any:
        """``value`` in the object store, once per master version."""
        key = (self.version, self.env_steps < self.inner.replay.learning_starts)
        if name not in self._refs or self._refs[name][0] != key:
            self._refs[name] = (key, self._rw.put(value))
        return self._refs[name][1]

    def _train_args(self, j: int) -> tuple:
        return (self._shared("master", self.master), self.version, self.env_steps)

    def train_iteration(self) -> dict[str, float]:
        cfg = self.inner
        self.actor.random_actions.fill_(self.env_steps < cfg.replay.learning_starts)
        weights, version = self._shared("acting", self.actor.state_dict()), self.version
        refs = [self.collectors.submit(i, "collect", weights) for i in range(len(self.collectors))]
        trained, lags = self._learn()
        batches = [self._collected(i, ref, weights) for i, ref in enumerate(refs)]
        for batch in batches:
            self.env_steps += batch.env_steps
            shared = self._rw.put(batch._replace(episodes=None))
            for j in range(len(self.learners)):
                self.learners.submit(j, "add", shared)  # ordered before its next train call
            if self.env_steps > cfg.replay.learning_starts:
                self.owed += len(self.learners) * cfg.replay.gradient_steps
        self.iteration += 1
        metrics = self._metrics(trained, lags)
        metrics["train/collector_lag"] = self.version - version
        episodes = [b.episodes for b in batches if b.episodes is not None]  # all: sent back
        metrics.update(MultiAgentEpisodes.concat(episodes).metrics())
        return metrics

    def _collected(self, i: int, ref: Any, weights: Any) -> Collected:
        try:
            return self._rw.get(ref)
        except self._rw.WORKER_FAILURES as exc:
            self.collectors.restart(i, exc)
            return self.collectors.call_one(i, "collect", weights)

    def _learn(self) -> tuple[list[Trained], list[int]]:
        """Learner results, each applied on arrival, until the owed updates are done (or a
        learner has nothing to train on: a restarted one refilling its replay)."""
        trained: list[Trained] = []
        lags: list[int] = []
        if self.owed <= 0:
            return trained, lags
        if self._stream is None:
            in_turn = self.config.results_in_turn
            self._stream = self.learners.stream("train", self._train_args, in_turn=in_turn)
        while self.owed > 0:
            j, result = next(self._stream)
            if result.error is not None:
                raise NaNLossError(f"{result.error} (learner {j})")
            if result.networks is None:
                break
            lags.append(self.version - result.version)
            self.master = result.networks  # last writer wins (Biswas and Biswas's asynchrony)
            self.actor.load_state_dict(result.networks["actor"])
            self.version += 1
            self.updates += result.updates
            self.owed -= result.updates
            trained.append(result)
        # What a refilling learner could not do is not carried over without bound.
        self.owed = min(self.owed, 2 * len(self.learners) * self.inner.replay.gradient_steps)
        return trained, lags

    def _metrics(self, trained: list[Trained], lags: list[int]) -> dict[str, float]:
        metrics: dict[str, float] = {}
        if trained:
            names = [k for k in trained[0].metrics if k != "train/grad_steps"]
            for name in names:
                metrics[name] = float(np.mean([t.metrics[name] for t in trained]))
            metrics["train/learner_lag"] = float(np.mean(lags))
        metrics["train/grad_steps"] = self.updates
        metrics["train/learner_results"] = len(trained)
        metrics["train/master_version"] = self.version
        metrics["train/collector_restarts"] = self.collectors.restarts
        metrics["train/learner_restarts"] = self.learners.restarts
        return metrics

    def policy(self) -> ActorPolicy | JointPolicy:
        return deployed_policy(self.actor)

    def state_dict(self) -> dict[str, Any]:
        # Learner 0 answers after the call it is running; its result stays queued.
        learner = {**self.learners.call_one(0, "state_dict"), **self.master}
        return {
            "learner": learner,
            "policy": {"model": self._deployable_weights(), "obs_stats": None},
            "counters": {
                "env_steps": self.env_steps,
                "iteration": self.iteration,
                "version": self.version,
                "updates": self.updates,
                "owed": self.owed,
            },
        }

    def _deployable_weights(self) -> dict[str, torch.Tensor]:
        actor = frozen_copy(self.actor)
        actor.load_state_dict(self.master["actor"])
        return deployable(actor, copy=False).state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Every learner takes the saved learner state, the master its networks; returns
        False: replays refill and episodes restart."""
        learner = state["learner"]
        self.master = {name: learner[name] for name in NETWORKS}
        self.actor.load_state_dict(self.master["actor"])
        self.learners.call_all("load_state_dict", learner)
        counters = state["counters"]
        self.env_steps, self.iteration = int(counters["env_steps"]), int(counters["iteration"])
        self.version, self.updates = int(counters["version"]), int(counters["updates"])
        self.owed = int(counters["owed"])
        self._refs.clear()
        return False

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
        self.collectors.close()
        self.learners.close()


SPECS = (
    AlgorithmSpec(
        "maddpg-distributed",
        DistributedMADDPGConfig,
        DistributedMADDPG,
        build_model,
        "Distributed MADDPG: Ray collectors, asynchronous learners, last-writer-wins "
        "parameter server",
        "Discrete, Box (multi-agent envs)",
        runners=True,
        acts_jointly=True,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
