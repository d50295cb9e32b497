"""What the on-policy algorithms (PPO, A2C, REINFORCE, TRPO, ACKTR, APPO, IMPALA) hold:
`ModelLearner` (a model, its optimizer, device and precision, and their checkpoint state) and
`OnPolicyCore` (the sampler, the counters, the weights broadcast after each update, the
checkpoint layout), which each algorithm holds and calls from its own iteration. Their
batches are in `shoal.algos.cores.rollout_batch`, their settings checks in
`shoal.algos.cores.checks`, their metrics in `shoal.algos.cores.metrics` and their
optimizers in `shoal.optim`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import gymnasium as gym
import torch

from shoal.algos.cores.checks import masked_config
from shoal.algos.cores.learner_group import LearnerGroup, ReplayLearnerGroup
from shoal.collect import make_sampler
from shoal.core.device import (
    check_precision,
    grad_scaler,
    load_scaler_state,
    resolve_device,
    scaler_state,
    to_host,
)
from shoal.core.seeding import derive_seed
from shoal.core.types import EpisodeStats, Rollout
from shoal.fast.backend import place, uncompiled_copy
from shoal.nn.heads import apply_temperature
from shoal.nn.policy import ActorPolicy
from shoal.optim import build_optimizer

Model = TypeVar("Model", bound=torch.nn.Module)


class ModelLearner(Generic[Model]):
    """What every on-policy learner has around its update: one ``model`` on the run's device
    whose weights go to the samplers, its ``optimizer``, and their checkpoint state."""

    model: Model
    optimizer: torch.optim.Optimizer

    def setup(
        self,
        config: Any,
        model: Model,
        make_optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer] | None = None,
    ) -> None:
        """Put ``model`` on ``config.run.device`` (compiled with ``run.compile``) and build its
        optimizer (``make_optimizer(parameters)``; by default AdamW with ``config.optim``'s
        settings), and float16's gradient scaler (``model.precision``)."""
        self.device = resolve_device(config.run.device)
        check_precision(config.model.precision, self.device)
        self.model = place(model, self.device, config.run.compile)
        self.parameters: list[torch.Tensor] = list(self.model.parameters())
        if make_optimizer is None:
            optim = config.optim
            decay = optim.weight_decay
            self.optimizer = build_optimizer(self.parameters, "adamw", optim.lr, optim.eps, decay)
        else:
            self.optimizer = make_optimizer(self.parameters)
        self.scaler = grad_scaler(config.model.precision, self.device)

    def get_weights(self) -> dict[str, torch.Tensor]:
        """The model's ``state_dict()``: detached tensors sharing the weights' memory (a
        receiver copies them). The module walk is done once: ``state_dict`` visits every
        submodule, which costs more than the copies on a small model, while the parameter
        and buffer objects of a built model stay the same (``load_state_dict`` and the
        optimizer write into them in place)."""
        cached = getattr(self, "_weight_entries", None)
        if cached is None or cached[0] is not self.model:
            cached = self._weight_entries = (self.model, self.model.state_dict(keep_vars=True))
        if self.device.type == "cpu":
            return {name: tensor.detach() for name, tensor in cached[1].items()}
        return to_host(cached[1])

    def set_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(weights)

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            **scaler_state(getattr(self, "scaler", None)),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        load_scaler_state(getattr(self, "scaler", None), state)


class OnPolicyCore:
    """What the on-policy algorithms (PPO, A2C, REINFORCE, TRPO, ACKTR, APPO, IMPALA, and
    for their sampling ACER and R2D2) hold, as the evolution family holds `Population`: one
    sampler over the env config, the learner, the counters, the temperature schedule, the
    weights handed to the sampler after each update, the deployable policy and the
    checkpoint layout. The algorithm builds it, calls `broadcast` once its own parts are
    set, and reads its iteration top to bottom in its own file.

    Args:
        config: the algorithm's config (``env``, ``run``, ``model``, ``optim``, ``gamma``,
            ``num_steps``).
        learner_cls: ``learner_cls(config, obs_space, action_space)``.
        build_model: ``build_model(config, obs_space, action_space)``: the sampler's network.
        name: the algorithm's name, for errors.
        takes_action_masks: whether its learner restricts the policy to the legal actions in
            the rollouts (an env that reports masks is refused otherwise).
        group: ``group(learner_cls, config, obs_space, action_space)`` builds the learner
            group of ``run.learners`` > 1 (`shoal.algos.cores.learner_group`): PPO's
            minibatches split, IMPALA's env columns, R2D2's sequences.
    """

    def __init__(
        self,
        config: Any,
        learner_cls: Callable[[Any, gym.Space, gym.Space], Any],
        build_model: Callable[[Any, gym.Space, gym.Space], Any],
        name: str,
        takes_action_masks: bool = True,
        group: Callable[..., Any] = LearnerGroup,
    ):
        self.config = config
        # Reward normalization scales by the std of returns discounted with the algorithm's gamma.
        env_config = dataclasses.replace(config.env, gamma=config.gamma)
        self.sampler = make_sampler(
            env_config,
            lambda obs_space, action_space: build_model(config, obs_space, action_space),
            config.num_steps,
            config.run,
            acting=config.model.backend,
        )
        sampler = self.sampler
        try:
            if sampler.action_masked:  # also multi-agent envs whose observations carry masks
                config = masked_config(config, name, takes_action_masks)
            # run.learners > 1: the same learner, data-parallel over a group of Ray actors.
            spaces = sampler.observation_space, sampler.action_space
            if config.run.learners == 1:
                self.learner = learner_cls(config, *spaces)
            else:
                self.learner = group(learner_cls, config, *spaces)
        except BaseException:
            sampler.close()  # its envs (and Ray runners) go with the failed start
            raise
        self.env_steps = 0
        self.episodes = 0
        self.iteration = 0
        self.temperature: float | None = None
        self.publish: Callable[[dict[str, torch.Tensor]], None] = sampler.set_weights
        """Where the learner's weights go after each update: the sampler's policy (APPO's
        sampler thread takes versioned copies instead, IMPALA's runners snapshots)."""

    def progress(self) -> float:
        """Fraction of the schedules' horizon done (``optim.anneal_steps`` or total steps)."""
        optim = self.config.optim
        return self.env_steps / (optim.anneal_steps or self.config.run.total_steps)

    def sample(self) -> tuple[Rollout, EpisodeStats]:
        """The next rollout, counted."""
        rollout, episodes = self.sampler.sample()
        self.count(rollout, episodes)
        return rollout, episodes

    def count(self, rollout: Rollout, episodes: EpisodeStats) -> None:
        """Add a rollout's env steps and episodes to the counters, and the iteration."""
        # Multi-agent envs have a row per (env, agent): count env steps and env episodes.
        agents = self.sampler.agents_per_env
        self.env_steps += rollout.rewards.numel() // agents
        self.episodes += episodes.returns.size // agents
        self.iteration += 1

    def finish_iteration(
        self, metrics: dict[str, float], episodes: EpisodeStats
    ) -> dict[str, float]:
        """After the update: log the temperature the rollout was sampled with, schedule the
        next one and hand the new weights to the sampler; add the episode metrics."""
        if self.temperature is not None:
            metrics["train/temperature"] = self.temperature
        if self.sampler.restarts:
            metrics["perf/sampler_restarts"] = self.sampler.restarts
        self.broadcast()
        metrics.update(episodes.metrics())
        return metrics

    def broadcast(self, set_temperature: bool = False) -> None:
        """Hand the learner's weights to ``publish``, with the temperature for the next
        rollout: the scheduled one, or with ``set_temperature`` the constant one (when the
        learner is built or its weights were loaded from a checkpoint, which may hold another
        value; nothing else changes it)."""
        # The temperature is a buffer of the weights, so the next rollout is sampled with it
        # and its update uses the same value, as probability ratios need.
        if set_temperature or self.config.model.temperature_min is not None:
            self.temperature = apply_temperature(
                self.learner.model, self.config.model, self.env_steps, self.episodes
            )
        self.publish(self.learner.get_weights())

    def policy(self) -> ActorPolicy:
        return ActorPolicy(
            uncompiled_copy(self.learner.model), self.sampler.obs_stats(), self.config.env.clip_obs
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "learner": self.learner.state_dict(),
            "sampler": self.sampler.get_state(),
            "policy": {
                "model": self.learner.model.state_dict(),
                "obs_stats": self.sampler.obs_stats(),
            },
            "counters": {
                "env_steps": self.env_steps,
                "episodes": self.episodes,
                "iteration": self.iteration,
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore, then hand the restored weights on (`broadcast`); returns False when the
        envs could not be restored mid-episode."""
        self.learner.load_state_dict(state["learner"])
        self.env_steps = state["counters"]["env_steps"]
        self.episodes = state["counters"]["episodes"]
        self.iteration = state["counters"]["iteration"]
        self.broadcast(set_temperature=True)
        fallback = derive_seed(self.config.run.seed, "env-restart", self.iteration)
        return self.sampler.set_state(state["sampler"], fallback)

    def close(self) -> None:
        self.sampler.close()
        if isinstance(self.learner, (LearnerGroup, ReplayLearnerGroup)):  # its Ray actors
            self.learner.close()


def held(name: str, part: str = "core") -> property:
    """A counter (``env_steps``, ``iteration``) or part (``learner``, ``sampler``) of an
    algorithm, read from the part it holds: the `Algorithm` protocol asks the algorithm."""
    return property(lambda self: getattr(getattr(self, part), name))
