"""A replay of self-play positions (AlphaZero): each row is a position as the player to move
saw it, its legal moves, the search's visit distribution there and the game's outcome for that
player. Rows are added a finished game at a time and sampled uniformly; the oldest are
overwritten first."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch


class Positions(NamedTuple):
    """A batch of positions: ``obs`` ``[N, ...]``, ``legal`` ``[N, A]`` bool, ``policy``
    ``[N, A]`` (sums to 1 over the legal moves), ``outcome`` ``[N]`` in [-1, 1]."""

    obs: Any
    legal: Any
    policy: Any
    outcome: Any


class PositionReplay:
    """Circular storage of ``capacity`` positions of ``obs_shape`` with ``num_actions`` moves."""

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], num_actions: int, seed: int = 0):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.storage = Positions(
            np.zeros((capacity, *obs_shape), np.float32),
            np.zeros((capacity, num_actions), bool),
            np.zeros((capacity, num_actions), np.float32),
            np.zeros(capacity, np.float32),
        )
        self.written = 0
        """Positions ever added (the next row is ``written % capacity``)."""
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return min(self.written, self.capacity)

    def add(self, positions: Positions) -> None:
        """Add ``N`` positions (numpy arrays), the oldest rows making room."""
        count = len(positions.outcome)
        rows = (self.written + np.arange(count)) % self.capacity
        for store, new in zip(self.storage, positions, strict=True):
            store[rows] = new
        self.written += count

    def sample(self, size: int) -> Positions:
        """``size`` positions drawn uniformly (with replacement), as CPU tensors."""
        if len(self) == 0:
            raise ValueError("cannot sample an empty replay")
        rows = self.rng.integers(len(self), size=size)
        return Positions(*(torch.from_numpy(store[rows]) for store in self.storage))

    def state_dict(self) -> dict[str, Any]:
        stored = len(self)
        return {
            "capacity": self.capacity,
            "written": self.written,
            "storage": {name: store[:stored] for name, store in self.storage._asdict().items()},
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["capacity"]) != self.capacity:
            raise ValueError(
                f"replay state has capacity {state['capacity']} but this replay has "
                f"{self.capacity}; build it with the saved settings"
            )
        self.written = int(state["written"])
        for name, store in self.storage._asdict().items():
            saved = np.asarray(state["storage"][name])
            store[: len(saved)] = saved
        self.rng.bit_generator.state = state["rng"]
