"""PPO on CartPole-v1: shoal against Stable-Baselines3, in one process, on one CPU thread.

Three configurations, interleaved seed by seed so that machine noise hits all of them:

* ``shoal tuned``: shoal's tuned example ``ppo-cartpole``.
* ``shoal zoo``: shoal PPO with the rl-baselines3-zoo CartPole-v1 hyperparameters.
* ``sb3 zoo``: Stable-Baselines3 PPO with the same zoo hyperparameters.

Every configuration is evaluated the same way: shoal's own evaluator runs the deterministic
policy for one episode on each of 20 separate environments every 8192 env steps, and a run is
solved when the mean return is >= 475. The clock is paused while evaluating. Imports and the
one-off lazy initialisation of torch are excluded by an untimed warm-up of both libraries.

Usage: ``python benchmarks/ppo_cartpole.py [--seeds 3] [--json out.json] [--quick]``
(needs ``pip install -e '.[bench]'`` for stable-baselines3). See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

import shoal
from shoal.train.evaluate import evaluate
from shoal.train.seeding import derive_seed

try:
    import stable_baselines3
    from stable_baselines3 import PPO as SB3PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
except ImportError:  # pragma: no cover - reported in main()
    stable_baselines3 = None
    BaseCallback = object

ENV_ID = "CartPole-v1"
TARGET_RETURN = 475.0
EVAL_EVERY = 8192
EVAL_EPISODES = 20
TORCH_THREADS = 1
SHOAL_TUNED_BUDGET = 500_000
ZOO_BUDGET = 100_000  # the zoo's n_timesteps: horizon of both linear schedules and the budget
THROUGHPUT_STEPS = 32_768

TARGET_SPEEDUP = 10.0  # sb3 zoo solve seconds / shoal tuned solve seconds
TARGET_THROUGHPUT_RATIO = 3.0  # shoal zoo env-steps/s / sb3 zoo env-steps/s
TARGET_TUNED_THROUGHPUT = 100_000.0  # shoal tuned env-steps/s

# rl-baselines3-zoo hyperparameters for CartPole-v1 (ppo.yml), in shoal's config names.
SHOAL_ZOO = {
    "env.num_envs": 8,
    "num_steps": 32,
    "minibatch_size": 256,
    "num_epochs": 20,
    "gae_lambda": 0.8,
    "gamma": 0.98,
    "optim.lr": 1e-3,
    "optim.lr_schedule": "linear",
    "clip_eps": 0.2,
    "clip_schedule": "linear",
    "optim.anneal_steps": ZOO_BUDGET,
    "ent_coef": 0.0,
    "vf_coef": 0.5,
    "optim.max_grad_norm": 0.5,
    "model.activation": "tanh",
    "model.hidden": (64, 64),
}
SHOAL_QUIET = {
    "run.console": False,
    "run.tensorboard": False,
    "run.checkpoint_every_steps": 0,
    "run.torch_threads": TORCH_THREADS,
}


@dataclass
class RunRecord:
    config: str
    seed: int
    kind: str
    """solve: train until solved or the budget ends; throughput: a fixed budget, no evaluation."""
    solved: bool
    env_steps: int
    """Env steps when solved (or at the end of the budget)."""
    setup_s: float
    train_s: float
    untimed_s: float
    """Excluded from the clock: evaluation (for shoal also logging and the final checkpoint)."""
    eval_return: float | None
    evaluations: int

    @property
    def solve_s(self) -> float:
        """Wall-clock to solve: set-up (envs and model) plus training, evaluation excluded."""
        return self.setup_s + self.train_s

    @property
    def steps_per_s(self) -> float:
        return self.env_steps / self.train_s


# --- shoal -------------------------------------------------------------------------------------


def shoal_run(
    workdir: Path, name: str, seed: int, tuned: bool, total_steps: int, solve: bool
) -> RunRecord:
    """One shoal run; the loop's own clocks exclude evaluation and checkpointing."""
    overrides: dict[str, Any] = dict(SHOAL_QUIET)
    overrides["run.total_steps"] = total_steps
    if solve:
        overrides["run.eval_every_steps"] = EVAL_EVERY
        overrides["run.eval_episodes"] = EVAL_EPISODES
        overrides["run.target_return"] = TARGET_RETURN
    else:
        overrides["run.eval_every_steps"] = 0
        overrides["run.target_return"] = None
    run_dir = str(workdir / f"{name}-{seed}-{'solve' if solve else 'throughput'}")
    if tuned:
        result = shoal.train(tuned="ppo-cartpole", seed=seed, run_dir=run_dir, **overrides)
    else:
        overrides.update(SHOAL_ZOO)
        result = shoal.train("ppo", env=ENV_ID, seed=seed, run_dir=run_dir, **overrides)
    evaluations = result.env_steps // EVAL_EVERY if solve else 0
    return RunRecord(
        config=name,
        seed=seed,
        kind="solve" if solve else "throughput",
        solved=result.solved,
        env_steps=result.env_steps,
        setup_s=result.setup_s,
        train_s=result.train_s,
        untimed_s=result.wall_s - result.setup_s - result.train_s,
        eval_return=result.eval_return,
        evaluations=evaluations,
    )


# --- Stable-Baselines3 -------------------------------------------------------------------------


def linear(start: float) -> Callable[[float], float]:
    """SB3 schedules get the remaining progress, 1 at the start of learn() and 0 at the end."""
    return lambda remaining: remaining * start


class SB3Policy:
    """Lets shoal's evaluator drive an SB3 model: batched numpy observations to actions."""

    def __init__(self, model: Any):
        self.model = model

    def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        return self.model.predict(obs, deterministic=deterministic)[0]


class EvalAndStop(BaseCallback):
    """Evaluates after each training phase that crosses a multiple of ``EVAL_EVERY`` env steps,
    with the clock paused, and stops learning once solved (or after ``stop_after`` steps).

    SB3 trains on a rollout only after it is complete, so the evaluation runs at the start of
    the next rollout, the point where shoal's loop evaluates too; the one vector step SB3 then
    takes before it can be stopped is not counted in the time or the steps to solve.
    """

    def __init__(self, seed: int, eval_env: Any = None, stop_after: int | None = None):
        super().__init__()
        self.seed = seed
        self.eval_env = eval_env
        self.stop_after = stop_after
        self.next_eval = EVAL_EVERY
        self.evaluations = 0
        self.eval_s = 0.0
        self.eval_return: float | None = None
        self.solved_at: tuple[int, float] | None = None  # (env steps, perf_counter)

    def _on_rollout_start(self) -> None:
        if self.eval_env is None or self.solved_at or self.num_timesteps < self.next_eval:
            return
        start = time.perf_counter()
        seed = derive_seed(self.seed, "eval", self.evaluations)
        self.eval_return = evaluate(SB3Policy(self.model), self.eval_env, seed)["eval/return"]
        self.evaluations += 1
        self.next_eval = (self.num_timesteps // EVAL_EVERY + 1) * EVAL_EVERY
        if self.eval_return >= TARGET_RETURN:
            self.solved_at = (self.num_timesteps, start)
        else:
            self.eval_s += time.perf_counter() - start

    def _on_step(self) -> bool:
        if self.solved_at is not None:
            return False
        return self.stop_after is None or self.num_timesteps <= self.stop_after


def sb3_model(seed: int) -> Any:
    env = make_vec_env(ENV_ID, n_envs=8, seed=seed)
    return SB3PPO(
        "MlpPolicy",
        env,
        n_steps=32,
        batch_size=256,
        n_epochs=20,
        gae_lambda=0.8,
        gamma=0.98,
        learning_rate=linear(1e-3),
        clip_range=linear(0.2),
        ent_coef=0.0,
        vf_coef=0.5,
        max_grad_norm=0.5,
        seed=seed,
        device="cpu",
        verbose=0,
    )


def sb3_run(seed: int, solve: bool, total_steps: int) -> RunRecord:
    """SB3 with the zoo hyperparameters; the clock runs from building its envs and model to the
    stop, minus evaluation. ``solve=False``: ``total_steps`` of training, no evaluation."""
    torch.set_num_threads(TORCH_THREADS)
    eval_env = shoal.make_env(ENV_ID, num_envs=EVAL_EPISODES) if solve else None
    try:
        start = time.perf_counter()
        model = sb3_model(seed)
        setup_s = time.perf_counter() - start
        if solve:
            callback = EvalAndStop(seed, eval_env)
            model.learn(ZOO_BUDGET, callback=callback)
        else:
            # Stop after the last full rollout of the budget, keeping the zoo's 1e5-step
            # schedules (learn(total_steps) would anneal them over total_steps instead).
            callback = EvalAndStop(seed, stop_after=total_steps)
            model.learn(ZOO_BUDGET, callback=callback)
        end = time.perf_counter()
        model.get_env().close()
    finally:
        if eval_env is not None:
            eval_env.close()
    if callback.solved_at is not None:
        env_steps, end = callback.solved_at
    else:
        # Not solved: the whole budget. Fixed budget: the vector step taken to stop is not counted.
        env_steps = model.num_timesteps if solve else total_steps
    train_s = end - start - setup_s - callback.eval_s
    return RunRecord(
        config="sb3 zoo",
        seed=seed,
        kind="solve" if solve else "throughput",
        solved=callback.solved_at is not None,
        env_steps=env_steps,
        setup_s=setup_s,
        train_s=train_s,
        untimed_s=callback.eval_s,
        eval_return=callback.eval_return,
        evaluations=callback.evaluations,
    )


# --- the benchmark -----------------------------------------------------------------------------


def warm_up(workdir: Path) -> None:
    """Untimed: lazy imports (torch._dynamo on the first optimizer), allocator, evaluator."""
    shoal_run(workdir, "warmup-tuned", 0, tuned=True, total_steps=4096, solve=False)
    shoal_run(workdir, "warmup-zoo", 0, tuned=False, total_steps=512, solve=False)
    torch.set_num_threads(TORCH_THREADS)
    model = sb3_model(0)
    model.learn(512)
    eval_env = shoal.make_env(ENV_ID, num_envs=EVAL_EPISODES)
    evaluate(SB3Policy(model), eval_env, 0)
    eval_env.close()
    model.get_env().close()


def run_all(seeds: int, throughput_steps: int, log: Callable[[str], None]) -> list[RunRecord]:
    records: list[RunRecord] = []

    def done(record: RunRecord) -> None:
        records.append(record)
        status = "solved" if record.solved else "not solved"
        if record.kind == "throughput":
            status = "fixed budget"
        log(
            f"  {record.config:<12} seed {record.seed} {record.kind:<10} {status:<12} "
            f"{record.env_steps:>7} steps  {record.solve_s:7.2f} s  "
            f"{record.steps_per_s:>9,.0f} steps/s  (untimed {record.untimed_s:.2f} s)"
        )

    with tempfile.TemporaryDirectory(prefix="shoal-bench-") as tmp:
        workdir = Path(tmp)
        log("warm-up (untimed) ...")
        warm_up(workdir)
        for seed in range(seeds):
            log(f"seed {seed}")
            done(shoal_run(workdir, "shoal tuned", seed, True, SHOAL_TUNED_BUDGET, solve=True))
            done(sb3_run(seed, solve=True, total_steps=ZOO_BUDGET))
            done(shoal_run(workdir, "shoal zoo", seed, False, ZOO_BUDGET, solve=True))
            # Fixed-budget throughput, both libraries, zoo hyperparameters; alternate the order.
            pair = [
                lambda s=seed: shoal_run(workdir, "shoal zoo", s, False, throughput_steps, False),
                lambda s=seed: sb3_run(s, solve=False, total_steps=throughput_steps),
            ]
            for measure in pair if seed % 2 == 0 else pair[::-1]:
                done(measure())
    return records


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(records: list[RunRecord]) -> dict[str, Any]:
    rows: dict[str, dict[str, Any]] = {}
    for config in ("shoal tuned", "shoal zoo", "sb3 zoo"):
        solves = [r for r in records if r.config == config and r.kind == "solve"]
        fixed = [r for r in records if r.config == config and r.kind == "throughput"]
        rows[config] = {
            "seeds": len(solves),
            "solved": sum(r.solved for r in solves),
            "median_solve_s": median([r.solve_s for r in solves]),
            "median_solve_steps": median([r.env_steps for r in solves]),
            "median_solve_run_steps_per_s": median([r.steps_per_s for r in solves]),
            "median_fixed_budget_steps_per_s": median([r.steps_per_s for r in fixed]),
        }
    tuned, shoal_zoo, sb3 = rows["shoal tuned"], rows["shoal zoo"], rows["sb3 zoo"]
    speedup = sb3["median_solve_s"] / tuned["median_solve_s"]
    throughput_ratio = (
        shoal_zoo["median_fixed_budget_steps_per_s"] / sb3["median_fixed_budget_steps_per_s"]
    )
    tuned_rate = tuned["median_solve_run_steps_per_s"]
    checks = {
        "wall_clock_speedup": {
            "description": "sb3 zoo median solve s / shoal tuned median solve s",
            "value": speedup,
            "target": TARGET_SPEEDUP,
            # Unsolved shoal seeds would make the ratio look better than it is.
            "pass": speedup >= TARGET_SPEEDUP and tuned["solved"] == tuned["seeds"],
        },
        "zoo_throughput_ratio": {
            "description": "shoal zoo / sb3 zoo median training env-steps/s (fixed budget)",
            "value": throughput_ratio,
            "target": TARGET_THROUGHPUT_RATIO,
            "pass": throughput_ratio >= TARGET_THROUGHPUT_RATIO,
        },
        "tuned_throughput": {
            "description": "shoal tuned median training env-steps/s (solve runs)",
            "value": tuned_rate,
            "target": TARGET_TUNED_THROUGHPUT,
            "pass": tuned_rate >= TARGET_TUNED_THROUGHPUT,
        },
    }
    extra = {
        "solve_steps_ratio_sb3_over_shoal_tuned": sb3["median_solve_steps"]
        / tuned["median_solve_steps"],
        "solve_run_throughput_ratio_shoal_zoo_over_sb3": shoal_zoo["median_solve_run_steps_per_s"]
        / sb3["median_solve_run_steps_per_s"],
    }
    return {"rows": rows, "checks": checks, "extra": extra}


def print_report(summary: dict[str, Any], seeds: int, throughput_steps: int) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=100)
    table = Table(
        title=f"PPO CartPole-v1, {seeds} seed(s), medians; solved = mean of {EVAL_EPISODES} "
        f"deterministic episodes >= {TARGET_RETURN:g}, checked every {EVAL_EVERY} env steps"
    )
    table.add_column("config")
    table.add_column("solved", justify="right")
    table.add_column("solve s", justify="right")
    table.add_column("steps to solve", justify="right")
    table.add_column("steps/s (solve runs)", justify="right")
    table.add_column(f"steps/s ({throughput_steps:,} fixed)", justify="right")
    for name, row in summary["rows"].items():
        fixed = row["median_fixed_budget_steps_per_s"]
        table.add_row(
            name,
            f"{row['solved']}/{row['seeds']}",
            f"{row['median_solve_s']:.2f}",
            f"{row['median_solve_steps']:,.0f}",
            f"{row['median_solve_run_steps_per_s']:,.0f}",
            "-" if np.isnan(fixed) else f"{fixed:,.0f}",
        )
    console.print(table)
    checks = Table(title="targets")
    checks.add_column("check")
    checks.add_column("value", justify="right")
    checks.add_column("target", justify="right")
    checks.add_column("result")
    for check in summary["checks"].values():
        value, target = check["value"], check["target"]
        fmt = (lambda v: f"{v:,.0f}") if target >= 1000 else (lambda v: f"{v:.2f}x")
        checks.add_row(
            check["description"],
            fmt(value),
            ">= " + fmt(target),
            "[green]PASS[/green]" if check["pass"] else "[red]FAIL[/red]",
        )
    console.print(checks)
    extra = summary["extra"]
    steps_ratio = extra["solve_steps_ratio_sb3_over_shoal_tuned"]
    solve_rate_ratio = extra["solve_run_throughput_ratio_shoal_zoo_over_sb3"]
    console.print(
        f"also: sb3 zoo / shoal tuned env steps to solve {steps_ratio:.2f}x; "
        f"shoal zoo / sb3 zoo steps/s in the solve runs {solve_rate_ratio:.2f}x"
    )
    console.print(
        f"torch threads = {TORCH_THREADS} for both libraries; evaluation time excluded for both; "
        "imports excluded (untimed warm-up); set-up of envs and model included in solve time."
    )


def environment() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": TORCH_THREADS,
        "shoal": getattr(shoal, "__version__", "unknown"),
        "stable_baselines3": stable_baselines3.__version__,
        "numpy": np.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds per configuration")
    parser.add_argument("--json", type=Path, help="also write every run and the summary here")
    parser.add_argument("--quick", action="store_true", help="smoke check: 1 seed, short budget")
    parser.add_argument(
        "--throughput-steps",
        type=int,
        default=THROUGHPUT_STEPS,
        help="env steps of each fixed-budget throughput run (a multiple of 256)",
    )
    args = parser.parse_args(argv)
    if stable_baselines3 is None:
        print("stable-baselines3 is missing: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    seeds = 1 if args.quick else args.seeds
    throughput_steps = 8192 if args.quick else args.throughput_steps
    if seeds < 1 or throughput_steps < 256 or throughput_steps % 256:
        parser.error("--seeds must be >= 1 and --throughput-steps a positive multiple of 256")

    started = time.perf_counter()
    records = run_all(seeds, throughput_steps, lambda line: print(line, flush=True))
    summary = summarize(records)
    print()
    print_report(summary, seeds, throughput_steps)
    print(f"benchmark took {time.perf_counter() - started:.0f} s")
    if args.json is not None:
        payload = {
            "benchmark": "ppo_cartpole",
            "settings": {
                "seeds": seeds,
                "throughput_steps": throughput_steps,
                "target_return": TARGET_RETURN,
                "eval_every_steps": EVAL_EVERY,
                "eval_episodes": EVAL_EPISODES,
                "shoal_tuned_budget": SHOAL_TUNED_BUDGET,
                "zoo_budget": ZOO_BUDGET,
                "shoal_zoo_overrides": {
                    k: list(v) if isinstance(v, tuple) else v for k, v in SHOAL_ZOO.items()
                },
            },
            "environment": environment(),
            "summary": summary,
            "runs": [
                asdict(r) | {"solve_s": r.solve_s, "steps_per_s": r.steps_per_s} for r in records
            ],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2))
        print(f"wrote {args.json}")
    return 0 if all(c["pass"] for c in summary["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
