"""Fixed policies for the agent groups a shared-weight learner does not train.

A multi-agent env with several groups (mpe2's ``simple_adversary``: an adversary and two
agents) can be trained one group at a time: the learner trains ``env.group`` and every other
group acts by a fixed policy named in ``env.opponents``, ``{group: spec}``:

* ``random``: a uniformly random action for every agent (a legal one, where the env reports
  action masks), from its own generator, seeded with the env's reset seed and saved with the
  env's state, so runs resume exactly;
* ``module:Class`` (or ``module:Class(key=literal, ...)``): a scripted policy of the user's,
  built as ``Class(observation_space, action_space, **kwargs)`` with one agent's spaces. Its
  ``act(obs, action_mask)`` maps the group's observations ``[B, N, *obs_shape]`` (and its
  legal actions ``[B, N, A]``, or None) to actions ``[B, N, *action_shape]``; optional
  ``reset(seed)``, ``get_state()`` and ``set_state(state)`` seed it and make it resumable.
  A trained shoal policy serves as an opponent through such a class that calls
  ``shoal.load(run).act``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from shoal.core.errors import ConfigError
from shoal.core.imports import build_named, with_methods


class Opponent(Protocol):
    def act(self, obs: np.ndarray, action_mask: np.ndarray | None) -> np.ndarray: ...


class RandomOpponent:
    """Uniformly random actions (legal ones under a mask), one per agent and env."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, seed: int = 0):
        if not isinstance(action_space, (gym.spaces.Discrete, gym.spaces.Box)):
            raise ConfigError(
                f"env.opponents random: actions {action_space} are not Discrete or Box"
            )
        self.action_space = action_space
        self.rng = np.random.default_rng(seed)

    def reset(self, seed: int | None) -> None:
        if seed is not None:
            self.rng = np.random.default_rng(seed)

    def act(self, obs: np.ndarray, action_mask: np.ndarray | None) -> np.ndarray:
        batch = obs.shape[:2]
        space = self.action_space
        if isinstance(space, gym.spaces.Box):
            return self.rng.uniform(space.low, space.high, (*batch, *space.shape)).astype(
                space.dtype
            )
        if action_mask is None:
            return self.rng.integers(space.n, size=batch) + int(space.start)
        # A uniformly random legal action: the argmax of uniform noise over legal ones.
        noise = self.rng.random(action_mask.shape)
        return np.where(action_mask, noise, -1.0).argmax(axis=-1) + int(space.start)

    def get_state(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state}

    def set_state(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]


def make_opponent(group: str, spec: str, observation_space: gym.Space, action_space: gym.Space):
    """The opponent ``spec`` names for ``group`` (module docstring)."""
    what = f"env.opponents {group}"
    built_in = {"random": RandomOpponent}
    needs = with_methods(("act",), "an opponent class (one with act(obs, action_mask))")
    opponent = build_named(
        spec, what, "opponent", built_in, observation_space, action_space, check=needs
    )
    if not callable(getattr(opponent, "act", None)):
        raise ConfigError(f"{what} {spec!r} is invalid: it has no act(obs, action_mask) method")
    return opponent


def make_opponents(
    specs: Mapping[str, str], groups: Mapping[str, Any], learner_group: str | None
) -> dict[str, Any]:
    """One opponent for each group in ``specs``, checked against the env's ``groups``."""
    unknown = [name for name in specs if name not in groups]
    if unknown:
        raise ConfigError(f"env.opponents names groups {unknown} this env lacks: {list(groups)}")
    if learner_group is not None and learner_group in specs:
        raise ConfigError(
            f"env.opponents gives the learning group {learner_group!r} a fixed policy; name "
            "the other groups"
        )
    return {
        name: make_opponent(name, spec, groups[name].observation_space, groups[name].action_space)
        for name, spec in specs.items()
    }
