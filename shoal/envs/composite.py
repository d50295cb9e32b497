"""Composite observations (``Dict`` and ``Tuple`` spaces, nested too) packed into byte records.

Every storage in shoal (rollouts, replay, the Ray transport, checkpoints) holds observations as
one preallocated tensor ``[..., *shape]`` of one dtype. A composite observation is kept there as
a *record*: one row of ``record_bytes`` uint8 in which each leaf of the space (a key of a
``Dict``, an item of a ``Tuple``) has its own aligned field in its own dtype, the layout of a
NumPy structured array. So uint8 images stay uint8 (one byte a pixel), vectors stay float32,
discrete values stay integers, and nothing is converted or widened in storage. The fields are
read back as zero-copy views (`PackedObs.leaf_array`, `PackedObs.leaf_tensor`): on NumPy arrays
for normalization, on tensors (CPU or GPU) for the networks' per-key encoders
(`shoal.nn.composite.CompositeEncoder`).

`shoal.envs.gym.GymVectorEnv` packs what the env returns; `shoal.nn.policy.ActorPolicy.act` packs
the dicts a user passes. A leaf's storage dtype: uint8 Boxes and MultiBinary as uint8, other
Boxes as float32, Discrete and MultiDiscrete as int64.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from shoal.core.errors import ShoalError, UnsupportedSpaceError
from shoal.envs.shapes import as_box

ALIGN = 8
"""Field offsets and the record size are multiples of 8 bytes, so every field is an aligned
view in its dtype (int64 included) on every row."""


@dataclass(frozen=True)
class Leaf:
    """One field of a record: where the value at ``path`` lives and how it is stored."""

    path: tuple[str | int, ...]
    space: gym.Space
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int

    @property
    def name(self) -> str:
        """The path as one string: ``"pos"``, ``"sensors.camera"``, ``"0"``."""
        return ".".join(str(key) for key in self.path)

    @cached_property
    def size(self) -> int:
        """Values per observation."""
        return int(np.prod(self.shape, dtype=np.int64))

    @cached_property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def is_image(self) -> bool:
        """A uint8 Box of shape ``[C, H, W]`` or ``[H, W]``: read by an image encoder."""
        space = self.space
        return (
            isinstance(space, gym.spaces.Box)
            and space.dtype == np.uint8
            and len(self.shape) in (2, 3)
        )

    @property
    def is_float(self) -> bool:
        """A Box stored as float32: a vector that normalization standardizes per key."""
        return isinstance(self.space, gym.spaces.Box) and self.dtype == np.float32


def storage_of(space: gym.Space, path: str) -> tuple[np.dtype, tuple[int, ...]]:
    """Storage dtype and shape of one leaf space; ``path`` names it in errors."""
    if isinstance(space, gym.spaces.Box):
        dtype = np.uint8 if space.dtype == np.uint8 else np.float32
        return np.dtype(dtype), tuple(space.shape)
    if isinstance(space, gym.spaces.Discrete):
        return np.dtype(np.int64), ()
    if isinstance(space, gym.spaces.MultiDiscrete):
        return np.dtype(np.int64), tuple(np.asarray(space.nvec).shape)
    if isinstance(space, gym.spaces.MultiBinary):
        return np.dtype(np.uint8), tuple(np.atleast_1d(np.asarray(space.n)).tolist())
    raise UnsupportedSpaceError(
        f"observation part {path or '(top)'!r} is a {type(space).__name__} space ({space}); "
        "the parts of a Dict or Tuple observation may be Box, Discrete, MultiDiscrete, "
        "MultiBinary, or Dict and Tuple of them"
    )


def _children(space: gym.Space) -> Iterator[tuple[str | int, gym.Space]]:
    if isinstance(space, gym.spaces.Dict):
        yield from space.spaces.items()
    elif isinstance(space, gym.spaces.Tuple):
        yield from enumerate(space.spaces)


def is_composite(space: gym.Space) -> bool:
    return isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple))


def leaf_spaces(space: gym.Space, path: tuple = ()) -> Iterator[tuple[tuple, gym.Space]]:
    """``(path, space)`` of every leaf of a (nested) Dict/Tuple space, depth first, Dict keys
    in the space's order and Tuple items by index."""
    if not is_composite(space):
        yield path, space
        return
    for key, child in _children(space):
        yield from leaf_spaces(child, (*path, key))


def nest(space: gym.Space, value_of: Callable[[tuple], Any], path: tuple = ()) -> Any:
    """The nested dicts/tuples of ``space``'s shape with ``value_of(path)`` at each leaf."""
    if not is_composite(space):
        return value_of(path)
    items = {key: nest(child, value_of, (*path, key)) for key, child in _children(space)}
    return items if isinstance(space, gym.spaces.Dict) else tuple(items.values())


class _Packed(gym.Space):
    """What both packed forms share: the env's space (``original``) and the `gym.Space`
    protocol around it."""

    def __init__(self, original: gym.Space, shape: tuple[int, ...], dtype: type):
        self.original = original
        super().__init__(shape=shape, dtype=dtype)

    def seed(self, seed: int | None = None) -> Any:
        return self.original.seed(seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.original == self.original

    def __hash__(self) -> int:
        return hash((type(self).__name__, repr(self.original)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.original})"


class PackedObs(_Packed):
    """A ``Dict``/``Tuple`` observation space as stored: records of ``record_bytes`` uint8.

    ``original`` is the env's space; ``leaves`` are its fields in the order of `leaf_spaces`.
    Not a Box on purpose: code that only knows flat observations refuses it instead of
    reading bytes as numbers.
    """

    def __init__(self, original: gym.Space):
        if not is_composite(original):
            raise TypeError(f"PackedObs packs Dict or Tuple spaces, got {original}")
        leaves: list[Leaf] = []
        offset = 0
        for path, space in leaf_spaces(original):
            dtype, shape = storage_of(space, ".".join(map(str, path)))
            leaf = Leaf(path, space, dtype, shape, offset)
            leaves.append(leaf)
            offset += -(-leaf.nbytes // ALIGN) * ALIGN
        if not leaves:
            raise UnsupportedSpaceError(f"observation space {original} has no parts")
        self.leaves = tuple(leaves)
        self.record_bytes = max(offset, ALIGN)
        self._padded = sum(leaf.nbytes for leaf in leaves) < self.record_bytes
        super().__init__(original, (self.record_bytes,), np.uint8)

    # -- packing ---------------------------------------------------------------------------

    def pack(self, obs: Any, out: np.ndarray | None = None) -> np.ndarray:
        """Records ``[B, record_bytes]`` of a batch of composite observations: nested dicts and
        tuples whose leaves are arrays ``[B, ...]`` (what a Gymnasium vector env returns)."""
        first = _get(obs, self.leaves[0].path, self.leaves[0].name)
        batch = np.shape(first)[0] if np.ndim(first) > len(self.leaves[0].shape) else None
        if batch is None:
            raise ShoalError(
                f"expected a batch of observations, got {self.leaves[0].name!r} of shape "
                f"{np.shape(first)} (one observation: use pack_one)"
            )
        if out is None:
            out = np.empty((batch, self.record_bytes), np.uint8)
            if self._padded:  # padding bytes: zero, so equal observations give equal records
                out.fill(0)
        for leaf in self.leaves:
            value = np.asarray(_get(obs, leaf.path, leaf.name))
            try:  # each field as a 2-D view in its dtype, filled with one assignment
                field_view(out, leaf.offset, leaf.dtype, (leaf.size,))[...] = value.reshape(
                    batch, leaf.size
                )
            except ValueError as exc:
                raise ShoalError(
                    f"observation part {leaf.name!r} should have shape {leaf.shape} per "
                    f"observation, got {value.shape} for a batch of {batch}"
                ) from exc
        return out

    def pack_one(self, obs: Any) -> np.ndarray:
        """The record ``[record_bytes]`` of one observation."""
        return self.pack(map_leaves(obs, lambda value: np.asarray(value)[None]))[0]

    def is_single(self, obs: Any) -> bool:
        """Whether ``obs`` (a nested dict/tuple) is one observation rather than a batch."""
        leaf = self.leaves[0]
        return np.ndim(_get(obs, leaf.path, leaf.name)) == len(leaf.shape)

    # -- reading ---------------------------------------------------------------------------

    def leaf_array(self, records: np.ndarray, leaf: Leaf) -> np.ndarray:
        """A view ``[B, *leaf.shape]`` of ``leaf``'s field in ``records`` ``[B, record_bytes]``."""
        return field_view(records, leaf.offset, leaf.dtype, leaf.shape)

    def leaf_tensor(self, records: torch.Tensor, leaf: Leaf) -> torch.Tensor:
        """`leaf_array` for tensors ``[N, record_bytes]`` uint8, on any device."""
        field = records[:, leaf.offset : leaf.offset + leaf.nbytes]
        return field.view(_TORCH_DTYPES[leaf.dtype]).reshape(records.shape[0], *leaf.shape)

    def unpack(self, records: np.ndarray) -> Any:
        """The nested dicts/tuples of arrays ``[B, ...]`` that ``records`` hold."""
        return self._nest(lambda leaf: self.leaf_array(records, leaf).copy())

    def unpack_tensor(self, records: torch.Tensor) -> Any:
        """The nested dicts/tuples of tensors ``[N, ...]`` (views) that ``records`` hold: what
        a custom encoder (`ModelConfig.encoder` ``module:Class``) reads on a composite space."""
        if records.dtype != torch.uint8:
            raise ShoalError(f"packed observations are uint8 records, got {records.dtype}")
        return self._nest(lambda leaf: self.leaf_tensor(records, leaf))

    def _nest(self, value_of: Callable[[Leaf], Any]) -> Any:
        by_path = {leaf.path: leaf for leaf in self.leaves}
        return nest(self.original, lambda path: value_of(by_path[path]))

    # -- gym.Space -------------------------------------------------------------------------

    def sample(self, mask: Any = None, probability: Any = None) -> np.ndarray:
        return self.pack_one(self.original.sample())

    def contains(self, x: Any) -> bool:
        return isinstance(x, np.ndarray) and x.shape == self.shape and x.dtype == np.uint8


def field_view(
    records: np.ndarray, offset: int, dtype: np.dtype | type, shape: tuple[int, ...]
) -> np.ndarray:
    """The field at byte ``offset`` of records ``[B, record_bytes]`` as a view ``[B, *shape]``
    in ``dtype`` (a copy only when the records' rows are not contiguous)."""
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    field = records[:, offset : offset + nbytes]
    return field.view(dtype).reshape(records.shape[0], *shape)


_TORCH_DTYPES = {
    np.dtype(np.uint8): torch.uint8,
    np.dtype(np.float32): torch.float32,
    np.dtype(np.int64): torch.int64,
}


def _get(obs: Any, path: tuple, name: str) -> Any:
    value = obs
    for key in path:
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            raise ShoalError(
                f"observation has no part {name!r} (expected a "
                f"{'dict' if isinstance(key, str) else 'tuple'} with it)"
            ) from None
    return value


def map_leaves(obs: Any, fn: Any) -> Any:
    if isinstance(obs, dict):
        return {key: map_leaves(value, fn) for key, value in obs.items()}
    if isinstance(obs, tuple):
        return tuple(map_leaves(value, fn) for value in obs)
    return fn(obs)


@dataclass(frozen=True)
class ActionPart:
    """One part of a Tuple/Dict action: its space and its columns ``[start, end)``."""

    path: tuple[str | int, ...]
    space: gym.Space
    start: int
    end: int

    @property
    def name(self) -> str:
        return ".".join(str(key) for key in self.path)


def action_width(space: gym.Space, path: str) -> int:
    """Columns one action part takes in a packed row; ``path`` names it in errors."""
    if isinstance(space, gym.spaces.Discrete):
        return 1
    if isinstance(space, gym.spaces.MultiDiscrete) and np.asarray(space.nvec).ndim == 1:
        return len(space.nvec)
    if isinstance(space, gym.spaces.MultiBinary) and np.ndim(space.n) == 0:
        return int(space.n)  # type: ignore[arg-type]  # a scalar n: ndim checked above
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
        return space.shape[0]
    raise UnsupportedSpaceError(
        f"action part {path or '(top)'!r} is {space}; the parts of a Tuple or Dict action may "
        "be Discrete, 1-D MultiDiscrete, 1-D MultiBinary and 1-D Box, nested in Tuple or Dict"
    )


class PackedActions(_Packed):
    """A ``Tuple``/``Dict`` action space as the on-policy learners see it: float32 rows of
    ``width`` columns, each part in its own columns (a Discrete part's index, a MultiDiscrete
    or MultiBinary part's values, a Box part's values). `shoal.envs.gym.GymVectorEnv` unpacks
    the rows into the env's nested actions (`unpack`); the policy is a product of one
    distribution per part (`shoal.nn.distributions.Product`)."""

    def __init__(self, original: gym.Space):
        if not is_composite(original):
            raise TypeError(f"PackedActions packs Tuple or Dict spaces, got {original}")
        parts: list[ActionPart] = []
        column = 0
        for path, space in leaf_spaces(original):
            width = action_width(space, ".".join(map(str, path)))
            parts.append(ActionPart(path, space, column, column + width))
            column += width
        if not parts:
            raise UnsupportedSpaceError(f"action space {original} has no parts")
        self.parts = tuple(parts)
        self.width = column
        super().__init__(original, (column,), np.float32)

    def unpack(self, rows: np.ndarray) -> Any:
        """The env's nested actions (arrays ``[B, ...]``) from packed rows ``[B, width]``:
        integer parts rounded to their values (Discrete ``start`` included), Box parts
        clipped to their bounds."""
        rows = np.asarray(rows)
        values: dict[tuple, np.ndarray] = {}
        for part in self.parts:
            piece = rows[:, part.start : part.end]
            space = part.space
            if isinstance(space, gym.spaces.Discrete):
                values[part.path] = np.rint(piece[:, 0]).astype(np.int64) + int(space.start)
            elif isinstance(space, gym.spaces.MultiDiscrete):
                values[part.path] = np.rint(piece).astype(np.int64)
            elif isinstance(space, gym.spaces.MultiBinary):
                values[part.path] = np.rint(piece).astype(np.int8)
            else:
                box = as_box(space)
                values[part.path] = np.clip(piece, box.low, box.high).astype(box.dtype)

        return nest(self.original, values.__getitem__)

    def pack(self, actions: Any) -> np.ndarray:
        """Packed rows ``[B, width]`` of a batch of nested actions (the inverse of `unpack`)."""
        first = np.asarray(_get(actions, self.parts[0].path, self.parts[0].name))
        rows = np.zeros((first.shape[0], self.width), np.float32)
        for part in self.parts:
            value = np.asarray(_get(actions, part.path, part.name), np.float32)
            if isinstance(part.space, gym.spaces.Discrete):
                value = value - float(part.space.start)
            rows[:, part.start : part.end] = value.reshape(rows.shape[0], -1)
        return rows

    def sample(self, mask: Any = None, probability: Any = None) -> np.ndarray:
        one = map_leaves(self.original.sample(), lambda value: np.asarray(value)[None])
        return self.pack(one)[0]

    def contains(self, x: Any) -> bool:
        return isinstance(x, np.ndarray) and x.shape == self.shape
