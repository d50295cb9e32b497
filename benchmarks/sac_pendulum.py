"""SAC on Pendulum-v1: shoal against Stable-Baselines3, in one process, on one CPU thread.

Two measurements.

The solve race (`race.py`), two configurations interleaved seed by seed (the order alternates)
so that machine noise hits both:

* ``shoal tuned``: shoal's tuned example ``sac-pendulum``, budget 20k env steps.
* ``sb3 zoo``: Stable-Baselines3 SAC with the rl-baselines3-zoo Pendulum-v1 hyperparameters
  (``learning_rate`` 1e-3, SB3's SAC defaults otherwise, one env), budget the zoo's 2e4 env
  steps.

Both are evaluated the same way: every 500 env steps shoal's own evaluator runs the
deterministic policy for one episode on each of 10 separate environments, and a run is solved
when the mean return is >= -200. The clock is paused while evaluating; building the envs and
the model is timed; imports are excluded by an untimed warm-up. Targets: SB3's median solve
time at least 2x shoal's, and shoal's median env steps to solve no more than SB3's.

Gradient updates per second at batch 256, in isolation: each library's replay is filled with
2,000 random Pendulum transitions, then consecutive updates (sampling included) are timed.

Usage: ``python benchmarks/sac_pendulum.py [--seeds 3] [--json out.json] [--quick]``
(needs ``pip install -e '.[bench]'`` for stable-baselines3). See benchmarks/README.md.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import race  # benchmarks/race.py: the script's directory is on sys.path
import torch
from common import TORCH_THREADS, SolveCriterion, base_parser, median, require_sb3, sb3_warm_up

import shoal
from shoal.api import build_config
from shoal.registry import algorithm_for_config

try:
    from stable_baselines3 import SAC as SB3SAC
    from stable_baselines3.common.env_util import make_vec_env
except ImportError:  # pragma: no cover - reported in main()
    pass

ENV_ID = "Pendulum-v1"
TUNED = "sac-pendulum"
CRITERION = SolveCriterion(target_return=-200.0, eval_every=500, eval_episodes=10)
BUDGET = 20_000  # env steps, both libraries: the zoo's n_timesteps
QUICK_BUDGET = 3 * CRITERION.eval_every
TARGET_SPEEDUP = 2.0  # sb3 zoo median solve seconds / shoal tuned median solve seconds
TARGET_STEPS_RATIO = 1.0  # sb3 zoo median env steps to solve / shoal tuned median

# rl-baselines3-zoo hyperparams/sac.yml, Pendulum-v1: n_timesteps 2e4, MlpPolicy,
# learning_rate 1e-3. The rest are SB3's SAC defaults, written out so that the JSON report
# records them and a change of SB3's defaults does not change the benchmark silently.
ZOO = {
    "learning_rate": 1e-3,
    "buffer_size": 1_000_000,
    "learning_starts": 100,
    "batch_size": 256,
    "tau": 0.005,
    "gamma": 0.99,
    "train_freq": 1,
    "gradient_steps": 1,
    "ent_coef": "auto",
    "target_update_interval": 1,
    "target_entropy": "auto",
    "policy_kwargs": {"net_arch": [256, 256]},
}
ZOO_N_ENVS = 1

UPDATE_BATCH = 256
FILL_TRANSITIONS = 2_000  # random transitions in each replay before timing updates
UPDATES = 500  # timed consecutive gradient updates per repeat
QUICK_UPDATES = 50
WARM_UPDATES = 20  # untimed updates before each timed block
# The same learner with SB3's network size, so that updates/s compares like with like.
ZOO_NET = {"model.hidden": (256, 256)}
UPDATE_ROWS = {
    "shoal": "shoal tuned",
    "shoal_zoo_net": "shoal, zoo's 256-256 nets",
    "sb3": "sb3 zoo",
}


# --- the solve race ----------------------------------------------------------------------------


def sb3_model(seed: int, **overrides: Any) -> Any:
    """SB3 SAC with the zoo hyperparameters (no schedules, so the budget changes nothing)."""
    env = make_vec_env(ENV_ID, n_envs=ZOO_N_ENVS, seed=seed)
    kwargs = ZOO | overrides
    kwargs["policy_kwargs"] = dict(kwargs["policy_kwargs"])  # SB3 adds keys to it
    return SB3SAC("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **kwargs)


def sb3_run(seed: int, budget: int) -> race.RaceRecord:
    """SB3 until solved or ``learn(budget)`` ends. With ``train_freq`` 1, off-policy ``learn``
    alternates one env step (``collect_rollouts``, calling ``on_rollout_start`` first) and one
    gradient step, so `common.EvalAndStop` evaluates at exactly every multiple of 500 env
    steps, after that step's update: where shoal evaluates, after an iteration's update."""
    return race.sb3_zoo_run(ENV_ID, sb3_model, seed, budget, CRITERION)


def shoal_run(workdir: Path, seed: int, budget: int) -> race.RaceRecord:
    return race.shoal_tuned_run(workdir, TUNED, seed, budget, criterion=CRITERION)


def warm_up(workdir: Path) -> None:
    """Untimed: lazy imports (torch._dynamo on the first optimizer), allocator, evaluator; both
    libraries train past their learning_starts so that their gradient steps run too."""
    learning_starts = build_config(tuned=TUNED).replay.learning_starts
    race.shoal_tuned_run(workdir, TUNED, 0, learning_starts + 256, solve=False)
    sb3_warm_up(ENV_ID, sb3_model, ZOO["learning_starts"] + 200, CRITERION)


# --- gradient updates per second ---------------------------------------------------------------


def sb3_updates_per_s(
    updates: int,
    batch_size: int = UPDATE_BATCH,
    transitions: int = FILL_TRANSITIONS,
    seed: int = 0,
) -> float:
    """Gradient updates per second of SB3 SAC with the zoo hyperparameters, in isolation.

    ``learn(transitions)`` with ``learning_starts`` beyond it fills the replay buffer with
    uniformly random actions and no update (and sets up the logger that ``train`` writes
    to); then ``train(gradient_steps=updates, batch_size=batch_size)`` is timed, after a few
    untimed updates. Each update samples its batch, steps critic, actor and entropy
    coefficient, and moves the target networks, as in training."""
    torch.set_num_threads(TORCH_THREADS)
    model = sb3_model(seed, learning_starts=transitions + 1)
    model.learn(transitions)
    if model._n_updates != 0 or model.replay_buffer.size() != transitions:
        raise RuntimeError("SB3 replay fill: expected a full buffer and no update yet")
    model.train(gradient_steps=WARM_UPDATES, batch_size=batch_size)
    start = time.perf_counter()
    model.train(gradient_steps=updates, batch_size=batch_size)
    elapsed = time.perf_counter() - start
    model.get_env().close()
    return updates / elapsed


def random_actions(space: gym.Space, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` uniformly random actions of a bounded `Box` (or `Discrete`) space."""
    if isinstance(space, gym.spaces.Discrete):
        return space.start + rng.integers(space.n, size=n)
    return rng.uniform(space.low, space.high, (n, *space.shape)).astype(space.dtype)


def shoal_updates_per_s(
    tuned: str,
    updates: int,
    batch_size: int = UPDATE_BATCH,
    transitions: int = FILL_TRANSITIONS,
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
) -> float:
    """Gradient updates per second of shoal's learner for the tuned example ``tuned``, in
    isolation.

    The algorithm is built as ``shoal.train`` builds it,
    ``algorithm_for_config(config).algorithm_cls(config)`` on the tuned config, with one torch
    thread. Its replay, ``algorithm.replay`` (a `shoal.data.replay.ReplayBuffer`), is filled
    with about ``transitions`` steps of uniformly random actions on a separate vector env of
    the config's env with the replay's ``num_envs``. Then ``updates`` consecutive
    ``algorithm.learner.update(algorithm.replay.sample(batch_size))`` are timed, after a few
    untimed ones; sampling is timed, as in SB3's ``train``. What ``update`` returns is
    ignored. ``overrides`` change the tuned config (e.g. SB3's network size)."""
    torch.set_num_threads(TORCH_THREADS)
    kwargs = {"run.torch_threads": TORCH_THREADS, **(overrides or {})}
    config = build_config(tuned=tuned, seed=seed, **kwargs)
    algorithm = algorithm_for_config(config).algorithm_cls(config)
    replay, learner = algorithm.replay, algorithm.learner
    env = shoal.make_env(config.env, num_envs=replay.num_envs)
    try:
        rng = np.random.default_rng(seed)
        obs = env.reset(seed=seed)
        for _ in range(-(-transitions // replay.num_envs)):
            actions = random_actions(env.action_space, replay.num_envs, rng)
            step = env.step(actions)
            replay.add(obs, actions, step.reward, step.terminated, step.truncated, ~step.autoreset)
            obs = step.obs
    finally:
        env.close()
    for _ in range(WARM_UPDATES):
        learner.update(replay.sample(batch_size))
    start = time.perf_counter()
    for _ in range(updates):
        learner.update(replay.sample(batch_size))
    elapsed = time.perf_counter() - start
    algorithm.close()
    return updates / elapsed


def measure_updates(repeats: int, updates: int, log: Any) -> dict[str, Any]:
    """``repeats`` timed blocks per library (a fresh model and replay each), the order
    alternating; medians and the shoal / SB3 ratio."""
    rates: dict[str, list[float]] = {name: [] for name in UPDATE_ROWS}
    for repeat in range(repeats):
        measures = [
            ("shoal", lambda r=repeat: shoal_updates_per_s(TUNED, updates, seed=r)),
            (
                "shoal_zoo_net",
                lambda r=repeat: shoal_updates_per_s(TUNED, updates, seed=r, overrides=ZOO_NET),
            ),
            ("sb3", lambda r=repeat: sb3_updates_per_s(updates, seed=r)),
        ]
        for name, measure in measures if repeat % 2 == 0 else measures[::-1]:
            rates[name].append(measure())
            log(f"  {name:<13} repeat {repeat}  {rates[name][-1]:8,.1f} updates/s")
    medians = {name: median(runs) for name, runs in rates.items()}
    return {
        "batch_size": UPDATE_BATCH,
        "fill_transitions": FILL_TRANSITIONS,
        "updates": updates,
        "warm_updates": WARM_UPDATES,
        "repeats": repeats,
        **{f"{name}_median": rate for name, rate in medians.items()},
        "ratio_shoal_over_sb3": medians["shoal"] / medians["sb3"],
        "ratio_shoal_zoo_net_over_sb3": medians["shoal_zoo_net"] / medians["sb3"],
        **{f"{name}_runs": runs for name, runs in rates.items()},
    }


def print_updates(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=100)
    table = Table(title=f"gradient updates/s, batch {result['batch_size']}")
    table.add_column("library")
    table.add_column("updates/s", justify="right")
    table.add_column("per repeat", justify="right")
    for name, label in UPDATE_ROWS.items():
        runs = ", ".join(f"{v:,.1f}" for v in result[f"{name}_runs"])
        table.add_row(label, f"{result[f'{name}_median']:,.1f}", runs)
    console.print(table)
    console.print(
        f"shoal tuned / sb3 zoo median updates/s {result['ratio_shoal_over_sb3']:.2f}x, "
        f"shoal with the zoo's 256-256 networks / sb3 zoo "
        f"{result['ratio_shoal_zoo_net_over_sb3']:.2f}x over "
        f"{result['repeats']} repeat(s); "
        f"{result['updates']} consecutive updates timed after {result['warm_updates']} untimed "
        f"ones, replay filled with {result['fill_transitions']:,} random transitions; each "
        "update samples its batch (SB3: critic, actor, entropy coefficient and target networks; "
        "shoal: one learner.update)."
    )


# --- the benchmark -----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = base_parser(__doc__)
    parser.add_argument(
        "--budget",
        type=int,
        default=BUDGET,
        help=f"env steps per run for both libraries (default {BUDGET:,}; "
        f"{QUICK_BUDGET:,} with --quick)",
    )
    parser.add_argument(
        "--updates",
        type=int,
        default=UPDATES,
        help=f"timed gradient updates per repeat (default {UPDATES}; {QUICK_UPDATES} with "
        "--quick); one repeat per seed",
    )
    args = parser.parse_args(argv)
    if not require_sb3():
        return 2
    seeds = 1 if args.quick else args.seeds
    budget = QUICK_BUDGET if args.quick else args.budget
    updates = QUICK_UPDATES if args.quick else args.updates
    if seeds < 1 or budget < CRITERION.eval_every or updates < 1:
        parser.error(f"--seeds and --updates must be >= 1 and --budget >= {CRITERION.eval_every}")

    def log(line: str) -> None:
        print(line, flush=True)

    started = time.perf_counter()
    records = race.run_race(
        seeds,
        lambda workdir, seed: shoal_run(workdir, seed, budget),
        lambda seed: sb3_run(seed, budget),
        warm_up,
        log,
    )
    log("gradient updates/s")
    updates_result = measure_updates(seeds, updates, log)
    summary = race.summarize(records, TARGET_SPEEDUP, TARGET_STEPS_RATIO)
    summary["updates_per_s"] = updates_result
    print()
    print_updates(updates_result)
    status = race.finish(started, summary, "SAC", ENV_ID, seeds, budget, CRITERION)
    if args.json is not None:
        sb3_settings = ZOO | {"n_envs": ZOO_N_ENVS}
        settings = {"seeds": seeds, "budget": budget, "sb3_zoo": sb3_settings}
        race.write_json(args.json, "sac_pendulum", settings, TUNED, summary, records, CRITERION)
    return status


if __name__ == "__main__":
    sys.exit(main())
