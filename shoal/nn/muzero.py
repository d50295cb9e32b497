"""MuZero's three functions (Schrittwieser et al. 2020, "Mastering Atari, Go, Chess and Shogi
by Planning with a Learned Model"): representation ``h(obs) -> s``, dynamics
``g(s, a) -> (s', reward)`` and prediction ``f(s) -> (policy, value)``, as MLPs for vector
observations. Hidden states are min-max scaled to [0, 1] per sample (appendix G); rewards and
values are logits over the support ``-S..S`` of the transformed scalar
(`shoal.losses.search`)."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from shoal.nn.init import linear
from shoal.nn.mlp import MLP


def scale_hidden(state: torch.Tensor) -> torch.Tensor:
    """Min-max scale each hidden state ``[B, L]`` to [0, 1]."""
    low = state.min(-1, keepdim=True).values
    high = state.max(-1, keepdim=True).values
    return (state - low) / (high - low).clamp(min=1e-5)


class MuZeroNet(nn.Module):
    """``initial(obs)`` and ``recurrent(state, action)``; ``support_size`` ``S`` atoms each
    side of zero for the value and the reward."""

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        num_actions: int,
        latent: int = 64,
        hidden: tuple[int, ...] = (64,),
        support_size: int = 10,
        activation: str = "relu",
    ):
        super().__init__()
        self.num_actions, self.latent, self.support_size = num_actions, latent, support_size
        atoms = 2 * support_size + 1
        self.represent = MLP(math.prod(obs_shape), hidden, activation)
        self.represent_out = linear(self.represent.out_dim, latent)
        self.dynamics = MLP(latent + num_actions, hidden, activation)
        self.dynamics_out = linear(self.dynamics.out_dim, latent)
        self.reward_out = linear(self.dynamics.out_dim, atoms, gain=0.01)
        self.predict = MLP(latent, hidden, activation)
        self.policy_out = linear(self.predict.out_dim, num_actions, gain=0.01)
        self.value_out = linear(self.predict.out_dim, atoms, gain=0.01)

    def prediction(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(policy logits [B, A], value logits [B, 2S + 1])``."""
        x = self.predict(state)
        return self.policy_out(x), self.value_out(x)

    def initial(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(hidden state [B, L], policy logits, value logits)`` of observations."""
        state = scale_hidden(self.represent_out(self.represent(obs.float().flatten(1))))
        return (state, *self.prediction(state))

    def recurrent(
        self, state: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(next hidden state, reward logits, policy logits, value logits)``."""
        hot = F.one_hot(action.long(), self.num_actions).to(state.dtype)
        x = self.dynamics(torch.cat([state, hot], dim=-1))
        nxt = scale_hidden(self.dynamics_out(x))
        return (nxt, self.reward_out(x), *self.prediction(nxt))
