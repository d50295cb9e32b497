"""The learners of AlphaZero and MuZero: the network, its optimizer and one update on a batch
of their replays, which the algorithm holds as a part. With ``run.learners`` N > 1 it holds a
`shoal.algos.cores.learner_group.ReplayLearnerGroup` of N of them instead: each batch is split
among them (AlphaZero's positions by rows; MuZero's unrolls by rows, its time-major targets
along their second axis, `unroll_rows`) and their gradients are all-reduced, weighted by
their shares of the batch, into one update; the new priorities come back in the batch's order.
Self-play scales on its own, on Ray runners (``run.runners``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from shoal.algos.cores.group_shares import ReplayShare
from shoal.algos.cores.learner_group import ReplayLearnerGroup
from shoal.core.device import resolve_device
from shoal.data.positions import Positions
from shoal.data.trajectories import Unroll
from shoal.losses.search import alphazero_loss, muzero_loss, scalar_to_support
from shoal.losses.value import value_transform
from shoal.optim import build_optimizer, minimize
from shoal.search.models import decode


class SearchLearner:
    """What both learners share: the network on the run's device, Adam, the gradient step
    as a part (``minimize``: a learner group's rank swaps in one that all-reduces), the
    learning rate set from outside (its schedule), the update count."""

    def __init__(self, config: Any, net: nn.Module):
        self.config = config
        self.device = resolve_device(config.run.device)
        self.model = net.to(self.device)
        opt = config.optim
        self.optimizer = build_optimizer(self.model.parameters(), "adam", opt.lr, opt.eps,
                                         opt.weight_decay)  # fmt: skip
        self.minimize: Callable[..., Any] = minimize
        self.grad_steps = 0

    def set_lr(self, lr: float) -> None:
        """The learning rate of the coming updates (``optim.lr_schedule``'s value)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def get_weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu() for k, v in self.model.state_dict().items()}

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "grad_steps": self.grad_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.grad_steps = int(state.get("grad_steps", self.grad_steps))


class AlphaZeroLearner(SearchLearner):
    """The policy-value network's update on a batch of positions (`alphazero_loss`)."""

    def update(self, batch: Positions) -> tuple[dict[str, torch.Tensor], None]:
        """One gradient step; the loss parts (means over the batch), and no priorities."""
        self.model.train()
        batch = Positions(*(x.to(self.device) for x in batch))
        logits, value = self.model(batch.obs)
        loss, parts = alphazero_loss(logits, value, batch.policy, batch.outcome, batch.legal,
                                     self.config.value_coef)  # fmt: skip
        self.minimize({"total": loss, **parts}, self.optimizer, self.config.optim.max_grad_norm)
        self.grad_steps += 1
        return parts, None


class MuZeroLearner(SearchLearner):
    """The representation, dynamics and prediction functions' update on a batch of unrolls
    (`muzero_loss`), the gradient halved through the latent state at every step."""

    def update(self, batch: Unroll) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """One gradient step; the loss parts (means over the batch) and the new priorities
        (the first position's absolute value error), on the host."""
        cfg, device = self.config, self.device
        net: Any = self.model  # a MuZeroNet (initial, recurrent)
        net.train()

        def two_hot(x: torch.Tensor) -> torch.Tensor:
            return scalar_to_support(value_transform(x.to(device)), cfg.support_size)

        state, policy, value = net.initial(batch.obs.to(device))
        policies, values, rewards = [policy], [value], []
        for k in range(cfg.unroll_steps):
            state = 0.5 * state + 0.5 * state.detach()  # halve the gradient through time
            state, reward, policy, value = net.recurrent(state, batch.actions[k].to(device))
            policies.append(policy)
            values.append(value)
            rewards.append(reward)
        loss, parts = muzero_loss(
            torch.stack(policies), torch.stack(values), torch.stack(rewards),
            batch.target_policy.to(device), two_hot(batch.target_value),
            two_hot(batch.target_reward), batch.policy_mask.to(device),
            batch.value_mask.to(device), batch.reward_mask.to(device),
            batch.weights.to(device), cfg.value_coef,
        )  # fmt: skip
        self.minimize({"total": loss, **parts}, self.optimizer, cfg.optim.max_grad_norm)
        self.grad_steps += 1
        errors = (decode(values[0].detach()) - batch.target_value[0].to(device)).abs()
        return parts, errors.cpu()


def learner_of(
    learner_cls: type[SearchLearner],
    build: Callable[[Any, Any, Any], nn.Module],
    config: Any,
    obs_space: Any,
    action_space: Any,
) -> SearchLearner:
    """A learner around a fresh ``build(config, obs_space, action_space)`` network: what a
    learner group builds on each rank (`group_learner`)."""
    return learner_cls(config, build(config, obs_space, action_space))


UNROLL_ROWS = ("obs", "weights", "indices")
"""An `Unroll`'s fields whose first axis is the batch's; the others are time-major ``[K, B]``."""


def unroll_rows(batch: Unroll, rows: slice) -> Unroll:
    """``batch``'s unrolls ``rows`` (its time-major fields cut along their second axis)."""
    return Unroll(*(getattr(batch, f)[rows] if f in UNROLL_ROWS else getattr(batch, f)[:, rows]
                    for f in Unroll._fields))  # fmt: skip


def group_learner(
    learner_cls: type[SearchLearner], build: Callable[[Any, Any, Any], nn.Module], config: Any,
    obs_space: Any, action_space: Any,
) -> Any:  # fmt: skip
    """The ``run.learners`` > 1 group of ``learner_cls`` learners around ``build``'s network
    (the module doc)."""
    make = functools.partial(learner_of, learner_cls, build)
    cut = unroll_rows if learner_cls is MuZeroLearner else None
    share = ReplayShare if cut is None else functools.partial(ReplayShare, cut=cut)
    return ReplayLearnerGroup(make, config, obs_space, action_space, share_cls=share)
