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
        return ring_state(self.capacity, self.written, self.storage._asdict(), self.rng)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.written = load_ring(state, self.capacity, self.storage._asdict(), self.rng)


def ring_state(capacity: int, written: int, arrays: dict[str, np.ndarray],
               rng: np.random.Generator) -> dict[str, Any]:  # fmt: skip
    """The state of a ring of ``capacity`` rows (the stored rows of each array, views)."""
    stored = min(written, capacity)
    return {
        "capacity": capacity,
        "written": written,
        "storage": {name: array[:stored] for name, array in arrays.items()},
        "rng": rng.bit_generator.state,
    }


def load_ring(state: dict[str, Any], capacity: int, arrays: dict[str, np.ndarray],
              rng: np.random.Generator) -> int:  # fmt: skip
    """Write `ring_state`'s rows back into ``arrays`` and the generator; returns ``written``."""
    if int(state["capacity"]) != capacity:
        raise ValueError(
            f"replay state has capacity {state['capacity']} but this replay has {capacity}; "
            "build it with the saved settings"
        )
    for name, array in arrays.items():
        saved = np.asarray(state["storage"][name])
        array[: len(saved)] = saved
    rng.bit_generator.state = state["rng"]
    return int(state["written"])
