"""ACER: actor-critic with experience replay (Wang, Bapst, Heess, Mnih, Munos, Kavukcuoglu and
de Freitas 2017, "Sample efficient actor-critic with experience replay", arXiv:1611.01224).

Each iteration samples one rollout segment (``num_steps`` per env) and learns from it on-policy,
stores it with the behaviour policy's statistics, then replays a Poisson(``replay_ratio``)
number of stored segments (`shoal.data.segments.SegmentReplay`), each in time order:

* the critic regresses on Retrace targets ``Q_ret`` (`shoal.losses.retrace`, traces
  ``min(1, rho)``; ``min(1, rho^(1/d))`` for ``d``-dimensional continuous actions);
* the policy follows truncated importance weights ``min(c, rho)`` with the bias correction
  (`shoal.losses.acer.acer_policy_objective`), plus an entropy bonus;
* with ``trust_region``, that gradient with respect to the policy's statistics is projected so
  its first-order KL change against an average policy network (an exponential moving average
  of the weights, ``average_decay``) is at most ``delta`` (`trust_region_projection`).

Discrete actions use a Q head (``V = E_pi Q``); continuous actions the stochastic dueling
network (`shoal.nn.acer.ACERNetwork`), with the value target
``min(1, rho) (Q_ret - Q~) + V`` and, in the policy gradient, ``Q_opc`` (Retrace with traces 1).
Defaults follow OpenAI Baselines' ACER (20 steps, replay ratio 4, c = 10, delta = 1, average
decay 0.99, RMSProp 7e-4, gradient norm 10).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import gymnasium as gym
import numpy as np
import torch

from shoal.algos.cores.checks import check_learner_group, check_no_masks
from shoal.algos.cores.group_shares import ColumnShare
from shoal.algos.cores.learner_group import LearnerGroup
from shoal.algos.cores.metrics import mean_metrics
from shoal.algos.cores.on_policy import ModelLearner, OnPolicyCore, held
from shoal.algos.spec import AlgorithmSpec
from shoal.config import (
    EnvConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    check,
    check_choices,
    check_positive,
)
from shoal.config.usage import NO_LSTM, OWN_GAMMA
from shoal.core.device import to_device
from shoal.core.seeding import derive_seed
from shoal.core.types import Rollout
from shoal.data.segments import SegmentReplay
from shoal.losses import retrace
from shoal.losses.acer import acer_policy_objective, trust_region_projection
from shoal.nn.acer import ACERNetwork
from shoal.nn.distributions import Categorical
from shoal.nn.policy import ActorPolicy
from shoal.nn.target import frozen_copy, soft_update
from shoal.optim import minimize, rmsprop_or_adamw
from shoal.optim.schedules import scheduled


@dataclass(frozen=True)
class ACERReplayConfig:
    """ACER's segment replay."""

    buffer_size: int = 50_000
    """Transitions kept (whole segments of num_steps x num_envs)."""
    learning_starts: int = 1_000
    """Transitions stored before replayed updates begin (on-policy updates start at once)."""
    replay_ratio: float = 4.0
    """Mean number of replayed segments per on-policy segment (Poisson draws; 0: on-policy
    only, the paper's A3C-like limit)."""
    save: bool = False
    """Store the replay in checkpoints (exact resume; large files)."""

    def __post_init__(self) -> None:
        check_positive(self, "buffer_size")
        check(self, "learning_starts", self.learning_starts >= 0, "must be >= 0")
        check(self, "replay_ratio", self.replay_ratio >= 0, "must be >= 0")


@dataclass(frozen=True)
class ACERConfig:
    """ACER hyperparameters (OpenAI Baselines' defaults)."""

    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=7e-4, max_grad_norm=10.0))
    model: ModelConfig = field(default_factory=ModelConfig)
    replay: ACERReplayConfig = field(default_factory=ACERReplayConfig)
    num_steps: int = 20
    """Steps per environment in each segment."""
    gamma: float = 0.99
    """Discount factor."""
    truncation: float = 10.0
    """c: importance weights are truncated at c, and the bias correction takes the rest."""
    trust_region: bool = True
    """Project the policy gradient into the KL trust region around the average policy."""
    delta: float = 1.0
    """Trust region size: the largest first-order KL change per sample."""
    average_decay: float = 0.99
    """Decay of the average policy network's moving average of the weights."""
    q_coef: float = 0.5
    """Weight of the critic's loss."""
    ent_coef: float = 0.01
    """Weight of the entropy bonus."""
    sdn_samples: int = 5
    """Continuous actions: samples of the stochastic dueling network's advantage mean."""
    optimizer: Literal["rmsprop", "rmsprop-tf", "adam"] = "rmsprop"
    """rmsprop (PyTorch's; smoothing rms_alpha, epsilon optim.eps), rmsprop-tf (the paper's
    rule as TensorFlow runs it: average starting at 1, epsilon inside the square root;
    `shoal.optim`) or adam (AdamW)."""
    rms_alpha: float = 0.99
    """Smoothing constant of RMSProp's squared-gradient average."""

    UNUSED: ClassVar[dict[str, str]] = {
        **OWN_GAMMA,
        **NO_LSTM,
        "model.shared_trunk": "its policy and Q heads always share one trunk",
    }

    def __post_init__(self) -> None:
        check_choices(self)
        check_positive(self, "num_steps", "truncation", "delta", "sdn_samples")
        check(self, "gamma", 0.0 <= self.gamma <= 1.0, "must be in [0, 1]")
        check(self, "average_decay", 0.0 <= self.average_decay < 1.0, "must be in [0, 1)")
        check(self, "q_coef", self.q_coef >= 0, "must be >= 0")
        check(self, "ent_coef", self.ent_coef >= 0, "must be >= 0")
        check(self, "rms_alpha", 0.0 < self.rms_alpha < 1.0, "must be in (0, 1)")
        check(
            self.model,
            "lstm_hidden",
            self.model.lstm_hidden is None,
            "ACER is feed-forward here (R2D2 is shoal's recurrent replay learner); unset it",
        )
        check(self.model, "backend", self.model.backend != "numpy", "ACER trains through torch")
        check_no_masks(self, "ACER")
        columns = self.env.num_envs * max(1, self.run.runners)
        split = f"must be <= the {columns} env columns of each segment: they are split among them"
        check(self.run, "learners", self.run.learners <= columns, split)
        check_learner_group(self, "ACER", columns * self.num_steps)


def build_model(config: ACERConfig, obs_space: gym.Space, action_space: gym.Space) -> ACERNetwork:
    return ACERNetwork(obs_space, action_space, config.model)


def behaviour_statistics(model: ACERNetwork, obs: torch.Tensor) -> torch.Tensor:
    """``[T, B, P]`` the statistics ``phi`` of the policy that acted on ``obs [T, B, ...]``."""
    with torch.no_grad():
        return model.policy_params(model.features(obs.flatten(0, 1))).unflatten(0, obs.shape[:2])


def behaviour_of(learner: Any, obs: torch.Tensor) -> torch.Tensor:
    """`behaviour_statistics` of ``learner``'s network (or a learner group's synchronized
    copy), on the host."""
    return behaviour_statistics(learner.model, obs.to(learner.device)).cpu()


def segment_of(rollout: Rollout, behaviour: torch.Tensor) -> dict[str, torch.Tensor]:
    """What ACER stores of a rollout: ``obs [T + 1, B]`` (the last observation appended, to
    bootstrap the segment's end), the transitions, and the behaviour statistics."""
    if rollout.last_obs is None:
        raise ValueError("ACER needs rollouts that carry last_obs (shoal's EnvRunner does)")
    return {
        "obs": torch.cat([rollout.obs, rollout.last_obs.unsqueeze(0)]),
        "actions": rollout.actions,
        "rewards": rollout.rewards,
        "terminated": rollout.terminated,
        "truncated": rollout.truncated,
        "valid": rollout.valid,
        "behaviour": behaviour,
    }


def _masked_mean(x: torch.Tensor, valid: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    return torch.where(valid, x, 0.0).sum() / count


class ACERLearner(ModelLearner[ACERNetwork]):
    """The network, its average copy and the optimizer; `update` takes one segment."""

    def __init__(self, config: ACERConfig, obs_space: gym.Space, action_space: gym.Space):
        self.config = config
        model = build_model(config, obs_space, action_space)
        make_optimizer = functools.partial(
            rmsprop_or_adamw, config.optimizer, optim=config.optim, alpha=config.rms_alpha
        )
        self.setup(config, model, make_optimizer)
        self.average = frozen_copy(self.model)
        self.minimize: Callable[..., Any] = minimize
        """The gradient step, a part: a learner group's rank swaps in one that all-reduces
        (`shoal.algos.cores.group_shares.SharedMinimize`)."""

    def losses(self, segment: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict]:
        """The loss terms of one segment (``total`` last) and diagnostics; see the module
        docstring. The policy term is a surrogate whose gradient is the (projected) ACER
        gradient."""
        cfg, model = self.config, self.model
        obs, actions = segment["obs"], segment["actions"]
        steps, envs = actions.shape[:2]
        valid = segment["valid"]
        count = valid.sum().clamp(min=1)
        features = model.features(obs.flatten(0, 1))
        params = model.policy_params(features)
        dist = model.distribution_of(params)
        values, q_every = model.critic(features, dist)
        values = values.unflatten(0, (steps + 1, envs))
        # The statistics phi of the segment's steps, as a leaf of the policy graph, so that
        # per-sample gradients with respect to them can be taken and projected.
        phi = params[: steps * envs]
        dist_t = model.distribution_of(phi)
        mu = model.distribution_of(segment["behaviour"].flatten(0, 1))
        flat_actions = actions.flatten(0, 1)
        log_pi_a = dist_t.log_prob(flat_actions)
        log_rho_a = (log_pi_a - mu.log_prob(flat_actions)).detach().unflatten(0, (steps, envs))
        rho_a = log_rho_a.exp().flatten()
        v_t, v_next = values[:-1].detach(), values[1:].detach()
        flags = (segment["rewards"], segment["terminated"], segment["truncated"])
        if isinstance(dist_t, Categorical) and isinstance(mu, Categorical):  # discrete
            assert q_every is not None  # the Q head's values of every action
            q_all = q_every[: steps * envs]
            q_a = q_all.gather(-1, flat_actions.long().unsqueeze(-1)).squeeze(-1)
            q_ret = retrace(
                q_a.detach().unflatten(0, (steps, envs)), v_next, *flags, log_rho_a, cfg.gamma
            )
            log_pi_all = dist_t.logits
            pi_all = log_pi_all.exp().detach()
            rho_all = pi_all / mu.logits.exp().clamp(min=1e-8)
            advantage_all = q_all.detach() - v_t.flatten().unsqueeze(-1)
            objective = acer_policy_objective(
                log_pi_a, rho_a, q_ret.flatten() - v_t.flatten(),
                log_pi_all, rho_all, advantage_all, pi_all, cfg.truncation,
            )  # fmt: skip
            critic_loss = 0.5 * (q_ret.flatten() - q_a).square()
        else:
            objective, critic_loss = self._continuous(
                features[: steps * envs], values, dist_t, mu, flat_actions, rho_a, log_rho_a, flags
            )
        objective = objective + cfg.ent_coef * dist_t.entropy()
        flat_valid = valid.flatten()
        objective = torch.where(flat_valid, objective, 0.0)
        (g,) = torch.autograd.grad(objective.sum(), phi, retain_graph=True)
        kl = torch.zeros((), device=phi.device)
        if cfg.trust_region:
            with torch.no_grad():
                average = self.average
                average_phi = average.policy_params(average.features(obs[:-1].flatten(0, 1)))
            leaf = phi.detach().requires_grad_(True)
            averaged: Any = model.distribution_of(average_phi)  # the same kind as leaf's
            kl_rows = averaged.kl(model.distribution_of(leaf))
            (k,) = torch.autograd.grad(kl_rows.sum(), leaf)
            g = trust_region_projection(g, k, cfg.delta)
            kl = _masked_mean(kl_rows.detach(), flat_valid, count)
        policy_loss = -(g.detach() * phi).sum() / count
        critic = _masked_mean(critic_loss, flat_valid, count)
        losses = {
            "policy": policy_loss,
            "critic": critic,
            "total": policy_loss + cfg.q_coef * critic,
        }
        stats = {
            "rho_mean": _masked_mean(rho_a, flat_valid, count).detach(),
            "entropy": _masked_mean(dist_t.entropy().detach(), flat_valid, count),
            "kl_average": kl,
        }
        return losses, stats

    def _continuous(self, features, values, dist, mu, actions, rho_a, log_rho_a, flags):
        """The stochastic dueling network's objective and critic loss (Wang et al. 2017,
        section 4 and Algorithm 2)."""
        cfg, model = self.config, self.model
        steps, envs = log_rho_a.shape
        v = values[:-1].flatten()
        v_next = values[1:].detach()
        n = cfg.sdn_samples
        with torch.no_grad():
            noise = torch.randn((n + 1, *dist.mean.shape), device=dist.mean.device)
            samples = dist.mean + dist.log_std.exp() * noise  # [n + 1, N, A], u_1..u_n and b
            u, b = samples[:n], samples[n]
        repeated = features.unsqueeze(0).expand(n, *features.shape).flatten(0, 1)
        mean_advantage = model.advantage(repeated, u.flatten(0, 1)).unflatten(0, (n, -1)).mean(0)
        q_a = v + model.advantage(features, actions) - mean_advantage
        q_b = v + model.advantage(features, b) - mean_advantage
        d = actions.shape[-1]
        q_a_tm = q_a.detach().unflatten(0, (steps, envs))
        q_ret = retrace(q_a_tm, v_next, *flags, log_rho_a / d, cfg.gamma).flatten()
        q_opc = retrace(q_a_tm, v_next, *flags, torch.zeros_like(log_rho_a), cfg.gamma).flatten()
        log_pi_b = dist.log_prob(b)
        rho_b = (log_pi_b - mu.log_prob(b)).exp().detach()
        v_detached = v.detach()
        objective = acer_policy_objective(
            dist.log_prob(actions), rho_a, q_opc - v_detached,
            log_pi_b.unsqueeze(-1), rho_b.unsqueeze(-1), (q_b.detach() - v_detached).unsqueeze(-1),
            torch.ones_like(rho_b).unsqueeze(-1), cfg.truncation,
        )  # fmt: skip
        value_target = rho_a.clamp(max=1.0) * (q_ret - q_a.detach()) + v_detached
        critic_loss = 0.5 * (q_ret - q_a).square() + 0.5 * (value_target - v).square()
        return objective, critic_loss

    def update(self, segment: dict[str, torch.Tensor], lr: float) -> dict[str, Any]:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        losses, stats = self.losses(to_device(segment, self.device))
        norm = self.minimize(losses, self.optimizer, self.config.optim.max_grad_norm)
        decay = self.config.average_decay
        soft_update(list(self.average.parameters()), self.parameters, 1.0 - decay)
        row = {f"loss/{name}": value.detach() for name, value in losses.items()}
        row.update((f"train/{name}", value) for name, value in stats.items())
        if norm is not None:
            row["train/grad_norm"] = torch.as_tensor(norm)
        return row

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "average": self.average.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.average.load_state_dict(state["average"])


class ACER:
    """One ACER iteration: a rollout learned on-policy, stored, then replayed segments."""

    env_steps = held("env_steps")
    iteration = held("iteration")
    learner = held("learner")
    sampler = held("sampler")

    def __init__(self, config: ACERConfig):
        self.config = config
        self.core = OnPolicyCore(
            self.config,
            ACERLearner,
            build_model,
            "ACER",
            takes_action_masks=False,
            group=functools.partial(LearnerGroup, share_cls=ColumnShare),
        )
        self.core.broadcast(set_temperature=True)
        segment_steps = config.num_steps * self.sampler.num_envs * self.sampler.agents_per_env
        self.replay = SegmentReplay(
            max(1, config.replay.buffer_size // segment_steps),
            derive_seed(config.run.seed, "acer-replay"),
        )
        self.draws = np.random.default_rng(derive_seed(config.run.seed, "acer-replay-ratio"))

    def train_iteration(self) -> dict[str, float]:
        cfg = self.config
        lr = scheduled(cfg.optim.lr_schedule, cfg.optim.lr, self.core.progress())
        rollout, episodes = self.core.sample()
        segment = segment_of(rollout, behaviour_of(self.learner, rollout.obs))
        rows = [self.learner.update(segment, lr)]
        self.replay.add(segment)
        stored = len(self.replay) * segment["actions"].numel()
        replays = 0
        if stored >= cfg.replay.learning_starts and cfg.replay.replay_ratio > 0:
            replays = int(self.draws.poisson(cfg.replay.replay_ratio))
            rows += [self.learner.update(self.replay.sample(), lr) for _ in range(replays)]
        metrics = mean_metrics(rows)
        metrics["train/lr"] = lr
        metrics["train/replayed_segments"] = replays
        return self.core.finish_iteration(metrics, episodes)

    def state_dict(self) -> dict[str, Any]:
        state = self.core.state_dict()
        state["replay"] = self.replay.state_dict() if self.config.replay.save else None
        state["replay_draws"] = self.draws.bit_generator.state
        return state

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        exact = self.core.load_state_dict(state)
        if state.get("replay") is not None:
            self.replay.load_state_dict(state["replay"])
        self.draws.bit_generator.state = state["replay_draws"]
        return exact

    def policy(self) -> ActorPolicy:
        return self.core.policy()

    def close(self) -> None:
        self.core.close()


SPECS = (
    AlgorithmSpec(
        "acer",
        ACERConfig,
        ACER,
        build_model,
        "ACER: actor-critic with experience replay (Retrace, truncated IS, trust region)",
        "Discrete, Box",
        runners=True,
        learner_groups=True,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
