"""Config fields and values of earlier shoal versions: where a renamed field lives now
(`Renamed`, a config class's ``RENAMED``) and what an old value is called now (a class's
``RENAMED_VALUES``). Config files, checkpoints, command lines and keyword overrides written
for an earlier version keep working, with a `RenamedFieldWarning` naming the new spelling."""

from __future__ import annotations

import dataclasses
import typing
import warnings
from collections.abc import Mapping
from typing import Any, NamedTuple


class Renamed(NamedTuple):
    """Where a config field of an earlier shoal version lives now (config files, checkpoints,
    command lines and keyword overrides written for it keep working, with a warning)."""

    path: str
    """The field's dotted name now, e.g. ``replay.buffer_size``."""
    values: dict[Any, Any] | None = None
    """Old values that are spelled differently now."""


REPLAY_RENAMES: dict[str, Renamed] = {
    "buffer_size": Renamed("replay.buffer_size"),
    "batch_size": Renamed("replay.batch_size"),
    "n_step": Renamed("replay.n_step"),
    "replay": Renamed("replay.prioritized", {"uniform": "none"}),
    "priority_alpha": Renamed("replay.priority_alpha"),
    "priority_beta": Renamed("replay.priority_beta"),
    "learning_starts": Renamed("replay.learning_starts"),
    "gradient_steps": Renamed("replay.gradient_steps"),
    "save_replay": Renamed("replay.save"),
}
"""The flat replay fields of shoal 0.1's DQN, DDPG, TD3, SAC, D4PG, MADDPG and CTEDD configs."""


class RenamedFieldWarning(UserWarning):
    """A config used a field name of an earlier shoal version."""


def renames(cls: type) -> dict[str, Renamed]:
    """The renamed fields of a config class (its ``RENAMED`` class attribute)."""
    return getattr(cls, "RENAMED", {})


def _is_current(cls: type, name: str, value: Any) -> bool:
    """``name`` is a field of ``cls`` now and ``value`` fits it (a block takes a mapping)."""
    hints = typing.get_type_hints(cls)
    if name not in hints or name not in {f.name for f in dataclasses.fields(cls)}:
        return False
    return not dataclasses.is_dataclass(hints[name]) or isinstance(value, (dict, Mapping))


def rename_key(cls: type, key: str, value: Any, where: str = "") -> tuple[str, Any]:
    """``(key, value)`` in today's spelling: a renamed field's dotted path (a dotted ``key``
    whose head was renamed keeps its tail) and value, an old value's new name (a dotted
    ``key`` is looked up in the nested block it names); unchanged otherwise. Warns once per
    use of an old name."""
    name = key.replace("-", "_")
    head, dot, tail = name.partition(".")
    rule = renames(cls).get(head)
    if rule is None or _is_current(cls, head, value if not dot else {}):
        if not dot:
            return key, renamed_value(cls, name, value, where)
        block = _block_class(cls, head)
        if block is None:
            return key, value
        inner, value = rename_key(block, tail, value, f"{where}.{head}" if where else head)
        return (key if inner == tail else f"{head}.{inner}"), value
    new = f"{rule.path}.{tail}" if dot else rule.path
    if rule.values is not None and not dot:
        value = rule.values.get(value, value)
    old = f"{where}.{name}" if where else name
    warnings.warn(
        f"config field {old!r} is now {new!r} (the old name still works)",
        RenamedFieldWarning,
        stacklevel=3,
    )
    return new, value


def renamed_value(cls: type, name: str, value: Any, where: str = "") -> Any:
    """``value`` of field ``name`` of ``cls`` as it is called now: an old value the class's
    ``RENAMED_VALUES`` lists (``{field: {old: new}}``) becomes its new name, with a warning;
    any other value is returned as it is."""
    renamed = getattr(cls, "RENAMED_VALUES", {}).get(name)
    if not renamed or not isinstance(value, str) or value not in renamed:
        return value
    field = f"{where}.{name}" if where else name
    warnings.warn(
        f"config value {field} = {value!r} is now {renamed[value]!r} (the old name still works)",
        RenamedFieldWarning,
        stacklevel=3,
    )
    return renamed[value]


def _block_class(cls: type, name: str) -> type | None:
    """The config block class of field ``name`` of ``cls`` (None: not a nested block)."""
    if not dataclasses.is_dataclass(cls):
        return None
    hint = typing.get_type_hints(cls).get(name)
    return hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None


def _nest(key: str, value: Any) -> tuple[str, Any]:
    """``a.b.c: v`` as ``a: {b: {c: v}}``."""
    head, dot, tail = key.partition(".")
    if not dot:
        return head, value
    inner_key, inner_value = _nest(tail, value)
    return head, {inner_key: inner_value}


def _merge(into: dict[str, Any], key: str, value: Any) -> None:
    if isinstance(value, dict) and isinstance(into.get(key), dict):
        for k, v in value.items():
            _merge(into[key], k, v)
    else:
        into[key] = value


def upgrade(cls: type, data: dict[str, Any], path: str = "") -> dict[str, Any]:
    """``data`` (a config mapping for ``cls``) with renamed fields moved to where they live
    now (`Renamed`) and old values given their new names (``RENAMED_VALUES``)."""
    if not renames(cls) and not getattr(cls, "RENAMED_VALUES", None):
        return data
    out: dict[str, Any] = {}
    for key, value in data.items():
        new, value = rename_key(cls, key, value, path)
        head, nested = _nest(new, value)
        _merge(out, head, nested)
    return out
