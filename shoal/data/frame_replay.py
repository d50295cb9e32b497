"""Replay storage of stacked frames with each frame stored once.

A frame-stacked observation ``[k, H, W]`` (Atari: 4 x 84 x 84 uint8, 28 KB) shares ``k - 1``
frames with the observation before it, so `ReplayBuffer` built with ``frame_stack=k`` keeps
only the newest frame of each step (`FrameStacks`) and rebuilds the stacks when it samples:
about 7 KB per transition instead of 28 KB, as in the DQN paper's own replay (Mnih et al.
2015) and Dopamine's. ``bytes_per_transition`` measures it.

What is stored is checked against what the env gave, so the rebuilt stacks equal the env's
observations exactly: each new stack must either continue the previous step's stack of its env
(its older ``k - 1`` frames are that stack's newest ``k - 1``) or start an episode padded the
way frame stackers pad at reset: copies of the first frame (Gymnasium's
`FrameStackObservation`, ``padding_type="reset"``, its default) or zeros (its
``padding_type=0``, Stable-Baselines3's `VecFrameStack`). Each step records how many of its
stack's frames belong to the current episode and how the rest are padded, so stacks never take
frames across an episode boundary (the autoreset row, which holds the true final observation,
continues its episode; the reset observation after it starts the next one) or across the
circular wrap: the frame ring keeps ``k - 1`` rows more than the buffer, so the oldest
sampleable step still has its older frames.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from shoal.core.errors import ConfigError
from shoal.envs.composite import PackedObs


class FrameStacks:
    """The newest frame of every stored step, ``[rows + k - 1, num_envs, *frame_shape]``, and
    what rebuilds each step's ``k``-frame stack.

    Args:
        rows: rows of the replay buffer (vector steps it keeps).
        num_envs: environments per row (``B``).
        obs_shape: ``(k, *frame_shape)``, stacked along the first axis, oldest first.
        dtype: storage dtype of the frames (uint8 for images).
    """

    def __init__(self, rows: int, num_envs: int, obs_shape: tuple[int, ...], dtype: np.dtype):
        if len(obs_shape) < 2:
            raise ValueError(
                f"frame-stacked replay needs observations [k, *frame_shape]; got shape {obs_shape}"
            )
        self.stack = int(obs_shape[0])
        self.rows = rows
        self.num_envs = num_envs
        self.frame_rows = rows + self.stack - 1
        self.frames = np.zeros((self.frame_rows, num_envs, *obs_shape[1:]), dtype)
        self.history = np.zeros((rows, num_envs), np.uint8)
        """Frames of the stack (newest first) that belong to the step's episode: 1 to k."""
        self.zero_pad = np.zeros((rows, num_envs), bool)
        """The stack's other frames are zeros (else copies of the episode's first frame)."""
        self._flat_frames = self.frames.reshape(self.frame_rows * num_envs, *obs_shape[1:])
        self._back = np.arange(self.stack - 1, -1, -1)  # stack position i is k-1-i steps back
        self._env_ids = np.arange(num_envs)
        self._last: np.ndarray | None = None  # the stacks of the latest add

    def add(self, step: int, obs: np.ndarray) -> None:
        """Store the observations ``[B, k, ...]`` of vector step number ``step`` (0, 1, ...)."""
        obs = np.asarray(obs)
        newest = obs[:, -1]
        frame_size = newest[0].size
        older = obs[:, :-1].reshape(self.num_envs, self.stack - 1, frame_size)
        if step == 0:
            continues = np.zeros(self.num_envs, bool)
        else:
            previous = self._last if self._last is not None else self.stacks_at_step(step - 1)
            shifted = previous[:, 1:].reshape(older.shape)
            continues = (older == shifted).all(axis=(1, 2))
        # Episode starts: padded with copies of the first frame, or with zeros.
        repeat = np.zeros(self.num_envs, bool)
        zeros = np.zeros(self.num_envs, bool)
        starts = np.flatnonzero(~continues)
        if starts.size:
            first = newest[starts].reshape(starts.size, 1, frame_size)
            repeat[starts] = (older[starts] == first).all(axis=(1, 2))
            zeros[starts] = ~older[starts].any(axis=(1, 2))
        bad = ~(continues | repeat | zeros)
        if bad.any():
            env = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"frame-stacked replay: the observation of env {env} at step {step} neither "
                "continues the previous step's stack (its older frames shifted by one) nor "
                "starts an episode padded with copies of its first frame or with zeros; store "
                "such observations without frame_stack"
            )
        ring = step % self.rows
        if step > 0:
            before = (step - 1) % self.rows
            history = np.minimum(self.history[before] + 1, self.stack)
            self.history[ring] = np.where(continues, history, 1)
            self.zero_pad[ring] = np.where(continues, self.zero_pad[before], ~repeat)
        else:
            self.history[ring] = 1
            self.zero_pad[ring] = ~repeat
        self.frames[step % self.frame_rows] = newest
        self._last = obs.copy()

    def stacks_at_step(self, step: int) -> np.ndarray:
        """The stacks ``[B, k, ...]`` stored for vector step ``step`` (one still stored)."""
        positions = (step % self.rows) * self.num_envs + self._env_ids
        return self.stacks(positions, step + 1)

    def stacks(self, positions: np.ndarray, steps_written: int) -> np.ndarray:
        """The stacks ``[N, k, ...]`` at flat buffer positions ``row * B + env`` ``[N]``, when
        ``steps_written`` vector steps have been added."""
        ring_row, env = np.divmod(positions, self.num_envs)
        # The latest step that landed on each ring row.
        step = ring_row + self.rows * ((steps_written - 1 - ring_row) // self.rows)
        history = self.history.reshape(-1).take(positions).astype(np.int64)
        back = np.minimum(self._back, history[:, None] - 1)  # padding repeats the first frame
        source = (step[:, None] - back) % self.frame_rows * self.num_envs + env[:, None]
        out = self._flat_frames.take(source, axis=0)
        zero = self.zero_pad.reshape(-1).take(positions)[:, None] & (self._back >= history[:, None])
        if zero.any():
            out[zero] = 0
        return out

    def state_dict(self, steps_written: int) -> dict[str, Any]:
        """The written part of the storage (views, not copies)."""
        rows = min(steps_written, self.rows)
        return {
            "frames": self.frames[: min(steps_written, self.frame_rows)],
            "history": self.history[:rows],
            "zero_pad": self.zero_pad[:rows],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in ("frames", "history", "zero_pad"):
            array, saved = getattr(self, name), state[name]
            if saved.shape[1:] != array.shape[1:] or saved.dtype != array.dtype:
                raise ValueError(
                    f"replay state has {name} of shape {saved.shape[1:]} and dtype "
                    f"{saved.dtype} per row, this buffer {array.shape[1:]} {array.dtype}"
                )
            array[: len(saved)] = saved
        self._last = None  # rebuilt from storage at the next add


def stack_size(space: gym.Space) -> int:
    """``k`` of frame-stacked observations ``[k, *frame_shape]`` (a Box of 2 or more axes)."""
    if isinstance(space, PackedObs):
        raise ConfigError(
            "frame_replay stores frame-stacked Box observations [k, H, W]; Dict and Tuple "
            "observations are stored as packed records (image parts stay uint8, but stacked "
            "frames are not shared between transitions): turn frame_replay off"
        )
    if not isinstance(space, gym.spaces.Box) or len(space.shape) < 2:
        raise ConfigError(
            f"frame_replay stores frame-stacked observations [k, H, W]; got {space}: "
            "turn frame_replay off for this env"
        )
    return int(space.shape[0])


def _owned_bytes(obj: Any, seen: set[int]) -> int:
    """Bytes of the numpy arrays that ``obj`` (and the objects, dicts and lists it holds)
    own; views count nothing, so each buffer is counted once."""
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return obj.nbytes if obj.base is None else 0
    if isinstance(obj, dict):
        return sum(_owned_bytes(v, seen) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(_owned_bytes(v, seen) for v in obj)
    if hasattr(obj, "__dict__") and type(obj).__module__.startswith("shoal."):
        return sum(_owned_bytes(v, seen) for v in vars(obj).values())
    return 0


def bytes_per_transition(buffer: Any) -> float:
    """Memory of a replay buffer's arrays (storage, frame ring, priorities), by their
    ``nbytes``, per transition of capacity. Preallocated, so it holds for the full buffer."""
    return _owned_bytes(buffer, set()) / buffer.capacity
