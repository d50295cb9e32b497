"""Gymnasium env ids: the registered spec of an id (registering ale-py's Atari ids and
importing the module of a ``module:EnvId`` id on the way), below the adapters that build envs
from them (`shoal.envs.gym`, `shoal.envs.atari`) and the catalog of ids."""

from __future__ import annotations

import difflib

import gymnasium as gym

from shoal.core.errors import UnknownEnvError
from shoal.core.imports import import_module, untrusted_note


def env_spec(env_id: str) -> gym.envs.registration.EnvSpec:
    """The registered spec of ``env_id``, or an `UnknownEnvError` listing close matches.
    Atari ids are found without importing ale-py first: a miss registers its envs (when the
    atari extra is installed) and looks again. ``module:EnvId`` (Gymnasium's convention)
    imports ``module`` first, whose import registers the id: the way to use a custom env in
    Ray runners, which build their envs in other processes."""
    module, sep, name = env_id.rpartition(":")
    if sep:
        import_env_module(module, env_id)
        env_id = name
    try:
        return gym.spec(env_id)
    except gym.error.Error as exc:
        if register_ale_envs():
            return env_spec(env_id)
        known = list(gym.envs.registry.keys())
        close = difflib.get_close_matches(env_id, known, n=5, cutoff=0.5)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise UnknownEnvError(
            f"unknown environment id {env_id!r}.{hint} (`shoal list --envs` shows all ids)"
        ) from exc


def import_env_module(module: str, env_id: str) -> None:
    """Import the module of a ``module:EnvId`` id, looking in the working directory too
    (`shoal.core.imports.import_module`)."""
    try:
        import_module(module)
    except ImportError as exc:
        untrusted = untrusted_note(module)
        if untrusted:
            raise UnknownEnvError(f"environment id {env_id!r}: {untrusted}") from exc
        raise UnknownEnvError(
            f"environment id {env_id!r}: cannot import module {module!r} ({exc}). Run shoal "
            f"from the directory that holds {module.partition('.')[0]}, or add that directory "
            "to PYTHONPATH"
        ) from exc


def register_ale_envs() -> bool:
    """Register ale-py's Atari ids once; True when that added ids, False otherwise."""
    if "ALE/Pong-v5" in gym.envs.registry:
        return False
    try:
        import ale_py
    except ImportError:
        return False
    gym.register_envs(ale_py)
    return True
