"""NumPy building blocks of the fast path: activations with their backward passes, log-softmax,
the Gaussian log-density, and the way arrays go back to torch.

They work in place where the caller hands over a fresh array, to save allocations on the small
arrays of control tasks.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from shoal.nn.distributions import LOG_SQRT_2PI


def tanh(x: np.ndarray) -> np.ndarray:
    """In place on a fresh pre-activation."""
    return np.tanh(x, out=x)


def tanh_backward(grad: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``grad * (1 - y^2)``, with one temporary; ``grad`` is overwritten."""
    slope = np.multiply(y, y)
    np.subtract(1.0, slope, out=slope)
    return np.multiply(grad, slope, out=grad)


def relu(x: np.ndarray) -> np.ndarray:
    """In place on a fresh pre-activation."""
    return np.maximum(x, 0.0, out=x)


def relu_backward(grad: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``grad * [y > 0]``; ``grad`` is overwritten."""
    return np.multiply(grad, y > 0, out=grad)


ACTIVATIONS: dict[str, tuple[Callable[[np.ndarray], np.ndarray], Callable]] = {
    "tanh": (tanh, tanh_backward),
    "relu": (relu, relu_backward),
}
"""By `shoal.config.ModelConfig.activation` name: the activation, and its backward from the
output ``y``."""


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Over the last axis; ``logits`` is overwritten."""
    logits -= logits.max(-1, keepdims=True)
    logits -= np.log(np.exp(logits).sum(-1, keepdims=True))
    return logits


def gaussian_log_prob(z: np.ndarray, log_std: np.ndarray) -> np.ndarray:
    """Log-density of standardized actions ``z = (a - mean) / std``, summed over the last axis."""
    return (-0.5 * z * z - log_std).sum(-1) - z.shape[-1] * LOG_SQRT_2PI


def as_tensor(array: np.ndarray) -> Tensor:
    """A torch view of a float32 (or int64) result; NumPy's float64 scalars are cast."""
    if array.dtype == np.float64:
        array = array.astype(np.float32)
    return torch.from_numpy(np.ascontiguousarray(array))


def as_array(x: Tensor | np.ndarray) -> np.ndarray:
    """A NumPy view of a CPU tensor; arrays pass as they are."""
    return x.numpy() if isinstance(x, Tensor) else x
