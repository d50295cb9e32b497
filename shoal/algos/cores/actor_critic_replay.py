"""What the off-policy actor-critics (DDPG, TD3, SAC, D4PG, and MADDPG's per-agent learners)
share: their replay settings (`ActorCriticReplayConfig`) and the networks-targets-optimizer
core of a learner.

`ActorCriticCore` holds the actor, the critic ensemble, their targets, one optimizer with a
parameter group per network, target updates and checkpoint state. Each learner uses it by
composition (`ActorCriticLearner` adds the plumbing around it) and writes its own ``update``
from the pure losses of `shoal.losses.actor_critic`. The act-store-learn iteration is
`shoal.algos.cores.off_policy.ReplayAlgorithm`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, TypeVar

import torch
from torch import nn

from shoal.config import (
    REPLAY_RENAMES,
    EnvConfig,
    ModelConfig,
    OptimConfig,
    Renamed,
    ReplayConfig,
    RunConfig,
    check,
    check_choices,
    check_positive,
    check_replay_holds,
)
from shoal.config.usage import NO_LR_SCHEDULE, NO_LSTM, SEPARATE_NETWORKS
from shoal.core.device import (
    check_precision,
    grad_scaler,
    load_scaler_state,
    resolve_device,
    scaler_state,
    to_device,
    to_host,
)
from shoal.core.types import ReplayBatch
from shoal.fast.backend import place
from shoal.losses import bootstrap_discount, n_step_return
from shoal.nn.action_scaling import ActionScaler
from shoal.nn.critics import CriticEnsemble
from shoal.nn.target import frozen_copy, soft_update
from shoal.optim import build_optimizer, minimize


@dataclass(frozen=True)
class ActorCriticReplayConfig:
    """Settings shared by DDPG, TD3, SAC and D4PG. Defaults follow Stable-Baselines3's SAC and
    TD3 (one env, one gradient step per env step, batch 256, 256x256 ReLU networks)."""

    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=lambda: EnvConfig(id="Pendulum-v1", num_envs=1))
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=1e-3, eps=1e-8, max_grad_norm=None)
    )
    """Adam for both networks; lr is the critic's (and the actor's unless actor_lr is set).
    max_grad_norm clips each network's gradient norm separately."""
    model: ModelConfig = field(
        default_factory=lambda: ModelConfig(hidden=(256, 256), activation="relu")
    )
    """Hidden layers of the actor and of each critic."""
    actor_lr: float | None = None
    """Actor learning rate (None: optim.lr)."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Target networks: target <- tau * online + (1 - tau) * target after each update."""
    replay: ReplayConfig = field(
        default_factory=lambda: ReplayConfig(
            buffer_size=1_000_000, batch_size=256, learning_starts=100
        )
    )
    """Replay size, batch size, n-step returns, prioritization, learning_starts (env steps of
    uniformly random actions before the first gradient step), gradient steps per iteration."""
    rollout_steps: int = 1
    """Vector-env steps per iteration (env steps per iteration = rollout_steps * num_envs)."""
    critic_loss: Literal["mse", "huber"] = "mse"
    """Per-sample critic regression loss (0.5 e^2, or Huber with threshold 1)."""
    critic_l2: float = 0.0
    """L2 regularization c * ||w||^2 of the critic's weights (the DDPG paper uses 1e-2)."""

    RENAMED: ClassVar[dict[str, Renamed]] = REPLAY_RENAMES

    UNUSED: ClassVar[dict[str, str]] = {
        **NO_LR_SCHEDULE,
        **SEPARATE_NETWORKS,
        **NO_LSTM,
        "optim.weight_decay": "critic_l2 regularizes its critic (as in the DDPG paper)",
    }

    def __post_init__(self) -> None:
        check_choices(self)
        check_positive(self, "rollout_steps")
        check(self, "gamma", 0.0 <= self.gamma <= 1.0, "must be in [0, 1]")
        check(self, "tau", 0.0 < self.tau <= 1.0, "must be in (0, 1]")
        check(self, "critic_l2", self.critic_l2 >= 0, "must be >= 0")
        if self.actor_lr is not None:
            check_positive(self, "actor_lr")
        check_replay_holds(self, self.env.num_envs)


ActorT = TypeVar("ActorT", bound=nn.Module)  # an `Actor`, or MADDPG's and CTEDD's teams


class ActorCriticCore(Generic[ActorT]):
    """The actor, the critic ensemble, their targets and one Adam optimizer with a parameter
    group per network, as DDPG, TD3, SAC and D4PG learners use them.

    One optimizer over the sum of the losses is the same as one optimizer per loss: each loss
    reaches only its own network's parameters (actor losses see the critic through
    ``detach_weights``), and Adam's update of a parameter depends only on that parameter's
    gradients. It saves a backward pass and an optimizer call per update.

    Args:
        config: an `ActorCriticReplayConfig`.
        actor, critic: the online networks.
        target_actor: keep a target copy of the actor (DDPG, TD3, D4PG; SAC has none).
        extra: further parameter groups with their learning rates (SAC's log-temperature,
            CQL's penalty weight).
    """

    def __init__(
        self,
        config: ActorCriticReplayConfig,
        actor: ActorT,
        critic: CriticEnsemble,
        target_actor: bool,
        extra: Sequence[tuple[Sequence[nn.Parameter], float]] = (),
    ):
        self.config = config
        self.device = resolve_device(config.run.device)
        check_precision(config.model.precision, self.device)
        compiled = config.run.compile
        self.target_actor = place(frozen_copy(actor), self.device) if target_actor else None
        self.target_critic = place(frozen_copy(critic), self.device)
        self.actor = place(actor, self.device, compiled)
        self.critic = place(critic, self.device, compiled)
        self.actor_params: list[torch.Tensor] = list(actor.parameters())
        self.critic_params: list[torch.Tensor] = list(critic.parameters())
        optim = config.optim
        groups: list[dict[str, Any]] = [
            {"params": self.actor_params, "lr": config.actor_lr or optim.lr},
            # Adam's weight_decay adds wd * w to the gradient: the gradient of (wd / 2) ||w||^2.
            {"params": self.critic_params, "weight_decay": 2.0 * config.critic_l2},
        ]
        for params, lr in extra:  # created on the run's device by the learner
            groups.append({"params": list(params), "lr": lr})
        self.optimizer = build_optimizer(groups, "adam", optim.lr, optim.eps)
        self.scaler = grad_scaler(config.model.precision, self.device)
        self._critic_pairs: tuple[list[torch.Tensor], list[torch.Tensor]] = (
            list(self.target_critic.parameters()),
            self.critic_params,
        )
        self.minimize = minimize
        """The gradient step, a part: a learner group's rank swaps in one that all-reduces
        (`shoal.algos.cores.group_shares.SharedMinimize`)."""
        self._actor_pairs: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
        if self.target_actor is not None:
            self._actor_pairs = (list(self.target_actor.parameters()), self.actor_params)
        self.grad_steps = 0

    def batch(self, batch: ReplayBatch) -> ReplayBatch:
        """A replay batch on the networks' device (pinned, asynchronous copies)."""
        return to_device(batch, self.device)

    def unit_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Replay's env-unit actions in the unit box the networks use."""
        scaler = self.actor.scaler
        assert isinstance(scaler, ActionScaler)  # continuous actors have one
        return scaler.to_unit(actions)

    def bootstrap(self, batch: ReplayBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """``(returns, discounts)`` ``[N]`` of a batch's n-step windows."""
        gamma = self.config.gamma
        return n_step_return(batch.rewards, gamma), bootstrap_discount(
            batch.steps, batch.terminated, gamma
        )

    def step(self, losses: dict[str, torch.Tensor]) -> None:
        """One optimizer step on the sum of ``losses`` (a non-finite one is refused by name);
        actor and critic gradients are clipped each to ``optim.max_grad_norm``."""
        total = sum(losses.values())
        self.minimize(
            {**losses, "total": total},
            self.optimizer,
            self.config.optim.max_grad_norm,
            scaler=self.scaler,
            clip_groups=(self.actor_params, self.critic_params),
        )
        self.grad_steps += 1

    @property
    def target_policy(self) -> ActorT:
        """The target actor (the learners that keep one: DDPG, TD3, D4PG)."""
        assert self.target_actor is not None, "built with target_actor=True"
        return self.target_actor

    def update_targets(self, actor: bool = True) -> None:
        """Polyak-average the target critic (and target actor, when kept and ``actor``)."""
        soft_update(*self._critic_pairs, self.config.tau)
        if actor and self._actor_pairs is not None:
            soft_update(*self._actor_pairs, self.config.tau)

    def set_random_actions(self, on: bool) -> None:
        switch = self.actor.random_actions  # a bool buffer of every actor here
        assert isinstance(switch, torch.Tensor)
        switch.fill_(on)

    def state_dict(self) -> dict[str, Any]:
        state = {
            "actor": self.actor.state_dict(),
            "critic": self.critic.state_dict(),
            "target_critic": self.target_critic.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "grad_steps": self.grad_steps,
            **scaler_state(self.scaler),
        }
        if self.target_actor is not None:
            state["target_actor"] = self.target_actor.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        self.target_critic.load_state_dict(state["target_critic"])
        if self.target_actor is not None:
            self.target_actor.load_state_dict(state["target_actor"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.grad_steps = int(state["grad_steps"])
        load_scaler_state(self.scaler, state)


class ActorCriticLearner(Generic[ActorT]):
    """The plumbing of a learner built on an `ActorCriticCore` (``self.core``): weights for
    the samplers, checkpoint state, the random-action switch. A learner adds its ``update``."""

    core: ActorCriticCore[ActorT]

    @property
    def device(self) -> torch.device:
        return self.core.device

    @property
    def grad_steps(self) -> int:
        return self.core.grad_steps

    @property
    def policy_network(self) -> nn.Module:
        return self.core.actor

    @property
    def minimize(self) -> Callable[..., Any]:
        """The core's gradient step (a learner group's rank swaps it)."""
        return self.core.minimize

    @minimize.setter
    def minimize(self, step: Callable[..., Any]) -> None:
        self.core.minimize = step

    def set_random_actions(self, on: bool) -> None:
        self.core.set_random_actions(on)

    def get_weights(self) -> dict[str, torch.Tensor]:
        return to_host(self.core.actor.state_dict())

    def set_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self.core.actor.load_state_dict(weights)

    def state_dict(self) -> dict[str, Any]:
        return self.core.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.core.load_state_dict(state)
