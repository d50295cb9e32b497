"""Q-networks for the value-based family, and what their outputs mean.

A `QNetwork` maps observations to ``[N, A, M]`` outputs. A *value kind* says what the last
axis holds and how it is trained: one Q-value (DQN, ``M = 1``), C51 logits over a fixed
support, QR-DQN quantiles, or REM's ensemble of Q-heads. The DQN learner is the same for all
four; only the kind passed in differs, which is how QR-DQN and REM reuse it.
"""

from __future__ import annotations

from typing import Any, Protocol

import gymnasium as gym
import torch
from torch import nn

from shoal.errors import ConfigError, UnsupportedSpaceError
from shoal.losses import (
    categorical_projection,
    categorical_td_loss,
    combine_heads,
    q_learning_target,
    quantile_huber_loss,
    quantile_midpoints,
    quantile_target,
    random_convex_combination,
    td_loss,
)
from shoal.nn.actor_critic import ActOutput, ObsEncoding
from shoal.nn.cnn import build_encoder
from shoal.nn.mlp import MLP
from shoal.nn.q_heads import QHead
from shoal.types import ReplayBatch


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


def masked_argmax(q: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is not None:
        q = q.masked_fill(~mask, float("-inf"))
    return q.argmax(dim=-1)


def _bootstrap_action(
    kind: ValueKind, next_target: torch.Tensor, next_online: torch.Tensor | None, mask: Any
) -> torch.Tensor:
    """Greedy next action by the online network (Double DQN) or else by the target."""
    selector = next_target if next_online is None else next_online.detach()
    return masked_argmax(kind.q_values(selector), mask)


class ExpectedQ:
    """DQN: one Q-value per action, TD regression with Huber or squared error."""

    atoms = 1

    def __init__(self, loss_kind: str = "huber"):
        self.loss_kind = loss_kind

    def q_values(self, out: torch.Tensor) -> torch.Tensor:
        return out.squeeze(-1)

    def loss(self, out_taken, next_target, next_online, returns, discounts, batch):
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

    def q_values(self, out: torch.Tensor) -> torch.Tensor:
        return (out.softmax(dim=-1) * self.support).sum(-1)

    def loss(self, out_taken, next_target, next_online, returns, discounts, batch):
        action = _bootstrap_action(self, next_target, next_online, batch.next_action_mask)
        next_probs = next_target[torch.arange(len(action)), action].softmax(dim=-1)
        target = categorical_projection(next_probs, self.support, returns, discounts)
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

    def loss(self, out_taken, next_target, next_online, returns, discounts, batch):
        action = _bootstrap_action(self, next_target, next_online, batch.next_action_mask)
        next_quantiles = next_target[torch.arange(len(action)), action]
        target = quantile_target(returns, discounts, next_quantiles)
        return quantile_huber_loss(out_taken, target, self.taus, self.kappa, batch.weights)


class EnsembleQ:
    """REM (Agarwal et al. 2020): ``atoms`` Q-heads; each minibatch trains one random convex
    combination of them, online and target alike. Acting uses their mean."""

    def __init__(self, heads: int, loss_kind: str = "huber"):
        self.atoms = heads
        self.loss_kind = loss_kind

    def q_values(self, out: torch.Tensor) -> torch.Tensor:
        return out.mean(-1)

    def loss(self, out_taken, next_target, next_online, returns, discounts, batch):
        alphas = random_convex_combination(self.atoms)
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


class GreedyDistribution:
    """What `shoal.policy.ActorPolicy` asks of a policy: ``mode()`` is the greedy action,
    ``sample()`` the exploring one (epsilon-greedy or Boltzmann, as the network is set)."""

    def __init__(self, network: QNetwork, q: torch.Tensor, mask: torch.Tensor | None):
        self.network, self.q, self.mask = network, q, mask

    def mode(self) -> torch.Tensor:
        return masked_argmax(self.q, self.mask)

    def sample(self) -> torch.Tensor:
        net, q = self.network, self.q
        if net.boltzmann:
            logits = q / net.temperature
            return masked_argmax(logits - torch.empty_like(q).exponential_().log(), self.mask)
        greedy = self.mode()
        # A uniformly random legal action: the argmax of uniform noise over legal actions.
        random = masked_argmax(torch.rand_like(q), self.mask)
        explore = torch.rand(q.shape[0]) < net.epsilon
        return torch.where(explore, random, greedy)


class QNetwork(nn.Module):
    """MLP trunk (or an image encoder, `shoal.nn.cnn`) and a `QHead`; ``epsilon`` and
    ``temperature`` are buffers, so exploration settings travel with the weights to every
    sampler."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, config: Any, kind: ValueKind):
        super().__init__()
        if not isinstance(action_space, gym.spaces.Discrete):
            raise UnsupportedSpaceError(
                f"action space {action_space} is not supported by DQN; it needs Discrete "
                "actions (use SAC, TD3 or DDPG for continuous ones)"
            )
        self.kind = kind
        model = config.model
        if model.encoder == "ref001-model3":
            raise ConfigError(
                "model.encoder 'ref001-model3' is reference 001's CNN + LSTM model and DQN's "
                "Q-network has no recurrent core; use 'ref001-model2', 'nature' or 'impala'"
            )
        if model.encoder != "mlp":  # an image encoder (`shoal.nn.cnn`) replaces both
            self.encoding: nn.Module = nn.Identity()
            self.body: nn.Module = build_encoder(obs_space, model)
        else:
            self.encoding = ObsEncoding(obs_space)
            self.body = MLP(self.encoding.out_dim, model.hidden, model.activation)
        self.head = QHead(
            self.body.out_dim,
            int(action_space.n),
            atoms=kind.atoms,
            dueling=config.dueling,
            noisy=config.noisy,
            hidden=config.head_hidden,
            sigma0=config.noisy_sigma0,
        )
        self.boltzmann = config.exploration == "boltzmann"
        self.noisy = config.noisy
        self.register_buffer("epsilon", torch.tensor(float(config.epsilon_start)))
        self.register_buffer("temperature", torch.tensor(float(config.temperature_start)))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``[N, ...]`` observations -> ``[N, A, M]`` outputs."""
        return self.head(self.body(self.encoding(obs)))

    def q_values(self, obs: torch.Tensor) -> torch.Tensor:
        return self.kind.q_values(self(obs))

    def reset_noise(self) -> None:
        self.head.reset_noise()

    def distribution(
        self, obs: torch.Tensor, action_mask: torch.Tensor | None = None
    ) -> GreedyDistribution:
        return GreedyDistribution(self, self.q_values(obs), action_mask)

    def act(
        self,
        obs: torch.Tensor,
        deterministic: bool = False,
        action_mask: torch.Tensor | None = None,
    ) -> ActOutput:
        if self.noisy and self.training:
            self.reset_noise()  # noisy nets explore with fresh noise at every step
        dist = self.distribution(obs, action_mask)
        actions = dist.mode() if deterministic else dist.sample()
        values = dist.q.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        return ActOutput(actions, torch.zeros_like(values), values)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.q_values(obs).max(dim=-1).values
