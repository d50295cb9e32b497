"""Multi-layer perceptron encoder."""

from __future__ import annotations

from torch import nn

from shoal.nn.init import linear

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "silu": nn.SiLU,
    "elu": nn.ELU,
}


class MLP(nn.Sequential):
    """``in_dim -> hidden[0] -> ... -> hidden[-1]`` with an activation after every layer."""

    def __init__(self, in_dim: int, hidden: tuple[int, ...], activation: str = "tanh"):
        layers: list[nn.Module] = []
        for size in hidden:
            layers += [linear(in_dim, size), ACTIVATIONS[activation]()]
            in_dim = size
        super().__init__(*layers)
        self.out_dim = in_dim
