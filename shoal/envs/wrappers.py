"""Gymnasium wrappers named in the config: ``env.wrappers``, ``env.frame_stack`` and
``env.vector_wrappers``.

Each entry is a wrapper class by name with keyword arguments of literal values, applied in
order to every single env before vectorization (Gymnasium's ``make_vec(wrappers=...)``):
``"ClipAction"``, ``"FrameStackObservation(stack_size=4)"``,
``"TimeLimit(max_episode_steps=200)"``, or a class of the user's own as
``"mymodule:MyWrapper(scale=0.5)"`` (imported like a ``module:EnvId`` env id, from the working
directory too). Names without a module are looked up in ``gymnasium.wrappers``. The entries
are kept in the run's config, so ``shoal eval``, ``--resume`` and ``shoal.load`` rebuild the
same env.

``env.vector_wrappers`` name Gymnasium's vector wrappers (``gymnasium.wrappers.vector``:
``ClipReward``, ``DtypeObservation``, ``RescaleObservation``, ...) or the user's own
``module:Class``, the same way; they wrap the vector env once it is built, so they keep a
native vectorization.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from shoal.config import EnvConfig
from shoal.core.errors import ConfigError
from shoal.core.imports import checked_class, import_object, parse_call, subclass_of

WrapperFn = Callable[[gym.Env], gym.Env]


SINGLE = ("EnvConfig.wrappers", gym.wrappers, gym.Wrapper)
VECTOR = ("EnvConfig.vector_wrappers", gym.wrappers.vector, gym.vector.VectorWrapper)
"""Where names without a module are looked up: (config field, module, wrapper base class)."""


def parse_wrapper(spec: str, kind: tuple = SINGLE) -> tuple[str, dict[str, Any]]:
    """``"Name(key=value, ...)"`` as ``(name, kwargs)``; values must be Python literals."""
    try:
        return parse_call(spec)
    except ValueError as exc:
        raise _bad(spec, str(exc), kind) from None


def wrapper_fns(config: EnvConfig) -> list[WrapperFn]:
    """The wrappers of ``config`` (``wrappers`` in order, then ``frame_stack``) as functions
    of one env; each class is resolved and its arguments checked against its signature now,
    before any env is built."""
    specs = list(config.wrappers)
    if config.frame_stack > 1:
        specs.append(f"FrameStackObservation(stack_size={config.frame_stack})")
    return _functions(specs, SINGLE)


def vector_wrapper_fns(config: EnvConfig) -> list[WrapperFn]:
    """``env.vector_wrappers`` as functions of the vector env, resolved and checked now."""
    return _functions(list(config.vector_wrappers), VECTOR)


def _functions(specs: list[str], kind: tuple) -> list[WrapperFn]:
    fns: list[WrapperFn] = []
    for spec in specs:
        name, kwargs = parse_wrapper(spec, kind)
        cls = _resolve(spec, name, kind)
        _check_arguments(spec, cls, kwargs, kind)
        fns.append(functools.partial(_apply, spec, cls, kwargs, kind))
    return fns


def _apply(spec: str, cls: type, kwargs: dict[str, Any], kind: tuple, env: Any) -> Any:
    try:
        return cls(env, **kwargs)
    except (TypeError, ValueError, AssertionError) as exc:  # e.g. a wrong space for it
        spec_of = getattr(env, "spec", None)
        target = spec_of.id if spec_of is not None else env
        # A bare assert (older Gymnasium's) says nothing: name the spaces it checked instead.
        reason = str(exc) or (
            f"it refuses observation space {getattr(env, 'observation_space', '?')} or "
            f"action space {getattr(env, 'action_space', '?')}"
        )
        raise _bad(spec, f"{cls.__name__} cannot wrap {target}: {reason}", kind) from None


def _resolve(spec: str, name: str, kind: tuple) -> type:
    _, module, base = kind
    if ":" in name:
        try:
            found = import_object(name, "wrapper")
            return checked_class(found, spec, "wrapper", subclass_of(base, f"a {base.__name__}"))
        except ConfigError as exc:
            raise _bad(spec, str(exc).partition(": ")[2] or str(exc), kind) from None
    found = getattr(module, name, None)
    if not isinstance(found, type) or not issubclass(found, base):
        known = [n for n in dir(module) if n[:1].isupper()]
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise _bad(
            spec,
            f"{module.__name__} has no wrapper {name!r}; {hint}name your own as module:Class",
            kind,
        )
    return found


def _check_arguments(spec: str, cls: type, kwargs: dict[str, Any], kind: tuple) -> None:
    try:
        inspect.signature(cls).bind(None, **kwargs)
    except TypeError as exc:
        raise _bad(spec, f"bad arguments for {cls.__name__}: {exc}", kind) from None
    except ValueError:  # no signature to check against: the wrapper will say
        pass


def _bad(spec: str, why: str, kind: tuple = SINGLE) -> ConfigError:
    return ConfigError(f"{kind[0]} entry {spec!r} is invalid: {why}")
