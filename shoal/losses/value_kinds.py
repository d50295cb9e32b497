"""Value kinds: what the last axis of a Q-network's ``[N, A, M]`` outputs holds, and the loss
that trains it (DQN, C51, QR-DQN, REM).

A kind gives ``atoms`` (``M``), ``q_values`` (the expected action values the network acts on)
and ``loss`` (from the taken actions' outputs and the next state's; returns the loss and new
replay priorities). The DQN learner (`shoal.algos.value.dqn`) is the same for all four; only
the kind differs, which is how QR-DQN and REM reuse it. The networks are in `shoal.nn.q_network`.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

import torch

from shoal.core.types import ReplayBatch
from shoal.losses.q_learning import (
    categorical_projection,
    categorical_td_loss,
    combine_heads,
    masked_argmax,
    q_learning_target,
    quantile_huber_loss,
    quantile_midpoints,
    quantile_target,
    random_convex_combination,
    td_loss,
)

__all__ = ["CategoricalQ", "EnsembleQ", "ExpectedQ", "QuantileQ", "ValueKind", "make_value_kind"]


class ValueKind(Protocol):
    atoms: int
    """Size ``M`` of the last output axis."""

    def q_values(self, out: torch.Tensor) -> torch.Tensor:
        """``[..., A, M]`` outputs -> ``[..., A]`` expected action values (for acting)."""
        ...

    def loss(
        self,
        out_taken: torch.Tensor,
        next_target: torch.Tensor,
        next_online: torch.Tensor | None,
        returns: torch.Tensor,
        discounts: torch.Tensor,
        batch: ReplayBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Loss from the taken actions' outputs ``[N, M]``, the next state's target (and,
        for Double DQN, online) outputs ``[N, A, M]``; returns (loss, new priorities [N])."""
        ...


LossKind = Literal["huber", "mse"]

LossAndPriorities = tuple[torch.Tensor, torch.Tensor]


def _bootstrap_action(
    kind: ValueKind, next_target: torch.Tensor, next_online: torch.Tensor | None, mask: Any
) -> torch.Tensor:
    """Greedy next action by the online network (Double DQN) or else by the target."""
    selector = next_target if next_online is None else next_online.detach()
    return masked_argmax(kind.q_values(selector), mask)


class ExpectedQ:
    """DQN: one Q-value per action, TD regression with Huber or squared error."""

    atoms = 1

    def __init__(self, loss_kind: LossKind = "huber"):
        self.loss_kind = loss_kind

    def q_values(self, out: torch.Tensor) -> torch.Tensor:
        return out.squeeze(-1)

    def loss(
        self,
        out_taken: torch.Tensor,
        next_target: torch.Tensor,
        next_online: torch.Tensor | None,
        returns: torch.Tensor,
        discounts: torch.Tensor,
        batch: ReplayBatch,
    ) -> LossAndPriorities:
        online = None if next_online is None else next_online.detach().squeeze(-1)
        target = q_learning_target(
            returns, discounts, next_target.squeeze(-1), online, batch.next_action_mask
        )
        loss, td_errors = td_loss(out_taken.squeeze(-1), target, batch.weights, self.loss_kind)
        return loss, td_errors.abs()


class CategoricalQ:
    """C51 (Bellemare et al. 2017): logits over ``atoms`` returns evenly spaced in
    ``[v_min, v_max]``; the target distribution is projected back onto the support."""

    def __init__(self, atoms: int, v_min: float, v_max: float):
        self.atoms = atoms
        self.support = torch.linspace(v_min, v_max, atoms)

    def _support(self, like: torch.Tensor) -> torch.Tensor:
        if self.support.device != like.device:  # kept where the network computes
            self.support = self.support.to(like.device)
        return self.support

    def q_values(self, out: torch.Tensor) -> torch.Tensor:
        return (out.softmax(dim=-1) * self._support(out)).sum(-1)

    def loss(
        self,
        out_taken: torch.Tensor,
        next_target: torch.Tensor,
        next_online: torch.Tensor | None,
        returns: torch.Tensor,
        discounts: torch.Tensor,
        batch: ReplayBatch,
    ) -> LossAndPriorities:
        action = _bootstrap_action(self, next_target, next_online, batch.next_action_mask)
        rows = torch.arange(len(action), device=action.device)
        next_probs = next_target[rows, action].softmax(dim=-1)
        support = self._support(next_probs)
        target = categorical_projection(next_probs, support, returns, discounts)
        # The per-sample cross-entropy is Rainbow's priority (Hessel et al. 2018).
        return categorical_td_loss(out_taken, target, batch.weights)


class QuantileQ:
    """QR-DQN (Dabney et al. 2018): ``atoms`` quantiles at the midpoints of equal bins."""

    def __init__(self, quantiles: int, kappa: float):
        self.atoms = quantiles
        self.kappa = kappa
        self.taus = quantile_midpoints(quantiles)

    def q_values(self, out: torch.Tensor) -> torch.Tensor:
        return out.mean(-1)

    def loss(
        self,
        out_taken: torch.Tensor,
        next_target: torch.Tensor,
        next_online: torch.Tensor | None,
        returns: torch.Tensor,
        discounts: torch.Tensor,
        batch: ReplayBatch,
    ) -> LossAndPriorities:
        action = _bootstrap_action(self, next_target, next_online, batch.next_action_mask)
        next_quantiles = next_target[torch.arange(len(action), device=action.device), action]
        target = quantile_target(returns, discounts, next_quantiles)
        if self.taus.device != out_taken.device:  # kept where the network computes
            self.taus = self.taus.to(out_taken.device)
        return quantile_huber_loss(out_taken, target, self.taus, self.kappa, batch.weights)


class EnsembleQ:
    """REM (Agarwal et al. 2020): ``atoms`` Q-heads; each minibatch trains one random convex
    combination of them, online and target alike. Acting uses their mean."""

    def __init__(self, heads: int, loss_kind: LossKind = "huber"):
        self.atoms = heads
        self.loss_kind = loss_kind

    def q_values(self, out: torch.Tensor) -> torch.Tensor:
        return out.mean(-1)

    def loss(
        self,
        out_taken: torch.Tensor,
        next_target: torch.Tensor,
        next_online: torch.Tensor | None,
        returns: torch.Tensor,
        discounts: torch.Tensor,
        batch: ReplayBatch,
    ) -> LossAndPriorities:
        # Drawn from the global CPU generator, so a seed gives the same draws on every device.
        alphas = random_convex_combination(self.atoms).to(out_taken.device)
        online = None if next_online is None else combine_heads(next_online.detach(), alphas)
        target = q_learning_target(
            returns, discounts, combine_heads(next_target, alphas), online, batch.next_action_mask
        )
        q_taken = (out_taken * alphas).sum(-1)
        loss, td_errors = td_loss(q_taken, target, batch.weights, self.loss_kind)
        return loss, td_errors.abs()


def make_value_kind(config: Any) -> ValueKind:
    """The value kind a DQN config asks for (``config.value_head``)."""
    if config.value_head == "q":
        return ExpectedQ(config.loss)
    if config.value_head == "c51":
        return CategoricalQ(config.num_atoms, config.v_min, config.v_max)
    if config.value_head == "quantile":
        return QuantileQ(config.num_quantiles, config.kappa)
    if config.value_head == "rem":
        return EnsembleQ(config.num_heads, config.loss)
    raise ValueError(f"unknown value head {config.value_head!r}")
