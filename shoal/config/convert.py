"""Configs to and from plain data (YAML files, checkpoint JSON, keyword overrides): values
coerced to the field's type with an error naming the field, unknown fields refused with the
closest names, fields of earlier versions moved to where they live now
(`shoal.config.renames`)."""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from typing import Any, TypeVar

import numpy as np
import yaml

from shoal.config.renames import rename_key, upgrade
from shoal.core.errors import ConfigError, UnknownFieldError

T = TypeVar("T")


def read_yaml(path: Any) -> Any:
    """A YAML file's contents; a missing file or invalid YAML is one ConfigError line naming
    the file, line and column."""
    try:
        return yaml.safe_load(open(path, encoding="utf-8").read())
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path} is not valid YAML{where}: {problem}") from exc


def to_dict(config: Any) -> dict[str, Any]:
    """A JSON-ready dict of a (nested) config dataclass."""
    return dataclasses.asdict(config)


def from_dict(cls: type[T], data: dict[str, Any], path: str = "", base: T | None = None) -> T:
    """Build a (nested) config dataclass from plain data, e.g. YAML or checkpoint JSON.

    Fields missing from ``data`` keep the values of ``base`` when given, else the class's
    defaults. A nested block starts from its parent's default for that block, not from the
    block class's own defaults: ``optim: {lr: 0.01}`` in a DQN file keeps DQN's default
    gradient clipping, as ``--optim.lr 0.01`` on the command line does.

    Unknown keys are an error with the closest valid names, because a silently ignored typo in a
    tuned example would train something other than what its author meant.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{path or cls.__name__} must be a mapping, got {data!r}")
    for key in data:
        if not isinstance(key, str):
            raise ConfigError(f"{path or cls.__name__}: field names are text, got {key!r}")
    data = upgrade(cls, data, path)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(typing.cast(Any, cls)) if f.init}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        where = f"{path}.{name}" if path else name
        if name not in fields:
            close = difflib.get_close_matches(name, sorted(fields), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UnknownFieldError(f"unknown config field {where!r} for {cls.__name__}{hint}")
        if dataclasses.is_dataclass(hints[name]):
            block = getattr(base, name) if base is not None else _default(fields[name])
            kwargs[name] = from_dict(hints[name], value, where, base=block)
        else:
            kwargs[name] = _coerce(hints[name], value, f"{cls.__name__}.{name}")
    if base is not None:
        return typing.cast(T, dataclasses.replace(typing.cast(Any, base), **kwargs))
    return cls(**kwargs)


def _default(field: dataclasses.Field[Any]) -> Any:
    """A field's default value (built by its factory), or None when it has none."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None if field.default is dataclasses.MISSING else field.default


def _coerce(hint: Any, value: Any, path: str) -> Any:
    """``value`` as the type ``hint`` names (YAML and JSON give ints for floats, lists for
    tuples, strings such as ``1e-3`` for numbers), or a `ConfigError` naming the field, the
    expected type and what was given."""
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return (
            value
            if dataclasses.is_dataclass(value)
            else from_dict(typing.cast(Any, hint), value, path)
        )
    if hint is Any or isinstance(hint, typing.TypeVar):
        return value
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None:
            if type(None) in options:
                return None
            raise _type_error(hint, value, path)
        for option in (a for a in options if a is not type(None)):
            try:
                return _coerce(option, value, path)
            except ConfigError:
                continue
        raise _type_error(hint, value, path)
    if origin is typing.Literal:
        choices = typing.get_args(hint)
        if value in choices:
            return value
        raise ConfigError(f"{path} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    if origin is tuple:
        args = typing.get_args(hint)
        if not isinstance(value, (list, tuple)):
            raise _type_error(hint, value, path)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
        if args and len(args) != len(value):
            raise _type_error(hint, value, path)
        if not args:
            return tuple(value)
        pairs = enumerate(zip(args, value, strict=True))
        return tuple(_coerce(a, v, f"{path}[{i}]") for i, (a, v) in pairs)
    if origin in (list, dict):
        if not isinstance(value, origin):
            raise _type_error(hint, value, path)
        args = typing.get_args(hint)
        if origin is list:
            item = args[0] if args else Any
            return [_coerce(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
        item = args[1] if len(args) == 2 else Any
        return {k: _coerce(item, v, f"{path}.{k}") for k, v in value.items()}
    if hint is bool:
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        raise _type_error(hint, value, path)
    if hint is int:
        number = _number(value)
        if isinstance(number, int) or (isinstance(number, float) and number.is_integer()):
            return int(number)
        raise _type_error(hint, value, path)
    if hint is float:
        number = _number(value)
        if number is None:
            raise _type_error(hint, value, path)
        if math.isnan(number):  # never a setting; it would also make config.json invalid JSON
            raise ConfigError(f"{path} must be a number, got nan")
        return float(number)
    if hint is str:
        if isinstance(value, str):
            return value
        raise _type_error(hint, value, path)
    return value


def _number(value: Any) -> int | float | None:
    """An int or float from a number or a numeric string (YAML reads ``1e-3`` as a string);
    None for anything else, booleans included."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _type_error(hint: Any, value: Any, path: str) -> ConfigError:
    return ConfigError(f"{path} must be {_type_name(hint)}, got {value!r} ({type(value).__name__})")


def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(hint))
    if origin is typing.Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(hint)))
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_type_name(args[0])}"
        return "a list of " + str(len(args)) + " values"
    if origin is dict:
        return "a mapping"
    if origin is list:
        return "a list"
    if hint is type(None):
        return "null"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))


def replace(config: T, **changes: Any) -> T:
    """`dataclasses.replace` that also accepts dotted names for nested blocks."""
    nested: dict[str, dict[str, Any]] = {}
    flat: dict[str, Any] = {}
    for old_key, old_value in changes.items():
        key, value = rename_key(type(config), old_key, old_value)
        head, _, rest = key.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            flat[key] = value
    names = sorted(f.name for f in dataclasses.fields(typing.cast(Any, config)) if f.init)
    for name in (*flat, *nested):
        if name not in names:
            close = difflib.get_close_matches(name, names, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UnknownFieldError(
                f"unknown config field {name!r} for {type(config).__name__}{hint}"
            )
    hints = typing.get_type_hints(type(config))
    prefix = type(config).__name__
    for name, value in flat.items():
        flat[name] = _coerce(hints[name], value, f"{prefix}.{name}")
    for head, sub in nested.items():
        flat[head] = replace(getattr(config, head), **sub)
    return typing.cast(T, dataclasses.replace(typing.cast(Any, config), **flat))
