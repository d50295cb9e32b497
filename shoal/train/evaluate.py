"""Evaluation of a deterministic policy on environments separate from training."""

from __future__ import annotations

import numpy as np

from shoal.envs.base import VectorEnv
from shoal.interfaces import Policy


def evaluate(
    policy: Policy, env: VectorEnv, seed: int, deterministic: bool = True
) -> dict[str, float]:
    """Run the first episode of every env in ``env`` (one episode per parallel env).

    Taking exactly the first episode of each env avoids the bias of counting whichever episodes
    finish first, which would favour short (often bad) episodes.
    """
    n = env.num_envs
    returns = np.full(n, np.nan)
    lengths = np.zeros(n, np.int64)
    obs = env.reset(seed=seed)
    while np.isnan(returns).any():
        mask = getattr(env, "action_mask", None)  # legal actions, where the env reports them
        if mask is None:
            actions = policy.act(obs, deterministic=deterministic)
        else:
            actions = policy.act(obs, deterministic=deterministic, action_mask=mask)
        result = env.step(actions)
        done = np.flatnonzero(result.terminated | result.truncated)
        fresh = np.isnan(returns[done])
        returns[done[fresh]] = result.episode_returns[fresh]
        lengths[done[fresh]] = result.episode_lengths[fresh]
        obs = result.obs
    return {
        "eval/return": float(returns.mean()),
        "eval/return_std": float(returns.std()),
        "eval/return_min": float(returns.min()),
        "eval/length": float(lengths.mean()),
    }
