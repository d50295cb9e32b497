"""Replay of whole multi-agent episodes, for recurrent value-decomposition learners (QMIX, VDN,
IQL as in pymarl): recurrent agents are trained on complete sequences from their first step.

`EpisodeReplay` stores up to ``capacity`` episodes padded to ``max_len`` steps: step ``t`` of
an episode holds the observations ``obs[t]`` and the action, reward and flags of the
transition from ``obs[t]`` to ``obs[t + 1]``; ``filled[t]`` marks real transitions (False on
the padding), so an episode of length ``L`` has ``L + 1`` observations. `EpisodeBuilder` turns
the steps of a `shoal.envs.multi_agent.MultiAgentVectorEnv` (``B`` envs in parallel) into
episodes: each env's running episode is buffered until it ends, and the env's next-step
autoreset step (which ignores the actions) is not a transition but the first observation of
the next episode. Arrays are numpy; `EpisodeReplay.sample` returns time-major torch tensors.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from shoal.envs.multi_agent import MultiAgentStep

# name -> (per-step shape after [max_len(+1)], dtype, has the extra final-observation step)
_Layout = dict[str, tuple[tuple[int, ...], Any, bool]]


class EpisodeBatch(NamedTuple):
    """Sampled episodes, time-major and cut to the longest one in the batch (``T`` steps)."""

    obs: torch.Tensor
    """``[T + 1, B, N, *obs_shape]`` float32 observations (the last real one is the final)."""
    state: torch.Tensor
    """``[T + 1, B, S]`` float32 global states (``S = 0`` when the env has none)."""
    actions: torch.Tensor
    """``[T, B, N]`` int64 actions."""
    rewards: torch.Tensor
    """``[T, B, N]`` float32 per-agent rewards."""
    terminated: torch.Tensor
    """``[T, B]`` bool: the episode reached a terminal state on this step (no bootstrap)."""
    filled: torch.Tensor
    """``[T, B]`` bool: a real transition (False on padding): the loss mask."""
    active: torch.Tensor
    """``[T, B, N]`` bool: the agent acted on this step."""
    action_mask: torch.Tensor | None
    """``[T + 1, B, N, A]`` bool legal actions at each observation, or None."""
    indices: np.ndarray
    """``[B]`` slots of the sampled episodes."""


def _layout(
    n_agents: int, obs_shape: tuple[int, ...], state_dim: int, mask_dim: int | None
) -> _Layout:
    layout: _Layout = {
        "obs": ((n_agents, *obs_shape), np.float32, True),
        "state": ((state_dim,), np.float32, True),
        "actions": ((n_agents,), np.int64, False),
        "rewards": ((n_agents,), np.float32, False),
        "terminated": ((), bool, False),
        "filled": ((), bool, False),
        "active": ((n_agents,), bool, False),
    }
    if mask_dim is not None:
        layout["action_mask"] = ((n_agents, mask_dim), bool, True)
    return layout


def _allocate(rows: int, max_len: int, layout: _Layout) -> dict[str, np.ndarray]:
    return {
        name: np.zeros((rows, max_len + int(extra), *shape), dtype)
        for name, (shape, dtype, extra) in layout.items()
    }


class EpisodeReplay:
    """A ring buffer of ``capacity`` episodes of at most ``max_len`` steps (see module doc).

    Args:
        capacity: episodes kept; the oldest is overwritten first.
        max_len: longest episode (steps); `EpisodeBuilder` cuts longer ones.
        n_agents: agents of the group.
        obs_shape: one agent's observation shape.
        state_dim: global state size (0: none).
        action_mask_dim: number of actions when the env reports legal actions, else None.
        seed: seed of the sampling generator.
    """

    def __init__(
        self,
        capacity: int,
        max_len: int,
        n_agents: int,
        obs_shape: tuple[int, ...],
        state_dim: int = 0,
        action_mask_dim: int | None = None,
        seed: int = 0,
    ):
        if capacity < 1 or max_len < 1:
            raise ValueError(f"capacity {capacity} and max_len {max_len} must be >= 1")
        self.capacity, self.max_len = capacity, max_len
        self.layout = _layout(n_agents, tuple(obs_shape), state_dim, action_mask_dim)
        self.data = _allocate(capacity, max_len, self.layout)
        self.lengths = np.zeros(capacity, np.int64)
        self.episodes_added = 0
        self._rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return min(self.episodes_added, self.capacity)

    def add(self, episodes: dict[str, np.ndarray], lengths: np.ndarray) -> None:
        """Store ``k`` padded episodes: arrays ``[k, max_len(+1), ...]`` of the layout's fields
        and their ``lengths`` ``[k]`` (each >= 1)."""
        k = len(lengths)
        if k == 0:
            return
        slots = (self.episodes_added + np.arange(k)) % self.capacity
        for name, array in self.data.items():
            array[slots] = episodes[name]
        self.lengths[slots] = lengths
        self.episodes_added += k

    def sample(self, batch_size: int) -> EpisodeBatch:
        """``batch_size`` stored episodes uniformly (with replacement), time-major tensors."""
        if len(self) == 0:
            raise ValueError("cannot sample from an empty episode replay")
        index = self._rng.integers(0, len(self), batch_size)
        steps = int(self.lengths[index].max())

        def take(name: str) -> torch.Tensor:
            _, _, extra = self.layout[name]
            array = self.data[name][index, : steps + int(extra)]
            return torch.from_numpy(np.ascontiguousarray(array.swapaxes(0, 1)))

        return EpisodeBatch(
            obs=take("obs"),
            state=take("state"),
            actions=take("actions"),
            rewards=take("rewards"),
            terminated=take("terminated"),
            filled=take("filled"),
            active=take("active"),
            action_mask=take("action_mask") if "action_mask" in self.data else None,
            indices=index,
        )

    def state_dict(self) -> dict[str, Any]:
        """Stored episodes (views: save before adding more), counters and the generator."""
        stored = len(self)
        return {
            "capacity": self.capacity,
            "max_len": self.max_len,
            "episodes_added": self.episodes_added,
            "lengths": self.lengths[:stored],
            "storage": {k: v[:stored] for k, v in self.data.items()},
            "rng": self._rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("capacity", "max_len"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"episode replay state has {key}={state[key]} but this buffer has "
                    f"{key}={getattr(self, key)}; build the buffer with the saved settings"
                )
        stored = len(state["lengths"])
        for name, array in self.data.items():
            array[:stored] = state["storage"][name]
        self.lengths[:stored] = state["lengths"]
        self.episodes_added = int(state["episodes_added"])
        self._rng.bit_generator.state = state["rng"]


class EpisodeBuilder:
    """Buffers the running episode of each of ``num_envs`` envs and writes finished ones to a
    replay.

    An env's episode ends when every agent of the group is terminated or truncated; it counts
    as terminated (no bootstrap) unless an agent was truncated. An episode that reaches
    ``replay.max_len`` steps without ending is stored as a cut (not terminated) piece and
    continues as a new piece from its last observation; a recurrent learner then restarts its
    state there, so choose ``max_len`` at least the env's episode limit.
    """

    def __init__(self, num_envs: int, replay: EpisodeReplay, group: str):
        self.replay, self.group, self.num_envs = replay, group, num_envs
        self.max_len = replay.max_len
        self.run = _allocate(num_envs, self.max_len, replay.layout)
        n_agents = replay.layout["actions"][0][0]
        self.t = np.zeros(num_envs, np.int64)
        self.done = np.zeros((num_envs, n_agents), bool)
        self.cut = np.zeros(num_envs, bool)

    def _clear(self, rows: np.ndarray) -> None:
        for array in self.run.values():
            array[rows] = 0
        self.t[rows] = 0
        self.done[rows] = False
        self.cut[rows] = False

    def _first(self, rows: np.ndarray, obs, state, mask) -> None:
        self.run["obs"][rows, 0] = obs[rows]
        if state is not None:
            self.run["state"][rows, 0] = state[rows]
        if mask is not None and "action_mask" in self.run:
            self.run["action_mask"][rows, 0] = mask[rows]

    def start(
        self, obs: dict[str, np.ndarray], state: np.ndarray | None, mask: dict | None = None
    ) -> None:
        """Begin every env's episode from ``env.reset()``'s observations and state."""
        rows = np.arange(self.num_envs)
        self._clear(rows)
        self._first(rows, obs[self.group], state, None if mask is None else mask[self.group])

    def restart(
        self,
        envs: list[int] | np.ndarray,
        obs: dict[str, np.ndarray],
        state: np.ndarray | None,
        mask: dict | None = None,
    ) -> None:
        """Drop the unfinished episodes of ``envs`` and begin theirs again from ``obs``,
        ``state`` and ``mask`` (of every env, as `start` takes them): their runner was rebuilt
        and reset them, and the steps its old actor took since the last rollout were lost."""
        rows = np.asarray(envs, np.int64)
        self._clear(rows)
        self._first(rows, obs[self.group], state, None if mask is None else mask[self.group])

    def add(self, actions: np.ndarray, step: MultiAgentStep) -> int:
        """Record one vector step taken with ``actions`` ``[B, N]``; returns the number of
        episodes (or cut pieces) written to the replay."""
        g, run = self.group, self.run
        obs, state = step.obs[g], step.state
        mask = None if step.action_mask is None else step.action_mask[g]
        real = np.flatnonzero(~step.autoreset)
        t = self.t[real]
        run["actions"][real, t] = actions[real]
        run["rewards"][real, t] = step.rewards[g][real]
        run["active"][real, t] = step.active[g][real]
        run["filled"][real, t] = True
        truncated = step.truncated[g][real]
        self.done[real] |= step.terminated[g][real] | truncated
        self.cut[real] |= truncated.any(1)
        ended = np.zeros(self.num_envs, bool)
        ended[real] = self.done[real].all(1)
        run["terminated"][real, t] = ended[real] & ~self.cut[real]
        self.t[real] += 1
        t = self.t[real]
        run["obs"][real, t] = obs[real]
        if state is not None:
            run["state"][real, t] = state[real]
        if mask is not None and "action_mask" in run:
            run["action_mask"][real, t] = mask[real]
        full = np.zeros(self.num_envs, bool)
        full[real] = ~ended[real] & (t == self.max_len)
        flush = np.flatnonzero(ended | full)
        if flush.size:
            self.replay.add({k: v[flush] for k, v in run.items()}, self.t[flush].copy())
        self._restart_cut(np.flatnonzero(full))
        # Ended envs reset on their next step (next-step autoreset); clear them now so that
        # padding stays zero, and begin the new episode from the autoreset step's obs.
        self._clear(np.flatnonzero(ended))
        new = np.flatnonzero(step.autoreset)
        self._clear(new)
        self._first(new, obs, state, mask)
        return int(flush.size)

    def _restart_cut(self, rows: np.ndarray) -> None:
        if not rows.size:
            return
        last = {name: self.run[name][rows, self.max_len].copy() for name in ("obs", "state")}
        mask_last = (
            self.run["action_mask"][rows, self.max_len].copy()
            if ("action_mask" in self.run)
            else None
        )
        done = self.done[rows].copy()
        self._clear(rows)
        self.run["obs"][rows, 0] = last["obs"]
        self.run["state"][rows, 0] = last["state"]
        if mask_last is not None:
            self.run["action_mask"][rows, 0] = mask_last
        self.done[rows] = done

    def state_dict(self) -> dict[str, Any]:
        return {
            "run": {k: v.copy() for k, v in self.run.items()},
            "t": self.t.copy(),
            "done": self.done.copy(),
            "cut": self.cut.copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, array in self.run.items():
            array[:] = state["run"][name]
        self.t[:] = state["t"]
        self.done[:] = state["done"]
        self.cut[:] = state["cut"]


__all__ = ["EpisodeBatch", "EpisodeBuilder", "EpisodeReplay"]
