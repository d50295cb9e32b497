"""AlphaZero's policy-value network (Silver et al. 2017, "Mastering the game of Go without
human knowledge", methods): a shared trunk, a policy head of move logits and a value head in
[-1, 1]. Boards (``[C, H, W]`` observations) get a convolutional stem and residual blocks
(with ``board_activation``, the paper's ReLU by default); anything else an MLP (with
``activation``)."""

from __future__ import annotations

import math

import torch
from torch import nn

from shoal.nn.activations import ACTIVATION_MODULES, ACTIVATIONS
from shoal.nn.cnn import ResidualBlock, conv2d
from shoal.nn.distributions import Categorical
from shoal.nn.init import linear
from shoal.nn.mlp import MLP


class PolicyValueNet(nn.Module):
    """``forward(obs) -> (logits [B, A], value [B])``; ``distribution(obs, action_mask)`` is
    the prior over legal moves, so the network alone deploys as a policy (no search)."""

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        num_actions: int,
        hidden: tuple[int, ...] = (128, 128),
        blocks: int = 0,
        channels: int = 64,
        activation: str = "relu",
        board_activation: str = "relu",
    ):
        super().__init__()
        self.obs_shape, self.num_actions = tuple(obs_shape), num_actions
        self.board = blocks > 0 and len(obs_shape) == 3
        if self.board:
            c, h, w = obs_shape
            act = ACTIVATION_MODULES[board_activation]
            self.board_activation = ACTIVATIONS[board_activation]
            self.stem = nn.Sequential(conv2d(c, channels, 3, padding=1), act())
            blocks_ = [ResidualBlock(channels, board_activation) for _ in range(blocks)]
            self.blocks = nn.Sequential(*blocks_)
            self.policy_conv = nn.Sequential(conv2d(channels, 2, 1), act(), nn.Flatten())
            self.value_conv = nn.Sequential(conv2d(channels, 1, 1), act(), nn.Flatten())
            self.policy_out = linear(2 * h * w, num_actions, gain=0.01)
            self.value_hidden = linear(h * w, hidden[-1] if hidden else 64)
            self.value_out = linear(self.value_hidden.out_features, 1, gain=1.0)
        else:
            self.trunk = MLP(math.prod(obs_shape), tuple(hidden), activation)
            self.policy_out = linear(self.trunk.out_dim, num_actions, gain=0.01)
            self.value_out = linear(self.trunk.out_dim, 1, gain=1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        obs = obs.float()
        if self.board:
            f = self.board_activation
            x = f(self.blocks(self.stem(obs)))
            logits = self.policy_out(self.policy_conv(x))
            value = self.value_out(f(self.value_hidden(self.value_conv(x))))
        else:
            x = self.trunk(obs.flatten(1))
            logits, value = self.policy_out(x), self.value_out(x)
        return logits, torch.tanh(value.squeeze(-1))

    def distribution(
        self, obs: torch.Tensor, action_mask: torch.Tensor | None = None
    ) -> Categorical:
        logits, _ = self(obs)
        if action_mask is not None:
            logits = logits.masked_fill(~action_mask.bool(), torch.finfo(logits.dtype).min)
        return Categorical(logits)
