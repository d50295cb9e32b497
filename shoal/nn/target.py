"""Copies of networks: eager copies (`eager_copy`, the one place that knows how a compiled
module keeps its compiled forward) and target networks, slowly moving frozen copies for
stable bootstrap targets."""

from __future__ import annotations

import copy
from typing import TypeVar

import torch
from torch import nn

Network = TypeVar("Network", bound=nn.Module)


def eager_copy(network: Network) -> Network:
    """A deep copy of ``network`` that runs eagerly. ``nn.Module.compile`` keeps the compiled
    forward in the instance's ``_compiled_call_impl``, which a deep copy would keep calling,
    on the original's compiled graph; the copy drops it from every submodule."""
    clone = copy.deepcopy(network)
    for module in clone.modules():
        module.__dict__.pop("_compiled_call_impl", None)
    return clone


def frozen_copy(network: Network) -> Network:
    """An eager copy of ``network`` that autograd ignores, to serve as its target."""
    return eager_copy(network).requires_grad_(False)


@torch.no_grad()
def soft_update(target: list[torch.Tensor], online: list[torch.Tensor], tau: float) -> None:
    """Polyak averaging, ``target <- tau * online + (1 - tau) * target`` (Lillicrap et al.
    2015), for matching lists of tensors in one fused call (``tau = 1`` copies)."""
    if tau == 1.0:
        torch._foreach_copy_(target, online)
    else:
        torch._foreach_lerp_(target, online, tau)
