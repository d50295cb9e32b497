"""A replay shard of Ape-X (Horgan et al. 2018): prioritized storage of finished n-step
transitions sent by many actors.

`shoal.data.replay.ReplayBuffer` stores each env's steps in order and cuts n-step windows when
sampling, which needs every env's steps in one place. An Ape-X shard instead receives windows
that actors already cut (with `ReplayBuffer` on their side) from any number of actors and
envs, in any order, so it keeps them flat: one slot per transition, ``rewards`` ``[n]`` per
slot, the bootstrap observation stored with it. Priorities are the proportional scheme of
`shoal.data.prioritized` over the slots.

A shard is one process (a Ray actor in Ape-X). If it dies, its data dies with it: the pool
restarts it empty and the actors refill it; the learner only loses samples, never progress.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from shoal.core.types import ReplayBatch
from shoal.data.prioritized import ProportionalPriorities
from shoal.data.rollout import space_layout

_FIELDS = ("obs", "actions", "rewards", "steps", "terminated", "next_obs", "next_action_mask")


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty(0, dtype=dtype).numpy().dtype


class ReplayShard:
    """Circular prioritized storage of ``capacity`` n-step transitions.

    Args:
        capacity: transitions kept; the oldest are overwritten first.
        obs_space, action_space: fix shapes and storage dtypes (`space_layout`).
        n_step: window length ``n`` of the transitions (``rewards`` ``[n]``).
        alpha: priority exponent (`ProportionalPriorities`).
        seed: seed of the shard's sampling generator.
        action_mask_dim: number of actions when transitions carry legal-action masks.
    """

    def __init__(
        self,
        capacity: int,
        obs_space: gym.Space,
        action_space: gym.Space,
        n_step: int,
        alpha: float = 0.6,
        seed: int = 0,
        action_mask_dim: int | None = None,
    ):
        if capacity < 1 or n_step < 1:
            raise ValueError(f"capacity and n_step must be >= 1, got {capacity}, {n_step}")
        self.capacity = capacity
        self.n_step = n_step
        obs_shape, obs_dtype = space_layout(obs_space)
        action_shape, action_dtype = space_layout(action_space)
        obs_np = _numpy_dtype(obs_dtype)
        self.obs = np.zeros((capacity, *obs_shape), obs_np)
        self.next_obs = np.zeros((capacity, *obs_shape), obs_np)
        self.actions = np.zeros((capacity, *action_shape), _numpy_dtype(action_dtype))
        self.rewards = np.zeros((capacity, n_step), np.float32)
        self.steps = np.zeros(capacity, np.int64)
        self.terminated = np.zeros(capacity, bool)
        self.next_action_mask = None
        if action_mask_dim is not None:
            self.next_action_mask = np.zeros((capacity, action_mask_dim), bool)
        self.priorities = ProportionalPriorities(capacity, alpha)
        self._rng = np.random.default_rng(seed)
        self._added = 0

    def __len__(self) -> int:
        return min(self._added, self.capacity)

    def add(self, batch: ReplayBatch, priorities: np.ndarray | None = None) -> int:
        """Store the transitions of ``batch`` (its ``weights`` and ``indices`` are ignored)
        with initial ``priorities`` ``[N]`` (Ape-X's actor-side priorities), or with the
        largest priority seen so far when None. Returns the shard's size."""
        count = int(batch.steps.shape[0])
        keep = slice(max(0, count - self.capacity), count)  # more than fits: the newest
        slots = (self._added + np.arange(count)[keep]) % self.capacity
        overwritten = slots[self.priorities.active[slots]]
        if overwritten.size:  # before the write, so no sample mixes old and new
            self.priorities.deactivate(overwritten)
        for name in _FIELDS:
            store = getattr(self, name)
            value = getattr(batch, name)
            if (store is None) != (value is None):
                raise ValueError(f"the shard and the batch disagree on storing {name}")
            if store is not None:
                store[slots] = np.asarray(value)[keep]
        self._added += count
        self.priorities.activate(slots)
        if priorities is not None:
            self.priorities.update(slots, np.asarray(priorities)[keep])
        return len(self)

    def sample_many(self, count: int, batch_size: int, beta: float) -> list[ReplayBatch]:
        """``count`` batches of `sample` in one call (one round trip for a remote shard);
        empty while the shard is."""
        if len(self) == 0:
            return []
        return [self.sample(batch_size, beta) for _ in range(count)]

    def sample(self, batch_size: int, beta: float) -> ReplayBatch:
        """``batch_size`` transitions drawn by priority, with importance weights of exponent
        ``beta`` and ``indices`` (slots) for `update_priorities`."""
        if len(self) == 0:
            raise ValueError("the replay shard is empty: add transitions before sampling")
        indices, weights = self.priorities.sample(batch_size, self._rng, beta)
        indices = np.asarray(indices, np.int64)
        mask = None if self.next_action_mask is None else self.next_action_mask[indices]
        return ReplayBatch(
            obs=torch.from_numpy(self.obs[indices]),
            actions=torch.from_numpy(self.actions[indices]),
            rewards=torch.from_numpy(self.rewards[indices]),
            steps=torch.from_numpy(self.steps[indices]),
            terminated=torch.from_numpy(self.terminated[indices]),
            next_obs=torch.from_numpy(self.next_obs[indices]),
            next_action_mask=None if mask is None else torch.from_numpy(mask),
            weights=torch.from_numpy(np.asarray(weights, np.float32)),
            indices=indices,
        )

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """New priorities (the learner's ``|TD error|``) for sampled ``indices``. Slots
        overwritten since the sample take the update; with a shard many batches larger
        than the learner's lag this is rare, and costs one transition a wrong priority."""
        self.priorities.update(np.asarray(indices, np.int64), np.asarray(priorities))

    def state_dict(self) -> dict[str, Any]:
        """Stored transitions, priorities and the sampling generator (views: save before
        adding more)."""
        size = len(self)
        storage = {n: getattr(self, n)[:size] for n in _FIELDS if getattr(self, n) is not None}
        return {
            "capacity": self.capacity,
            "added": self._added,
            "storage": storage,
            "priorities": self.priorities.state_dict(),
            "rng": self._rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["capacity"] != self.capacity:
            raise ValueError(
                f"shard state holds {state['capacity']} transitions, this shard "
                f"{self.capacity}; build it with the saved capacity"
            )
        for name, saved in state["storage"].items():
            getattr(self, name)[: len(saved)] = saved
        self._added = int(state["added"])
        self.priorities.load_state_dict(state["priorities"])
        self._rng.bit_generator.state = state["rng"]
