"""Gymnasium wrappers named in the config: ``env.wrappers`` and ``env.frame_stack``.

Each entry is a wrapper class by name with keyword arguments of literal values, applied in
order to every single env before vectorization (Gymnasium's ``make_vec(wrappers=...)``):
``"ClipAction"``, ``"FrameStackObservation(stack_size=4)"``,
``"TimeLimit(max_episode_steps=200)"``, or a class of the user's own as
``"mymodule:MyWrapper(scale=0.5)"`` (imported like a ``module:EnvId`` env id, from the working
directory too). Names without a module are looked up in ``gymnasium.wrappers``. The entries
are kept in the run's config, so ``shoal eval``, ``--resume`` and ``shoal.load`` rebuild the
same env.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from shoal.config import EnvConfig
from shoal.errors import ConfigError
from shoal.imports import import_object, parse_call

WrapperFn = Callable[[gym.Env], gym.Env]


def parse_wrapper(spec: str) -> tuple[str, dict[str, Any]]:
    """``"Name(key=value, ...)"`` as ``(name, kwargs)``; values must be Python literals."""
    try:
        return parse_call(spec)
    except ValueError as exc:
        raise _bad(spec, str(exc)) from None


def wrapper_fns(config: EnvConfig) -> list[WrapperFn]:
    """The wrappers of ``config`` (``wrappers`` in order, then ``frame_stack``) as functions
    of one env; each class is resolved and its arguments checked against its signature now,
    before any env is built."""
    specs = list(config.wrappers)
    if config.frame_stack > 1:
        specs.append(f"FrameStackObservation(stack_size={config.frame_stack})")
    fns = []
    for spec in specs:
        name, kwargs = parse_wrapper(spec)
        cls = _resolve(spec, name)
        _check_arguments(spec, cls, kwargs)
        fns.append(functools.partial(_apply, spec, cls, kwargs))
    return fns


def _apply(spec: str, cls: type, kwargs: dict[str, Any], env: gym.Env) -> gym.Env:
    try:
        return cls(env, **kwargs)
    except (TypeError, ValueError, AssertionError) as exc:  # e.g. a wrong space for it
        target = env.spec.id if env.spec else env
        raise _bad(spec, f"{cls.__name__} cannot wrap {target}: {exc}") from None


def _resolve(spec: str, name: str) -> type:
    if ":" in name:
        try:
            return import_object(name, "wrapper")
        except ConfigError as exc:
            raise _bad(spec, str(exc).partition(": ")[2] or str(exc)) from None
    found = getattr(gym.wrappers, name, None)
    if not isinstance(found, type) or not issubclass(found, gym.Wrapper):
        known = [n for n in dir(gym.wrappers) if n[:1].isupper()]
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise _bad(
            spec,
            f"gymnasium.wrappers has no wrapper {name!r}; {hint}name your own as module:Class",
        )
    return found


def _check_arguments(spec: str, cls: type, kwargs: dict[str, Any]) -> None:
    try:
        inspect.signature(cls).bind(None, **kwargs)
    except TypeError as exc:
        raise _bad(spec, f"bad arguments for {cls.__name__}: {exc}") from None
    except ValueError:  # no signature to check against: the wrapper will say
        pass


def _bad(spec: str, why: str) -> ConfigError:
    return ConfigError(f"EnvConfig.wrappers entry {spec!r} is invalid: {why}")
