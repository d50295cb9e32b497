"""Twin Delayed DDPG (Fujimoto et al. 2018, arXiv:1802.09477).

DDPG with three changes against overestimation: two critics and the smaller of their targets
(clipped double-Q), actor and target updates only every ``policy_delay`` critic updates, and
target policy smoothing (clipped Gaussian noise on the target action). It shares DDPG's
networks and the pure losses of `shoal.losses.actor_critic`, not its class.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
from shoal.config import NoiseConfig, check, check_positive
from shoal.core.types import ReplayBatch
from shoal.losses.actor_critic import (
    deterministic_actor_loss,
    ensemble_td_loss,
    smoothed_target_actions,
    twin_min_target,
)
from shoal.nn.actors import DeterministicActor


@dataclass(frozen=True)
class TD3Config(ActorCriticReplayConfig):
    """TD3 hyperparameters (the paper's defaults); the shared replay and network settings are
    documented on `ActorCriticReplayConfig`."""

    noise: NoiseConfig = field(default_factory=lambda: NoiseConfig(kind="gaussian", scale=0.1))
    """Exploration noise on the actor's actions (the paper: Gaussian, std 0.1 of the range)."""
    policy_delay: int = 2
    """Critic updates per actor and target update."""
    target_noise: float = 0.2
    """Std of the smoothing noise on target actions (unit box)."""
    target_noise_clip: float = 0.5
    """The smoothing noise is clipped to [-target_noise_clip, target_noise_clip]."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "policy_delay")
        check(self, "target_noise", self.target_noise >= 0, "must be >= 0")
        check(self, "target_noise_clip", self.target_noise_clip >= 0, "must be >= 0")


ActorObjective = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``objective(q, policy_actions, data_actions)``: the actor's loss from the first critic's
``[N]`` values of its ``[N, d]`` unit-box actions (and the batch's actions); TD3+BC passes
its own."""


def _deterministic_objective(q, policy_actions, data_actions):
    return deterministic_actor_loss(q)


class TD3Learner(ActorCriticLearner[DeterministicActor]):
    def __init__(
        self,
        config: TD3Config,
        obs_space: gym.Space,
        action_space: gym.Space,
        actor_objective: ActorObjective = _deterministic_objective,
    ):
        self.config = config
        self.actor_objective = actor_objective
        actor = build_model(config, obs_space, action_space)
        critic = deterministic_critic(config, obs_space, action_space, out_dim=1, members=2)
        self.core = ActorCriticCore(config, actor, critic, target_actor=True)
        self.actor_loss = torch.zeros((), device=self.core.device)
        """The latest actor loss, reported between delayed actor updates."""

    def update(self, batch: ReplayBatch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        cfg, core = self.config, self.core
        batch = core.batch(batch)
        returns, discounts = core.bootstrap(batch)
        with torch.no_grad():
            next_actions = smoothed_target_actions(
                core.target_policy(batch.next_obs), cfg.target_noise, cfg.target_noise_clip
            )
            next_q = core.target_critic(batch.next_obs, next_actions).squeeze(-1)
        target = twin_min_target(returns, discounts, next_q)
        data_actions = core.unit_actions(batch.actions)
        q = core.critic(batch.obs, data_actions).squeeze(-1)
        critic_loss, priorities = ensemble_td_loss(q, target, batch.weights, cfg.critic_loss)
        update_actor = (core.grad_steps + 1) % cfg.policy_delay == 0
        losses = {"critic": critic_loss}
        if update_actor:  # the actor follows the first critic, as in the paper
            actions = core.actor(batch.obs)
            policy_q = core.critic(batch.obs, actions, detach_weights=True)
            self.actor_loss = losses["actor"] = self.actor_objective(
                policy_q[0, :, 0], actions, data_actions
            )
        core.step(losses)
        if update_actor:
            core.update_targets()
        metrics = {
            "loss/critic": critic_loss.detach(),
            "loss/actor": self.actor_loss.detach(),
            "train/q_mean": q.detach().mean(),
        }
        return metrics, priorities

    def state_dict(self) -> dict[str, Any]:
        return {**self.core.state_dict(), "actor_loss": self.actor_loss.detach().clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.core.load_state_dict(state)
        self.actor_loss = state["actor_loss"].to(self.core.device)


class TD3(ReplayAlgorithm):
    def __init__(self, config: TD3Config):
        super().__init__(config, TD3Learner, build_model)


SPECS = (
    AlgorithmSpec(
        "td3",
        TD3Config,
        TD3,
        build_model,
        "TD3: DDPG with twin critics, delayed policy updates and target policy smoothing",
        "Box (bounded)",
        runners=True,
        learner_groups=True,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
