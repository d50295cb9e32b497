"""Evaluation of a deterministic policy on environments separate from training."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shoal.envs.base import VectorEnv
from shoal.errors import ShoalError
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
        result = env.step(policy.act(obs, deterministic=deterministic))
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


def record_video(policy: Policy, env: VectorEnv, path: Path, seed: int, episodes: int = 1) -> int:
    """Render ``episodes`` episodes of the first env to a .gif or .mp4; returns frames written."""
    import imageio.v2 as imageio

    if path.suffix.lower() not in (".gif", ".mp4"):
        raise ShoalError(f"video path {path} must end in .gif or .mp4")
    obs = env.reset(seed=seed)
    frames = [env.render()]
    if frames[0] is None:
        raise ShoalError("this environment cannot render rgb_array frames")
    finished = 0
    while finished < episodes:
        result = env.step(policy.act(obs, deterministic=True))
        obs = result.obs
        if result.autoreset[0]:
            continue  # the autoreset step shows the first frame of the next episode
        frames.append(env.render())
        finished += int(result.terminated[0] or result.truncated[0])
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        # H.264 with yuv420p needs even frame sizes; anything stricter would rescale frames.
        mp4 = {"fps": 30, "macro_block_size": 2}
        kwargs = mp4 if path.suffix.lower() == ".mp4" else {"duration": 1 / 30}
        imageio.mimsave(path, frames, **kwargs)
    except (ImportError, ValueError, RuntimeError) as exc:
        raise ShoalError(
            f"could not write {path}: {exc}. For .mp4 install the video extra "
            "(pip install 'shoal[video]') or write a .gif"
        ) from exc
    return len(frames)
