"""What the built-in batched multi-agent worlds share (the particle world, tag, the traffic
intersection): resetting every env, exact state of their named arrays, the factory their ids
are registered with, and drawing frames of discs.

A world subclasses `BatchedWorld` and provides ``num_envs``, ``groups``, ``rng``,
``tracker``, ``_needs_reset`` and ``_started``, ``_reset_envs(index)`` (new episodes in
those envs), ``observe()`` and, in ``state_arrays``, the names of the arrays that hold its
state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import numpy as np

from shoal.config import EnvConfig
from shoal.core.errors import ConfigError
from shoal.envs.multi_agent import AgentGroup, EpisodeTracker


class BatchedWorld:
    env_id: str = ""
    state_arrays: ClassVar[tuple[str, ...]] = ()
    """Attributes (arrays over envs) that `get_state` saves and `set_state` writes back."""
    num_envs: int
    groups: dict[str, AgentGroup]
    rng: np.random.Generator
    tracker: EpisodeTracker
    _needs_reset: np.ndarray
    _started: bool

    def _reset_envs(self, index: np.ndarray) -> None:
        raise NotImplementedError

    def observe(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        raise NotImplementedError

    def reset(self, seed: int | None = None) -> tuple[dict[str, np.ndarray], np.ndarray]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self._reset_envs(np.arange(self.num_envs))
        self._needs_reset[:] = False
        self.tracker = EpisodeTracker(self.num_envs, self.groups)
        self._started = True
        self._derive()
        return self.observe()

    def get_state(self) -> dict[str, Any]:
        state = {name: getattr(self, name).copy() for name in self.state_arrays}
        state.update(
            needs_reset=self._needs_reset.copy(),
            started=self._started,
            rng=self.rng.bit_generator.state,
            tracker=self.tracker.state_dict(),
        )
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        for name in self.state_arrays:
            getattr(self, name)[:] = state[name]
        self._needs_reset = np.array(state["needs_reset"], bool)
        self._started = bool(state["started"])
        self.rng = np.random.default_rng()
        self.rng.bit_generator.state = state["rng"]
        self.tracker.load_state_dict(state["tracker"])
        self._derive()

    def _derive(self) -> None:
        """After `reset` and `set_state`: recompute what is derived from the state arrays
        (cached geometry)."""

    def close(self) -> None:
        pass


def factory(cls: type[BatchedWorld]) -> Callable[[EnvConfig], Any]:
    """``cls(num_envs, max_episode_steps=..., **env.kwargs)`` from an `EnvConfig`, with a
    clear error for keyword arguments ``cls`` does not take."""

    def make(config: EnvConfig) -> Any:
        try:
            return cls(  # type: ignore[call-arg]
                config.num_envs, max_episode_steps=config.max_episode_steps, **config.kwargs
            )
        except TypeError as error:
            raise ConfigError(f"{cls.env_id}: bad env.kwargs {config.kwargs}: {error}") from None

    return make


Disc = tuple[float, float, float, tuple[int, int, int]]
"""``(x, y, radius, RGB colour)``."""


def disc_frame(
    discs: Iterable[Disc],
    size: int,
    extent: float | None = None,
    background: tuple[int, int, int] = (255, 255, 255),
    paint: Callable[[np.ndarray, np.ndarray, np.ndarray], None] | None = None,
) -> np.ndarray:
    """An RGB frame ``[size, size, 3]`` of the square ``[-extent, extent]^2`` (by default
    grown from 1 to keep every disc in sight), ``paint(frame, xs, ys)`` drawn first (xs and ys
    the pixel centres' world coordinates), then the discs in order (at least 1.5 pixels)."""
    discs = list(discs)
    if extent is None:
        extent = max([1.0] + [max(abs(x), abs(y)) + r for x, y, r, _ in discs])
    scale = size / (2 * extent)
    frame = np.full((size, size, 3), background, np.uint8)
    centers = (np.arange(size, dtype=np.float32) + 0.5) / scale - extent
    xs, ys = centers[None, :], -centers[:, None]  # image rows go down, y goes up
    if paint is not None:
        paint(frame, xs, ys)
    for x, y, r, color in discs:
        r = max(r, 1.5 / scale)
        frame[(xs - x) ** 2 + (ys - y) ** 2 <= r * r] = color
    return frame
