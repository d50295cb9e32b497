"""Replay storage for value-based learners: a circular ``[rows, num_envs, ...]`` buffer of
vector steps, sampled as n-step windows (uniform or prioritized)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from shoal.core.types import ReplayBatch
from shoal.data.frame_replay import FrameStacks
from shoal.data.prioritized import Priorities
from shoal.data.rollout import space_layout
from shoal.data.staging import stage_for

_FIELDS = ("obs", "actions", "rewards", "terminated", "truncated", "valid", "action_mask")


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty(0, dtype=dtype).numpy().dtype


class ReplayBuffer:
    """Preallocated circular storage of vector steps, sampled as n-step windows.

    Row ``t`` of env ``b`` holds the observation the action was taken on, the action, its
    reward, ``terminated``, ``truncated`` and ``valid`` (False for the autoreset steps of
    `shoal.core.types.StepResult`). The observation that follows row ``t`` is the one of row
    ``t + 1`` of the same env, found by index and never stored twice: with next-step autoreset
    the row after an episode's last step is its (invalid) autoreset row, whose observation is
    the true final observation, so truncated episodes bootstrap from it.

    A transition is sampleable when it is valid and its ``n_step`` following rows are in the
    buffer (they hold the window and its bootstrap observation), so the newest ``n_step`` rows
    wait, and the oldest row stops being sampleable just before it is overwritten.

    Args:
        capacity: transitions to keep; rounded up to whole rows of ``num_envs`` (see
            ``self.capacity``).
        num_envs: environments per vector step (``B``).
        obs_space, action_space: fix shapes and storage dtypes (`space_layout`; uint8 images
            stay uint8).
        n_step: window length ``n`` of every sample.
        action_mask_dim: number of actions when the env gives legal-action masks, else None.
        priorities: `ProportionalPriorities` or `RankBasedPriorities` over ``self.capacity``
            positions, or a callable making one from that capacity (e.g.
            ``functools.partial(ProportionalPriorities, alpha=0.6)``); None samples uniformly.
        seed: seed of the buffer's own sampling generator.
        reward_shape: shape of one step's reward beyond the env axis, e.g. ``(N,)`` for one
            reward per agent (MADDPG); ``()`` for a scalar.
        frame_stack: ``k`` when observations are ``k`` stacked frames ``[k, ...]`` (oldest
            first, e.g. Atari's 4 x 84 x 84): store each frame once and rebuild the stacks
            when sampling (`shoal.data.frame_replay`), about ``k`` times less memory. None
            stores whole observations.
        device: the learner's device: `sample` hands a CUDA learner its batches through
            pinned staging buffers (`shoal.data.staging`); None or the CPU: CPU tensors.
    """

    def __init__(
        self,
        capacity: int,
        num_envs: int,
        obs_space: gym.Space,
        action_space: gym.Space,
        n_step: int = 1,
        action_mask_dim: int | None = None,
        priorities: Priorities | Callable[[int], Priorities] | None = None,
        seed: int = 0,
        reward_shape: tuple[int, ...] = (),
        frame_stack: int | None = None,
        device: torch.device | str | None = None,
    ):
        self.staging = stage_for(device)
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if n_step < 1:
            raise ValueError(f"n_step must be >= 1, got {n_step}")
        self.rows = -(-capacity // num_envs)
        if self.rows <= n_step:
            raise ValueError(
                f"capacity {capacity} gives {self.rows} rows of {num_envs} envs, but n_step="
                f"{n_step} windows need at least {n_step + 1} rows: use capacity >= "
                f"{(n_step + 1) * num_envs}"
            )
        self.num_envs = num_envs
        self.n_step = n_step
        self.capacity = self.rows * num_envs
        if priorities is not None and not isinstance(priorities, Priorities):
            priorities = priorities(self.capacity)  # a factory such as a class or a partial
        if priorities is not None and priorities.capacity != self.capacity:
            raise ValueError(
                f"priorities cover {priorities.capacity} positions but the buffer has "
                f"{self.capacity} ({self.rows} rows x {num_envs} envs); build them with "
                f"capacity={self.capacity}"
            )
        self.priorities = priorities
        size = (self.rows, num_envs)
        obs_shape, obs_dtype = space_layout(obs_space)
        action_shape, action_dtype = space_layout(action_space)
        self._frames = None
        if frame_stack is None:
            self.obs: Any = np.zeros(size + obs_shape, _numpy_dtype(obs_dtype))  # (None: frames)
        else:
            if obs_shape[:1] != (frame_stack,) or len(obs_shape) < 2:
                raise ValueError(
                    f"frame_stack={frame_stack} needs observations [{frame_stack}, ...] "
                    f"(frames stacked on the first axis); got shape {obs_shape}"
                )
            self.obs = None
            self._frames = FrameStacks(self.rows, num_envs, obs_shape, _numpy_dtype(obs_dtype))
        self.actions = np.zeros(size + action_shape, _numpy_dtype(action_dtype))
        self.rewards = np.zeros(size + tuple(reward_shape), np.float32)
        self.terminated = np.zeros(size, bool)
        self.truncated = np.zeros(size, bool)
        self.valid = np.zeros(size, bool)
        self.action_mask: np.ndarray | None = None
        if action_mask_dim is not None:
            self.action_mask = np.zeros(size + (action_mask_dim,), bool)
        # Flat ``[rows * num_envs, ...]`` views: position ``row * num_envs + env``.
        self._flat = {
            name: array.reshape(self.capacity, *array.shape[2:])
            for name in _FIELDS
            if (array := getattr(self, name)) is not None
        }
        self._offsets = np.arange(n_step)
        self._window_offsets = self._offsets * num_envs
        self._env_ids = np.arange(num_envs)
        self._rng = np.random.default_rng(seed)
        self._rows_written = 0
        self._num_sampleable = 0

    def __len__(self) -> int:
        """Stored transitions (autoreset rows included)."""
        return min(self._rows_written, self.rows) * self.num_envs

    def num_sampleable(self) -> int:
        return self._num_sampleable

    def add(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        valid: np.ndarray,
        action_mask: np.ndarray | None = None,
    ) -> None:
        """Store one vector step: ``obs`` ``[B, *obs_shape]`` (the observations the actions
        were taken on), ``actions`` ``[B, *action_shape]``, ``rewards``, ``terminated``,
        ``truncated``, ``valid`` ``[B]``, and ``action_mask`` ``[B, A]`` (legal actions at
        ``obs``) when the buffer was built with ``action_mask_dim``."""
        if (action_mask is None) != (self.action_mask is None):
            raise ValueError(
                "pass action_mask to add() exactly when the buffer was built with action_mask_dim"
            )
        row = self._rows_written % self.rows
        if self._rows_written >= self.rows:
            self._retire(row)  # before the write, so it is never sampled half-overwritten
        if self._frames is None:
            self.obs[row] = obs
        else:
            self._frames.add(self._rows_written, obs)
        self.actions[row] = actions
        self.rewards[row] = rewards
        self.terminated[row] = terminated
        self.truncated[row] = truncated
        self.valid[row] = valid
        if action_mask is not None:
            assert self.action_mask is not None, "masks need a buffer made with action_mask_dim"
            self.action_mask[row] = action_mask
        self._rows_written += 1
        # This write completes the window (and bootstrap row) of the row n_step back.
        ready = self._rows_written - 1 - self.n_step
        if ready >= 0:
            self._admit(ready % self.rows)

    def extend(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        valid: np.ndarray,
        action_mask: np.ndarray | None = None,
    ) -> None:
        """`add` for each step of a time-major chunk: every field ``[T, B, ...]``."""
        for t in range(len(rewards)):
            self.add(
                obs[t],
                actions[t],
                rewards[t],
                terminated[t],
                truncated[t],
                valid[t],
                None if action_mask is None else action_mask[t],
            )

    def cut_episodes(self, envs: np.ndarray | list[int]) -> None:
        """End the episodes of ``envs`` before their newest stored step, whose following
        observation was lost (a runner that died and was replaced starts new episodes; the
        steps its old actor took were never stored). The newest row of those envs becomes an
        invalid row after a truncation at the row before it, exactly the layout of an episode
        truncated there: windows stop at that row and bootstrap from the newest row's
        observation, which is the true one. Call it before adding the new episodes' steps."""
        envs = np.asarray(envs, np.int64)
        if envs.size == 0 or self._rows_written == 0:
            return
        newest = (self._rows_written - 1) % self.rows
        # The newest row is not sampleable yet (it waits for n_step later rows): its flag can
        # change before it is admitted.
        self.valid[newest, envs] = False
        if self._rows_written >= 2:
            before = (self._rows_written - 2) % self.rows
            self.truncated[before, envs] |= ~self.terminated[before, envs]

    def _admit(self, row: int) -> None:
        envs = self._env_ids[self.valid[row]]
        self._num_sampleable += envs.size
        if self.priorities is not None and envs.size:
            self.priorities.activate(row * self.num_envs + envs)

    def _retire(self, row: int) -> None:
        envs = self._env_ids[self.valid[row]]
        self._num_sampleable -= envs.size
        if self.priorities is not None and envs.size:
            self.priorities.deactivate(row * self.num_envs + envs)

    def sample(self, batch_size: int, beta: float = 1.0) -> ReplayBatch:
        """``batch_size`` n-step windows (with replacement) as a `ReplayBatch` of new CPU
        tensors, or on the learner's GPU through pinned staging buffers (``device``);
        ``beta`` is the importance-sampling exponent (ignored by uniform replay)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if self._num_sampleable < 1:
            raise ValueError(
                f"the replay buffer has no sampleable transition yet ({len(self)} stored; a "
                f"transition needs n_step={self.n_step} later steps of its env): add more "
                "steps before sampling"
            )
        if self.priorities is None:
            indices = self._sample_uniform(batch_size)
            weights = np.ones(batch_size, np.float32)
        else:
            indices, weights = self.priorities.sample(batch_size, self._rng, beta)
        batch = self._gather(np.asarray(indices, np.int64), weights)
        return batch if self.staging is None else self.staging(batch)

    def _sample_uniform(self, batch_size: int) -> np.ndarray:
        """Uniform over sampleable positions: draw from the sampleable rows and redraw the
        invalid (autoreset) ones, which are a small share in practice."""
        first = max(0, self._rows_written - self.rows) * self.num_envs
        span = (self._rows_written - self.n_step) * self.num_envs - first
        valid = self._flat["valid"]
        out = np.empty(batch_size, np.int64)
        todo = np.arange(batch_size)
        for _ in range(8):
            # Consecutive rows are consecutive flat positions, modulo the capacity.
            draw = (self._rng.integers(0, span, size=todo.size) + first) % self.capacity
            ok = valid.take(draw)
            out[todo[ok]] = draw[ok]
            todo = todo[~ok]
            if todo.size == 0:
                return out
        # Mostly invalid rows (e.g. one-step episodes): draw from the explicit list instead.
        flat = (first + np.arange(span)) % self.capacity
        out[todo] = self._rng.choice(flat[valid.take(flat)], size=todo.size)
        return out

    def windows(self, indices: np.ndarray, weights: np.ndarray | None = None) -> ReplayBatch:
        """The n-step windows starting at ``indices`` (``[N]`` flat positions ``row * num_envs +
        env``, each a valid row with its ``n_step`` following rows written), as a `ReplayBatch`
        of new CPU tensors cut as `sample` cuts them; ``weights`` ``[N]`` default to ones. For
        callers that choose positions themselves, e.g. an actor cutting its own new steps."""
        indices = np.asarray(indices, np.int64)
        if weights is None:
            weights = np.ones(indices.size, np.float32)
        return self._gather(indices, weights)

    def _gather(self, indices: np.ndarray, weights: np.ndarray) -> ReplayBatch:
        """Build the n-step windows of ``indices`` (``[N]`` flat positions) by index. Flat
        `np.take` on ``[rows * num_envs, ...]`` views: much faster than 2-d fancy indexing."""
        flat = self._flat
        # [N, n] flat positions of rows t..t+n-1 of the same env (one row = num_envs positions)
        window = indices[:, None] + self._window_offsets
        window %= self.capacity
        terminated = flat["terminated"].take(window)
        ended = terminated | flat["truncated"].take(window)
        ended[:, -1] = True  # no end inside the window: K = n
        first_end = ended.argmax(axis=1)  # K - 1
        steps = first_end + 1
        rewards = flat["rewards"].take(window, axis=0)  # [N, n, *reward_shape]
        in_episode = self._offsets <= first_end[:, None]  # later steps: the next episode's
        rewards *= in_episode.reshape(in_episode.shape + (1,) * (rewards.ndim - 2))
        terminated = terminated.ravel().take(first_end + np.arange(0, window.size, self.n_step))
        # Row t + K: the observation n steps on, or the final one when the episode ended.
        following = indices + steps * self.num_envs
        following %= self.capacity
        mask = None
        if self.action_mask is not None:
            mask = torch.from_numpy(flat["action_mask"].take(following, axis=0))
        if self._frames is None:
            obs = flat["obs"].take(indices, axis=0)
            next_obs = flat["obs"].take(following, axis=0)
        else:
            obs = self._frames.stacks(indices, self._rows_written)
            next_obs = self._frames.stacks(following, self._rows_written)
        return ReplayBatch(
            obs=torch.from_numpy(obs),
            actions=torch.from_numpy(flat["actions"].take(indices, axis=0)),
            rewards=torch.from_numpy(rewards),
            steps=torch.from_numpy(steps.astype(np.int64, copy=False)),
            terminated=torch.from_numpy(terminated),
            next_obs=torch.from_numpy(next_obs),
            next_action_mask=mask,
            weights=torch.from_numpy(np.asarray(weights, np.float32)),
            indices=indices,
        )

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray | torch.Tensor):
        """New priorities (e.g. ``|TD error|``, ``[N]``) for the sampled ``indices``; a no-op
        for uniform replay. Positions retired since the sample are skipped; one already
        refilled by a newer transition would take the update, which only a learner lagging a
        whole capacity behind its sampler (asynchronous replay) can run into."""
        if self.priorities is None:
            return
        if isinstance(priorities, torch.Tensor):
            priorities = priorities.detach().cpu().numpy()
        self.priorities.update(np.asarray(indices, np.int64), priorities)

    def rng_state(self) -> dict[str, Any]:
        """The sampling generator's state alone (a buffer refilled from a dataset needs no
        more to sample exactly as before)."""
        return dict(self._rng.bit_generator.state)

    def set_rng_state(self, state: dict[str, Any]) -> None:
        self._rng.bit_generator.state = state

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: the written rows (views, not copies: save
        before adding more), counters, the sampling generator and the priorities."""
        stored = min(self._rows_written, self.rows)
        arrays = {name: getattr(self, name) for name in _FIELDS}
        return {
            "rows": self.rows,
            "num_envs": self.num_envs,
            "n_step": self.n_step,
            "rows_written": self._rows_written,
            "num_sampleable": self._num_sampleable,
            "storage": {k: v[:stored] for k, v in arrays.items() if v is not None},
            "rng": self._rng.bit_generator.state,
            "priorities": None if self.priorities is None else self.priorities.state_dict(),
            "frames": None if self._frames is None else self._frames.state_dict(self._rows_written),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("rows", "num_envs", "n_step"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"replay state has {key}={state[key]} but this buffer has "
                    f"{key}={getattr(self, key)}; build the buffer with the saved settings"
                )
        if (state["priorities"] is None) != (self.priorities is None):
            raise ValueError("replay state and buffer disagree on prioritized sampling")
        if (state.get("frames") is None) != (self._frames is None):
            raise ValueError("replay state and buffer disagree on frame_stack storage")
        for name in _FIELDS:
            array, saved = getattr(self, name), state["storage"].get(name)
            if (array is None) != (saved is None):
                raise ValueError(f"replay state and buffer disagree on storing {name}")
            if array is None:
                continue
            if saved.shape[1:] != array.shape[1:] or saved.dtype != array.dtype:
                raise ValueError(
                    f"replay state has {name} of shape {saved.shape[1:]} and dtype "
                    f"{saved.dtype} per row, this buffer {array.shape[1:]} {array.dtype}"
                )
            array[: len(saved)] = saved
        if self._frames is not None:
            self._frames.load_state_dict(state["frames"])
        self._rows_written = int(state["rows_written"])
        self._num_sampleable = int(state["num_sampleable"])
        self._rng.bit_generator.state = state["rng"]
        if self.priorities is not None:
            self.priorities.load_state_dict(state["priorities"])
