"""Recording which config fields a run's code reads (for ``tests/test_config_usage.py``), and
Ray's worker API in this process, so that the distributed algorithms' workers read their
settings where the recording sees them."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import shoal.config
from shoal.distributed.in_process import InProcessPool

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


class _Ref:
    """A finished call: its result, or the exception it raised."""

    def __init__(self, call: Callable[[], Any]):
        try:
            self.value, self.error = call(), None
        except Exception as exc:  # raised again where the result is taken
            self.value, self.error = None, exc


class RefPool(InProcessPool):
    """shoal's in-process pool with Ray's ``submit``: a call run when it is made, its result
    (or exception) held in a reference that `get` reads."""

    def submit(self, i: int, method: str, *args: Any) -> _Ref:
        args = tuple(a.value if isinstance(a, _Ref) else a for a in args)
        return _Ref(lambda: getattr(self.workers[i], method)(*args))

    def call_one(self, i: int, method: str, *args: Any) -> Any:
        return get(self.submit(i, method, *args))


def get(ref: Any) -> Any:
    if not isinstance(ref, _Ref):
        return ref
    if ref.error is not None:
        raise ref.error
    return ref.value


class InProcessRay:
    """The functions of `shoal.distributed.ray_workers` that the algorithms call, in this
    process."""

    WORKER_FAILURES: tuple[type[BaseException], ...] = ()
    WorkerPool = RefPool.build
    get = staticmethod(get)

    @staticmethod
    def connect(address: str | None = None, num_cpus: int | None = None) -> None:
        return None

    @staticmethod
    def put(value: Any) -> Any:
        return value

    @staticmethod
    def wait_first(refs: Any) -> Any:
        return next(iter(refs))

    @staticmethod
    def gpu_share(device: str, learners: int) -> float:
        return 0.0

    @staticmethod
    def node_ip() -> str:
        return "127.0.0.1"
