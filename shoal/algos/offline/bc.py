"""Behaviour cloning (Pomerleau 1991, "Efficient training of artificial neural networks for
autonomous navigation"): supervised learning of the dataset's actions, the baseline every
offline learner is measured against.

Discrete actions: a softmax policy trained by cross-entropy. Continuous actions: a
deterministic tanh policy in the unit box trained by squared error. The dataset is the only
teacher, so behaviour cloning cannot continue online.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
import torch
from torch import nn

from shoal.algos.cores import offline as offline_core
from shoal.algos.cores.offline import OfflineAlgorithm, OfflineConfig
from shoal.algos.spec import AlgorithmSpec
from shoal.config import NoiseConfig
from shoal.config.usage import IN_STEP, NO_COMPILE, NO_LR_SCHEDULE, NO_LSTM, Gate
from shoal.core.device import check_precision, resolve_device, to_device, to_host
from shoal.core.types import ReplayBatch
from shoal.fast.backend import place
from shoal.losses.offline import behaviour_cloning_loss
from shoal.nn.actors import CategoricalActor, DeterministicActor
from shoal.optim import build_optimizer, minimize


@dataclass(frozen=True)
class BCConfig(OfflineConfig):
    """Behaviour cloning settings; the rest are `OfflineConfig`'s (gamma, tau and the
    critic's settings go unused)."""

    ONLINE: ClassVar[bool] = False
    GATES: ClassVar[dict[str, Gate | None]] = {
        **OfflineConfig.GATES,
        "run.runners": None,  # never online: refused by name (its spec's no_runners)
    }
    UNUSED: ClassVar[dict[str, str]] = {
        **NO_COMPILE,
        **NO_LR_SCHEDULE,
        **NO_LSTM,
        **IN_STEP,
        "model.shared_trunk": "it trains one network, the actor",
        **{name: "behaviour cloning has no critic and no returns"
           for name in ("gamma", "tau", "critic_loss", "critic_l2")},
    }  # fmt: skip


def build_model(
    config: BCConfig, obs_space: gym.Space, action_space: gym.Space
) -> CategoricalActor | DeterministicActor:
    if isinstance(action_space, gym.spaces.Discrete):
        return CategoricalActor(obs_space, action_space, config.model)
    return DeterministicActor(obs_space, action_space, config.model, NoiseConfig(scale=0.0))


class BCLearner:
    def __init__(self, config: BCConfig, obs_space: gym.Space, action_space: gym.Space):
        self.config = config
        self.device = resolve_device(config.run.device)
        check_precision(config.model.precision, self.device)
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.actor = place(build_model(config, obs_space, action_space), self.device)
        self.optimizer = build_optimizer(
            self.actor.parameters(), "adamw", config.actor_lr or config.optim.lr,
            config.optim.eps, config.optim.weight_decay,
        )  # fmt: skip
        self.minimize = minimize
        """The gradient step, a part: a learner group's rank swaps in one that all-reduces
        (`shoal.algos.cores.group_shares.SharedMinimize`)."""
        self.grad_steps = 0

    def update(self, batch: ReplayBatch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        batch = to_device(batch, self.device)
        actor = self.actor
        if isinstance(actor, CategoricalActor):
            prediction, actions = actor.logits(actor.features(batch.obs)), batch.actions
        else:
            prediction, actions = actor(batch.obs), actor.scaler.to_unit(batch.actions)
        loss = behaviour_cloning_loss(prediction, actions, self.discrete)
        self.minimize({"policy": loss}, self.optimizer, self.config.optim.max_grad_norm)
        self.grad_steps += 1
        return {"loss/policy": loss.detach()}, batch.weights  # no priorities: uniform replay

    @property
    def policy_network(self) -> nn.Module:
        return self.actor

    def set_random_actions(self, on: bool) -> None:
        self.actor.random_actions.fill_(on)

    def get_weights(self) -> dict[str, torch.Tensor]:
        return to_host(self.actor.state_dict())

    def state_dict(self) -> dict[str, Any]:
        return {
            "actor": self.actor.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "grad_steps": self.grad_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.actor.load_state_dict(state["actor"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.grad_steps = int(state["grad_steps"])


class BC(OfflineAlgorithm):
    def __init__(self, config: BCConfig):
        super().__init__(config, BCLearner, build_model)


SPECS = (
    AlgorithmSpec(
        "bc",
        BCConfig,
        BC,
        build_model,
        "Behaviour cloning of a dataset's actions",
        "Box (bounded), Discrete",
        prepare=offline_core.prepare,
        counts=offline_core.counts,
        own_spaces=True,
        extra_evaluation=True,
        no_runners="learns from its dataset only, never acting in an env",
        learner_groups=True,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
