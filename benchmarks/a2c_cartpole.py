"""A2C on CartPole-v1: shoal against Stable-Baselines3, in one process, on one CPU thread.

Two configurations, interleaved seed by seed (the order alternates) so that machine noise hits
both:

* ``shoal tuned``: shoal's tuned example ``a2c-cartpole``.
* ``sb3 zoo``: Stable-Baselines3 A2C with the rl-baselines3-zoo CartPole-v1 hyperparameters
  (8 envs, ``ent_coef`` 0, SB3's defaults otherwise: 5-step rollouts, RMSprop at 7e-4,
  gamma 0.99, no GAE, 64-64 tanh networks), budget the zoo's 5e5 env steps.

Both are evaluated the same way, as in ``ppo_cartpole.py``: shoal's own evaluator runs the
deterministic policy for one episode on each of 20 separate environments every 8192 env steps,
and a run is solved when the mean return is >= 475. The clock is paused while evaluating;
building the envs and the model is timed; imports are excluded by an untimed warm-up.

Usage: ``python benchmarks/a2c_cartpole.py [--seeds 3] [--json out.json] [--quick]``
(needs ``pip install -e '.[bench]'`` for stable-baselines3). See benchmarks/README.md.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import common  # benchmarks/common.py: the script's directory is on sys.path
import race  # benchmarks/race.py
from common import CARTPOLE, base_parser, require_sb3, sb3_warm_up

try:
    from stable_baselines3 import A2C as SB3A2C
    from stable_baselines3.common.env_util import make_vec_env
except ImportError:  # pragma: no cover - reported in main()
    pass

ENV_ID = "CartPole-v1"
TUNED = "a2c-cartpole"
BUDGET = 500_000  # env steps, both libraries: the zoo's n_timesteps
QUICK_BUDGET = 3 * CARTPOLE.eval_every
TARGET_SPEEDUP = 5.0  # sb3 zoo median solve seconds / shoal tuned median solve seconds

# rl-baselines3-zoo hyperparams/a2c.yml, CartPole-v1; everything else is SB3's A2C default.
ZOO_N_ENVS = 8
ZOO = {"ent_coef": 0.0}


def sb3_model(seed: int) -> Any:
    """SB3 A2C with the zoo hyperparameters (no schedules, so the budget changes nothing)."""
    env = make_vec_env(ENV_ID, n_envs=ZOO_N_ENVS, seed=seed)
    return SB3A2C("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **ZOO)


def sb3_run(seed: int, budget: int) -> race.RaceRecord:
    """SB3 until solved or ``learn(budget)`` ends. A2C collects 5 steps of 8 envs per
    rollout and updates once; `EvalAndStop` evaluates at the first rollout start at or past
    each multiple of 8192 env steps (at most 39 steps later than shoal, whose iterations
    divide 8192)."""
    return race.sb3_zoo_run(ENV_ID, sb3_model, seed, budget)


def warm_up(workdir: Path) -> None:
    """Untimed: lazy imports (torch._dynamo on the first optimizer), allocator, evaluator."""
    race.shoal_tuned_run(workdir, TUNED, 0, 4096, solve=False)
    sb3_warm_up(ENV_ID, sb3_model, 400)


def main(argv: list[str] | None = None) -> int:
    parser = base_parser(__doc__)
    parser.add_argument(
        "--budget",
        type=int,
        default=BUDGET,
        help=f"env steps per run for both libraries (default {BUDGET:,}; "
        f"{QUICK_BUDGET:,} with --quick)",
    )
    args = parser.parse_args(argv)
    if not require_sb3():
        return 2
    common.use_backend(args.backend)
    seeds = 1 if args.quick else args.seeds
    budget = QUICK_BUDGET if args.quick else args.budget
    if seeds < 1 or budget < CARTPOLE.eval_every:
        parser.error(f"--seeds must be >= 1 and --budget >= {CARTPOLE.eval_every}")

    started = time.perf_counter()
    records = race.run_race(
        seeds,
        lambda workdir, seed: race.shoal_tuned_run(workdir, TUNED, seed, budget),
        lambda seed: sb3_run(seed, budget),
        warm_up,
        lambda line: print(line, flush=True),
    )
    summary = race.summarize(records, TARGET_SPEEDUP)
    status = race.finish(started, summary, "A2C", ENV_ID, seeds, budget)
    if args.json is not None:
        settings = {"seeds": seeds, "budget": budget, "sb3_zoo": ZOO | {"n_envs": ZOO_N_ENVS}}
        race.write_json(args.json, "a2c_cartpole", settings, TUNED, summary, records)
    return status


if __name__ == "__main__":
    sys.exit(main())
