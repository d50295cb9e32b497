"""The few array operations the on-policy losses need, for torch tensors and NumPy arrays alike.

The policy, value and entropy losses (`shoal.losses.policy_gradient`, `shoal.losses.value`)
and their gradients are written once against these, so the same definition runs under
autograd on torch tensors and on the NumPy arrays of the fast path (`shoal.fast`). Every
function takes and returns arrays of the kind it is given.
"""

from __future__ import annotations

from types import ModuleType
from typing import TypeVar

import numpy as np
import torch
from torch import Tensor

Array = TypeVar("Array", Tensor, np.ndarray)


def module_of(x: Tensor | np.ndarray) -> ModuleType:
    """``torch`` for a tensor, ``numpy`` for an array: both have ``exp``, ``clip``,
    ``minimum``, ``maximum``, ``where`` and ``full_like`` with the same meaning."""
    return torch if isinstance(x, Tensor) else np


def constant(x: Array) -> Array:
    """``x`` with no gradient flowing back through it (tensors are detached)."""
    return x.detach() if isinstance(x, Tensor) else x


def as_float(mask: Tensor | np.ndarray, like: Tensor | np.ndarray) -> Tensor | np.ndarray:
    """A boolean mask as ones and zeros in the floating type of ``like``."""
    if isinstance(mask, Tensor):
        assert isinstance(like, Tensor), "a tensor mask takes a tensor's dtype"
        return mask.to(like.dtype)
    assert isinstance(like, np.ndarray), "an array mask takes an array's dtype"
    return mask.astype(like.dtype)


def count(x: Tensor | np.ndarray) -> int:
    """Number of elements."""
    return x.numel() if isinstance(x, Tensor) else x.size
