"""Weight initialization, in one place: orthogonal weights with per-layer gains, zero biases.

Orthogonal init with gain sqrt(2) for hidden layers, 0.01 for policy outputs and 1 for value
outputs is the choice that "Implementation Matters in Deep Policy Gradients" (Engstrom et al.
2020) found to matter for PPO.
"""

from __future__ import annotations

import math
from typing import TypeVar

from torch import nn

Layer = TypeVar("Layer", nn.Linear, nn.Conv2d)

HIDDEN_GAIN = math.sqrt(2.0)
POLICY_GAIN = 0.01
VALUE_GAIN = 1.0


def init_linear(layer: Layer, gain: float) -> Layer:
    nn.init.orthogonal_(layer.weight, gain=gain)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
    return layer


def linear(in_features: int, out_features: int, gain: float = HIDDEN_GAIN) -> nn.Linear:
    """An orthogonally initialized `nn.Linear`."""
    return init_linear(nn.Linear(in_features, out_features), gain)
