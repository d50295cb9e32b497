"""Target networks: slowly moving copies of a network for stable bootstrap targets."""

from __future__ import annotations

import copy

import torch
from torch import nn


def frozen_copy(network: nn.Module) -> nn.Module:
    """A deep copy of ``network`` that autograd ignores, to serve as its target. A compiled
    network's copy runs eagerly (it would otherwise call the original's compiled forward)."""
    clone = copy.deepcopy(network).requires_grad_(False)
    for module in clone.modules():
        module.__dict__.pop("_compiled_call_impl", None)
    return clone


@torch.no_grad()
def soft_update(target: list[torch.Tensor], online: list[torch.Tensor], tau: float) -> None:
    """Polyak averaging, ``target <- tau * online + (1 - tau) * target`` (Lillicrap et al.
    2015), for matching lists of tensors in one fused call (``tau = 1`` copies)."""
    if tau == 1.0:
        torch._foreach_copy_(target, online)
    else:
        torch._foreach_lerp_(target, online, tau)
