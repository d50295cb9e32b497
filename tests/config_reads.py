"""Recording which config fields a run's code reads (for ``tests/test_config_usage.py``). The
distributed algorithms run there on Ray's stand-in in this process (`in_process_ray`), so that
their workers read their settings where the recording sees them."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import sys
from collections.abc import Iterator
from typing import Any

import shoal.config

CONFIG_DIR = os.path.dirname(shoal.config.__file__)
NOT_USE = (CONFIG_DIR, dataclasses.__file__, copy.__file__)
"""Code that reads every field without using one: conversion, checks, copies."""


def field_paths(config: Any, prefix: str = "") -> dict[str, tuple[type, str]]:
    """``{dotted field: (the class of the block holding it, its name)}``."""
    out: dict[str, tuple[type, str]] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out.update(field_paths(value, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = (type(config), f.name)
    return out


def config_classes(config: Any) -> set[type]:
    """The classes of ``config`` and its blocks, with their bases that are dataclasses (a
    nested block's plain class is what `shoal.config.unnest` builds from it)."""
    found: set[type] = set()
    for cls, _ in field_paths(config).values():
        found |= {c for c in cls.__mro__ if dataclasses.is_dataclass(c)}
    return found


@contextlib.contextmanager
def recording(classes: set[type]) -> Iterator[set[tuple[str, str]]]:
    """Record ``(class name, field)`` for every field of ``classes`` read while inside, by
    code other than the config machinery, the configs' own checks (``__post_init__``) and
    the methods dataclasses generate."""
    reads: set[tuple[str, str]] = set()
    saved: dict[type, Any] = {}
    for cls in classes:
        names = {f.name for f in dataclasses.fields(cls)}

        def getattribute(self: Any, name: str, _names: set[str] = names) -> Any:
            if name in _names:
                code = sys._getframe(1).f_code
                if (code.co_name != "__post_init__" and code.co_filename != "<string>"
                        and not code.co_filename.startswith(NOT_USE)):  # fmt: skip
                    for base in type(self).__mro__:
                        reads.add((base.__name__, name))
            return object.__getattribute__(self, name)

        saved[cls] = cls.__dict__.get("__getattribute__")
        cls.__getattribute__ = getattribute  # type: ignore[method-assign]
    try:
        yield reads
    finally:
        for cls, old in saved.items():
            if old is None:
                del cls.__getattribute__
            else:
                cls.__getattribute__ = old  # type: ignore[method-assign]


def unread(config: Any, reads: set[tuple[str, str]]) -> list[str]:
    """The dotted fields of ``config`` that no recorded read reached."""
    return [path for path, (cls, name) in field_paths(config).items()
            if (cls.__name__, name) not in reads]  # fmt: skip
