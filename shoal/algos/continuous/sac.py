"""Soft Actor-Critic (Haarnoja et al. 2018, arXiv:1801.01290 and arXiv:1812.05905), and its
discrete-action variant (Christodoulou 2019, arXiv:1910.07207).

A stochastic actor maximizes return plus ``alpha`` times its entropy. Continuous actions come
from a tanh-squashed Gaussian (with the change-of-variables correction of its log-density);
two critics and the smaller of their soft targets fight overestimation; ``alpha`` is tuned
automatically toward a target entropy. With a Discrete action space the actor is a softmax
and the expectations over actions are computed exactly instead of sampled.

An update is one backward pass and one optimizer step over the critic, actor and temperature
losses together (see `ActorCriticCore`), and both critics are one batched network
(`CriticEnsemble`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import gymnasium as gym
import torch
from torch import nn

from shoal.algos.cores.actor_critic_replay import (
    ActorCriticCore,
    ActorCriticLearner,
    ActorCriticReplayConfig,
)
from shoal.algos.cores.off_policy import ReplayAlgorithm
from shoal.algos.spec import AlgorithmSpec
from shoal.config import check, check_positive
from shoal.core.device import resolve_device
from shoal.core.types import ReplayBatch
from shoal.envs.shapes import shape_of
from shoal.losses.actor_critic import (
    discrete_sac_actor_loss,
    discrete_soft_value,
    ensemble_td_loss,
    entropy_temperature_loss,
    sac_actor_loss,
    soft_q_target,
)
from shoal.nn.actors import CategoricalActor, SquashedGaussianActor
from shoal.nn.critics import q_ensemble, taken_q


@dataclass(frozen=True)
class SACConfig(ActorCriticReplayConfig):
    """SAC hyperparameters (Stable-Baselines3's defaults); the shared replay and network
    settings are documented on `ActorCriticReplayConfig`."""

    init_alpha: float = 1.0
    """Initial entropy temperature."""
    learn_alpha: bool = True
    """Tune alpha toward target_entropy (False: keep init_alpha)."""
    alpha_lr: float | None = None
    """Learning rate of log(alpha) (None: optim.lr)."""
    entropy_backup: bool = True
    """Include -alpha log pi(a'|s') in the critics' target (SAC's soft backup); CQL's authors
    leave it out for MuJoCo."""
    target_entropy: float | None = None
    """Entropy to aim for; None: -dim(A) for continuous actions (the paper's heuristic) and
    0.98 * log(num_actions) for discrete ones (Christodoulou 2019)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "init_alpha")
        if self.alpha_lr is not None:
            check_positive(self, "alpha_lr")
        for name in ("init_alpha", "target_entropy"):
            value = getattr(self, name)
            check(self, name, value is None or math.isfinite(value), "must be finite")


def build_model(
    config: SACConfig, obs_space: gym.Space, action_space: gym.Space
) -> SquashedGaussianActor | CategoricalActor:
    if isinstance(action_space, gym.spaces.Discrete):
        return CategoricalActor(obs_space, action_space, config.model)
    return SquashedGaussianActor(obs_space, action_space, config.model)


def default_target_entropy(action_space: gym.Space) -> float:
    if isinstance(action_space, gym.spaces.Discrete):
        return 0.98 * math.log(int(action_space.n))
    return -float(shape_of(action_space)[0])


class CriticPenalty(Protocol):
    """A term added to the critic's loss (CQL's conservative penalty), passed to `SACLearner`
    as a part: its parameters join the optimizer, its state the checkpoints."""

    def param_groups(self) -> list[tuple[list[nn.Parameter], float]]: ...

    def __call__(
        self,
        core: ActorCriticCore,
        batch: ReplayBatch,
        data_q: torch.Tensor,
        all_q: torch.Tensor | None,
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Losses and metrics from the critics' ``[M, N]`` Q-values of the batch's actions
        (and ``[M, N, A]`` of every discrete action)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class SACLearner(ActorCriticLearner[SquashedGaussianActor | CategoricalActor]):
    def __init__(
        self,
        config: SACConfig,
        obs_space: gym.Space,
        action_space: gym.Space,
        penalty: CriticPenalty | None = None,
    ):
        self.config = config
        self.penalty = penalty
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        actor = build_model(config, obs_space, action_space)
        critic = q_ensemble(obs_space, action_space, config.model)
        device = resolve_device(config.run.device)  # log_alpha joins the optimizer there
        self.log_alpha = nn.Parameter(torch.tensor(math.log(config.init_alpha), device=device))
        self.target_entropy = (
            default_target_entropy(action_space)
            if config.target_entropy is None
            else config.target_entropy
        )
        extra = [] if penalty is None else penalty.param_groups()
        if config.learn_alpha:
            extra.append(([self.log_alpha], config.alpha_lr or config.optim.lr))
        self.core = ActorCriticCore(config, actor, critic, target_actor=False, extra=extra)

    def update(self, batch: ReplayBatch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        batch = self.core.batch(batch)
        if self.discrete:
            return self._update_discrete(batch)
        cfg, core, actor = self.config, self.core, self.core.actor
        assert isinstance(actor, SquashedGaussianActor)  # not discrete
        alpha = self.log_alpha.detach().exp()
        returns, discounts = core.bootstrap(batch)
        with torch.no_grad():
            next_actions, next_log_prob = actor.sample(batch.next_obs)
            next_q = core.target_critic(batch.next_obs, next_actions).squeeze(-1)
        backup_log_prob = next_log_prob if cfg.entropy_backup else None
        target = soft_q_target(returns, discounts, next_q, backup_log_prob, alpha)
        q = core.critic(batch.obs, core.unit_actions(batch.actions)).squeeze(-1)
        critic_loss, priorities = ensemble_td_loss(q, target, batch.weights, cfg.critic_loss)
        extra = self._penalty(batch, q, None)
        actions, log_prob = actor.sample(batch.obs)
        policy_q = core.critic(batch.obs, actions, detach_weights=True).squeeze(-1)
        actor_loss = sac_actor_loss(policy_q, log_prob, alpha)
        return self._finish(critic_loss, actor_loss, log_prob, q, alpha, priorities, extra)

    def _update_discrete(self, batch: ReplayBatch):
        cfg, core = self.config, self.core
        alpha = self.log_alpha.detach().exp()
        returns, discounts = core.bootstrap(batch)
        with torch.no_grad():
            next_probs = core.actor(batch.next_obs)
            backup_alpha = alpha if cfg.entropy_backup else 0.0
            next_q = core.target_critic(batch.next_obs)
            next_value = discrete_soft_value(next_probs, next_q, backup_alpha)
            target = returns + discounts * next_value
        q_all = core.critic(batch.obs)  # [2, N, A]
        q = taken_q(q_all, batch.actions)
        critic_loss, priorities = ensemble_td_loss(q, target, batch.weights, cfg.critic_loss)
        extra = self._penalty(batch, q, q_all)
        probs = core.actor(batch.obs)
        actor_loss = discrete_sac_actor_loss(probs, q_all, alpha)
        expected_log_prob = (probs * probs.clamp_min(1e-8).log()).sum(dim=-1)
        return self._finish(critic_loss, actor_loss, expected_log_prob, q, alpha, priorities, extra)

    def _penalty(self, batch, q, q_all):
        """The critic penalty's losses and metrics (none without a penalty)."""
        return ({}, {}) if self.penalty is None else self.penalty(self.core, batch, q, q_all)

    def _finish(self, critic_loss, actor_loss, log_prob, q, alpha, priorities, extra):
        losses = {"critic": critic_loss, "actor": actor_loss, **extra[0]}
        metrics = {
            **extra[1],
            "loss/critic": critic_loss.detach(),
            "loss/actor": actor_loss.detach(),
            "train/q_mean": q.detach().mean(),
            "train/alpha": alpha,
            "train/entropy": -log_prob.detach().mean(),
        }
        if self.config.learn_alpha:
            alpha_loss = entropy_temperature_loss(self.log_alpha, log_prob, self.target_entropy)
            losses["alpha"] = alpha_loss
            metrics["loss/alpha"] = alpha_loss.detach()
        self.core.step(losses)
        self.core.update_targets()
        return metrics, priorities

    def state_dict(self):
        state = {**self.core.state_dict(), "log_alpha": self.log_alpha.detach().clone()}
        if self.penalty is not None:
            state["penalty"] = self.penalty.state_dict()
        return state

    def load_state_dict(self, state):
        self.core.load_state_dict(state)
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        if self.penalty is not None:
            self.penalty.load_state_dict(state["penalty"])


class SAC(ReplayAlgorithm):
    def __init__(self, config: SACConfig):
        super().__init__(config, SACLearner, build_model)


SPECS = (
    AlgorithmSpec(
        "sac",
        SACConfig,
        SAC,
        build_model,
        "Soft Actor-Critic with automatic entropy tuning; discrete-action variant",
        "Box (bounded), Discrete",
        runners=True,
        learner_groups=True,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
