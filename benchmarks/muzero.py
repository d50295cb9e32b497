"""MuZero on CartPole: shoal's env steps and wall-clock to solve, against LightZero's MuZero.

* shoal: the tuned example ``muzero-cartpole`` (CartPole-v1, stop at an evaluation mean of
  475 over 10 episodes) and the same settings on LightZero's task (CartPole-v0, stop at 200),
  one torch thread, per seed: the env step and the training and total seconds at which the
  evaluation reached the target.
* LightZero 0.2.0: its own CartPole MuZero config (CartPole-v0, 8 collector envs, 25
  simulations, 100 updates of 256 per collect, evaluation of 3 episodes every 100 updates,
  stop at 200) on the CPU, run by ``muzero_lightzero_side.py`` in its own environment
  (``make .venv-lightzero/.installed``): the collector's env steps and the seconds since its
  first evaluation when an evaluation reached 200.

Usage: ``python benchmarks/muzero.py [--seeds 1] [--lightzero-python
.venv-lightzero/bin/python] [--max-env-steps 100000] [--json out.json]``.
See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

import shoal

HERE = Path(__file__).parent


def shoal_run(seed: int, env: str, target: float, max_steps: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    started = time.perf_counter()
    result = shoal.train(tuned="muzero-cartpole", seed=seed, quiet=True,
                         run_dir=f"runs/bench-muzero-{env}-{seed}",
                         **{"env.id": env, "run.target_return": target,
                            "run.total_steps": max_steps})  # fmt: skip
    return {
        "library": "shoal",
        "env": env,
        "seed": seed,
        "solved": result.eval_return is not None and result.eval_return >= target,
        "env_steps": result.eval_step,
        "train_s": round(result.train_s, 1),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def lightzero_run(python: str, seed: int, max_steps: int, target: float) -> dict[str, Any]:
    out = subprocess.run([python, str(HERE / "muzero_lightzero_side.py"), "--seed", str(seed),
                          "--max-env-steps", str(max_steps)],
                         capture_output=True, text=True)  # fmt: skip
    last_line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    if not last_line.startswith("{"):
        raise RuntimeError(f"LightZero failed:\n{(out.stdout + out.stderr)[-3000:]}")
    side = json.loads(last_line)
    evaluations = side["evaluations"]
    solved = next((e for e in evaluations if e[1] >= target), None)
    last = solved or evaluations[-1]
    return {
        "library": "lightzero",
        "env": "CartPole-v0",
        "seed": seed,
        "solved": solved is not None,
        "env_steps": last[0],
        "wall_s": last[2],
        "process_s": side["process_s"],
        "evaluations": evaluations,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--lightzero-python", default=None)
    parser.add_argument("--max-env-steps", type=int, default=100_000)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = []
    for seed in range(args.seeds):
        rows.append(shoal_run(seed, "CartPole-v1", 475.0, args.max_env_steps))
        rows.append(shoal_run(seed, "CartPole-v0", 200.0, args.max_env_steps))
        if args.lightzero_python:
            rows.append(lightzero_run(args.lightzero_python, seed, args.max_env_steps, 200.0))
        for row in rows[-3:]:
            print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    sys.exit(main())
