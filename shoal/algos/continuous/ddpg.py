"""Deep Deterministic Policy Gradient (Lillicrap et al. 2015, arXiv:1509.02971).

A deterministic actor ``mu(s)`` and a critic ``Q(s, a)``, both with slowly tracking target
networks. The critic regresses toward ``r + gamma Q'(s', mu'(s'))``; the actor follows the
critic's action gradient. Exploration adds Gaussian or Ornstein-Uhlenbeck noise to the actor's
actions (RLlib's noise_scale, exploration_theta, exploration_sigma). n-step returns,
prioritized replay, the Huber loss and L2 regularization of the critic are config fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import torch

from shoal.algos.cores.actor_critic_replay import (
    ActorCriticCore,
    ActorCriticLearner,
    ActorCriticReplayConfig,
)
from shoal.algos.cores.off_policy import ReplayAlgorithm
from shoal.algos.spec import AlgorithmSpec
from shoal.config import NoiseConfig
from shoal.core.types import ReplayBatch
from shoal.envs.shapes import shape_of
from shoal.losses.actor_critic import deterministic_actor_loss, ensemble_td_loss, twin_min_target
from shoal.nn.actors import DeterministicActor
from shoal.nn.critics import CriticEnsemble


@dataclass(frozen=True)
class DDPGConfig(ActorCriticReplayConfig):
    """DDPG hyperparameters; the shared replay and network settings are documented on
    `ActorCriticReplayConfig`."""

    noise: NoiseConfig = field(default_factory=lambda: NoiseConfig(kind="ou"))
    """Exploration noise on the actor's actions."""


def build_model(config: Any, obs_space: gym.Space, action_space: gym.Space) -> DeterministicActor:
    """The deterministic actor of DDPG, TD3 and D4PG: any config with ``model`` and ``noise``."""
    return DeterministicActor(obs_space, action_space, config.model, config.noise)


def deterministic_critic(
    config: ActorCriticReplayConfig, obs_space: gym.Space, action_space: gym.Space, **kwargs
) -> CriticEnsemble:
    """A critic ensemble over (observation, unit-box action) inputs; ``kwargs`` give
    ``out_dim`` and ``members``."""
    return CriticEnsemble(obs_space, shape_of(action_space)[0], model=config.model, **kwargs)


class DDPGLearner(ActorCriticLearner[DeterministicActor]):
    def __init__(self, config: DDPGConfig, obs_space: gym.Space, action_space: gym.Space):
        self.config = config
        actor = build_model(config, obs_space, action_space)
        critic = deterministic_critic(config, obs_space, action_space, out_dim=1, members=1)
        self.core = ActorCriticCore(config, actor, critic, target_actor=True)

    def update(self, batch: ReplayBatch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        core = self.core
        batch = core.batch(batch)
        returns, discounts = core.bootstrap(batch)
        with torch.no_grad():
            next_actions = core.target_policy(batch.next_obs)
            next_q = core.target_critic(batch.next_obs, next_actions).squeeze(-1)
        target = twin_min_target(returns, discounts, next_q)
        q = core.critic(batch.obs, core.unit_actions(batch.actions)).squeeze(-1)
        critic_loss, priorities = ensemble_td_loss(
            q, target, batch.weights, self.config.critic_loss
        )
        policy_q = core.critic(batch.obs, core.actor(batch.obs), detach_weights=True)
        actor_loss = deterministic_actor_loss(policy_q[0, :, 0])
        core.step({"critic": critic_loss, "actor": actor_loss})
        core.update_targets()
        metrics = {
            "loss/critic": critic_loss.detach(),
            "loss/actor": actor_loss.detach(),
            "train/q_mean": q.detach().mean(),
        }
        return metrics, priorities


class DDPG(ReplayAlgorithm):
    def __init__(self, config: DDPGConfig):
        super().__init__(config, DDPGLearner, build_model)


SPECS = (
    AlgorithmSpec(
        "ddpg",
        DDPGConfig,
        DDPG,
        build_model,
        "DDPG: deterministic actor, Q critic, target networks, Gaussian or OU exploration",
        "Box (bounded)",
        runners=True,
        learner_groups=True,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
