"""REINFORCE: vanilla policy gradient on full-episode returns (Williams 1992, Machine Learning
8:229-256), with an optional learned baseline (Sutton & Barto 2018, sec. 13.4).

Every transition is weighted by the true discounted Monte-Carlo return of its episode, never a
bootstrapped estimate. The vector envs keep running across iterations, so a rollout usually ends
in the middle of some episodes: those transitions are *carried over* (`EpisodeCarry`) and trained
on in the first iteration in which their episode ends. Dropping them instead would bias the
batch toward short episodes (a good CartPole policy's 500-step episodes would rarely fit in one
rollout). The carried actions were sampled by a policy one or a few updates older; like the lag
of asynchronous actor-critic (Mnih et al. 2016) this is not importance-corrected.

A time-limit truncation (CartPole's 500 steps) ends the episode: REINFORCE uses the return up to
the cut, as the episode's score is defined by it, rather than bootstrapping a critic.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import gymnasium as gym
import torch

from shoal.algos.cores.checks import check_learner_group, check_no_masks
from shoal.algos.cores.group_shares import SharedMinimize, rows_of, share
from shoal.algos.cores.learner_group import LearnerGroup
from shoal.algos.cores.metrics import mean_metrics, step_metrics
from shoal.algos.cores.on_policy import ModelLearner, OnPolicyCore, held
from shoal.algos.spec import AlgorithmSpec
from shoal.config import EnvConfig, ModelConfig, OptimConfig, RunConfig, check, check_positive
from shoal.config.usage import NO_LSTM, OWN_GAMMA
from shoal.core.device import to_device
from shoal.core.types import Rollout
from shoal.losses import entropy_loss, episode_returns, policy_gradient_loss, value_loss
from shoal.losses.objectives import standardize
from shoal.nn import ActorCritic, RecurrentActorCritic
from shoal.nn.policy import ActorPolicy
from shoal.optim import minimize
from shoal.optim.schedules import scheduled


@dataclass(frozen=True)
class PGConfig:
    """REINFORCE hyperparameters; the tuned examples hold settings for specific tasks."""

    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3))
    model: ModelConfig = field(default_factory=ModelConfig)
    num_steps: int = 128
    """Steps per environment in each rollout (new env steps per iteration = num_steps *
    env.num_envs); transitions of episodes still running at its end wait for a later one."""
    gamma: float = 0.99
    """Discount factor of the Monte-Carlo returns."""
    baseline: bool = True
    """Subtract a learned state-value baseline: advantage = G - V(s), V regressed on G."""
    vf_coef: float = 0.5
    """Weight of the baseline's value loss (unused without a baseline)."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus."""
    normalize_advantages: bool = True
    """Standardize the returns (or advantages) within each batch."""
    max_carry_steps: int = 4096
    """Most steps of unfinished episodes carried to the next iteration per env; older steps of
    an episode longer than this are dropped (set env.max_episode_steps for endless envs)."""

    UNUSED: ClassVar[dict[str, str]] = {**OWN_GAMMA, **NO_LSTM}

    def __post_init__(self) -> None:
        check_positive(self, "num_steps", "max_carry_steps")
        check(self, "gamma", 0.0 <= self.gamma <= 1.0, "must be in [0, 1]")
        check(self, "vf_coef", self.vf_coef >= 0, "must be >= 0")
        check(self, "ent_coef", self.ent_coef >= 0, "must be >= 0")
        check_no_masks(self, "REINFORCE")
        rollout = self.num_steps * self.env.num_envs * max(1, self.run.runners)
        check_learner_group(self, "REINFORCE", rollout)


class EpisodeCarry(NamedTuple):
    """Time-major ``[P, B, ...]`` transitions kept across iterations until their episode ends.
    ``valid`` is False for autoreset steps and for steps that were already trained on."""

    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    valid: torch.Tensor


class PGBatch(NamedTuple):
    """Flat ``[N, ...]`` samples: valid transitions whose episode is complete. ``advantages``
    is None but in a learner group's rank, which takes them from the whole batch (`PGShare`)."""

    obs: torch.Tensor
    actions: torch.Tensor
    returns: torch.Tensor
    advantages: torch.Tensor | None = None


def build_model(config: PGConfig, obs_space: gym.Space, action_space: gym.Space) -> ActorCritic:
    return ActorCritic(obs_space, action_space, config.model)


def carry_rollout(rollout: Rollout) -> EpisodeCarry:
    return EpisodeCarry(
        rollout.obs,
        rollout.actions,
        rollout.rewards,
        rollout.terminated,
        rollout.truncated,
        rollout.valid,
    )


def make_batch(
    carry: EpisodeCarry | None, rollout: Rollout, gamma: float, max_carry_steps: int
) -> tuple[PGBatch, EpisodeCarry | None]:
    """Monte-Carlo returns over the carried steps followed by ``rollout``; returns the batch of
    complete episodes and what to carry to the next iteration (None when nothing is pending)."""
    data = carry_rollout(rollout)
    if carry is not None:
        data = EpisodeCarry(*(torch.cat([c, x]) for c, x in zip(carry, data, strict=True)))
    returns, complete = episode_returns(data.rewards, data.terminated, data.truncated, gamma)
    keep = (data.valid & complete).flatten()
    flat = lambda x: x.flatten(0, 1)[keep]
    batch = PGBatch(flat(data.obs), flat(data.actions), flat(returns))
    pending = data.valid & ~complete
    rows = pending.any(dim=1).nonzero()
    if rows.numel() == 0:
        return batch, None
    start = max(int(rows[0]), data.rewards.shape[0] - max_carry_steps)
    # Clone: the rollout's tensors are the sampler's buffers, overwritten by the next rollout.
    next_carry = EpisodeCarry(*(x[start:].clone() for x in data._replace(valid=pending)))
    return batch, next_carry


def advantages_of(config: PGConfig, returns: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``[N]`` advantages of a batch: its returns, less the baseline's (detached) ``values``
    with ``config.baseline``, standardized over the batch with ``normalize_advantages``."""
    advantages = returns - values.detach() if config.baseline else returns
    return standardize(advantages) if config.normalize_advantages else advantages


class PGLearner(ModelLearner[ActorCritic | RecurrentActorCritic]):
    """Owns the policy (and baseline) network and its optimizer; one gradient step per batch."""

    def __init__(self, config: PGConfig, obs_space: gym.Space, action_space: gym.Space):
        self.config = config
        self.setup(config, build_model(config, obs_space, action_space))
        self.minimize: Callable[..., Any] = minimize
        """The gradient step, a part: a learner group's rank swaps in one that all-reduces
        (`shoal.algos.cores.group_shares.SharedMinimize`)."""

    def losses(self, batch: PGBatch) -> dict[str, torch.Tensor]:
        """The loss terms of one batch, ``total`` last."""
        cfg = self.config
        dist, values = self.model(batch.obs)
        advantages = batch.advantages
        if advantages is None:
            advantages = advantages_of(cfg, batch.returns, values)
        losses = {
            "policy": policy_gradient_loss(dist.log_prob(batch.actions), advantages),
            "entropy": entropy_loss(dist.entropy()),
        }
        total = losses["policy"] + cfg.ent_coef * losses["entropy"]
        if cfg.baseline:
            losses["value"] = value_loss(values, batch.returns)
            total = total + cfg.vf_coef * losses["value"]
        losses["total"] = total
        return losses

    def update(self, batch: PGBatch, lr: float) -> dict[str, float]:
        metrics = {"train/lr": lr, "train/samples": batch.returns.numel()}
        if batch.returns.numel() == 0:
            return metrics  # no episode has ended yet
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        batch = to_device(batch, self.device)
        losses = self.losses(batch)
        self.minimize(losses, self.optimizer, self.config.optim.max_grad_norm, scaler=self.scaler)
        metrics.update(mean_metrics([step_metrics(losses, {})]))
        metrics["train/return_mean"] = batch.returns.mean().item()
        return metrics


class PGShare:
    """How a REINFORCE rank of a learner group (`shoal.algos.cores.learner_group`) takes an
    update: the advantages of the whole batch first (standardizing them needs all of it, as
    one learner does), then the learner's ``update`` on the rank's contiguous rows through a
    `SharedMinimize` weighted by its share of the rows (the losses are means over them).
    A batch of complete episodes may hold fewer samples than there are ranks: a rank left
    without rows computes on the whole batch at weight 0, so it still joins the all-reduce
    and adds nothing. Returns ``(share, metrics)``; ``train/samples`` is the whole batch's."""

    def __init__(self, learner: PGLearner, rank: int, world_size: int):
        self.learner, self.rank, self.world_size = learner, rank, world_size
        self.minimize = learner.minimize = SharedMinimize(rank, world_size)

    def update(self, args: tuple[PGBatch, float]) -> tuple[float, dict[str, float]]:
        batch, lr = args
        learner, size = self.learner, batch.returns.numel()
        if size == 0:  # every rank returns before a gradient step
            return 1.0 / self.world_size, learner.update(batch, lr)
        batch = to_device(batch, learner.device)
        with torch.no_grad():
            values = learner.model(batch.obs)[1]
        batch = batch._replace(advantages=advantages_of(learner.config, batch.returns, values))
        rows = share(size, self.rank, self.world_size)
        self.minimize.weight = (rows.stop - rows.start) / size
        if rows.stop == rows.start:
            rows = slice(0, size)
        metrics = learner.update(rows_of(batch, rows), lr)
        metrics["train/samples"] = size
        return self.minimize.weight, metrics


class PG:
    """One REINFORCE iteration: sample, finish returns of ended episodes, update, broadcast."""

    env_steps = held("env_steps")
    iteration = held("iteration")
    learner = held("learner")
    sampler = held("sampler")

    def __init__(self, config: PGConfig):
        self.carry: EpisodeCarry | None = None
        self.config = config
        self.core = OnPolicyCore(
            self.config,
            PGLearner,
            build_model,
            "PG",
            takes_action_masks=False,
            group=functools.partial(LearnerGroup, share_cls=PGShare),
        )
        self.core.broadcast(set_temperature=True)

    def train_iteration(self) -> dict[str, float]:
        cfg = self.config
        lr = scheduled(cfg.optim.lr_schedule, cfg.optim.lr, self.core.progress())
        rollout, episodes = self.core.sample()
        batch, self.carry = make_batch(self.carry, rollout, cfg.gamma, cfg.max_carry_steps)
        metrics = self.learner.update(batch, lr)
        metrics["train/carried_steps"] = 0 if self.carry is None else int(self.carry.valid.sum())
        return self.core.finish_iteration(metrics, episodes)

    def state_dict(self) -> dict[str, Any]:
        carry = None if self.carry is None else self.carry._asdict()
        return {**self.core.state_dict(), "carry": carry}

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        exact = self.core.load_state_dict(state)
        carry = state.get("carry")
        # Restarted episodes never finish the carried ones: their returns are unknowable.
        self.carry = EpisodeCarry(**carry) if carry is not None and exact else None
        return exact

    def policy(self) -> ActorPolicy:
        return self.core.policy()

    def close(self) -> None:
        self.core.close()


SPECS = (
    AlgorithmSpec(
        "pg",
        PGConfig,
        PG,
        build_model,
        "REINFORCE: vanilla policy gradient on full-episode returns, optional learned baseline",
        "Discrete, Box, MultiDiscrete, MultiBinary, Tuple, Dict",
        runners=True,
        learner_groups=True,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
