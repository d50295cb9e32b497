"""Small action distributions for the hot path.

`torch.distributions` validates arguments and normalizes lazily on every call; these classes do
only the arithmetic the learners use, which matters when a policy acts thousands of times per
second on small batches.
"""

from __future__ import annotations

import math
from typing import Any

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


MASKED_LOGIT = -1e9
"""The logit of an action that cannot be taken (padding, or masked out): its probability is
exactly 0 in float32 and, unlike -inf, ``0 * logit`` stays 0 in entropies and KLs."""


class MultiCategorical:
    """Independent categoricals, one per sub-action of a MultiDiscrete space: ``logits
    [..., sum(nvec)]`` hold each sub-action's logits in turn; actions are ``[..., k]``.
    Log-probabilities, entropies and KLs sum over the sub-actions (a factorized policy).

    ``mask`` ``[..., sum(nvec)]`` (bool, the same layout): True where a sub-action's value is
    legal; masked values get probability 0. The sub-actions are padded to the largest
    ``nvec`` so every operation is one tensor op over ``[..., k, max(nvec)]``."""

    def __init__(self, logits: torch.Tensor, nvec: list[int], mask: torch.Tensor | None = None):
        if mask is not None:
            logits = logits.masked_fill(~mask, MASKED_LOGIT)
        width = max(nvec)
        if all(n == width for n in nvec):
            padded = logits.unflatten(-1, (len(nvec), width))
        else:
            parts = [
                torch.nn.functional.pad(part, (0, width - n), value=MASKED_LOGIT)
                for part, n in zip(logits.split(nvec, dim=-1), nvec, strict=True)
            ]
            padded = torch.stack(parts, dim=-2)
        self.inner = Categorical(padded)

    def sample(self) -> torch.Tensor:
        return self.inner.sample()

    def mode(self) -> torch.Tensor:
        return self.inner.mode()

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        return self.inner.log_prob(actions).sum(dim=-1)

    def entropy(self) -> torch.Tensor:
        return self.inner.entropy().sum(dim=-1)

    def kl(self, other: MultiCategorical) -> torch.Tensor:
        return self.inner.kl(other.inner).sum(dim=-1)


class Bernoulli:
    """Independent Bernoullis over the last axis of ``logits [..., n]`` (MultiBinary actions,
    0 or 1 each); log-probabilities, entropies and KLs sum over it."""

    def __init__(self, logits: torch.Tensor):
        self.logits = logits
        self.log_p = torch.nn.functional.logsigmoid(logits)  # log P(1)
        self.log_q = torch.nn.functional.logsigmoid(-logits)  # log P(0)

    def sample(self) -> torch.Tensor:
        return (torch.rand_like(self.logits) < self.log_p.exp()).long()

    def mode(self) -> torch.Tensor:
        return (self.logits > 0).long()

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        ones = actions.to(self.logits.dtype)
        return (ones * self.log_p + (1.0 - ones) * self.log_q).sum(dim=-1)

    def entropy(self) -> torch.Tensor:
        p = self.log_p.exp()
        return -(p * self.log_p + (1.0 - p) * self.log_q).sum(dim=-1)

    def kl(self, other: Bernoulli) -> torch.Tensor:
        p = self.log_p.exp()
        return (p * (self.log_p - other.log_p) + (1.0 - p) * (self.log_q - other.log_q)).sum(-1)


class Product:
    """Independent distributions over the parts of a Tuple or Dict action, packed in one
    float row ``[..., width]`` (`shoal.envs.composite.PackedActions`): ``parts`` are
    ``(distribution, start, end)`` with the part's columns; log-probabilities, entropies and
    KLs add up. A Discrete part takes one column (its index as a float), MultiDiscrete and
    MultiBinary one per sub-action, a Box one per dimension."""

    def __init__(self, parts: list[tuple[Any, int, int]]):
        self.parts = parts

    def _split(self, actions: torch.Tensor) -> list[torch.Tensor]:
        pieces = []
        for dist, start, end in self.parts:
            piece = actions[..., start:end]
            if isinstance(dist, Categorical):
                piece = piece.squeeze(-1).long()
            elif isinstance(dist, (MultiCategorical, Bernoulli)):
                piece = piece.long()
            pieces.append(piece)
        return pieces

    def _join(self, pieces: list[torch.Tensor]) -> torch.Tensor:
        columns = [
            piece.unsqueeze(-1).float() if isinstance(dist, Categorical) else piece.float()
            for (dist, _, _), piece in zip(self.parts, pieces, strict=True)
        ]
        return torch.cat(columns, dim=-1)

    def sample(self) -> torch.Tensor:
        return self._join([dist.sample() for dist, _, _ in self.parts])

    def mode(self) -> torch.Tensor:
        return self._join([dist.mode() for dist, _, _ in self.parts])

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        pieces = self._split(actions)
        terms = [d.log_prob(a) for (d, _, _), a in zip(self.parts, pieces, strict=True)]
        return torch.stack(terms).sum(dim=0)

    def entropy(self) -> torch.Tensor:
        return torch.stack([dist.entropy() for dist, _, _ in self.parts]).sum(dim=0)

    def kl(self, other: Product) -> torch.Tensor:
        terms = [a.kl(b) for (a, _, _), (b, _, _) in zip(self.parts, other.parts, strict=True)]
        return torch.stack(terms).sum(dim=0)


Distribution = Categorical | DiagGaussian | MultiCategorical | Bernoulli | Product
