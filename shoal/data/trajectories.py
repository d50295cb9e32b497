"""MuZero's replay: whole episodes of search results, sampled as unrolls.

Positions sit in one ring in the order they were played; an episode is added when it ends, so
its positions are contiguous (wrapping at the end of the ring). Each keeps the observation,
the action taken, the reward that followed, the search's root value and visit distribution,
its n-step value target, and its episode's first ring index, length and ending (terminal or
truncated). An unroll from position ``t`` reads ``t .. t + K`` of the same episode; past the
episode's end, a terminated episode's values and rewards are 0 and its policy is unknown (no
loss), and a truncated episode's values and rewards are unknown too. Positions are drawn by
priority (`shoal.data.prioritized.ProportionalPriorities`; alpha 0 draws uniformly), the
oldest overwritten first.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from shoal.data.positions import load_ring, ring_state
from shoal.data.prioritized import ProportionalPriorities


class Episode(NamedTuple):
    """One finished episode of ``T`` steps (numpy arrays)."""

    obs: np.ndarray  # [T, ...]
    actions: np.ndarray  # [T]
    rewards: np.ndarray  # [T]
    root_values: np.ndarray  # [T]
    policies: np.ndarray  # [T, A]
    value_targets: np.ndarray  # [T]
    terminated: bool


class Unroll(NamedTuple):
    """A batch of ``B`` unrolls of ``K`` steps (CPU tensors); masks are False where the target
    is unknown."""

    obs: torch.Tensor  # [B, ...] the first position's observation
    actions: torch.Tensor  # [K, B]
    target_value: torch.Tensor  # [K + 1, B]
    target_reward: torch.Tensor  # [K, B]
    target_policy: torch.Tensor  # [K + 1, B, A]
    value_mask: torch.Tensor  # [K + 1, B]
    reward_mask: torch.Tensor  # [K, B]
    policy_mask: torch.Tensor  # [K + 1, B]
    weights: torch.Tensor  # [B] importance weights
    indices: np.ndarray  # [B] ring positions (for priority updates)


class TrajectoryReplay:
    """Ring storage of ``capacity`` positions of ``obs_shape`` with ``num_actions`` actions."""

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], num_actions: int,
                 alpha: float = 1.0, seed: int = 0):  # fmt: skip
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity, self.num_actions = capacity, num_actions
        self.obs = np.zeros((capacity, *obs_shape), np.float32)
        self.actions = np.zeros(capacity, np.int64)
        self.rewards = np.zeros(capacity, np.float32)
        self.root_values = np.zeros(capacity, np.float32)
        self.policies = np.zeros((capacity, num_actions), np.float32)
        self.value_targets = np.zeros(capacity, np.float32)
        self.start = np.zeros(capacity, np.int64)
        self.length = np.zeros(capacity, np.int64)
        self.terminated = np.zeros(capacity, bool)
        self.priorities = ProportionalPriorities(capacity, alpha=alpha)
        self.written = 0
        self.rng = np.random.default_rng(seed)

    _ARRAYS = ("obs", "actions", "rewards", "root_values", "policies", "value_targets", "start",
               "length", "terminated")  # fmt: skip

    def __len__(self) -> int:
        return min(self.written, self.capacity)

    def add(self, episode: Episode) -> None:
        """Store a finished episode (longer than the ring: its last ``capacity`` steps), its
        positions prioritized by ``|root value - value target|``."""
        keep = slice(max(0, len(episode.actions) - self.capacity), None)
        length = len(episode.actions[keep])
        rows = (self.written + np.arange(length)) % self.capacity
        if self.written >= self.capacity:
            self.priorities.deactivate(rows)
        elif self.written + length > self.capacity:
            self.priorities.deactivate(rows[rows < (self.written + length) % self.capacity])
        for name in ("obs", "actions", "rewards", "root_values", "policies", "value_targets"):
            getattr(self, name)[rows] = getattr(episode, name)[keep]
        self.start[rows] = rows[0]
        self.length[rows] = length
        self.terminated[rows] = episode.terminated
        self.priorities.activate(rows)
        errors = np.abs(episode.root_values[keep] - episode.value_targets[keep])
        self.priorities.update(rows, errors)
        self.written += length

    def update_priorities(self, indices: np.ndarray, errors: np.ndarray) -> None:
        self.priorities.update(indices, errors)

    def sample(self, batch_size: int, unroll_steps: int, beta: float = 1.0) -> Unroll:
        """``batch_size`` unrolls of ``unroll_steps`` steps from positions drawn by priority;
        actions past an episode's end are drawn uniformly (their targets are masked)."""
        if len(self) == 0:
            raise ValueError("cannot sample an empty replay")
        idx, weights = self.priorities.sample(batch_size, self.rng, beta)
        return self.unroll(idx, unroll_steps, weights)

    def unroll(self, idx: np.ndarray, unroll_steps: int, weights: np.ndarray) -> Unroll:
        """The unrolls of ``unroll_steps`` steps from ring positions ``idx``."""
        offset = (idx - self.start[idx]) % self.capacity
        length, terminated = self.length[idx], self.terminated[idx]
        k = np.arange(unroll_steps + 1)[:, None]  # [K + 1, 1]
        rows = (idx[None] + k) % self.capacity  # [K + 1, B]
        inside = offset[None] + k < length[None]
        value = np.where(inside, self.value_targets[rows], 0.0)
        value_mask = inside | terminated[None]
        reward = np.where(inside[:-1], self.rewards[rows[:-1]], 0.0)
        reward_mask = value_mask[:-1]
        policy = np.where(inside[..., None], self.policies[rows], 1.0 / self.num_actions)
        random = self.rng.integers(self.num_actions, size=rows[:-1].shape)
        actions = np.where(inside[:-1], self.actions[rows[:-1]], random)

        def tensor(x: np.ndarray, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.as_tensor(np.ascontiguousarray(x), dtype=dtype)

        return Unroll(
            obs=tensor(self.obs[idx]),
            actions=tensor(actions, torch.long),
            target_value=tensor(value),
            target_reward=tensor(reward),
            target_policy=tensor(policy),
            value_mask=tensor(value_mask, torch.bool),
            reward_mask=tensor(reward_mask, torch.bool),
            policy_mask=tensor(inside, torch.bool),
            weights=tensor(weights),
            indices=idx,
        )

    def state_dict(self) -> dict[str, Any]:
        arrays = {name: getattr(self, name) for name in self._ARRAYS}
        state = ring_state(self.capacity, self.written, arrays, self.rng)
        return {**state, "priorities": self.priorities.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        arrays = {name: getattr(self, name) for name in self._ARRAYS}
        self.written = load_ring(state, self.capacity, arrays, self.rng)
        self.priorities.load_state_dict(state["priorities"])
