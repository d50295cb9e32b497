"""The built-in 4-lane intersection (``shoal/intersection-v0``): simulation speed.

``--speed``: env-steps/s and agent-steps/s (4 agents an env) at 1, 64 and 1024 envs, one
CPU thread, uniformly random lane-following actions, heavy background traffic
(``traffic high``), resets included; each figure the median of ``--repeats`` timed blocks
after 20 untimed steps. Target: >= 100,000 agent-steps/s at 1024 envs.

The SUMO and SMARTS backends, highway-env's intersection and the paper's four experiments
(issue 25's remaining items) join this script when they are built.

Usage: ``python benchmarks/intersection.py --speed [--repeats 3] [--seconds 3] [--json F]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from shoal.envs.intersection import IntersectionEnv
from shoal.threads import set_compute_threads

TARGET = 100_000
"""Agent-steps/s of the built-in intersection at 1024 envs."""


def builtin_rate(num_envs: int, seconds: float, seed: int = 0) -> float:
    """Env-steps/s of one timed block."""
    env = IntersectionEnv(num_envs, traffic="high", seed=seed)
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    actions = [{"agent": rng.integers(4, size=(num_envs, 4))} for _ in range(64)]
    for a in actions[:20]:
        env.step(a)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(actions[steps % 64])
        steps += 1
    return steps * num_envs / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--speed", action="store_true", help="simulation speed (the default)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="length of a timed block")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    set_compute_threads(1)
    rows = {}
    for n in (1, 64, 1024):
        rates = [builtin_rate(n, args.seconds, seed) for seed in range(args.repeats)]
        rows[n] = statistics.median(rates)
        print(f"shoal/intersection-v0, {n:>4} envs: {rows[n]:>9,.0f} env-steps/s, "
              f"{4 * rows[n]:>9,.0f} agent-steps/s (median of {args.repeats})")  # fmt: skip
    met = 4 * rows[1024] >= TARGET
    print(f"target >= {TARGET:,} agent-steps/s at 1024 envs: {'met' if met else 'MISSED'}")
    if args.json:
        args.json.write_text(json.dumps({str(n): r for n, r in rows.items()}, indent=2))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
