"""Narrowing a Gymnasium space to the kind a component needs, with a clear error otherwise.

``gym.Space.shape`` is ``None`` for spaces without a fixed shape (Graph, Sequence, Text) and a
plain ``gym.Space`` has no ``low``, ``high`` or ``n``: code that needs them calls these instead
of assuming, so an unsupported space fails with its name rather than an AttributeError deep
in a network's constructor.
"""

from __future__ import annotations

import gymnasium as gym


def shape_of(space: gym.Space) -> tuple[int, ...]:
    """``space.shape``, or a TypeError for a space without a fixed shape."""
    if space.shape is None:
        raise TypeError(f"a {type(space).__name__} space has no fixed shape")
    return tuple(space.shape)


def as_box(space: gym.Space) -> gym.spaces.Box:
    """``space`` as a Box, or a TypeError naming what it is."""
    if not isinstance(space, gym.spaces.Box):
        raise TypeError(f"expected a Box space, got {space}")
    return space


def as_discrete(space: gym.Space) -> gym.spaces.Discrete:
    """``space`` as a Discrete space, or a TypeError naming what it is."""
    if not isinstance(space, gym.spaces.Discrete):
        raise TypeError(f"expected a Discrete space, got {space}")
    return space
