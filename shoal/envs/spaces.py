"""Gymnasium spaces as plain JSON data, so checkpoints can describe what a policy reads and
returns without building its environment (and without pickle)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from shoal.core.errors import CheckpointError
from shoal.envs.composite import PackedActions, PackedObs


def space_to_json(space: gym.Space) -> dict[str, Any]:
    """A JSON-able description of ``space`` (Box, Discrete, MultiDiscrete, MultiBinary,
    Tuple or Dict of them, and the packed form of the last two, `shoal.envs.composite`). Box
    bounds that are the same everywhere are stored once."""
    if isinstance(space, PackedObs):
        return {"type": "Packed", "space": space_to_json(space.original)}
    if isinstance(space, PackedActions):
        return {"type": "PackedActions", "space": space_to_json(space.original)}
    if isinstance(space, gym.spaces.Box):
        return {
            "type": "Box",
            "shape": list(space.shape),
            "dtype": str(space.dtype),
            "low": _bound(space.low),
            "high": _bound(space.high),
        }
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": np.asarray(space.nvec).tolist()}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
    if isinstance(space, gym.spaces.Tuple):
        return {"type": "Tuple", "spaces": [space_to_json(s) for s in space.spaces]}
    if isinstance(space, gym.spaces.Dict):
        return {"type": "Dict", "spaces": {k: space_to_json(s) for k, s in space.spaces.items()}}
    raise TypeError(f"cannot describe a {type(space).__name__} space")


def space_from_json(data: dict[str, Any]) -> gym.Space:
    """The space `space_to_json` described."""
    try:
        kind = data["type"]
        if kind == "Box":
            shape = tuple(data["shape"])
            dtype = np.dtype(data["dtype"])
            low = np.broadcast_to(np.asarray(data["low"], np.float64), shape).astype(dtype)
            high = np.broadcast_to(np.asarray(data["high"], np.float64), shape).astype(dtype)
            return gym.spaces.Box(low, high, shape, dtype)
        if kind == "Discrete":
            return gym.spaces.Discrete(data["n"], start=data.get("start", 0))
        if kind == "Packed":
            return PackedObs(space_from_json(data["space"]))
        if kind == "PackedActions":
            return PackedActions(space_from_json(data["space"]))
        if kind == "MultiDiscrete":
            return gym.spaces.MultiDiscrete(data["nvec"])
        if kind == "MultiBinary":
            return gym.spaces.MultiBinary(data["n"])
        if kind == "Tuple":
            return gym.spaces.Tuple([space_from_json(s) for s in data["spaces"]])
        if kind == "Dict":
            return gym.spaces.Dict({k: space_from_json(s) for k, s in data["spaces"].items()})
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"unreadable space description {data!r}: {exc}") from exc
    raise CheckpointError(f"unknown space type {kind!r}")


def _bound(values: np.ndarray) -> Any:
    flat = np.asarray(values, np.float64).ravel()
    if flat.size and (flat == flat[0]).all():
        return float(flat[0])
    return np.asarray(values, np.float64).tolist()
