"""What the replay-based learners share: the act-store-learn iteration (DQN, DDPG, TD3, SAC,
D4PG, and the pieces MADDPG reuses).

`ReplayAlgorithm` is the iteration: act for ``rollout_steps`` vector steps with the latest
weights, store them in replay, then take ``gradient_steps`` gradient steps on replay batches
(after ``learning_starts`` env steps). An algorithm gives it a learner and decides what the
samplers' exploration looks like each iteration (its ``exploration``). The actor-critics'
settings and learner core are in `shoal.algos.cores.actor_critic_replay`.

Sampling is in-process, or on ``run.runners`` Ray actors (`shoal.collect.make_sampler`), each
stepping its own ``env.num_envs`` envs: their rollouts are joined along the env axis and
stored as one vector step of ``runners x env.num_envs`` envs, and the iteration takes
``runners x gradient_steps`` gradient steps, so that updates per env step are the same as
in-process. With ``replay.max_lag`` k >= 1 a sampler thread (`shoal.collect.ahead`) samples
rollout n with the weights of iteration n - k while the learner trains on the replay, exactly
as many iterations behind whatever the timing.

With ``run.learners`` N > 1 the learner is a group of N data-parallel copies on Ray
(`shoal.algos.cores.learner_group.ReplayLearnerGroup`): each replay batch is split among them
and the result is one update on the whole batch.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, Protocol, cast

import gymnasium as gym
import torch
from torch import nn

from shoal.algos.cores.learner_group import ReplayLearnerGroup
from shoal.collect import make_sampler
from shoal.collect.ahead import AheadSampler
from shoal.config import EnvConfig, ModelConfig, OptimConfig, ReplayConfig, RunConfig
from shoal.config.checks import check
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
    config: ReplayLearnerConfig,
    replay: ReplayBuffer,
    learner: ReplayLearner,
    env_steps: int,
    rollouts: int = 1,
) -> dict[str, float]:
    """``rollouts x replay.gradient_steps`` updates on replay batches (``rollouts``: the
    rollouts of ``env.num_envs`` envs the iteration stored, one per runner), with new priorities for
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
    for _ in range(settings.gradient_steps * rollouts):
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


def random_start(learner: Any, config: Any, env_steps: int) -> dict[str, float]:
    """The actor-critics' exploration: uniformly random actions until
    ``replay.learning_starts`` env steps, then the learner's own (noise, entropy)."""
    cast(RandomStartLearner, learner).set_random_actions(env_steps < config.replay.learning_starts)
    return {}


Exploration = Callable[[Any, Any, int], dict[str, float]]
"""``exploration(learner, config, env_steps) -> metrics``: sets how the learner acts in the
coming iteration (`random_start`; DQN's annealed epsilon, `shoal.algos.value.dqn`)."""


class ReplayAlgorithm:
    """One iteration: act for ``rollout_steps`` vector steps, store them, learn from replay,
    set exploration for the next rollout. DQN, DDPG, TD3, SAC and D4PG are this with their
    parts passed in. Sampling runs in-process or on Ray runners, in step with learning or
    ``replay.max_lag`` iterations ahead of it (module docstring).

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
        batch = config.replay.batch_size
        split = f"must be <= replay.batch_size ({batch}): each batch is split among the learners"
        check(config.run, "learners", config.run.learners <= batch, split)
        self.exploration = exploration
        self.config = config
        self.sampler = make_sampler(
            config.env,
            functools.partial(model_fn, config),
            config.rollout_steps,
            config.run,
            acting=config.model.backend,
            own_stream=True,  # one synchronous Ray runner is then the in-process run
        )
        spaces = self.sampler.observation_space, self.sampler.action_space
        try:
            self.learner = self._build_learner(learner_fn, config, spaces)
        except BaseException:
            self.sampler.close()  # its envs (and Ray runners) go with the failed start
            raise
        num_envs = self.sampler.num_envs
        masked = self.sampler.action_masked
        frame_stack = stack_size(spaces[0]) if frame_replay else None
        self.replay = ReplayBuffer(
            config.replay.buffer_size,
            num_envs,
            *spaces,
            n_step=config.replay.n_step,
            action_mask_dim=int(as_discrete(spaces[1]).n) if masked else None,
            priorities=make_priorities(config.replay, num_envs),
            seed=derive_seed(config.run.seed, "replay", 0),
            frame_stack=frame_stack,
            device=self.learner.device,
        )
        self.env_steps = 0
        self.iteration = 0
        self.ahead: AheadSampler | None = None
        self._explored: dict[str, float] = {}
        """The metrics of the exploration set for the next rollout."""
        if config.replay.max_lag > 0:
            self.ahead = AheadSampler(self.sampler, config.replay.max_lag)
            self._explore_and_publish()

    @staticmethod
    def _build_learner(
        learner_fn: Callable[[Any, gym.Space, gym.Space], ReplayLearner],
        config: Any,
        spaces: tuple[gym.Space, gym.Space],
    ) -> ReplayLearner:
        """The learner, or with ``run.learners`` > 1 a group of them splitting each batch."""
        if config.run.learners == 1:
            return learner_fn(config, *spaces)
        return ReplayLearnerGroup(learner_fn, config, *spaces)

    def _explore_and_publish(self) -> None:
        """Set the exploration of the coming rollouts; sampling ahead, publish the weights
        (with it) as version ``iteration``."""
        self._explored = self.exploration(self.learner, self.config, self.env_steps)
        if self.ahead is not None:
            self.ahead.publish(self.iteration, self.learner.get_weights())

    def train_iteration(self) -> dict[str, float]:
        cfg = self.config
        if self.ahead is None:
            self._explore_and_publish()
            self.sampler.set_weights(self.learner.get_weights())
            rollout, episodes = self.sampler.sample()
            restarted, lag = self.sampler.last_restarted, {}
        else:
            start = time.perf_counter()
            ahead = self.ahead.take(self.iteration)
            rollout, episodes, restarted = ahead.rollout, ahead.episodes, ahead.restarted
            lag = {
                "train/policy_lag": float(self.iteration - ahead.version),
                "perf/sample_wait_s": time.perf_counter() - start,
            }
        metrics = dict(self._explored)
        if restarted:  # their old actors' last steps were lost: cut those episodes
            per_runner = self.sampler.envs_per_runner
            self.replay.cut_episodes([i * per_runner + e for i in restarted
                                      for e in range(per_runner)])  # fmt: skip
        self.replay.extend(*rollout.transitions())
        self.env_steps += rollout.rewards.numel()
        self.iteration += 1
        if self.env_steps > cfg.replay.learning_starts and self.replay.num_sampleable() > 0:
            metrics.update(self._learn())
        if self.ahead is not None:
            self._explore_and_publish()
        metrics.update(lag)
        metrics.update(episodes.metrics())
        return metrics

    def _learn(self) -> dict[str, float]:
        runners = self.sampler.num_runners
        metrics = learn_from_replay(self.config, self.replay, self.learner, self.env_steps, runners)
        if isinstance(self.learner, ReplayLearnerGroup) and self.learner.restarts:
            metrics["perf/learner_restarts"] = self.learner.restarts
        return metrics

    def _stop_sampling(self) -> None:
        """Park the sampler thread between two rollouts (its envs can then be read)."""
        if self.ahead is not None:
            self.ahead.stop()

    def policy(self) -> ActorPolicy:
        if self.config.env.normalize_obs:
            self._stop_sampling()  # the normalizer's statistics, not while the thread updates them
        return ActorPolicy(
            uncompiled_copy(self.learner.policy_network),
            self.sampler.obs_stats(),
            self.config.env.clip_obs,
        )

    def state_dict(self) -> dict[str, Any]:
        self._stop_sampling()
        state = {
            "learner": self.learner.state_dict(),
            "sampler": self.sampler.get_state(),
            "replay": self.replay.state_dict() if self.config.replay.save else None,
            "policy": {
                "model": self.learner.policy_network.state_dict(),
                "obs_stats": self.sampler.obs_stats(),
            },
            "counters": {"env_steps": self.env_steps, "iteration": self.iteration},
        }
        if self.ahead is not None:
            state["ahead"] = {**self.ahead.get_state(), "explored": dict(self._explored)}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore; returns whether the envs were restored mid-episode (a replay that was not
        saved refills: the training loop reads that from ``state``)."""
        self._stop_sampling()
        self.learner.load_state_dict(state["learner"])
        self.sampler.set_weights(self.learner.get_weights())
        self.env_steps = state["counters"]["env_steps"]
        self.iteration = state["counters"]["iteration"]
        replay_restored = state.get("replay") is not None
        if replay_restored:
            self.replay.load_state_dict(state["replay"])
        if self.ahead is not None:
            if "ahead" in state:  # the rollouts sampled ahead and the versions still needed
                self.ahead.set_state(state["ahead"])
                self._explored = dict(state["ahead"]["explored"])
            else:  # saved in step: sampling ahead starts from here
                self.ahead.start_at(self.iteration)
                self._explore_and_publish()
        fallback = derive_seed(self.config.run.seed, "env-restart", self.iteration)
        return self.sampler.set_state(state["sampler"], fallback)

    def close(self) -> None:
        if self.ahead is not None:
            self.ahead.close()
        self.sampler.close()
        if isinstance(self.learner, ReplayLearnerGroup):  # its Ray actors and placement group
            self.learner.close()
