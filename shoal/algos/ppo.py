"""Proximal Policy Optimization (Schulman et al. 2017, arXiv:1707.06347).

Clipped surrogate objective over minibatch SGD epochs on GAE advantages, with optional clipped
value loss, adaptive KL penalty (RLlib's ``kl_coeff``/``kl_target``, reference 004) and KL
early stopping. Discrete actions use a categorical policy, continuous ones a diagonal Gaussian.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import gymnasium as gym
import torch

from shoal.algos.on_policy import (
    ModelLearner,
    OnPolicyAlgorithm,
    PPOBatch,
    PPOSequenceBatch,
    check_bptt_chunk,
    check_finite,
    clip_and_step,
    make_batch,
    make_sequence_batch,
)
from shoal.config import (
    EnvConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    check,
    check_choices,
    check_positive,
)
from shoal.errors import NaNLossError
from shoal.losses import (
    adaptive_kl_coeff,
    clipped_value_loss,
    entropy_loss,
    kl_penalty_loss,
    ppo_clip_loss,
    value_loss,
)
from shoal.losses.gradients import (
    clipped_value_loss_grad,
    entropy_loss_grad,
    kl_penalty_loss_grad,
    ppo_clip_loss_grad,
    value_loss_grad,
)
from shoal.nn import ActorCritic, RecurrentActorCritic, build_actor_critic
from shoal.nn.direct_grad import DirectGradActorCritic, Outputs
from shoal.nn.recurrent import chunk_start_states
from shoal.train.schedules import scheduled


@dataclass(frozen=True)
class PPOConfig:
    """PPO hyperparameters. The defaults are the common settings of the PPO paper's MuJoCo
    experiments and of Stable-Baselines3 (2048 samples per rollout, 10 epochs, Adam 3e-4), a
    safe start on a new task; the tuned examples hold faster settings for specific ones."""

    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    num_steps: int = 256
    """Steps per environment in each rollout (rollout size = num_steps * env.num_envs, times
    run.runners with Ray runners)."""
    num_epochs: int = 10
    """Passes of minibatch SGD over each rollout."""
    minibatch_size: int = 256
    """Samples per gradient step."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda: 0 is one-step TD, 1 is Monte-Carlo."""
    clip_eps: float = 0.2
    """Clip range of the probability ratio."""
    clip_schedule: Literal["constant", "linear"] = "constant"
    """linear: decay clip_eps to zero over optim.anneal_steps."""
    value_clip: float | None = None
    """Use the clipped value loss with this range (None: the plain squared error)."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus."""
    normalize_advantages: bool = True
    """Standardize advantages within each minibatch."""
    target_kl: float | None = None
    """Stop the epochs of an iteration early once the approximate KL exceeds this."""
    kl_coeff: float = 0.0
    """Initial coefficient of the KL penalty to the rollout policy (0 disables it)."""
    kl_target: float = 0.01
    """KL the adaptive penalty steers toward: coefficient x1.5 above 2x, x0.5 below 0.5x."""
    bptt_chunk: int | None = None
    """Recurrent models (model.lstm_hidden): truncated backpropagation through time over
    pieces of this many steps per env (None: the whole rollout, num_steps). It must divide
    num_steps, and minibatch_size must hold whole pieces."""

    def __post_init__(self) -> None:
        check_positive(self, "num_steps", "num_epochs", "minibatch_size", "clip_eps")
        check_choices(self)
        check(self, "gamma", 0.0 <= self.gamma <= 1.0, "must be in [0, 1]")
        check(self, "gae_lambda", 0.0 <= self.gae_lambda <= 1.0, "must be in [0, 1]")
        check(self, "vf_coef", self.vf_coef >= 0, "must be >= 0")
        check(self, "kl_coeff", self.kl_coeff >= 0, "must be >= 0")
        check_positive(self, "kl_target")
        rollout = self.num_steps * self.env.num_envs * max(1, self.run.runners)
        check(
            self,
            "minibatch_size",
            self.minibatch_size <= rollout,
            f"must be <= num_steps * env.num_envs (* run.runners) = {rollout}",
        )
        check(
            self,
            "env",
            self.env.action_mask == "none",
            "PPO does not use action masks yet; set env.action_mask to none",
        )
        if self.value_clip is not None:
            check_positive(self, "value_clip")
        if self.target_kl is not None:
            check_positive(self, "target_kl")
        check_bptt_chunk(self)
        if self.model.lstm_hidden is not None:
            check(
                self,
                "minibatch_size",
                self.minibatch_size % self.chunk == 0,
                f"must be a multiple of bptt_chunk = {self.chunk} (minibatches hold whole pieces)",
            )

    @property
    def chunk(self) -> int:
        """Steps per truncated-BPTT piece of a recurrent model."""
        return self.bptt_chunk or self.num_steps


def build_model(
    config: PPOConfig, obs_space: gym.Space, action_space: gym.Space
) -> ActorCritic | RecurrentActorCritic:
    return build_actor_critic(obs_space, action_space, config.model)


class PPOLearner(ModelLearner):
    """Owns the actor-critic and its optimizer; turns a `PPOBatch` into SGD updates."""

    def __init__(self, config: PPOConfig, obs_space: gym.Space, action_space: gym.Space):
        self.config = config
        self.model = build_model(config, obs_space, action_space)
        self.parameters = list(self.model.parameters())
        optim = config.optim
        # The fused kernel updates all parameters in one op; on small networks the default
        # per-tensor loop costs more than the arithmetic.
        self.optimizer = torch.optim.AdamW(
            self.parameters, lr=optim.lr, eps=optim.eps, weight_decay=optim.weight_decay, fused=True
        )
        # MLP actor-critics skip autograd (`shoal.nn.direct_grad`): the same gradients and
        # optimizer step in about 0.4x the time on small networks.
        self.direct = DirectGradActorCritic.for_model(self.model, flat_parameters=True)

    def update(
        self, batch: PPOBatch | PPOSequenceBatch, lr: float, clip_eps: float, kl_coeff: float
    ) -> dict[str, float]:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.direct is not None and isinstance(batch, PPOBatch):
            losses, stats, epochs_done = self._direct_update(batch, clip_eps, kl_coeff)
        else:
            losses, stats, epochs_done = self._autograd_update(batch, clip_eps, kl_coeff)
        names = [f"loss/{k}" for k in losses] + [f"train/{k}" for k in stats]
        values = torch.stack([*losses.values(), *stats.values()]).detach().tolist()
        metrics = dict(zip(names, values, strict=True))
        metrics["train/epochs"] = epochs_done
        metrics["train/lr"] = lr
        return metrics

    def _autograd_update(
        self, batch: PPOBatch | PPOSequenceBatch, clip_eps: float, kl_coeff: float
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], int]:
        """The epochs of minibatch steps through autograd; returns the loss terms and
        diagnostics averaged over the steps, and the number of epochs run."""
        cfg = self.config
        history: list[torch.Tensor] = []
        epochs_done = 0
        epoch = self._sequence_epoch if isinstance(batch, PPOSequenceBatch) else self._epoch
        for _ in range(cfg.num_epochs):
            epoch_kl = []
            for minibatch, outputs in epoch(batch):
                losses, stats = self._minibatch_losses(minibatch, clip_eps, kl_coeff, outputs)
                self._step(losses)
                epoch_kl.append(stats["approx_kl"])
                # Metrics stay tensors until the end: one conversion per update, not per step.
                history.append(torch.stack([*losses.values(), *stats.values()]).detach())
            epochs_done += 1
            if cfg.target_kl is not None and torch.stack(epoch_kl).mean() > cfg.target_kl:
                break
        means = torch.stack(history).mean(0).unbind()
        losses = dict(zip(losses, means[: len(losses)], strict=True))
        return losses, dict(zip(stats, means[len(losses) :], strict=True)), epochs_done

    def _direct_update(
        self, batch: PPOBatch, clip_eps: float, kl_coeff: float
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], int]:
        """`_autograd_update` through `DirectGradActorCritic`. The steps need only the losses'
        gradients, so the loss terms are evaluated once, after the update, over every step's
        outputs together: the same means (over samples), without a dozen small ops per step.
        A step whose gradient is not finite stops before the optimizer applies it; a
        non-finite loss with finite gradients (an unused term) is reported after the update.
        Either way nothing is saved, so the last checkpoint stays good."""
        cfg = self.config
        steps: list[tuple[PPOBatch, Outputs, torch.Tensor]] = []
        epochs_done = 0
        for _ in range(cfg.num_epochs):
            first = len(steps)
            for minibatch, _ in self._epoch(batch):
                steps.append(self._direct_step(minibatch, clip_eps, kl_coeff))
            epochs_done += 1
            if cfg.target_kl is not None:
                _, stats = self._step_losses(steps[first:], clip_eps, kl_coeff)
                if stats["approx_kl"] > cfg.target_kl:
                    break
        losses, stats = self._step_losses(steps, clip_eps, kl_coeff)
        check_finite(losses, "this update's steps were applied to the weights in memory")
        return losses, stats, epochs_done

    def _step_losses(
        self, steps: list[tuple[PPOBatch, Outputs, torch.Tensor]], clip_eps: float, kl_coeff: float
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """`_losses` over the samples of several direct steps at once."""
        minibatches, outputs, advantages = zip(*steps, strict=True)
        cat = lambda parts: parts[0] if len(parts) == 1 else torch.cat(parts)  # noqa: E731
        minibatch = PPOBatch(*(cat(field) for field in zip(*minibatches, strict=True)))
        log_prob, entropy, values = (cat(f) for f in zip(*(o[:3] for o in outputs), strict=True))
        args = (log_prob, entropy, values, cat(advantages), clip_eps, kl_coeff)
        return self._losses(minibatch, *args)

    def _epoch(self, batch: PPOBatch) -> Iterator[tuple[PPOBatch, None]]:
        """Feed-forward minibatches of one epoch: shuffled samples."""
        n, size = batch.obs.shape[0], self.config.minibatch_size
        # Shuffle once per epoch, then take contiguous slices (views, no copies). A single
        # minibatch holding the whole batch needs no shuffle: its loss is a mean.
        shuffled = batch
        if size < n:
            permutation = torch.randperm(n)
            shuffled = PPOBatch(*(x[permutation] for x in batch))
        for start in range(0, n, size):
            minibatch = PPOBatch(*(x[start : start + size] for x in shuffled))
            if minibatch.obs.shape[0] < 2:
                continue  # a lone sample cannot be standardized; skip the remainder
            yield minibatch, None

    def _sequence_epoch(self, batch: PPOSequenceBatch) -> Iterator[tuple[PPOBatch, tuple]]:
        """Recurrent minibatches of one epoch: shuffled whole pieces of env sequences.

        Each piece starts from the state the current network reaches over the rollout,
        recomputed once per epoch from the rollout's stored initial state. States stored
        while sampling would be those of older weights from the second epoch on; the
        recomputation costs one gradient-free forward pass per epoch and keeps the start of
        every piece consistent with the network being trained (on the first epoch it equals
        what the sampler saw). The gradient stops at piece boundaries (truncated BPTT)."""
        chunk = self.config.chunk
        states = chunk_start_states(
            self.model, batch.rollout_obs, batch.initial_state, batch.rollout_starts, chunk
        ).flatten(0, 1)
        n, per = states.shape[0], self.config.minibatch_size // chunk
        order = torch.randperm(n) if per < n else torch.arange(n)
        for start in range(0, n, per):
            index = order[start : start + per]
            keep = batch.valid[:, index].flatten()
            if int(keep.sum()) < 2:
                continue
            features, _ = self.model(
                batch.chunks.obs[:, index], states[index], batch.starts[:, index]
            )
            outputs = self.model.heads(features.flatten(0, 1)[keep])
            yield PPOBatch(*(x[:, index].flatten(0, 1)[keep] for x in batch.chunks)), outputs

    def _minibatch_losses(
        self, mb: PPOBatch, clip_eps: float, kl_coeff: float, outputs: tuple | None = None
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The loss terms (``total`` last) and diagnostics of one minibatch; ``outputs`` is
        the model's ``(distribution, values)`` when already computed (recurrent models)."""
        dist, values = self.model(mb.obs) if outputs is None else outputs
        log_probs = dist.log_prob(mb.actions)
        advantages = self._advantages(mb)
        return self._losses(mb, log_probs, dist.entropy(), values, advantages, clip_eps, kl_coeff)

    def _advantages(self, mb: PPOBatch) -> torch.Tensor:
        advantages = mb.advantages
        if self.config.normalize_advantages:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        return advantages

    def _losses(
        self,
        mb: PPOBatch,
        log_probs: torch.Tensor,
        entropy: torch.Tensor,
        values: torch.Tensor,
        advantages: torch.Tensor,
        clip_eps: float,
        kl_coeff: float,
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        cfg = self.config
        policy, stats = ppo_clip_loss(log_probs, mb.log_probs, advantages, clip_eps)
        if cfg.value_clip is None:
            value = value_loss(values, mb.returns)
        else:
            value = clipped_value_loss(values, mb.values, mb.returns, cfg.value_clip)
        losses = {"policy": policy, "value": value, "entropy": entropy_loss(entropy)}
        total = policy + cfg.vf_coef * value + cfg.ent_coef * losses["entropy"]
        if kl_coeff > 0:
            # Sample-based KL(old || new) = E_old[log old - log new], unbiased on-policy.
            losses["kl"] = kl_penalty_loss(mb.log_probs - log_probs, kl_coeff)
            total = total + losses["kl"]
        losses["total"] = total
        return losses, stats

    def _direct_step(
        self, mb: PPOBatch, clip_eps: float, kl_coeff: float
    ) -> tuple[PPOBatch, Outputs, torch.Tensor]:
        """One gradient step through `DirectGradActorCritic`: the losses' gradients from
        `shoal.losses.gradients`, no autograd graph. Returns what `_step_losses` needs."""
        cfg = self.config
        out = self.direct.outputs(mb.obs, mb.actions)
        advantages = self._advantages(mb)
        g_log_prob = ppo_clip_loss_grad(out.log_prob, mb.log_probs, advantages, clip_eps)
        if kl_coeff > 0:
            g_log_prob = g_log_prob + kl_penalty_loss_grad(out.log_prob, kl_coeff)
        if cfg.value_clip is None:
            g_values = value_loss_grad(out.values, mb.returns)
        else:
            g_values = clipped_value_loss_grad(out.values, mb.values, mb.returns, cfg.value_clip)
        g_entropy = cfg.ent_coef * entropy_loss_grad(out.entropy) if cfg.ent_coef else None
        self.direct.backward(out, g_log_prob, g_entropy, cfg.vf_coef * g_values)
        if not self.direct.gradient_is_finite():
            step = [(mb, out, advantages)]
            check_finite(self._step_losses(step, clip_eps, kl_coeff)[0])  # names the loss
            raise NaNLossError("the gradient became non-finite; weights left unchanged")
        self.direct.clip_and_step(self.optimizer, cfg.optim.max_grad_norm)
        return mb, out, advantages

    def _step(self, losses: dict[str, torch.Tensor]) -> None:
        check_finite(losses)
        self.optimizer.zero_grad(set_to_none=True)
        losses["total"].backward()
        clip_and_step(self.optimizer, self.parameters, self.config.optim.max_grad_norm)


class PPO(OnPolicyAlgorithm):
    """One PPO iteration: sample a rollout, estimate advantages, update, broadcast weights."""

    def __init__(self, config: PPOConfig):
        self.kl_coeff = config.kl_coeff
        super().__init__(config, PPOLearner, build_model)

    def train_iteration(self) -> dict[str, float]:
        cfg = self.config
        progress = self.progress()
        lr = scheduled(cfg.optim.lr_schedule, cfg.optim.lr, progress)
        clip_eps = scheduled(cfg.clip_schedule, cfg.clip_eps, progress)
        rollout, episodes = self.sample()
        if cfg.model.lstm_hidden is None:
            batch = make_batch(rollout, cfg.gamma, cfg.gae_lambda)
        else:
            batch = make_sequence_batch(rollout, cfg.gamma, cfg.gae_lambda, cfg.chunk)
        metrics = self.learner.update(batch, lr, clip_eps, self.kl_coeff)
        if cfg.kl_coeff > 0:
            self.kl_coeff = adaptive_kl_coeff(
                self.kl_coeff, metrics["train/approx_kl"], cfg.kl_target
            )
            metrics["train/kl_coeff"] = self.kl_coeff
        return self.finish_iteration(metrics, episodes)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "kl_coeff": self.kl_coeff}

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        self.kl_coeff = state["kl_coeff"]
        return super().load_state_dict(state)
