"""Distributed Distributional DDPG's learner (Barth-Maron et al. 2018, arXiv:1804.08617).

DDPG with a categorical critic: the return distribution over ``num_atoms`` fixed atoms in
``[v_min, v_max]``, trained by cross-entropy toward the C51 projection of the n-step target
distribution (the projection of `shoal.losses.q_learning`, shared with DQN's C51 head). The
actor follows the gradient of the distribution's mean. n-step returns and prioritized replay
(priorities: the per-sample cross-entropy) are config fields; the paper's many distributed
actors are the Ray samplers' job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import gymnasium as gym
import torch

from shoal.algos.continuous.ddpg import build_model, deterministic_critic
from shoal.algos.cores.actor_critic_replay import (
    ActorCriticCore,
    ActorCriticLearner,
    ActorCriticReplayConfig,
)
from shoal.algos.cores.off_policy import ReplayAlgorithm
from shoal.algos.spec import AlgorithmSpec
from shoal.config import NoiseConfig, ReplayConfig, check
from shoal.core.types import ReplayBatch
from shoal.losses import categorical_projection, categorical_td_loss
from shoal.losses.actor_critic import deterministic_actor_loss
from shoal.nn.actors import DeterministicActor


@dataclass(frozen=True)
class D4PGConfig(ActorCriticReplayConfig):
    """D4PG hyperparameters; the shared replay and network settings are documented on
    `ActorCriticReplayConfig`."""

    noise: NoiseConfig = field(default_factory=lambda: NoiseConfig(kind="gaussian", scale=0.1))
    """Exploration noise on the actor's actions (the paper: Gaussian)."""
    replay: ReplayConfig = field(
        default_factory=lambda: ReplayConfig(
            buffer_size=1_000_000, batch_size=256, learning_starts=100, n_step=5
        )
    )
    """As `ActorCriticReplayConfig`'s, with 5-step returns (the paper's n = 5; the shoal 0.1
    field ``n_step`` names ``replay.n_step``)."""
    num_atoms: int = 51
    """Support size of the critic's return distribution."""
    v_min: float = -150.0
    """Lower end of the support (set it to the task's return range)."""
    v_max: float = 150.0
    """Upper end of the support."""

    UNUSED: ClassVar[dict[str, str]] = {
        **ActorCriticReplayConfig.UNUSED,
        "critic_loss": "its categorical critic learns by cross-entropy to the projected target",
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self, "num_atoms", self.num_atoms >= 2, "must be >= 2")
        check(self, "v_max", self.v_max > self.v_min, f"must be > v_min = {self.v_min}")


class D4PGLearner(ActorCriticLearner[DeterministicActor]):
    def __init__(self, config: D4PGConfig, obs_space: gym.Space, action_space: gym.Space):
        self.config = config
        actor = build_model(config, obs_space, action_space)
        critic = deterministic_critic(
            config, obs_space, action_space, out_dim=config.num_atoms, members=1
        )
        self.core = ActorCriticCore(config, actor, critic, target_actor=True)
        support = torch.linspace(config.v_min, config.v_max, config.num_atoms)
        self.support = support.to(self.core.device)

    def update(self, batch: ReplayBatch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        core = self.core
        batch = core.batch(batch)
        returns, discounts = core.bootstrap(batch)
        with torch.no_grad():
            next_actions = core.target_policy(batch.next_obs)
            next_logits = core.target_critic(batch.next_obs, next_actions)[0]
            target = categorical_projection(
                next_logits.softmax(dim=-1), self.support, returns, discounts
            )
        logits = core.critic(batch.obs, core.unit_actions(batch.actions))[0]
        critic_loss, priorities = categorical_td_loss(logits, target, batch.weights)
        policy_logits = core.critic(batch.obs, core.actor(batch.obs), detach_weights=True)[0]
        policy_q = (policy_logits.softmax(dim=-1) * self.support).sum(dim=-1)
        actor_loss = deterministic_actor_loss(policy_q)
        core.step({"critic": critic_loss, "actor": actor_loss})
        core.update_targets()
        q = (logits.detach().softmax(dim=-1) * self.support).sum(dim=-1)
        metrics = {
            "loss/critic": critic_loss.detach(),
            "loss/actor": actor_loss.detach(),
            "train/q_mean": q.mean(),
        }
        return metrics, priorities


class D4PG(ReplayAlgorithm):
    def __init__(self, config: D4PGConfig):
        super().__init__(config, D4PGLearner, build_model)


SPECS = (
    AlgorithmSpec(
        "d4pg",
        D4PGConfig,
        D4PG,
        build_model,
        "D4PG: DDPG with a categorical (C51) critic and n-step returns",
        "Box (bounded)",
        runners=True,
        learner_groups=True,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
