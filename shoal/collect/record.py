"""Recording whole episodes of a policy for an offline dataset (`shoal.data.offline`).

`record_episodes` steps a vector env with any batch policy and keeps each env's episodes
whole: ``T + 1`` raw observations (the last one the true final observation, which Gymnasium's
next-step autoreset hands back), ``T`` actions, rewards, terminations and truncations. The
autoreset steps that follow an episode's end are not transitions and are not recorded.
`exploring` makes a medium or mixed-quality collector of a trained policy: Gaussian noise on
continuous actions, uniformly random actions with probability epsilon.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import gymnasium as gym
import numpy as np

from shoal.data.offline import Episode
from shoal.envs.base import VectorEnv

BatchPolicy = Callable[[np.ndarray], np.ndarray]
"""``[B, ...]`` observations -> ``[B, ...]`` env actions."""


def random_policy(space: gym.Space, seed: int) -> BatchPolicy:
    """Uniformly random actions from ``space``, seeded (a copy of it draws them)."""
    space = copy.deepcopy(space)
    space.seed(seed)
    return lambda obs: np.stack([space.sample() for _ in range(len(obs))])


def exploring(
    policy: BatchPolicy, space: gym.Space, noise: float, epsilon: float, seed: int
) -> BatchPolicy:
    """``policy`` with Gaussian noise of std ``noise`` (in units of half the action range,
    clipped to the bounds; Box actions) and, with probability ``epsilon`` per step and env, a
    uniformly random action instead (any space)."""
    rng = np.random.default_rng(seed)
    random = random_policy(space, seed + 1)

    def act(obs: np.ndarray) -> np.ndarray:
        actions = np.array(policy(obs))
        if noise > 0 and isinstance(space, gym.spaces.Box):
            half = (space.high - space.low) / 2.0
            actions = actions + rng.normal(0.0, noise, actions.shape) * half
            actions = np.clip(actions, space.low, space.high).astype(space.dtype)
        if epsilon > 0:
            swap = rng.random(len(obs)) < epsilon
            if swap.any():
                actions[swap] = random(obs[swap])
        return actions

    return act


def record_episodes(
    policy: BatchPolicy,
    env: VectorEnv,
    episodes: int,
    seed: int,
    progress: Callable[[int], None] | None = None,
) -> list[Episode]:
    """Step ``env`` (raw observations and rewards) with ``policy`` until ``episodes``
    episodes have ended; returns them in the order they ended. Episodes still running then
    are dropped (they would end early, not where the env ends them). ``progress`` is told
    the count of ended episodes after each step (`shoal.train.progress.Countdown`)."""
    obs = env.reset(seed=seed)
    B = env.num_envs
    running: list[dict[str, list] | None] = [_fresh(obs[b]) for b in range(B)]
    done: list[Episode] = []
    while len(done) < episodes:
        actions = np.asarray(policy(obs))
        result = env.step(actions)
        for b in range(B):
            if result.autoreset[b]:  # the reset step: the new episode's first observation
                running[b] = _fresh(result.obs[b])
                continue
            current = running[b]
            assert current is not None  # an env whose episode ended autoresets next step
            current["actions"].append(actions[b])
            current["rewards"].append(float(result.reward[b]))
            current["terminations"].append(bool(result.terminated[b]))
            current["truncations"].append(bool(result.truncated[b]))
            current["observations"].append(result.obs[b])
            if result.terminated[b] or result.truncated[b]:
                done.append(_episode(current))
                running[b] = None
                if len(done) == episodes:
                    break
        obs = result.obs
        if progress is not None:
            progress(len(done))
    return done


def _fresh(first_obs: np.ndarray) -> dict[str, list]:
    return {"observations": [np.array(first_obs)], "actions": [], "rewards": [],
            "terminations": [], "truncations": []}  # fmt: skip


def _episode(parts: dict[str, list]) -> Episode:
    return Episode(
        observations=np.stack(parts["observations"]),
        actions=np.stack(parts["actions"]),
        rewards=np.asarray(parts["rewards"], np.float32),
        terminations=np.asarray(parts["terminations"], bool),
        truncations=np.asarray(parts["truncations"], bool),
    )
