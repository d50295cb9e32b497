"""Pickle-free snapshots of the Python-side state of Gymnasium environments.

A checkpoint must resume a run exactly: N steps, save, load, M steps has to produce the same
transitions as N + M steps in one go. That includes the environments, which are usually in the
middle of their episodes when the checkpoint is written. Checkpoints are read back with
``torch.load(weights_only=True)``, so environments cannot simply be pickled.

What works instead for pure-Python environments is an attribute walk: starting at the outermost
env, record every instance attribute that holds plain data (numpy arrays, scalars, random
generator states, and lists/tuples of those) and recurse into the nested environments (``.env`` of
wrappers, ``.envs`` of ``SyncVectorEnv``). A freshly built env of the same construction has the
same object graph, so writing the recorded values back puts it in the same state. Everything
else (spaces, specs, callables, render surfaces, ...) is fixed by construction and is skipped.

The snapshot is a nested dict holding only dict/list/str/int/float/bool/None and numpy arrays;
the checkpoint code turns the arrays into tensors. Its layout::

    {"version": 1, "root": node}
    node = {"class": "module.QualName",
            "attrs": {attribute name: value},
            "children": {attribute name: node | [node | None, ...]}}

Values that plain containers cannot express carry a ``"__kind__"`` tag: ``"tuple"`` (so tuples
come back as tuples, not lists), ``"numpy_scalar"`` (a 0-d array, so ``np.float32`` stays
``np.float32``) and ``"generator"`` (a ``np.random.Generator``'s ``bit_generator.state``).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, VectorEnv
from gymnasium.wrappers.utils import RunningMeanStd

__all__ = ["EnvStateUnsupported", "capture_env_state", "restore_env_state"]

FORMAT_VERSION = 1

_KIND = "__kind__"

# Objects the walk descends into. RunningMeanStd is not an environment, but the normalisation
# wrappers keep their running statistics in it, and a resumed run must see the same statistics.
_NODE_TYPES = (gym.Env, VectorEnv, RunningMeanStd)

# Array dtypes that survive the tensor conversion in checkpoints (bool, signed and unsigned ints,
# floats, complex). Object, string and structured arrays would need pickle.
_ARRAY_KINDS = frozenset("biufc")

# Exact types only: subclasses such as IntEnum members or np.float64 (a float subclass) must not
# be flattened into plain Python values, or their type would change on restore.
_PLAIN_SCALARS = (bool, int, float, str)

# Environments whose state lives in a native simulator that an attribute walk cannot see. A
# snapshot of them would look complete but resume from the wrong physics state, so refuse.
_NATIVE_SIMULATOR_MODULES = ("gymnasium.envs.box2d", "gymnasium.envs.mujoco", "ale_py")

_MISSING = object()
_SKIP = object()


class EnvStateUnsupported(Exception):
    """The environment keeps state that cannot be captured by walking its Python attributes."""


def capture_env_state(env: gym.Env | VectorEnv) -> dict[str, Any]:
    """Record the mid-episode state of ``env`` and everything it wraps.

    Raises ``EnvStateUnsupported`` if some object in the graph keeps its state out of reach
    (``AsyncVectorEnv`` workers, native simulators).
    """
    if not isinstance(env, (gym.Env, VectorEnv)):
        raise TypeError(f"expected a gymnasium Env or VectorEnv, got {type(env).__name__}")
    return {"version": FORMAT_VERSION, "root": _capture_node(env, "env", set())}


def restore_env_state(env: gym.Env | VectorEnv, state: dict[str, Any]) -> None:
    """Write a state from ``capture_env_state`` into a fresh env of the same construction.

    Raises ``ValueError`` naming the attribute path when the structure does not match. The env is
    only modified once the whole state has been checked, so a failed restore leaves it as it was.
    """
    if not isinstance(state, dict) or "root" not in state:
        raise ValueError("env state: expected a dict from capture_env_state with a 'root' entry")
    if state.get("version") != FORMAT_VERSION:
        raise ValueError(
            f"env state: format version {state.get('version')!r}, expected {FORMAT_VERSION}"
        )
    # Dry run first: every check happens there, so the real pass cannot fail half-way.
    _restore_node(env, state["root"], "env", apply=False)
    _restore_node(env, state["root"], "env", apply=True)


# --- capture -----------------------------------------------------------------------------------


def _class_name(obj: object) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _is_node(value: object) -> bool:
    return isinstance(value, _NODE_TYPES)


def _is_node_sequence(value: object) -> bool:
    return (
        isinstance(value, (list, tuple))
        and type(value) in (list, tuple)
        and len(value) > 0
        and all(map(_is_node, value))
    )


def _check_supported(obj: object, path: str) -> None:
    if isinstance(obj, AsyncVectorEnv):
        raise EnvStateUnsupported(
            f"{path}: AsyncVectorEnv keeps its environments in worker subprocesses, so their "
            "state cannot be saved; resuming such a run restarts the episodes"
        )
    if type(obj).__module__.startswith(_NATIVE_SIMULATOR_MODULES):
        raise EnvStateUnsupported(
            f"{path}: {_class_name(obj)} keeps its state in a native simulator that cannot be "
            "saved attribute by attribute; resuming such a run restarts the episodes"
        )


def _capture_node(obj: object, path: str, seen: set[int]) -> dict[str, Any]:
    _check_supported(obj, path)
    # An object reachable along two paths is recorded only at the first one; this also stops
    # the walk from looping should some object point back up the graph.
    seen.add(id(obj))
    attrs: dict[str, Any] = {}
    children: dict[str, Any] = {}
    for name, value in vars(obj).items():
        child_path = f"{path}.{name}"
        if _is_node(value):
            if id(value) not in seen:
                children[name] = _capture_node(value, child_path, seen)
        elif _is_node_sequence(value):
            # Keep list positions stable: an already-recorded item becomes None.
            children[name] = [
                None if id(item) in seen else _capture_node(item, f"{child_path}[{i}]", seen)
                for i, item in enumerate(value)
            ]
        else:
            encoded = _encode(value)
            if encoded is not _SKIP:
                attrs[name] = encoded
    return {"class": _class_name(obj), "attrs": attrs, "children": children}


def _encode(value: object) -> Any:
    """Plain-data form of ``value``, or ``_SKIP`` if it is not state this module records."""
    if value is None or type(value) in _PLAIN_SCALARS:
        return value
    if isinstance(value, np.ndarray):
        # A C-ordered base-class copy: later steps must not change the snapshot.
        return np.array(value, order="C") if value.dtype.kind in _ARRAY_KINDS else _SKIP
    if isinstance(value, np.generic):
        if value.dtype.kind not in _ARRAY_KINDS:
            return _SKIP
        return {_KIND: "numpy_scalar", "value": np.array(value)}
    if isinstance(value, np.random.Generator):
        return {_KIND: "generator", "state": _copy_plain(value.bit_generator.state)}
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        items = [_encode(item) for item in value]
        # All or nothing: half a container would restore as a different value.
        if any(item is _SKIP for item in items):
            return _SKIP
        return items if type(value) is list else {_KIND: "tuple", "items": items}
    return _SKIP


def _copy_plain(value: Any) -> Any:
    """Deep copy of a bit-generator state (dicts, lists, ints, strs, arrays)."""
    if isinstance(value, dict):
        return {key: _copy_plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy_plain(item) for item in value]
    if isinstance(value, np.ndarray):
        return value.copy()
    return value


# --- restore -----------------------------------------------------------------------------------


def _restore_node(obj: object, node: Any, path: str, *, apply: bool) -> None:
    if not isinstance(node, dict) or not {"class", "attrs", "children"} <= node.keys():
        raise ValueError(f"{path}: malformed env state node")
    if _class_name(obj) != node["class"]:
        raise ValueError(
            f"{path}: state was captured from {node['class']}, "
            f"but this env has {_class_name(obj)} here"
        )
    current = vars(obj)

    for name, encoded in node["attrs"].items():
        attr_path = f"{path}.{name}"
        value = current.get(name, _MISSING)
        if value is _MISSING:
            raise ValueError(f"{attr_path}: attribute is in the saved state but not on this env")
        if _is_node(value) or _is_node_sequence(value):
            raise ValueError(f"{attr_path}: saved as data, but this env holds an environment here")
        _restore_attr(obj, name, encoded, value, attr_path, apply=apply)

    for name, child in node["children"].items():
        child_path = f"{path}.{name}"
        value = current.get(name, _MISSING)
        if isinstance(child, list):
            if not _is_node_sequence(value) or len(value) != len(child):
                raise ValueError(
                    f"{child_path}: saved as a list of {len(child)} environments, "
                    f"but this env holds {_describe(value)}"
                )
            for i, (item, item_node) in enumerate(zip(value, child, strict=True)):
                if item_node is not None:
                    _restore_node(item, item_node, f"{child_path}[{i}]", apply=apply)
        elif _is_node(value):
            _restore_node(value, child, child_path, apply=apply)
        else:
            raise ValueError(
                f"{child_path}: saved as an environment object, "
                f"but this env holds {_describe(value)}"
            )


def _describe(value: object) -> str:
    if value is _MISSING:
        return "no such attribute"
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return f"a {type(value).__name__} of {len(value)} items"
    return f"a {type(value).__name__}"


def _restore_attr(
    obj: object, name: str, encoded: Any, current: Any, path: str, *, apply: bool
) -> None:
    # Arrays and generators are updated in place where the fresh env already has a compatible
    # one, so anything else holding a reference to them (views, a wrapper that kept
    # env.np_random) stays in step with the env.
    if isinstance(encoded, np.ndarray) and isinstance(current, np.ndarray):
        _check_shape(encoded, current, path)
        if current.dtype == encoded.dtype and current.flags.writeable:
            if apply:
                np.copyto(current, encoded)
            return
    if _kind(encoded) == "generator" and isinstance(current, np.random.Generator):
        # Built even when updating in place: it validates the saved state during the dry run.
        restored = _decode(encoded, None, path)
        if type(restored.bit_generator) is type(current.bit_generator):
            if apply:
                current.bit_generator.state = restored.bit_generator.state
            return
    value = _decode(encoded, current, path)
    if apply:
        setattr(obj, name, value)


def _kind(encoded: Any) -> str | None:
    return encoded.get(_KIND) if isinstance(encoded, dict) else None


def _check_shape(saved: np.ndarray, current: np.ndarray, path: str) -> None:
    if saved.shape != current.shape:
        raise ValueError(
            f"{path}: saved array has shape {saved.shape}, this env's has shape {current.shape}"
        )


def _decode(encoded: Any, current: Any, path: str) -> Any:
    """Rebuild a value from its plain-data form; ``current`` is the fresh env's value, if any,
    used to check array shapes."""
    if encoded is None or type(encoded) in _PLAIN_SCALARS:
        return encoded
    if isinstance(encoded, np.ndarray):
        if isinstance(current, np.ndarray):
            _check_shape(encoded, current, path)
        return np.array(encoded, order="C")
    if isinstance(encoded, list):
        return _decode_items(encoded, current, list, path)

    kind = _kind(encoded)
    if kind == "tuple":
        return tuple(_decode_items(encoded.get("items"), current, tuple, path))
    if kind == "numpy_scalar":
        value = encoded.get("value")
        if not isinstance(value, np.ndarray) or value.ndim != 0:
            raise ValueError(f"{path}: a numpy scalar must be saved as a 0-d array")
        return value[()]
    if kind == "generator":
        return _make_generator(encoded.get("state"), path)
    raise ValueError(f"{path}: cannot restore a saved value of type {type(encoded).__name__}")


def _decode_items(items: Any, current: Any, container: type, path: str) -> list[Any]:
    if not isinstance(items, list):
        raise ValueError(f"{path}: malformed saved {container.__name__}")
    # Lists may legitimately change length between capture and restore (a growing hand of
    # cards); element-wise shape checks only make sense when the lengths agree.
    if not isinstance(current, (list, tuple)) or type(current) is not container:
        current = [None] * len(items)
    if len(current) != len(items):
        current = [None] * len(items)
    return [
        _decode(item, cur, f"{path}[{i}]")
        for i, (item, cur) in enumerate(zip(items, current, strict=True))
    ]


def _make_generator(state: Any, path: str) -> np.random.Generator:
    name = state.get("bit_generator") if isinstance(state, dict) else None
    bit_generator_cls = getattr(np.random, name, None) if isinstance(name, str) else None
    if not (
        isinstance(bit_generator_cls, type)
        and issubclass(bit_generator_cls, np.random.BitGenerator)
    ):
        raise ValueError(f"{path}: unknown bit generator {name!r} in saved generator state")
    # Freshly seeded from OS entropy, then overwritten with the saved state right away.
    generator = np.random.Generator(bit_generator_cls())
    try:
        generator.bit_generator.state = _copy_plain(state)
    except (TypeError, ValueError, KeyError) as error:
        raise ValueError(f"{path}: invalid saved {name} state: {error}") from error
    return generator
