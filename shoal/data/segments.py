"""Replay of whole rollout segments, for learners that replay trajectories in time order with
off-policy corrections (ACER: Wang et al. 2017, arXiv:1611.01224, Algorithm 1).

A segment is one rollout of ``T`` steps over ``B`` envs, stored as it came: a dict of
time-major arrays ``[T(+1), B, ...]`` with fixed names, shapes and dtypes (the first segment
added fixes them). Up to ``capacity`` segments are kept, the oldest overwritten first, and one
is drawn uniformly at random per `sample` (a NumPy generator whose state is saved, so resumed
runs draw the same segments).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class SegmentReplay:
    """A ring of ``capacity`` rollout segments; see the module docstring."""

    def __init__(self, capacity: int, seed: int):
        if capacity < 1:
            raise ValueError(f"capacity = {capacity} is invalid: must be >= 1")
        self.capacity = capacity
        self.rng = np.random.default_rng(seed)
        self.arrays: dict[str, np.ndarray] = {}
        self.size = 0
        self.next = 0

    def __len__(self) -> int:
        return self.size

    def add(self, segment: dict[str, torch.Tensor | np.ndarray]) -> None:
        """Store one segment (copied), overwriting the oldest when full."""
        if not self.arrays:
            self.arrays = {
                name: np.zeros((self.capacity, *np.shape(x)), dtype=_array(x).dtype)
                for name, x in segment.items()
            }
        if segment.keys() != self.arrays.keys():
            raise ValueError(f"segment fields {sorted(segment)} != {sorted(self.arrays)}")
        for name, x in segment.items():
            self.arrays[name][self.next] = _array(x)
        self.next = (self.next + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self) -> dict[str, torch.Tensor]:
        """One stored segment, uniformly at random (tensors sharing no memory with the ring)."""
        if not self.size:
            raise ValueError("sample from an empty SegmentReplay")
        index = int(self.rng.integers(self.size))
        return {name: torch.from_numpy(a[index].copy()) for name, a in self.arrays.items()}

    def state_dict(self) -> dict[str, Any]:
        return {
            "arrays": {name: a[: self.size].copy() for name, a in self.arrays.items()},
            "size": self.size,
            "next": self.next,
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.arrays = {}
        size = state["size"]
        for name, stored in state["arrays"].items():
            self.arrays[name] = np.zeros((self.capacity, *stored.shape[1:]), dtype=stored.dtype)
            self.arrays[name][:size] = stored
        self.size, self.next = size, state["next"]
        self.rng.bit_generator.state = state["rng"]


def _array(x: torch.Tensor | np.ndarray) -> np.ndarray:
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
