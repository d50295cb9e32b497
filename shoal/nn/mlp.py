"""Multi-layer perceptron encoder."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
from torch import nn
from torch.nn import functional as F

from shoal.nn.activations import ACTIVATIONS
from shoal.nn.init import HIDDEN_GAIN, linear


def width_of(module: nn.Module) -> int:
    """The width of the features ``module`` returns: its ``out_dim`` (MLPs, the built-in
    encoders, a user's encoder, `shoal.nn.custom`), checked to be an int."""
    width = getattr(module, "out_dim", None)
    if not isinstance(width, int):
        raise TypeError(f"{type(module).__name__} has no integer out_dim (got {width!r})")
    return width


class MLP(nn.Module):
    """``in_dim -> hidden[0] -> ... -> hidden[-1]`` with an activation after every layer.

    The forward pass calls ``F.linear`` and the activation function directly instead of one
    module per layer: per-call overhead, not arithmetic, is most of a small network's time.
    """

    def __init__(self, in_dim: int, hidden: tuple[int, ...], activation: str = "tanh"):
        super().__init__()
        self.layers = nn.ModuleList()
        for size in hidden:
            self.layers.append(linear(in_dim, size))
            in_dim = size
        self.activation = ACTIVATIONS[activation]
        self.activation_name = activation
        self.out_dim = in_dim
        self.tap: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None
        """Called as ``tap(layer, inputs, pre_activations)`` in every forward pass when set
        (K-FAC reads each layer's inputs and output gradients through it, `shoal.optim.kfac`)."""

    @property
    def linears(self) -> list[nn.Linear]:
        """The layers, typed (a ModuleList knows them only as modules)."""
        return cast("list[nn.Linear]", list(self.layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for index, layer in enumerate(self.layers):
            pre = F.linear(x, layer.weight, layer.bias)  # type: ignore[arg-type]
            if self.tap is not None:
                self.tap(index, x, pre)
            x = self.activation(pre)
        return x


class ParallelMLP(nn.Module):
    """``members`` independent MLPs of the same shape applied to the same input at once.

    Each layer is one batched matmul over a ``[members, in, out]`` weight instead of one
    ``nn.Linear`` per member, which halves the number of tensor operations (forward and
    backward) of a separate actor and critic. On the small networks of control tasks the cost
    of a training step is mostly per-operation overhead, not arithmetic, so this is the single
    largest saving in PPO's update (measured ~25% per gradient step, CartPole, 64x64).
    """

    def __init__(self, in_dim: int, hidden: tuple[int, ...], activation: str, members: int):
        super().__init__()
        self.members = members
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for size in hidden:
            # Same init as `linear` per member: orthogonal on the [out, in] layout, transposed.
            weight = torch.stack(
                [linear(in_dim, size, HIDDEN_GAIN).weight.detach().T for _ in range(members)]
            )
            self.weights.append(nn.Parameter(weight.contiguous()))
            self.biases.append(nn.Parameter(torch.zeros(members, 1, size)))
            in_dim = size
        self.activation = ACTIVATIONS[activation]
        self.activation_name = activation
        self.out_dim = in_dim
        self.tap: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None
        """Called as ``tap(layer, inputs, pre_activations)`` in every forward pass when set
        (K-FAC reads each layer's inputs and output gradients through it, `shoal.optim.kfac`)."""

    def forward(self, x: torch.Tensor, detach_weights: bool = False) -> torch.Tensor:
        """``[N, in_dim]`` (or ``[members, N, in_dim]``) -> ``[members, N, out_dim]``.

        ``detach_weights``: use the weights as constants, so gradients reach the input but not
        the weights (an actor's loss through a critic, in the same backward pass as the
        critic's own loss)."""
        h = x.expand(self.members, *x.shape) if x.dim() == 2 else x
        for index, (weight, bias) in enumerate(zip(self.weights, self.biases, strict=True)):
            if detach_weights:
                weight, bias = weight.detach(), bias.detach()
            pre = torch.baddbmm(bias, h, weight)
            if self.tap is not None:
                self.tap(index, h, pre)
            h = self.activation(pre)
        return h
