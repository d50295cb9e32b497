"""Output heads: features in, a distribution or a value out."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from shoal.nn.distributions import (
    MASKED_LOGIT,
    Bernoulli,
    Categorical,
    DiagGaussian,
    MultiCategorical,
    Product,
)
from shoal.nn.init import POLICY_GAIN, VALUE_GAIN, linear
from shoal.optim.schedules import annealed_temperature

if TYPE_CHECKING:
    from shoal.config import ModelConfig


class CategoricalHead(nn.Module):
    """Logits for ``n`` discrete actions, divided by a softmax ``temperature``.

    Temperature above 1 flattens the policy (more exploration), below 1 sharpens it. It is a
    persistent buffer, so it travels with the weights (``state_dict``, ``get_weights``,
    checkpoints) and every sampler acts with the temperature the learner trains with; change
    it with `set_temperature` (Lamb et al. anneals it between iterations).
    """

    temperature: torch.Tensor

    def __init__(self, in_dim: int, num_actions: int, temperature: float = 1.0):
        super().__init__()
        self.logits = linear(in_dim, num_actions, POLICY_GAIN)
        self.register_buffer("temperature", torch.tensor(float(temperature)))

    def forward(self, features: torch.Tensor, mask: torch.Tensor | None = None) -> Categorical:
        """``mask`` ``[N, n]`` (bool): the legal actions; the others get probability 0."""
        # Always divided (exact at temperature 1): a host-side "is it 1?" flag would have to
        # follow every way the buffer's value can change, weight copies included.
        logits = self.logits(features) / self.temperature
        if mask is not None:
            logits = logits.masked_fill(~mask, MASKED_LOGIT)
        return Categorical(logits)

    @torch.no_grad()
    def set_temperature(self, value: float) -> None:
        if not value > 0:
            raise ValueError(f"softmax temperature must be > 0, got {value}")
        self.temperature.fill_(value)

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        # Weights saved before the temperature was a buffer keep the configured one, as
        # BatchNorm does for its num_batches_tracked.
        state_dict.setdefault(prefix + "temperature", self.temperature.detach().clone())
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def set_temperature(model: nn.Module, value: float) -> bool:
    """Set the softmax temperature of every `CategoricalHead` in ``model``; returns whether
    it has one (models with only continuous or value heads are left unchanged). Call it on
    the learner's model before its weights go to the samplers, so rollouts and updates use
    the same temperature."""
    heads = [m for m in model.modules() if isinstance(m, CategoricalHead)]
    for head in heads:
        head.set_temperature(value)
    return bool(heads)


def apply_temperature(
    model: nn.Module, config: ModelConfig, env_steps: int, episodes: int
) -> float | None:
    """Set the scheduled temperature on ``model``'s categorical heads and return it; None when
    the model has none or no schedule is configured (nothing to log). The temperature is a
    buffer of the weights, so a sampler given the weights afterwards samples with it, and the
    next update uses the same value the rollout was sampled with."""
    value = annealed_temperature(config, env_steps, episodes)
    has_head = set_temperature(model, value)
    return value if has_head and config.temperature_min is not None else None


class GaussianHead(nn.Module):
    """Diagonal Gaussian with a state-independent, learned log standard deviation."""

    def __init__(self, in_dim: int, action_dim: int, init_log_std: float = 0.0):
        super().__init__()
        self.mean = linear(in_dim, action_dim, POLICY_GAIN)
        self.log_std = nn.Parameter(torch.full((action_dim,), float(init_log_std)))

    def forward(self, features: torch.Tensor) -> DiagGaussian:
        return DiagGaussian(self.mean(features), self.log_std)


class MultiCategoricalHead(CategoricalHead):
    """`CategoricalHead` over the values of each sub-action of a MultiDiscrete space in turn
    (a factorized policy): the same logits layer, temperature and masking, one categorical
    per sub-action."""

    def __init__(self, in_dim: int, nvec: list[int], temperature: float = 1.0):
        super().__init__(in_dim, sum(int(n) for n in nvec), temperature)
        self.nvec = [int(n) for n in nvec]

    def forward(  # type: ignore[override]  # a categorical per sub-action
        self, features: torch.Tensor, mask: torch.Tensor | None = None
    ) -> MultiCategorical:
        return MultiCategorical(self.logits(features) / self.temperature, self.nvec, mask)


class BernoulliHead(nn.Module):
    """One logit per binary sub-action of a MultiBinary space."""

    def __init__(self, in_dim: int, n: int):
        super().__init__()
        self.logits = linear(in_dim, n, POLICY_GAIN)

    def forward(self, features: torch.Tensor) -> Bernoulli:
        return Bernoulli(self.logits(features))


class ProductHead(nn.Module):
    """One head per part of a Tuple/Dict action (`shoal.envs.composite.PackedActions`), all
    reading the same features; their distributions form a `Product`."""

    def __init__(self, heads: list[nn.Module], columns: list[tuple[int, int]]):
        super().__init__()
        self.heads = nn.ModuleList(heads)
        self.columns = columns

    def forward(self, features: torch.Tensor) -> Product:
        return Product(
            [
                (head(features), start, end)
                for head, (start, end) in zip(self.heads, self.columns, strict=True)
            ]
        )


class ValueHead(nn.Module):
    """A scalar state value per input row."""

    def __init__(self, in_dim: int):
        super().__init__()
        self.value = linear(in_dim, 1, VALUE_GAIN)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.value(features).squeeze(-1)
