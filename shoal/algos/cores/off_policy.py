"""What the replay-based learners share: the act-store-learn iteration (DQN, DDPG, TD3, SAC,
D4PG, and the pieces MADDPG reuses).

`ReplayAlgorithm` is the iteration: act for ``rollout_steps`` vector steps with the latest
weights, store them in replay, then take ``gradient_steps`` gradient steps on replay batches
(after ``learning_starts`` env steps). An algorithm gives it a learner and decides what the
samplers' exploration looks like each iteration (`ReplayAlgorithm.explore`). The actor-critics'
settings and learner core are in `shoal.algos.cores.actor_critic_replay`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, cast

import gymnasium as gym
import torch
from torch import nn

from shoal.collect import EnvRunner, LocalSampler
from shoal.config import EnvConfig, ModelConfig, OptimConfig, ReplayConfig, RunConfig
from shoal.core.seeding import derive_seed
from shoal.core.types import ReplayBatch
from shoal.data.frame_replay import stack_size
from shoal.data.prioritized import Priorities, ProportionalPriorities, RankBasedPriorities
from shoal.data.replay import ReplayBuffer
from shoal.envs.shapes import as_discrete
from shoal.fast.backend import uncompiled_copy
from shoal.nn.policy import ActorPolicy
from shoal.optim import check_finite_metrics


class ReplayLearnerConfig(Protocol):
    """The fields of a config that `ReplayAlgorithm` reads (DQN's and the actor-critics');
    read-only, as a frozen config's are."""

    @property
    def run(self) -> RunConfig: ...

    @property
    def env(self) -> EnvConfig: ...

    @property
    def optim(self) -> OptimConfig: ...

    @property
    def model(self) -> ModelConfig: ...

    @property
    def replay(self) -> ReplayConfig: ...

    @property
    def rollout_steps(self) -> int: ...


class ReplayLearner(Protocol):
    @property
    def grad_steps(self) -> int:
        """Gradient steps taken so far."""
        ...

    @property
    def device(self) -> torch.device:
        """Where the learner computes (the replay keeps its batches there)."""
        ...

    def update(self, batch: ReplayBatch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """One gradient step; returns metrics (scalar tensors) and new priorities ``[N]``."""
        ...

    @property
    def policy_network(self) -> nn.Module:
        """The network that acts (what samplers run and `ActorPolicy` deploys)."""
        ...

    def get_weights(self) -> dict[str, torch.Tensor]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class RandomStartLearner(ReplayLearner, Protocol):
    """A replay learner whose policy can act uniformly at random (the actor-critics', until
    ``replay.learning_starts``; the offline learners', never)."""

    def set_random_actions(self, on: bool) -> None: ...


def make_priorities(replay: ReplayConfig, num_envs: int) -> Priorities | None:
    """The priority structure ``replay.prioritized`` asks for, over a buffer's whole rows of
    ``num_envs``."""
    capacity = -(-replay.buffer_size // num_envs) * num_envs
    if replay.prioritized == "proportional":
        return ProportionalPriorities(capacity, replay.priority_alpha)
    if replay.prioritized == "rank":
        return RankBasedPriorities(capacity, replay.priority_alpha)
    return None


def learn_from_replay(
    config: ReplayLearnerConfig, replay: ReplayBuffer, learner: ReplayLearner, env_steps: int
) -> dict[str, float]:
    """``replay.gradient_steps`` updates on replay batches, with new priorities for
    prioritized replay (importance exponent annealed from ``priority_beta`` to 1 over
    ``optim.anneal_steps`` or the run); returns the mean metrics of the updates.

    On the CPU each step's priorities are written back at once. A GPU learner's are written
    back once per iteration, with one host copy instead of a host synchronisation per step:
    the steps of an iteration sample with the priorities of the iterations before, as Ape-X's
    learner does (Horgan et al. 2018). Its losses are checked for NaN here too, once per
    iteration, when the metrics reach the host (`shoal.optim.check_finite_metrics`)."""
    settings = config.replay
    prioritized = settings.prioritized != "none"
    anneal = config.optim.anneal_steps or config.run.total_steps
    beta0 = settings.priority_beta
    beta = beta0 + (1.0 - beta0) * min(1.0, env_steps / anneal)
    history, pending = [], []
    for _ in range(settings.gradient_steps):
        batch = replay.sample(settings.batch_size, beta)
        stats, priorities = learner.update(batch)
        if prioritized and priorities.device.type == "cpu":
            replay.update_priorities(batch.indices, priorities.detach().numpy())
        elif prioritized:
            pending.append((batch.indices, priorities.detach()))
        history.append(torch.stack(list(stats.values())))
    if pending:  # a GPU learner's priorities: one host copy per iteration
        host = torch.cat([p for _, p in pending]).cpu().numpy()
        for k, (indices, _) in enumerate(pending):
            replay.update_priorities(
                indices, host[k * settings.batch_size : (k + 1) * settings.batch_size]
            )
    means = history[0] if len(history) == 1 else torch.stack(history).mean(0)
    metrics = dict(zip(stats, means.tolist(), strict=True))
    check_finite_metrics(metrics)
    metrics["train/grad_steps"] = learner.grad_steps
    if prioritized:
        metrics["train/beta"] = beta
    return metrics


def replay_runner(
    config: Any,
    model_fn: Callable[[Any, gym.Space, gym.Space], nn.Module],
    env: EnvConfig,
    seed: int,
) -> EnvRunner:
    """The env runner of a replay learner: ``env``'s envs acting with ``model_fn``'s network
    for ``config.rollout_steps`` vector steps per sample."""
    return EnvRunner(
        env,
        lambda obs_space, action_space: model_fn(config, obs_space, action_space),
        config.rollout_steps,
        seed=seed,
        acting=config.model.backend,
        compiled=config.run.compile,
    )


def random_start(learner: Any, config: Any, env_steps: int) -> dict[str, float]:
    """The actor-critics' exploration: uniformly random actions until
    ``replay.learning_starts`` env steps, then the learner's own (noise, entropy)."""
    cast(RandomStartLearner, learner).set_random_actions(env_steps < config.replay.learning_starts)
    return {}


Exploration = Callable[[Any, Any, int], dict[str, float]]
"""``exploration(learner, config, env_steps) -> metrics``: sets how the learner acts in the
coming iteration (`random_start`; DQN's annealed epsilon, `shoal.algos.value.dqn`)."""


class ReplayAlgorithm:
    """One iteration: set exploration, act for ``rollout_steps`` vector steps, store them,
    learn from replay. DQN, DDPG, TD3, SAC and D4PG are this with their parts passed in.

    Args:
        config: a `ReplayConfig`.
        learner_fn: ``learner_fn(config, obs_space, action_space)`` builds the learner.
        model_fn: ``model_fn(config, obs_space, action_space)`` builds the acting network for
            the samplers (the learner's ``policy_network`` architecture).
        exploration: sets the learner's exploration before each iteration's acting.
        frame_replay: store stacked frames once each (`shoal.data.frame_replay`).
    """

    def __init__(
        self,
        config: Any,
        learner_fn: Callable[[Any, gym.Space, gym.Space], ReplayLearner],
        model_fn: Callable[[Any, gym.Space, gym.Space], nn.Module],
        exploration: Exploration = random_start,
        frame_replay: bool = False,
    ):
        self.exploration = exploration
        self.config = config
        runner = replay_runner(config, model_fn, config.env, derive_seed(config.run.seed, "env", 0))
        self.sampler = LocalSampler(runner)
        env = runner.env
        self.learner = learner_fn(config, env.observation_space, env.action_space)
        mask_dim = None if env.action_mask is None else int(as_discrete(env.action_space).n)
        frame_stack = stack_size(env.observation_space) if frame_replay else None
        self.replay = ReplayBuffer(
            config.replay.buffer_size,
            env.num_envs,
            env.observation_space,
            env.action_space,
            n_step=config.replay.n_step,
            action_mask_dim=mask_dim,
            priorities=make_priorities(config.replay, env.num_envs),
            seed=derive_seed(config.run.seed, "replay", 0),
            frame_stack=frame_stack,
            device=self.learner.device,
        )
        self.env_steps = 0
        self.iteration = 0

    def train_iteration(self) -> dict[str, float]:
        cfg = self.config
        metrics = self.exploration(self.learner, cfg, self.env_steps)
        self.sampler.set_weights(self.learner.get_weights())
        rollout, episodes = self.sampler.sample()
        self.replay.extend(*rollout.transitions())
        self.env_steps += rollout.rewards.numel()
        self.iteration += 1
        if self.env_steps > cfg.replay.learning_starts and self.replay.num_sampleable() > 0:
            metrics.update(self._learn())
        metrics.update(episodes.metrics())
        return metrics

    def _learn(self) -> dict[str, float]:
        return learn_from_replay(self.config, self.replay, self.learner, self.env_steps)

    def policy(self) -> ActorPolicy:
        return ActorPolicy(
            uncompiled_copy(self.learner.policy_network),
            self.sampler.obs_stats(),
            self.config.env.clip_obs,
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "learner": self.learner.state_dict(),
            "sampler": self.sampler.get_state(),
            "replay": self.replay.state_dict() if self.config.replay.save else None,
            "policy": {
                "model": self.learner.policy_network.state_dict(),
                "obs_stats": self.sampler.obs_stats(),
            },
            "counters": {"env_steps": self.env_steps, "iteration": self.iteration},
        }

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore; returns whether the envs were restored mid-episode (a replay that was not
        saved refills: the training loop reads that from ``state``)."""
        self.learner.load_state_dict(state["learner"])
        self.sampler.set_weights(self.learner.get_weights())
        self.env_steps = state["counters"]["env_steps"]
        self.iteration = state["counters"]["iteration"]
        replay_restored = state.get("replay") is not None
        if replay_restored:
            self.replay.load_state_dict(state["replay"])
        fallback = derive_seed(self.config.run.seed, "env-restart", self.iteration)
        return self.sampler.set_state(state["sampler"], fallback)

    def close(self) -> None:
        self.sampler.close()
