"""Does batch norm's mode change the policy? For checkpoints of Lamb et al.'s Model 2 (issue
41, part 3: why A2C Model 2 collapsed on Pong).

A2C's acting copy normalizes with the running statistics (batch norm in eval mode,
`shoal.collect.env_runner.act_with_running_statistics`), its update with the statistics of
its own batch (training mode). If the two differed much, the policy being improved would not
be the one that acted. This plays ``--steps`` Pong steps with the acting policy of each
checkpoint (sampled actions, Lamb et al.'s preprocessing, frame skip 4), then scores the
frames it saw both ways: in eval mode, and in training mode in batches of 80 frames (one
update's 16 envs x 5 steps), consecutive or shuffled. It prints each policy's mean entropy,
the mean KL(eval || training) and how often the two agree on the most likely action.

Usage: ``python benchmarks/batchnorm_modes.py CHECKPOINT [CHECKPOINT ...] [--steps 800]``
(about 20 s a checkpoint; needs the atari extra), for instance the checkpoints of
``runs/experiments/lamb-a2c-pong/model2-s0/checkpoints/``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shoal.api import load
from shoal.envs.atari import make_atari_env

BATCH = 80  # one A2C update: 16 envs x 5 steps


def played_frames(model: Any, steps: int, seed: int) -> torch.Tensor:
    """The observations of ``steps`` steps of the acting policy (eval mode, sampled)."""
    env = make_atari_env("PongNoFrameskip-v4", "crop80-stack", frameskip=4)
    obs, _ = env.reset(seed=seed)
    seen = []
    model.eval()
    with torch.no_grad():
        for _ in range(steps):
            seen.append(np.asarray(obs))
            action = model.distribution(torch.from_numpy(seen[-1])[None]).sample()
            obs, _, terminated, truncated, _ = env.step(int(action))
            if terminated or truncated:
                obs, _ = env.reset()
    env.close()
    return torch.from_numpy(np.stack(seen))


def log_probs_in_batches(model: Any, x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Log-probabilities with batch norm in training mode, over batches of `BATCH` frames
    taken in ``order`` (this moves the running statistics: score eval mode first)."""
    model.train()
    out = torch.empty(len(x), model.distribution(x[:2]).logits.shape[-1])
    with torch.no_grad():
        for start in range(0, len(x), BATCH):
            rows = order[start : start + BATCH]
            out[rows] = model.distribution(x[rows]).logits
    return out


def entropy(log_p: torch.Tensor) -> float:
    return float(-(log_p.exp() * log_p).sum(-1).mean())


def kl(log_p: torch.Tensor, log_q: torch.Tensor) -> float:
    return float((log_p.exp() * (log_p - log_q)).sum(-1).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+", type=Path)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    print("| checkpoint | entropy, eval mode | entropy, training mode (consecutive / shuffled) "
          "| KL(eval \\|\\| training) | same most likely action |")  # fmt: skip
    print("|---|---|---|---|---|")
    for path in args.checkpoints:
        model = load(path).model
        x = played_frames(model, args.steps, args.seed)
        model.eval()
        with torch.no_grad():
            running = model.distribution(x).logits
        consecutive = log_probs_in_batches(model, x, torch.arange(len(x)))
        shuffled = log_probs_in_batches(model, x, torch.randperm(len(x)))
        agree = (running.argmax(-1) == consecutive.argmax(-1)).float().mean()
        print(f"| {path.name} | {entropy(running):.3f} | {entropy(consecutive):.3f} / "
              f"{entropy(shuffled):.3f} | {kl(running, consecutive):.4f} / "
              f"{kl(running, shuffled):.4f} | {agree:.0%} |")  # fmt: skip


if __name__ == "__main__":
    main()
