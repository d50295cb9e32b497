"""Replay of whole trajectory pieces, for learners that replay them in time order.

`ArrayRing` keeps up to ``capacity`` items, each a dict of arrays with fixed names, shapes and
dtypes (the first item added fixes them), the oldest overwritten first. Two replays sit on it:

* `SegmentReplay`: rollout segments drawn uniformly, one per `sample` (ACER: Wang et al.
  2017, arXiv:1611.01224, Algorithm 1);
* `SequenceReplay`: fixed-length sequences drawn in batches by priority (R2D2: Kapturowski
  et al. 2019, ICLR; sequences are cut by `shoal.data.sequences.SequenceBuilder`).

Both sample with a NumPy generator whose state is saved, so resumed runs draw the same items.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import torch

from shoal.data.prioritized import ProportionalPriorities


class ArrayRing:
    """A ring of ``capacity`` dict-of-array items; see the module docstring."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity = {capacity} is invalid: must be >= 1")
        self.capacity = capacity
        self.arrays: dict[str, np.ndarray] = {}
        self.size = 0
        self.next = 0

    def __len__(self) -> int:
        return self.size

    def add(self, item: Mapping[str, torch.Tensor | np.ndarray]) -> int:
        """Store one item (copied); returns its slot."""
        if not self.arrays:
            self.arrays = {
                name: np.zeros((self.capacity, *np.shape(x)), dtype=_array(x).dtype)
                for name, x in item.items()
            }
        if item.keys() != self.arrays.keys():
            raise ValueError(f"item fields {sorted(item)} != {sorted(self.arrays)}")
        slot = self.next
        for name, x in item.items():
            self.arrays[name][slot] = _array(x)
        self.next = (slot + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)
        return slot

    def get(self, slots: np.ndarray) -> dict[str, torch.Tensor]:
        """The items at ``slots``, ``[len(slots), ...]`` each (fresh tensors)."""
        return {name: torch.from_numpy(a[slots]) for name, a in self.arrays.items()}

    def state_dict(self) -> dict[str, Any]:
        return {
            "arrays": {name: a[: self.size].copy() for name, a in self.arrays.items()},
            "size": self.size,
            "next": self.next,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.arrays = {}
        size = state["size"]
        for name, stored in state["arrays"].items():
            self.arrays[name] = np.zeros((self.capacity, *stored.shape[1:]), dtype=stored.dtype)
            self.arrays[name][:size] = stored
        self.size, self.next = size, state["next"]


class SegmentReplay:
    """Rollout segments, one drawn uniformly at random per `sample`."""

    def __init__(self, capacity: int, seed: int):
        self.ring = ArrayRing(capacity)
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return len(self.ring)

    def add(self, segment: Mapping[str, torch.Tensor | np.ndarray]) -> None:
        self.ring.add(segment)

    def sample(self) -> dict[str, torch.Tensor]:
        """One stored segment (tensors sharing no memory with the ring)."""
        if not len(self.ring):
            raise ValueError("sample from an empty SegmentReplay")
        slot = int(self.rng.integers(len(self.ring)))
        return {name: x[0] for name, x in self.ring.get(np.array([slot])).items()}

    def state_dict(self) -> dict[str, Any]:
        return {"ring": self.ring.state_dict(), "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ring.load_state_dict(state["ring"])
        self.rng.bit_generator.state = state["rng"]


class SequenceBatch(NamedTuple):
    """Sequences drawn from a `SequenceReplay` (or a replay shard of them)."""

    fields: dict[str, torch.Tensor]
    """Each ``[N, ...]``: the sequences' arrays as `shoal.data.sequences.SequenceBuilder`
    cuts them."""
    indices: np.ndarray
    """``[N]`` their slots, for the priority update."""
    weights: torch.Tensor
    """``[N]`` importance-sampling weights."""


class SequenceReplay:
    """Fixed-length sequences, drawn in batches with probability proportional to
    ``priority^alpha`` (Schaul et al. 2016; R2D2's ``alpha`` is 0.9), new ones at the largest
    priority seen so far."""

    def __init__(self, capacity: int, alpha: float, seed: int):
        self.ring = ArrayRing(capacity)
        self.priorities = ProportionalPriorities(capacity, alpha)
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return len(self.ring)

    def add(self, sequence: dict[str, np.ndarray], priority: float | None = None) -> None:
        """Store one sequence, at ``priority`` (default: the largest seen so far)."""
        slot = np.array([self.ring.add(sequence)])
        self.priorities.activate(slot)
        if priority is not None:
            self.priorities.update(slot, np.array([priority]))

    def sample(self, batch_size: int, beta: float) -> SequenceBatch:
        slots, weights = self.priorities.sample(batch_size, self.rng, beta)
        return SequenceBatch(self.ring.get(slots), slots, torch.from_numpy(weights))

    def update_priorities(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        self.priorities.update(slots, priorities)

    def state_dict(self) -> dict[str, Any]:
        return {
            "ring": self.ring.state_dict(),
            "priorities": self.priorities.state_dict(),
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ring.load_state_dict(state["ring"])
        self.priorities.load_state_dict(state["priorities"])
        self.rng.bit_generator.state = state["rng"]


def _array(x: torch.Tensor | np.ndarray) -> np.ndarray:
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


class SequenceShard:
    """A replay shard of R2D2 sequences for Ape-X's machinery (`shoal.algos.value.apex`):
    a `SequenceReplay` behind the calls the learner makes of a `shoal.data.replay_shard`
    shard (one process; it restarts empty if it dies)."""

    def __init__(self, capacity: int, alpha: float, seed: int):
        self.replay = SequenceReplay(capacity, alpha, seed)

    def __len__(self) -> int:
        return len(self.replay)

    def add(self, batch: dict[str, np.ndarray], priorities: np.ndarray | None = None) -> int:
        """Store the ``[k, ...]`` sequences of an actor's batch, at the actor's priorities
        (default: the largest seen so far); returns the shard's size."""
        for i in range(len(batch["valid"])):
            priority = None if priorities is None else float(priorities[i])
            self.replay.add({name: x[i] for name, x in batch.items()}, priority)
        return len(self.replay)

    def sample_many(self, count: int, batch_size: int, beta: float) -> list[SequenceBatch]:
        """``count`` batches in one call; empty while the shard is."""
        if not len(self.replay):
            return []
        return [self.replay.sample(batch_size, beta) for _ in range(count)]

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        self.replay.update_priorities(indices, priorities)
