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
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

from shoal.core.errors import ConfigError

_IMPORT_DIRS: list[str] = []
_UNTRUSTED_DIRS: list[str] = []
"""Directories a loaded checkpoint recorded that were not added to ``sys.path``."""


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
        untrusted = untrusted_note(module)
        if untrusted:
            raise ConfigError(f"{what} {path!r}: {untrusted}") from None
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


Check = Callable[[type], str | None]
"""What a setting needs of the class it names: None when ``cls`` fits, else what it must be
(``"an nn.Module subclass"``)."""


def subclass_of(base: type, words: str) -> Check:
    """A `Check` that the class derives from ``base`` (described as ``words``)."""
    return lambda cls: None if issubclass(cls, base) else words


def with_methods(names: tuple[str, ...], words: str) -> Check:
    """A `Check` that the class defines at least one of the methods ``names``."""
    return lambda cls: None if any(callable(getattr(cls, n, None)) for n in names) else words


def checked_class(found: Any, spec: str, what: str, check: Check | None) -> type:
    """``found`` (what ``spec`` names for the setting ``what``), refused unless it is a class
    that passes ``check``: a function, a builtin or any other callable named in a config is
    never called, so a run directory's config cannot make shoal run code that is not a
    class of the kind the setting takes."""
    if not inspect.isclass(found):
        kind = "a builtin" if inspect.isbuiltin(found) else f"a {type(found).__name__}"
        raise ConfigError(
            f"{what} {spec!r} is refused: it names {kind}, not a class; shoal calls only "
            "classes of the kind the setting takes"
        )
    needs = check(found) if check is not None else None
    if needs is not None:
        raise ConfigError(f"{what} {spec!r} is refused: {found.__name__} is not {needs}")
    return found


def build_named(
    spec: str,
    what: str,
    noun: str,
    built_in: dict[str, Any],
    *args: Any,
    check: Check | None = None,
) -> Any:
    """The object a config string names: a built-in ``Name`` or a user's ``module:Class``,
    with optional ``(key=literal, ...)``, built as ``Class(*args, **kwargs)``. A user's name
    must be a class that passes ``check`` (`checked_class`) before it is called. Every
    failure is a `ConfigError` that names ``what`` (the setting) and ``spec``; ``noun`` names
    the kind of object in the error for an unknown name."""
    try:
        name, kwargs = parse_call(spec)
    except ValueError as exc:
        raise ConfigError(f"{what} {spec!r} is invalid: {exc}") from None
    if ":" in name:
        cls = checked_class(import_object(name, what), spec, what, check)
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


def add_import_dirs(dirs: list[str], trust: bool = False) -> None:
    """A checkpoint's recorded module directories: made importable (those that exist) only
    when the user trusts the run's code (``--trust-code``); otherwise remembered, so that a
    module found only there is named in the error with the way to allow it. A run directory
    shared by someone else may ship a module and record its directory: nothing from it runs
    unless the user says so."""
    for directory in dirs:
        if not os.path.isdir(directory):
            continue
        if trust and directory not in sys.path:
            sys.path.append(directory)
        elif not trust and directory not in _UNTRUSTED_DIRS:
            _UNTRUSTED_DIRS.append(directory)


def untrusted_note(module: str) -> str:
    """Why ``module`` did not import, when a loaded run records a directory that holds it but
    was not trusted: the sentence that says how to allow it; "" otherwise."""
    top = module.partition(".")[0]
    for directory in _UNTRUSTED_DIRS:
        path = os.path.join(directory, top)
        if os.path.isfile(path + ".py") or os.path.isdir(path):
            return (
                f"module {module!r} is not importable here; the run records it in {directory}, "
                "which shoal does not import from unless you trust the run's code: pass "
                "--trust-code (trust_code=True in Python), or install the module or put its "
                "directory on PYTHONPATH"
            )
    return ""
