"""Activation functions by config name."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "tanh": torch.tanh,
    "relu": torch.relu,
    "silu": nn.functional.silu,
    "elu": nn.functional.elu,
}
"""Activations by config name, as plain functions: calling a function costs less than calling
a module, which adds up on the small networks of control tasks."""

ACTIVATION_MODULES: dict[str, type[nn.Module]] = {
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "silu": nn.SiLU,
    "elu": nn.ELU,
}
"""The same activations as modules, for `nn.Sequential` stacks (the image encoders)."""
