"""A2C: synchronous advantage actor-critic (Mnih et al. 2016, arXiv:1602.01783; the synchronous
variant of OpenAI Baselines, Wu et al. 2017).

Short rollouts over vector envs, n-step or GAE advantages bootstrapped from the critic (at the
rollout's end and at time-limit truncations, from the true final observation), one gradient step
per rollout on policy gradient + value loss - entropy bonus, with RMSProp as in the paper or
Adam. The rollout batch and its advantages are PPO's (`shoal.algos.ppo.make_batch`).

With an LSTM core (``model.lstm_hidden``) the update replays the rollout ``[T, B]`` in time
order from the state the sampler started it with (`Rollout.policy_state`), zeroing the state
at episode starts inside the rollout and detaching it every ``bptt_chunk`` steps (truncated
backpropagation through time); autoreset steps stay in the sequence but out of the loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import gymnasium as gym
import numpy as np
import torch

from shoal.algos.on_policy import (
    ModelLearner,
    OnPolicyAlgorithm,
    PPOBatch,
    PPOSequenceBatch,
    check_bptt_chunk,
    check_finite,
    make_batch,
    make_sequence_batch,
    rmsprop_or_adamw,
)
from shoal.algos.pg import gradient_step
from shoal.config import (
    EnvConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    check,
    check_choices,
    check_positive,
)
from shoal.losses import entropy_loss, policy_gradient_loss, value_loss
from shoal.losses.numpy_losses import (
    entropy_loss_and_grad,
    policy_gradient_loss_and_grad,
    value_loss_and_grad,
)
from shoal.nn import ActorCritic, RecurrentActorCritic, build_actor_critic
from shoal.nn.direct_grad import DirectGradActorCritic
from shoal.train.schedules import scheduled


@dataclass(frozen=True)
class A2CConfig:
    """A2C hyperparameters. The defaults are Stable-Baselines3's (5 steps, RMSProp 7e-4,
    entropy 0.0, gradient norm 0.5), which follow the A3C paper."""

    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=7e-4))
    model: ModelConfig = field(default_factory=ModelConfig)
    num_steps: int = 5
    """Steps per environment in each rollout: the n of the n-step returns."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 1.0
    """GAE lambda; 1.0 gives the paper's n-step returns bootstrapped from V(s_{t+n})."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus."""
    normalize_advantages: bool = False
    """Standardize the advantages within each rollout."""
    optimizer: Literal["rmsprop", "adam"] = "rmsprop"
    """rmsprop: as Mnih et al. 2016 / SB3 (smoothing rms_alpha, epsilon optim.eps = 1e-5,
    weight decay as an L2 term); adam: AdamW (decoupled weight decay)."""
    rms_alpha: float = 0.99
    """Smoothing constant of RMSProp's squared-gradient average."""
    bptt_chunk: int | None = None
    """Recurrent models (model.lstm_hidden): truncated backpropagation through time over
    pieces of this many steps per env (None: the whole rollout, num_steps). It must divide
    num_steps."""

    def __post_init__(self) -> None:
        check_positive(self, "num_steps")
        check_choices(self)
        check(self, "gamma", 0.0 <= self.gamma <= 1.0, "must be in [0, 1]")
        check(self, "gae_lambda", 0.0 <= self.gae_lambda <= 1.0, "must be in [0, 1]")
        check(self, "vf_coef", self.vf_coef >= 0, "must be >= 0")
        check(self, "ent_coef", self.ent_coef >= 0, "must be >= 0")
        check(self, "rms_alpha", 0.0 < self.rms_alpha < 1.0, "must be in (0, 1)")
        check(
            self,
            "env",
            self.env.action_mask == "none",
            "A2C does not use action masks yet; set env.action_mask to none",
        )
        check_bptt_chunk(self)

    @property
    def chunk(self) -> int:
        """Steps per truncated-BPTT piece of a recurrent model."""
        return self.bptt_chunk or self.num_steps


def build_model(
    config: A2CConfig, obs_space: gym.Space, action_space: gym.Space
) -> ActorCritic | RecurrentActorCritic:
    return build_actor_critic(obs_space, action_space, config.model)


def make_optimizer(config: A2CConfig, parameters: list[torch.Tensor]) -> torch.optim.Optimizer:
    return rmsprop_or_adamw(config.optimizer, parameters, config.optim, config.rms_alpha)


class A2CLearner(ModelLearner):
    """Owns the actor-critic and its optimizer; one gradient step per rollout."""

    def __init__(self, config: A2CConfig, obs_space: gym.Space, action_space: gym.Space):
        self.config = config
        self.model = build_model(config, obs_space, action_space)
        self.parameters = list(self.model.parameters())
        self.optimizer = make_optimizer(config, self.parameters)
        # MLP actor-critics skip autograd (`shoal.nn.direct_grad`): the same gradients and
        # optimizer step in about 0.4x the time on small networks.
        self.direct = DirectGradActorCritic.for_model(self.model, flat_parameters=True)

    def losses(self, batch: PPOBatch | PPOSequenceBatch) -> dict[str, torch.Tensor]:
        """The loss terms of one batch, ``total`` last."""
        if isinstance(batch, PPOSequenceBatch):
            (dist, values), batch = self._replay(batch)
        else:
            dist, values = self.model(batch.obs)
        log_probs = dist.log_prob(batch.actions)
        return self._losses(log_probs, dist.entropy(), values, self._advantages(batch), batch)

    def _advantages(self, batch: PPOBatch) -> torch.Tensor:
        advantages = batch.advantages
        if self.config.normalize_advantages and advantages.numel() > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        return advantages

    def _losses(
        self,
        log_probs: torch.Tensor,
        entropy: torch.Tensor,
        values: torch.Tensor,
        advantages: torch.Tensor,
        batch: PPOBatch,
    ) -> dict[str, torch.Tensor]:
        cfg = self.config
        losses = {
            "policy": policy_gradient_loss(log_probs, advantages),
            "value": value_loss(values, batch.returns),
            "entropy": entropy_loss(entropy),
        }
        losses["total"] = (
            losses["policy"] + cfg.vf_coef * losses["value"] + cfg.ent_coef * losses["entropy"]
        )
        return losses

    def _direct_step(self, batch: PPOBatch) -> dict[str, float]:
        """The gradient step through `DirectGradActorCritic`: the same losses and gradients
        as autograd's, faster on small MLPs (see `shoal.nn.direct_grad`), with the loss terms
        and their gradients evaluated in NumPy (`shoal.losses.numpy_losses`)."""
        cfg = self.config
        out = self.direct.outputs(batch.obs, batch.actions)
        log_prob, entropy, values = out.log_prob.numpy(), out.entropy.numpy(), out.values.numpy()
        advantages = self._advantages(batch).numpy()
        policy, g_log_prob = policy_gradient_loss_and_grad(log_prob, advantages)
        value, g_values = value_loss_and_grad(values, batch.returns.numpy())
        entropy_term, g_entropy = entropy_loss_and_grad(entropy)
        total = policy + cfg.vf_coef * value + cfg.ent_coef * entropy_term
        losses = {"policy": policy, "value": value, "entropy": entropy_term, "total": total}
        check_finite(losses)
        g_entropy = g_entropy * np.float32(cfg.ent_coef) if cfg.ent_coef else None
        g_values *= np.float32(cfg.vf_coef)
        self.direct.backward(out, g_log_prob, g_entropy, g_values)
        self.direct.clip_and_step(self.optimizer, cfg.optim.max_grad_norm)
        return losses

    def _replay(self, batch: PPOSequenceBatch) -> tuple[tuple, PPOBatch]:
        """Recurrent models: the ``(distribution, values)`` of the valid steps of a time-major
        rollout batch ``[T, B]``, run in time order from its initial state; the state is
        detached every ``config.chunk`` steps, so the gradient stops there (truncated BPTT).
        Also returns the valid samples, flat, in the same order."""
        chunk, steps = self.config.chunk, batch.chunks.obs.shape[0]
        state = batch.initial_state
        pieces = []
        for begin in range(0, steps, chunk):
            features, state = self.model(
                batch.chunks.obs[begin : begin + chunk], state, batch.starts[begin : begin + chunk]
            )
            pieces.append(features)
            state = state.detach()
        keep = batch.valid.flatten()
        features = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        outputs = self.model.heads(features.flatten(0, 1)[keep])
        return outputs, PPOBatch(*(x.flatten(0, 1)[keep] for x in batch.chunks))

    def update(self, batch: PPOBatch | PPOSequenceBatch, lr: float) -> dict[str, float]:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.direct is not None and isinstance(batch, PPOBatch):
            values = self._direct_step(batch)
        else:
            losses = self.losses(batch)
            gradient_step(losses, self.optimizer, self.parameters, self.config.optim.max_grad_norm)
            stacked = torch.stack(list(losses.values())).detach().tolist()
            values = dict(zip(losses, stacked, strict=True))
        metrics = {f"loss/{k}": v for k, v in values.items()}
        metrics["train/lr"] = lr
        return metrics


class A2C(OnPolicyAlgorithm):
    """One A2C iteration: sample a rollout, estimate advantages, one update, broadcast."""

    def __init__(self, config: A2CConfig):
        super().__init__(config, A2CLearner, build_model)

    def train_iteration(self) -> dict[str, float]:
        cfg = self.config
        lr = scheduled(cfg.optim.lr_schedule, cfg.optim.lr, self.progress())
        rollout, episodes = self.sample()
        # Autoreset transitions are dropped by make_batch; truncations bootstrap from the
        # final observation's value (`Rollout.next_values`). Recurrent models keep the
        # rollout time-major ([T, B]: one piece of num_steps per env), masked the same way.
        if cfg.model.lstm_hidden is None:
            batch = make_batch(rollout, cfg.gamma, cfg.gae_lambda)
        else:
            batch = make_sequence_batch(rollout, cfg.gamma, cfg.gae_lambda, cfg.num_steps)
        return self.finish_iteration(self.learner.update(batch, lr), episodes)
