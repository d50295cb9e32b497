"""CTEDD's stage 1 learner (Gang Chen 2019, section 4.1; `shoal.algos.multi_agent.ctedd`):
the global policies, their exploration scales and the centralized critics, with Eq. (2) and
Eq. (4) on replay batches as MADDPG's, and Eq. (5) on the latest samples."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from shoal.algos.cores.actor_critic_replay import ActorCriticCore, ActorCriticLearner
from shoal.algos.multi_agent.ctedd_acting import exploration_scale, global_actor
from shoal.core.types import ReplayBatch
from shoal.fast.backend import place
from shoal.losses.actor_critic import deterministic_actor_loss, ensemble_td_loss
from shoal.losses.distillation import exploration_scale_loss
from shoal.nn.critics import CriticEnsemble, critic_inputs, own_action_inputs
from shoal.nn.local_policies import GlobalActor
from shoal.optim import build_optimizer, minimize


class CTEDDLearner(ActorCriticLearner[GlobalActor]):
    """Stage 1: the global policies, their exploration scales and the centralized critics
    (whose inputs are MADDPG's, `shoal.nn.critics.critic_inputs`)."""

    def __init__(self, config: Any, num_agents: int, action_dim: int, state_dim: int, offset: int):
        """``config``: a `shoal.algos.multi_agent.ctedd.CTEDDConfig` (which imports this
        module)."""
        self.config = config
        self.offset = offset
        """Where the state starts in a replay row (after the joint observations)."""
        n, self.num_agents, self.action_dim = num_agents, num_agents, action_dim
        actor = global_actor(config, n, action_dim, state_dim)
        space = gym.spaces.Box(-np.inf, np.inf, (state_dim,), np.float32)
        critic = CriticEnsemble(space, n * action_dim, 1, config.model, members=n)
        self.core = ActorCriticCore(config, actor, critic, target_actor=True)
        scale = exploration_scale(config, actor)
        self.scale = place(scale, self.device, config.run.compile)
        self.scale_optimizer = build_optimizer(
            self.scale.parameters(), "adam", config.exploration_lr, eps=1e-8
        )

    def update(self, batch: ReplayBatch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Eq. (2) for the critics and Eq. (4) for the deterministic parts, as MADDPG."""
        cfg, core, n = self.config, self.core, self.num_agents
        batch = core.batch(batch)
        returns, discounts = core.bootstrap(batch)
        state, next_state = batch.obs[:, self.offset :], batch.next_obs[:, self.offset :]
        replayed = batch.actions.float()
        with torch.no_grad():
            next_inputs = critic_inputs(next_state, core.target_policy(next_state))
            next_q = core.target_critic.evaluate(next_inputs).squeeze(-1)  # [N, M]
            target = returns.T + discounts * next_q
        q = core.critic.evaluate(critic_inputs(state, replayed)).squeeze(-1)
        critic_loss, errors = ensemble_td_loss(
            q.reshape(1, -1), target.reshape(-1), batch.weights.repeat(n), cfg.critic_loss
        )
        critic_loss = critic_loss * n
        inputs = own_action_inputs(state, replayed, core.actor(state))
        policy_q = core.critic.evaluate(inputs, detach_weights=True).squeeze(-1)
        actor_loss = deterministic_actor_loss(policy_q.reshape(-1)) * n
        core.step({"critic": critic_loss, "actor": actor_loss})
        core.update_targets()
        metrics = {
            "loss/critic": critic_loss.detach(),
            "loss/actor": actor_loss.detach(),
            "train/q_mean": q.detach().mean(),
        }
        return metrics, errors.view(n, -1).mean(dim=0)

    def exploration_update(
        self, state: torch.Tensor, sampled: torch.Tensor, alpha: float
    ) -> dict[str, float]:
        """Eq. (5) on the latest samples: ``state`` ``[K, S]``, ``sampled`` ``[K, N, d]``."""
        actor, critic = self.core.actor, self.core.critic
        state, sampled = state.to(self.device), sampled.to(self.device)
        with torch.no_grad():
            mean = actor(state)
            features = actor.features(state)
            q_sampled = critic.evaluate(critic_inputs(state, sampled.clamp(-1, 1)))
            q_mean = critic.evaluate(critic_inputs(state, mean))
            advantages = (q_sampled - q_mean).squeeze(-1).T  # [K, N]: agent i's critic
            if self.config.normalize_advantages and len(advantages) > 1:
                advantages = advantages / (advantages.std(dim=0) + 1e-6)
        scale = self.scale(features)
        loss, stats = exploration_scale_loss(sampled, mean, scale, advantages, alpha)
        minimize({"exploration": loss}, self.scale_optimizer, self.config.optim.max_grad_norm)
        return {
            "loss/exploration": loss.item(),
            "train/entropy": stats["entropy"].item(),
            "train/advantage": stats["advantage"].item(),
            "train/sigma_mean": scale.detach().mean().item(),
            "train/alpha": alpha,
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            **self.core.state_dict(),
            "scale": self.scale.state_dict(),
            "scale_optimizer": self.scale_optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.core.load_state_dict(state)
        self.scale.load_state_dict(state["scale"])
        self.scale_optimizer.load_state_dict(state["scale_optimizer"])
