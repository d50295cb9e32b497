"""Action-value heads of the value-based family: plain, dueling, noisy and distributional.

`QHead` maps features ``[..., in_dim]`` to ``[..., num_actions, atoms]``; the learner gives the
last axis its meaning: one Q-value (``atoms=1``, DQN), C51 logits, QR-DQN quantiles or REM's
ensemble of Q-values.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from shoal.nn.init import HIDDEN_GAIN, VALUE_GAIN, linear

__all__ = ["NoisyLinear", "QHead"]


def _scale_noise(x: torch.Tensor) -> torch.Tensor:
    """``f(x) = sgn(x) * sqrt(|x|)`` of factorized noisy networks."""
    return x.sign() * x.abs().sqrt()


class NoisyLinear(nn.Module):
    """Linear layer with factorized Gaussian parameter noise (Fortunato et al. 2018,
    arXiv:1706.10295, section 3).

    ``y = (mu_w + sigma_w * eps_w) x + mu_b + sigma_b * eps_b`` with the factorized noise
    ``eps_w = outer(f(eps_out), f(eps_in))``, ``eps_b = f(eps_out)``, ``f(x) = sgn(x) sqrt(|x|)``:
    ``in + out`` Gaussian draws per layer instead of ``in * out``. Initialization follows the
    paper for the factorized case: ``mu ~ U[-1/sqrt(in), 1/sqrt(in)]``,
    ``sigma = sigma0 / sqrt(in)``.

    The noise stays fixed until `reset_noise` (the learner calls it once per step); it is drawn
    from the global torch generator, so seeding torch makes it reproducible. The layer uses the
    noise in train mode while ``noise_enabled`` is True, and the mean weights ``mu`` in eval
    mode or when ``noise_enabled`` is False.
    """

    eps_in: torch.Tensor
    eps_out: torch.Tensor

    def __init__(self, in_features: int, out_features: int, sigma0: float = 0.5):
        super().__init__()
        if in_features < 1 or out_features < 1:
            raise ValueError(
                f"in_features and out_features must be >= 1, got {in_features}, {out_features}"
            )
        if sigma0 < 0:
            raise ValueError(f"sigma0 must be >= 0, got {sigma0}")
        self.in_features = in_features
        self.out_features = out_features
        self.noise_enabled = True
        bound = 1.0 / math.sqrt(in_features)
        sigma = sigma0 / math.sqrt(in_features)
        self.weight_mu = nn.Parameter(
            torch.empty(out_features, in_features).uniform_(-bound, bound)
        )
        self.weight_sigma = nn.Parameter(torch.full((out_features, in_features), sigma))
        self.bias_mu = nn.Parameter(torch.empty(out_features).uniform_(-bound, bound))
        self.bias_sigma = nn.Parameter(torch.full((out_features,), sigma))
        # The scaled factors f(eps_in), f(eps_out); buffers, so checkpoints and .to() carry them.
        self.register_buffer("eps_in", torch.zeros(in_features))
        self.register_buffer("eps_out", torch.zeros(out_features))
        self.reset_noise()

    def reset_noise(self) -> None:
        """Draws new factorized noise: ``in`` then ``out`` standard normals."""
        device, dtype = self.eps_in.device, self.eps_in.dtype
        self.eps_in.copy_(_scale_noise(torch.randn(self.in_features, device=device, dtype=dtype)))
        self.eps_out.copy_(_scale_noise(torch.randn(self.out_features, device=device, dtype=dtype)))

    @property
    def weight_epsilon(self) -> torch.Tensor:
        """``[out, in]`` weight noise ``outer(f(eps_out), f(eps_in))``."""
        return torch.outer(self.eps_out, self.eps_in)

    @property
    def bias_epsilon(self) -> torch.Tensor:
        """``[out]`` bias noise ``f(eps_out)``."""
        return self.eps_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and self.noise_enabled):
            return F.linear(x, self.weight_mu, self.bias_mu)
        weight = self.weight_mu + self.weight_sigma * self.weight_epsilon
        bias = self.bias_mu + self.bias_sigma * self.bias_epsilon
        return F.linear(x, weight, bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


class QHead(nn.Module):
    """Features ``[..., in_dim]`` to action values ``[..., num_actions, atoms]``.

    * ``dueling`` (Wang et al. 2016, arXiv:1511.06581, eq. 9): a value stream ``[..., 1, atoms]``
      and an advantage stream ``[..., A, atoms]`` combined as ``V + A - mean_a A``. With
      ``atoms > 1`` the combination is per atom, before any softmax, as Rainbow does for C51
      logits (Hessel et al. 2018, arXiv:1710.02298).
    * ``hidden``: one hidden layer of that width with ReLU inside each stream, as in the dueling
      and Rainbow networks; None maps the features linearly.
    * ``noisy`` (Fortunato et al. 2018, arXiv:1706.10295): every linear layer of the head is a
      `NoisyLinear` with ``sigma0``, replacing epsilon-greedy exploration.

    Plain layers are orthogonally initialized (`shoal.nn.init`) with gain ``sqrt(2)`` for the
    hidden ReLU layer and 1 for the output layer, zero biases; noisy layers use the paper's
    initialization.
    """

    def __init__(
        self,
        in_dim: int,
        num_actions: int,
        atoms: int = 1,
        dueling: bool = False,
        noisy: bool = False,
        hidden: int | None = None,
        sigma0: float = 0.5,
    ):
        super().__init__()
        for name, value in (("in_dim", in_dim), ("num_actions", num_actions), ("atoms", atoms)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if hidden is not None and hidden < 1:
            raise ValueError(f"hidden must be None or >= 1, got {hidden}")
        self.num_actions = num_actions
        self.atoms = atoms
        self.dueling = dueling
        self.noisy = noisy
        self._sigma0 = sigma0
        self._hidden = hidden
        if dueling:
            self.value = self._stream(in_dim, atoms)
            self.advantage = self._stream(in_dim, num_actions * atoms)
        else:
            self.q = self._stream(in_dim, num_actions * atoms)

    def _layer(self, in_dim: int, out_dim: int, gain: float) -> nn.Module:
        if self.noisy:
            return NoisyLinear(in_dim, out_dim, self._sigma0)
        return linear(in_dim, out_dim, gain)

    def _stream(self, in_dim: int, out_dim: int) -> nn.Module:
        if self._hidden is None:
            return self._layer(in_dim, out_dim, VALUE_GAIN)
        return nn.Sequential(
            self._layer(in_dim, self._hidden, HIDDEN_GAIN),
            nn.ReLU(),
            self._layer(self._hidden, out_dim, VALUE_GAIN),
        )

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """``[..., in_dim]`` -> ``[..., num_actions, atoms]``."""
        if not self.dueling:
            return self.q(features).unflatten(-1, (self.num_actions, self.atoms))
        value = self.value(features).unsqueeze(-2)
        advantage = self.advantage(features).unflatten(-1, (self.num_actions, self.atoms))
        # Subtracting the mean advantage makes V and A identifiable (Wang et al. 2016, eq. 9).
        return value + advantage - advantage.mean(dim=-2, keepdim=True)

    def reset_noise(self) -> None:
        """Draws new noise for every `NoisyLinear` of the head (nothing when not noisy)."""
        for module in self.modules():
            if isinstance(module, NoisyLinear):
                module.reset_noise()
