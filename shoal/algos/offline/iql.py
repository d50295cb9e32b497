"""Implicit Q-learning (Kostrikov et al. 2021, "Offline reinforcement learning with implicit
Q-learning", arXiv:2110.06169): learn values without ever querying an action the dataset
did not take.

Three networks, three losses, one optimizer step:

1. ``V(s)`` regresses on the target critics' ``min_m Q_m(s, a)`` at the dataset's actions
   with the expectile loss: an upper expectile estimates the best action's value among those
   the data supports (`expectile_loss`).
2. The critics regress on ``r + gamma V(s')`` (n-step windows, as replay cuts them).
3. The policy clones the dataset's actions weighted by ``exp(beta (Q - V))``: advantage-
   weighted regression (`advantage_weights`), with a Gaussian policy for continuous actions
   (`GaussianActor`) and a softmax for discrete ones.

IQL continues online from its offline weights (``--online``; the paper's fine-tuning).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import torch
from torch import nn
from torch.nn import functional as F

from shoal.algos.cores import offline as offline_core
from shoal.algos.cores.actor_critic_replay import ActorCriticCore, ActorCriticLearner
from shoal.algos.cores.offline import OfflineAlgorithm, OfflineConfig
from shoal.algos.spec import AlgorithmSpec
from shoal.config import check, check_positive
from shoal.core.types import ReplayBatch
from shoal.fast.backend import place
from shoal.losses.actor_critic import ensemble_td_loss
from shoal.losses.offline import advantage_weights, expectile_loss, weighted_log_likelihood_loss
from shoal.nn.actors import CategoricalActor, GaussianActor
from shoal.nn.critics import CriticEnsemble, q_ensemble, taken_q


@dataclass(frozen=True)
class IQLConfig(OfflineConfig):
    """IQL's settings (the paper's MuJoCo ones: lr 3e-4, expectile 0.7, temperature 3);
    the replay, network and offline settings are documented on `OfflineConfig`."""

    expectile: float = 0.7
    """tau of V's expectile regression: 0.5 is SARSA's mean, toward 1 the max."""
    temperature: float = 3.0
    """beta of the advantage weights exp(beta * (Q - V))."""
    max_weight: float = 100.0
    """Cap of the advantage weights."""
    value_lr: float | None = None
    """Learning rate of V (None: optim.lr)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self, "expectile", 0.0 < self.expectile < 1.0, "must be in (0, 1)")
        check(self, "temperature", self.temperature >= 0, "must be >= 0")
        check_positive(self, "max_weight")
        if self.value_lr is not None:
            check_positive(self, "value_lr")


def build_model(config: IQLConfig, obs_space: gym.Space, action_space: gym.Space) -> nn.Module:
    if isinstance(action_space, gym.spaces.Discrete):
        return CategoricalActor(obs_space, action_space, config.model)
    return GaussianActor(obs_space, action_space, config.model)


class IQLLearner(ActorCriticLearner):
    def __init__(self, config: IQLConfig, obs_space: gym.Space, action_space: gym.Space):
        self.config = config
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        actor = build_model(config, obs_space, action_space)
        critic = q_ensemble(obs_space, action_space, config.model)
        self.value = CriticEnsemble(obs_space, 0, 1, config.model, members=1)
        value_lr = config.value_lr or config.optim.lr
        self.core = ActorCriticCore(
            config, actor, critic, target_actor=False,
            extra=[(list(self.value.parameters()), value_lr)],
        )  # fmt: skip
        place(self.value, self.core.device, config.run.compile)

    def update(self, batch: ReplayBatch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        cfg, core = self.config, self.core
        batch = core.batch(batch)
        returns, discounts = core.bootstrap(batch)
        actions = batch.actions if self.discrete else core.unit_actions(batch.actions)
        with torch.no_grad():
            target_q = self._q(core.target_critic, batch.obs, actions).min(dim=0).values
            target = returns + discounts * self.value(batch.next_obs)[0, :, 0]
        v = self.value(batch.obs)[0, :, 0]
        value_loss = expectile_loss(target_q - v, cfg.expectile)
        q = self._q(core.critic, batch.obs, actions)
        critic_loss, priorities = ensemble_td_loss(q, target, batch.weights, cfg.critic_loss)
        weights = advantage_weights(target_q - v, cfg.temperature, cfg.max_weight)
        actor_loss = weighted_log_likelihood_loss(self._log_prob(batch.obs, actions), weights)
        core.step({"critic": critic_loss, "value": value_loss, "actor": actor_loss})
        core.update_targets()
        metrics = {
            "loss/critic": critic_loss.detach(),
            "loss/value": value_loss.detach(),
            "loss/actor": actor_loss.detach(),
            "train/q_mean": q.detach().mean(),
            "train/v_mean": v.detach().mean(),
            "train/weight_mean": weights.mean(),
        }
        return metrics, priorities

    def _q(self, critic: nn.Module, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """``[2, N]`` Q-values of the dataset's actions."""
        if not self.discrete:
            return critic(obs, actions).squeeze(-1)
        return taken_q(critic(obs), actions)

    def _log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        actor = self.core.actor
        if not self.discrete:
            return actor.log_prob(obs, actions)
        log_probs = F.log_softmax(actor.logits(actor.features(obs)), dim=-1)
        return log_probs.gather(-1, actions.long().view(-1, 1)).squeeze(-1)

    def state_dict(self) -> dict[str, Any]:
        return {**self.core.state_dict(), "value": self.value.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.core.load_state_dict(state)
        self.value.load_state_dict(state["value"])


class IQL(OfflineAlgorithm):
    def __init__(self, config: IQLConfig):
        super().__init__(config, IQLLearner, build_model)


# ``iql`` is the multi-agent independent Q-learning (`shoal.algos.multi_agent.qmix`), so
# implicit Q-learning is ``iql-offline``.
SPECS = (
    AlgorithmSpec(
        "iql-offline",
        IQLConfig,
        IQL,
        build_model,
        "Implicit Q-learning: expectile values, advantage-weighted policy (offline, then online)",
        "Box (bounded), Discrete",
        prepare=offline_core.prepare,
        counts=offline_core.counts,
        own_spaces=True,
        extra_evaluation=True,
        runners=True,
        learner_groups=True,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
