"""DQN on CartPole-v1: shoal against Stable-Baselines3, in one process, on one CPU thread.

Two configurations, interleaved seed by seed (the order alternates) so that machine noise hits
both:

* ``shoal tuned``: shoal's tuned example ``dqn-cartpole``, budget 150k env steps.
* ``sb3 zoo``: Stable-Baselines3 DQN with the rl-baselines3-zoo CartPole-v1 hyperparameters,
  budget 150k env steps (the zoo's 5e4 may end before solving), epsilon schedule of the zoo.

Both are evaluated the same way, as in ``ppo_cartpole.py``: shoal's own evaluator runs the
deterministic policy for one episode on each of 20 separate environments every 8192 env steps,
and a run is solved when the mean return is >= 475. The clock is paused while evaluating;
building the envs and the model is timed; imports are excluded by an untimed warm-up.

Usage: ``python benchmarks/dqn_cartpole.py [--seeds 3] [--json out.json] [--quick]``
(needs ``pip install -e '.[bench]'`` for stable-baselines3). See benchmarks/README.md.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import race  # benchmarks/race.py: the script's directory is on sys.path
from common import CARTPOLE, base_parser, require_sb3, sb3_warm_up

try:
    from stable_baselines3 import DQN as SB3DQN
    from stable_baselines3.common.env_util import make_vec_env
except ImportError:  # pragma: no cover - reported in main()
    pass

ENV_ID = "CartPole-v1"
TUNED = "dqn-cartpole"
BUDGET = 150_000  # env steps, both libraries
QUICK_BUDGET = 3 * CARTPOLE.eval_every
TARGET_SPEEDUP = 3.0  # sb3 zoo median solve seconds / shoal tuned median solve seconds

# rl-baselines3-zoo hyperparams/dqn.yml, CartPole-v1 (n_envs 1, the zoo's default).
ZOO_N_TIMESTEPS = 50_000
ZOO_EXPLORATION_FRACTION = 0.16
ZOO = {
    "learning_rate": 2.3e-3,
    "batch_size": 64,
    "buffer_size": 100_000,
    "learning_starts": 1000,
    "gamma": 0.99,
    "target_update_interval": 10,
    "train_freq": 256,
    "gradient_steps": 128,
    "exploration_final_eps": 0.04,
    "policy_kwargs": {"net_arch": [256, 256]},
}
# SB3's exploration_fraction is a fraction of learn()'s total_timesteps: epsilon reaches its
# final value after exploration_fraction * total_timesteps env steps. The zoo decays it over
# 0.16 * 5e4 = 8000 steps; with a larger budget the same fraction would stretch the decay (to
# 24k steps for 150k) and slow SB3 down, so the fraction is rescaled to keep 8000 steps.
ZOO_EXPLORATION_STEPS = round(ZOO_EXPLORATION_FRACTION * ZOO_N_TIMESTEPS)


# --- the two sides ------------------------------------------------------------------------------


def sb3_model(seed: int, budget: int) -> Any:
    """SB3 DQN with the zoo hyperparameters, for ``learn(budget)``."""
    env = make_vec_env(ENV_ID, n_envs=1, seed=seed)
    return SB3DQN(
        "MlpPolicy",
        env,
        exploration_fraction=ZOO_EXPLORATION_STEPS / budget,
        seed=seed,
        device="cpu",
        verbose=0,
        **ZOO,
    )


def sb3_run(seed: int, budget: int) -> race.RaceRecord:
    """SB3 until solved or ``learn(budget)`` ends.

    Off-policy ``learn`` alternates ``collect_rollouts`` (train_freq = 256 env steps, calling
    ``on_rollout_start`` first and ``on_step`` after every env step) with ``train`` (128
    gradient steps). `EvalAndStop` evaluates in ``on_rollout_start`` once the env steps reach a
    multiple of 8192 (a multiple of 256, so exactly there), which is after the previous
    rollout's gradient steps: the point where shoal evaluates, after an iteration's update. Once
    solved, the next ``on_step`` stops ``learn`` before any further gradient step; that step
    and its time are not counted."""
    return race.sb3_zoo_run(ENV_ID, lambda s: sb3_model(s, budget), seed, budget)


def warm_up(workdir: Path) -> None:
    """Untimed: lazy imports (torch._dynamo on the first optimizer), allocator, evaluator; both
    libraries train past learning_starts so that their gradient steps run too."""
    race.shoal_tuned_run(workdir, TUNED, 0, 2048, solve=False)
    sb3_warm_up(ENV_ID, lambda s: sb3_model(s, BUDGET), 1536)


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
    seeds = 1 if args.quick else args.seeds
    budget = QUICK_BUDGET if args.quick else args.budget
    if seeds < 1 or budget < ZOO_EXPLORATION_STEPS:
        parser.error(f"--seeds must be >= 1 and --budget >= {ZOO_EXPLORATION_STEPS}")

    started = time.perf_counter()
    records = race.run_race(
        seeds,
        lambda workdir, seed: race.shoal_tuned_run(workdir, TUNED, seed, budget),
        lambda seed: sb3_run(seed, budget),
        warm_up,
        lambda line: print(line, flush=True),
    )
    summary = race.summarize(records, TARGET_SPEEDUP)
    status = race.finish(started, summary, "DQN", ENV_ID, seeds, budget)
    if args.json is not None:
        sb3_settings = ZOO | {
            "n_envs": 1,
            "exploration_fraction": ZOO_EXPLORATION_STEPS / budget,
            "exploration_steps": ZOO_EXPLORATION_STEPS,
        }
        settings = {"seeds": seeds, "budget": budget, "sb3_zoo": sb3_settings}
        race.write_json(args.json, "dqn_cartpole", settings, TUNED, summary, records)
    return status


if __name__ == "__main__":
    sys.exit(main())
