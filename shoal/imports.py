"""Importing users' code named by a ``module:Name`` string: custom envs, wrappers, encoders
and callbacks.

The ``shoal`` command, unlike ``python script.py``, does not put the working directory on
``sys.path``; a module that is found only there is imported from it, and the directory is
remembered (`import_dirs`) so checkpoints can record it for ``shoal eval`` and ``shoal.load``
run from elsewhere.
"""

from __future__ import annotations

import ast
import importlib
import os
import sys
from typing import Any

from shoal.errors import ConfigError

_IMPORT_DIRS: list[str] = []


def import_module(module: str) -> Any:
    """``importlib.import_module``, retried from the working directory; raises ImportError."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = module.partition(".")[0]
        cwd = os.getcwd()
        if exc.name != top or cwd in sys.path:
            raise
        sys.path.insert(0, cwd)
        try:
            found = importlib.import_module(module)
        except ImportError:
            sys.path.remove(cwd)
            raise
        if cwd not in _IMPORT_DIRS:
            _IMPORT_DIRS.append(cwd)
        return found


def import_object(path: str, what: str) -> Any:
    """The object ``module:Name`` names (``Name`` may be dotted: ``Outer.Inner``); ``what``
    names the setting in the `ConfigError` raised when it cannot be found."""
    module, sep, attr = path.partition(":")
    if not sep or not module or not attr:
        raise ConfigError(f"{what} {path!r} is invalid: name it as module:Name")
    try:
        found: Any = import_module(module)
    except ImportError as exc:
        raise ConfigError(
            f"{what} {path!r}: cannot import module {module!r} ({exc}). Run shoal from the "
            f"directory that holds {module.partition('.')[0]}, or add that directory to "
            "PYTHONPATH"
        ) from None
    for part in attr.split("."):
        found = getattr(found, part, None)
        if found is None:
            raise ConfigError(f"{what} {path!r}: module {module!r} has no {attr!r}")
    return found


def parse_call(spec: str) -> tuple[str, dict[str, Any]]:
    """``"Name"`` or ``"Name(key=value, ...)"`` as ``(name, kwargs)``, the values Python
    literals (how config strings name a wrapper or a callback with its arguments); raises
    ValueError saying what is wrong."""
    name, paren, rest = spec.strip().partition("(")
    name = name.strip()
    if not name or (paren and not rest.rstrip().endswith(")")):
        raise ValueError("write Name or Name(key=value, ...)")
    kwargs: dict[str, Any] = {}
    if not paren:
        return name, kwargs
    try:
        call = ast.parse(f"f({rest.rstrip()[:-1]})", mode="eval").body
    except SyntaxError as exc:
        raise ValueError(f"its arguments do not parse ({exc.msg})") from None
    assert isinstance(call, ast.Call)
    if call.args or any(keyword.arg is None for keyword in call.keywords):
        raise ValueError("give arguments by keyword: Name(key=value)")
    for keyword in call.keywords:
        try:
            kwargs[str(keyword.arg)] = ast.literal_eval(keyword.value)
        except ValueError:
            raise ValueError(f"{keyword.arg}= must be a literal value") from None
    return name, kwargs


def build_named(spec: str, what: str, noun: str, built_in: dict[str, Any], *args: Any) -> Any:
    """The object a config string names: a built-in ``Name`` or a user's ``module:Class``,
    with optional ``(key=literal, ...)``, built as ``Class(*args, **kwargs)``. Every failure
    is a `ConfigError` that names ``what`` (the setting) and ``spec``; ``noun`` names the
    kind of object in the error for an unknown name."""
    try:
        name, kwargs = parse_call(spec)
    except ValueError as exc:
        raise ConfigError(f"{what} {spec!r} is invalid: {exc}") from None
    if ":" in name:
        cls = import_object(name, what)
    elif name in built_in:
        cls = built_in[name]
    else:
        raise ConfigError(
            f"{what} {spec!r} is invalid: no built-in {noun} {name!r} (built-in: "
            f"{', '.join(built_in)}); name your own as module:Class"
        )
    try:
        return cls(*args, **kwargs)
    except ConfigError:
        raise
    except Exception as exc:  # the user's constructor: any failure is a config error
        raise ConfigError(f"{what} {spec!r}: {type(exc).__name__}: {exc}") from exc


def import_dirs() -> list[str]:
    """Directories added to ``sys.path`` to import users' modules in this process."""
    return list(_IMPORT_DIRS)


def add_import_dirs(dirs: list[str]) -> None:
    """Make a checkpoint's recorded module directories importable (those that exist)."""
    for directory in dirs:
        if os.path.isdir(directory) and directory not in sys.path:
            sys.path.append(directory)
