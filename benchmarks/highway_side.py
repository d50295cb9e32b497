"""highway-env's half of ``benchmarks/intersection.py --speed``, run in highway-env's own
virtual environment (it needs ``pygame-ce``, which replaces the ``pygame`` shoal's video
extra installs; ``make bench-intersection`` creates it as ``.venv-highway``).

Steps ``intersection-multi-agent-v1`` with ``--agents`` controlled vehicles (4, as
``shoal/intersection-v0``) and uniformly random actions, at 0.1 s per step like shoal's
intersection (``simulation_frequency`` and ``policy_frequency`` 10; highway-env's defaults
are 15 and 1, a 1 s step of 15 simulation steps), resets included, rendering off. Prints one
JSON line: env-steps/s and agent-steps/s of each timed block.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

warnings.filterwarnings("ignore")

import gymnasium as gym  # noqa: E402
import highway_env  # noqa: E402, F401  (registers the envs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    config = {"controlled_vehicles": args.agents, "simulation_frequency": 10,
              "policy_frequency": 10, "duration": 30}  # fmt: skip
    env = gym.make("intersection-multi-agent-v1", config=config, render_mode=None)
    env.reset(seed=0)
    space = env.action_space
    space.seed(0)
    rates = []
    for _ in range(args.repeats):
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            _, _, terminated, truncated, _ = env.step(space.sample())
            steps += 1
            if terminated or truncated:
                env.reset()
        rates.append(steps / (time.perf_counter() - start))
    print(json.dumps({"env_steps_per_s": rates, "agents": args.agents}))


if __name__ == "__main__":
    main()
