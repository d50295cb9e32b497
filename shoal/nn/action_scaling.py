"""Continuous actions between the unit box the networks work in and the env's bounds.

Actors end in ``tanh`` and critics take actions in ``[-1, 1]^d``; the env gets actions in its
own ``[low, high]``. This module is the one place that converts between the two, so the learners
never see env units and the env never sees unit ones.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from shoal.core.errors import UnsupportedSpaceError


def check_bounded_box(space: gym.Space, algorithm: str) -> gym.spaces.Box:
    """``space`` if it is a 1-D Box with finite bounds, else a clear `UnsupportedSpaceError`."""
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        raise UnsupportedSpaceError(
            f"action space {space} is not supported by {algorithm}; it needs a 1-D Box of "
            "continuous actions (use DQN or discrete SAC for Discrete ones, and PPO, A2C, PG, "
            "TRPO or IMPALA for MultiDiscrete, MultiBinary, Tuple and Dict ones)"
        )
    if not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
        raise UnsupportedSpaceError(
            f"action space {space} is unbounded; {algorithm} squashes actions into the env's "
            "bounds and needs finite low and high: give the env's action space bounds (a "
            'wrapper that sets them, e.g. "RescaleAction(min_action=-1, max_action=1)" on an '
            "env with bounds; gymnasium's ClipAction makes the space unbounded)"
        )
    return space


class ActionScaler(nn.Module):
    """Affine map between the unit box ``[-1, 1]^d`` and a Box's ``[low, high]``; the bounds
    are buffers, so a saved policy carries them."""

    center: torch.Tensor
    half_range: torch.Tensor

    def __init__(self, space: gym.spaces.Box):
        super().__init__()
        # Copies: spaces that come back from Ray hold read-only arrays, which torch warns about.
        low = torch.tensor(space.low, dtype=torch.float32)
        high = torch.tensor(space.high, dtype=torch.float32)
        self.register_buffer("center", (high + low) / 2)
        self.register_buffer("half_range", (high - low) / 2)

    def to_env(self, unit: torch.Tensor) -> torch.Tensor:
        """Unit-box actions to env units."""
        return torch.addcmul(self.center, unit, self.half_range)

    def to_unit(self, actions: torch.Tensor) -> torch.Tensor:
        """Env-unit actions to the unit box (clipped: envs may round outside the bounds)."""
        return ((actions - self.center) / self.half_range).clamp(-1.0, 1.0)
