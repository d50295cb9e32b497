"""Q-networks for the value-based family.

A `QNetwork` maps observations to ``[N, A, M]`` outputs. Its *value kind*
(`shoal.losses.value_kinds.ValueKind`) says what the last axis holds and how it is trained: one
Q-value (DQN, ``M = 1``), C51 logits over a fixed support, QR-DQN quantiles, or REM's ensemble
of Q-heads. The network reads only the kind's ``atoms`` and ``q_values`` (to act); the DQN
learner trains every kind the same way through the kind's loss.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch
from torch import nn

from shoal.core.errors import ConfigError, UnsupportedSpaceError
from shoal.core.types import ActOutput
from shoal.losses.q_learning import masked_argmax
from shoal.losses.value_kinds import ValueKind
from shoal.nn.actor_critic import encoder_and_body
from shoal.nn.mlp import width_of
from shoal.nn.q_heads import QHead


class GreedyDistribution:
    """What `shoal.nn.policy.ActorPolicy` asks of a policy: ``mode()`` is the greedy action,
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
        explore = torch.rand(q.shape[0], device=q.device) < net.epsilon
        return torch.where(explore, random, greedy)


class QNetwork(nn.Module):
    """MLP trunk (or an image encoder, `shoal.nn.cnn`) and a `QHead`; ``epsilon`` and
    ``temperature`` are buffers, so exploration settings travel with the weights to every
    sampler."""

    epsilon: torch.Tensor
    temperature: torch.Tensor

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, config: Any, kind: ValueKind):
        super().__init__()
        if not isinstance(action_space, gym.spaces.Discrete):
            raise UnsupportedSpaceError(
                f"action space {action_space} is not supported by DQN; it needs Discrete "
                "actions (use SAC, TD3 or DDPG for continuous ones, and PPO, A2C, PG, TRPO "
                "or IMPALA for MultiDiscrete, MultiBinary, Tuple and Dict ones)"
            )
        self.kind = kind
        model = config.model
        if model.encoder == "batchnorm-cnn3-lstm":
            raise ConfigError(
                "model.encoder 'batchnorm-cnn3-lstm' is Lamb et al.'s CNN + LSTM model and DQN's "
                "Q-network has no recurrent core; use 'batchnorm-cnn2', 'nature' or 'impala'"
            )
        self.encoding, self.body = encoder_and_body(obs_space, model)
        self.head = QHead(
            width_of(self.body),
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
