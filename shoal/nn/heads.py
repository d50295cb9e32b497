"""Output heads: features in, a distribution or a value out."""

from __future__ import annotations

import torch
from torch import nn

from shoal.nn.distributions import Categorical, DiagGaussian
from shoal.nn.init import POLICY_GAIN, VALUE_GAIN, linear


class CategoricalHead(nn.Module):
    """Logits for ``n`` discrete actions, divided by a softmax ``temperature``.

    Temperature above 1 flattens the policy (more exploration), below 1 sharpens it; schedules
    may change ``temperature`` between iterations (reference 001 anneals it).
    """

    def __init__(self, in_dim: int, num_actions: int, temperature: float = 1.0):
        super().__init__()
        self.logits = linear(in_dim, num_actions, POLICY_GAIN)
        self.temperature = temperature

    def forward(self, features: torch.Tensor) -> Categorical:
        logits = self.logits(features)
        if self.temperature != 1.0:
            logits = logits / self.temperature
        return Categorical(logits)


class GaussianHead(nn.Module):
    """Diagonal Gaussian with a state-independent, learned log standard deviation."""

    def __init__(self, in_dim: int, action_dim: int, init_log_std: float = 0.0):
        super().__init__()
        self.mean = linear(in_dim, action_dim, POLICY_GAIN)
        self.log_std = nn.Parameter(torch.full((action_dim,), float(init_log_std)))

    def forward(self, features: torch.Tensor) -> DiagGaussian:
        return DiagGaussian(self.mean(features), self.log_std)


class ValueHead(nn.Module):
    """A scalar state value per input row."""

    def __init__(self, in_dim: int):
        super().__init__()
        self.value = linear(in_dim, 1, VALUE_GAIN)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.value(features).squeeze(-1)
