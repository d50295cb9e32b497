"""Small action distributions for the hot path.

`torch.distributions` validates arguments and normalizes lazily on every call; these classes do
only the arithmetic the learners use, which matters when a policy acts thousands of times per
second on small batches.
"""

from __future__ import annotations

import math

import torch

LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


class Categorical:
    """Categorical over the last axis of ``logits [..., n]``."""

    def __init__(self, logits: torch.Tensor):
        self.logits = torch.log_softmax(logits, dim=-1)

    def sample(self) -> torch.Tensor:
        # Gumbel-max: argmax(logits + Gumbel noise) is an exact sample, in two tensor ops.
        gumbel = -torch.empty_like(self.logits).exponential_().log()
        return (self.logits + gumbel).argmax(dim=-1)

    def mode(self) -> torch.Tensor:
        return self.logits.argmax(dim=-1)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        return self.logits.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self) -> torch.Tensor:
        return -(self.logits.exp() * self.logits).sum(dim=-1)

    def kl(self, other: Categorical) -> torch.Tensor:
        return (self.logits.exp() * (self.logits - other.logits)).sum(dim=-1)


class DiagGaussian:
    """Independent Gaussians over the last axis; log-probs and entropies sum over it."""

    def __init__(self, mean: torch.Tensor, log_std: torch.Tensor):
        self.mean = mean
        self.log_std = log_std.expand_as(mean)

    def sample(self) -> torch.Tensor:
        return self.mean + self.log_std.exp() * torch.randn_like(self.mean)

    def mode(self) -> torch.Tensor:
        return self.mean

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        z = (actions - self.mean) * torch.exp(-self.log_std)
        return (-0.5 * z.square() - self.log_std - LOG_SQRT_2PI).sum(dim=-1)

    def entropy(self) -> torch.Tensor:
        return (self.log_std + 0.5 + LOG_SQRT_2PI).sum(dim=-1)

    def kl(self, other: DiagGaussian) -> torch.Tensor:
        var_ratio = torch.exp(2.0 * (self.log_std - other.log_std))
        mean_term = ((self.mean - other.mean) * torch.exp(-other.log_std)).square()
        return 0.5 * (var_ratio + mean_term - 1.0 - 2.0 * (self.log_std - other.log_std)).sum(-1)


Distribution = Categorical | DiagGaussian
